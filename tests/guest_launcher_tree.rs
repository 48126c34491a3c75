//! The launcher image's file tree (scripts/assemble-launcher-tree, Containerfile): it holds
//! qlauncher, qemu-system-x86_64, their libraries and firmware, the programs KubeVirt runs from the
//! image (bash as /bin/sh and /bin/bash, cp, ls, sleep, the companion programs, virtiofsd) and
//! nothing else (no second shell, ip, nft, qemu-img, xorriso, libvirt); its metadata (qemu 107 in
//! /etc/passwd and /etc/group, nsswitch.conf, the file capability of virt-launcher-monitor); and
//! QEMU chrooted into it boots the test guest with SeaBIOS. How KubeVirt's pods run these
//! programs is tests/pod_image.rs.
//!
//! Needs the companion programs built (scripts/build-companions) and virtiofsd
//! (scripts/install-deps).

use testkit::guest;

use guest::{GuestImages, Vm};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const STEP: Duration = Duration::from_secs(120);

/// Every path in `dir` (files, symlinks, directories), recursively.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let meta = std::fs::symlink_metadata(&p).unwrap();
        out.push(p.clone());
        if meta.is_dir() {
            walk(&p, out);
        }
    }
}

/// Whether the ELF64 image `elf` has a `PT_INTERP` program header (a dynamic executable).
fn has_interpreter(elf: &[u8]) -> bool {
    assert_eq!(&elf[..4], b"\x7fELF", "not an ELF file");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) == 3
    })
}

#[test]
fn launcher_tree_has_only_qemu_and_qlauncher_and_boots_the_guest() {
    let img = GuestImages::locate();
    let tree = tempfile::Builder::new()
        .prefix(&format!("qlg-tree-{}-", std::process::id()))
        .tempdir()
        .unwrap();
    let root = tree.path().join("root");
    let st = Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scripts/assemble-launcher-tree"
    ))
    .arg(&root)
    .arg(env!("CARGO_BIN_EXE_qlauncher"))
    .status()
    .expect("run scripts/assemble-launcher-tree");
    assert!(st.success(), "assemble-launcher-tree failed");

    let mut paths = Vec::new();
    walk(&root, &mut paths);
    let forbidden = [
        "dash",
        "busybox",
        "ash",
        "ip",
        "nft",
        "qemu-img",
        "xorriso",
        "xorrisofs",
        "genisoimage",
        "mkisofs",
        "virtqemud",
        "libvirtd",
        "virtlogd",
        "virsh",
        "iptables",
        "dhclient",
    ];
    for p in &paths {
        let name = p.file_name().unwrap().to_string_lossy();
        assert!(
            !forbidden.contains(&name.as_ref()),
            "forbidden program in the tree: {}",
            p.display()
        );
        assert!(
            !name.starts_with("libvirt"),
            "libvirt file in the tree: {}",
            p.display()
        );
    }
    let mut programs: Vec<String> = paths
        .iter()
        .filter(|p| {
            use std::os::unix::fs::PermissionsExt;
            let m = std::fs::symlink_metadata(p).unwrap();
            m.is_file()
                && m.permissions().mode() & 0o111 != 0
                && p.parent()
                    .is_some_and(|d| d.ends_with("usr/bin") || d.ends_with("usr/sbin"))
        })
        .map(|p| p.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    programs.sort();
    assert_eq!(
        programs,
        [
            "usr/bin/bash",
            "usr/bin/container-disk",
            "usr/bin/cp",
            "usr/bin/ls",
            "usr/bin/qemu-system-x86_64",
            "usr/bin/qlauncher",
            "usr/bin/sleep",
            "usr/bin/virt-freezer",
            "usr/bin/virt-launcher-monitor",
            "usr/bin/virt-probe",
            "usr/bin/virt-tail",
        ]
    );
    // One shell: sh is bash; node-labeller.sh and virt-launcher are qlauncher; virtiofsd where
    // KubeVirt runs it.
    assert_eq!(
        std::fs::read_link(root.join("usr/bin/sh")).unwrap(),
        Path::new("bash")
    );
    for name in ["node-labeller.sh", "virt-launcher"] {
        assert_eq!(
            std::fs::read_link(root.join("usr/bin").join(name)).unwrap(),
            Path::new("qlauncher"),
            "{name}"
        );
    }
    assert!(root.join("usr/libexec/virtiofsd").is_file());
    // container-disk runs inside scratch containerDisk images: static (no ELF interpreter).
    let elf = std::fs::read(root.join("usr/bin/container-disk")).unwrap();
    assert!(!has_interpreter(&elf), "container-disk is not static");
    // Users and name service as KubeVirt's image has them.
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).unwrap();
    assert!(passwd.contains("qemu:x:107:107:"), "{passwd}");
    let group = std::fs::read_to_string(root.join("etc/group")).unwrap();
    assert!(group.lines().any(|l| l == "qemu:x:107:"), "{group}");
    let nss = std::fs::read_to_string(root.join("etc/nsswitch.conf")).unwrap();
    assert!(nss
        .lines()
        .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["hosts:", "files", "dns"]));
    // The monitor's file capability (what a non-root compute container keeps through its exec).
    let caps = testkit::run(&[
        "getcap",
        root.join("usr/bin/virt-launcher-monitor").to_str().unwrap(),
    ]);
    assert!(caps.contains("cap_net_bind_service=ep"), "getcap: {caps}");

    let root_arg = root.to_str().unwrap();
    let version = testkit::run(&[
        "chroot",
        root_arg,
        "/usr/bin/qemu-system-x86_64",
        "--version",
    ]);
    assert!(version.starts_with("QEMU emulator version "));
    testkit::run(&["chroot", root_arg, "/usr/bin/qlauncher", "--help"]);

    // QEMU inside the tree boots the guest's disk with SeaBIOS (firmware, TCG module and the
    // virtio-net option ROM all come from the tree).
    // It also carries a ConfigDrive ("config-2") disk, read by the guest.
    let user_data = "#!/bin/sh\necho config-drive test\n";
    let mut vm = Vm::start_in(Some(&root), |dir| {
        std::fs::copy(&img.disk_qcow2, dir.join("disk.qcow2")).unwrap();
        let disk = Vm::in_root(Some(&root), &dir.join("disk.qcow2"));
        let latest = dir.join("cd/openstack/latest");
        std::fs::create_dir_all(&latest).unwrap();
        std::fs::write(latest.join("user_data"), user_data).unwrap();
        std::fs::write(latest.join("meta_data.json"), "{\"uuid\":\"qlg\"}\n").unwrap();
        let st = Command::new("genisoimage")
            .args(["-quiet", "-V", "config-2", "-J", "-r", "-o"])
            .arg(dir.join("config-2.iso"))
            .arg(dir.join("cd"))
            .status()
            .expect("run genisoimage");
        assert!(st.success(), "genisoimage failed");
        let iso = Vm::in_root(Some(&root), &dir.join("config-2.iso"));
        vec![
            "-drive".into(),
            format!("file={},if=none,id=d0,format=qcow2", disk.display()),
            "-device".into(),
            "virtio-blk-pci,drive=d0,bootindex=1".into(),
            "-drive".into(),
            format!(
                "file={},if=none,id=cd,format=raw,readonly=on",
                iso.display()
            ),
            "-device".into(),
            "virtio-blk-pci,drive=cd".into(),
            "-netdev".into(),
            "user,id=n0".into(),
            "-device".into(),
            "virtio-net-pci,netdev=n0".into(),
        ]
    });
    vm.wait_booted();
    assert_eq!(
        vm.console.wait_for_marker("cidata ", STEP).unwrap(),
        "cidata vdb type=configdrive label=config-2"
    );
    let marker = vm.console.wait_for_marker("user-data ", STEP).unwrap();
    let b64 = marker.strip_prefix("user-data ").unwrap();
    let (rc, decoded) = vm
        .console
        .run(&format!("echo {b64} | base64 -d"), STEP)
        .unwrap();
    assert_eq!((rc, decoded + "\n"), (0, user_data.to_string()));
    let lease = vm.console.wait_for_marker("lease eth0 ", STEP).unwrap();
    assert!(
        lease.starts_with("lease eth0 ip=10.0.2.15/24 router=10.0.2.2 "),
        "{lease}"
    );
    let status = vm.power_off(STEP);
    assert!(status.success(), "QEMU exit status {status}");
}

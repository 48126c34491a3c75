//! qlauncher chrooted into the compute container's file tree (`scripts/assemble-launcher-tree`,
//! the same files as the `Containerfile`'s image) boots the demo VMI with `qlauncher run`, the
//! guest gets its DHCP lease from qlauncher, and SIGTERM stops it gracefully. Every process of the
//! pod runs the monitor, the launcher or QEMU: qlauncher needs no outside program but QEMU (the
//! tree's shell and coreutils are there only for KubeVirt's other containers; no `ip`, `nft`,
//! `qemu-img`).
//!
//! The test plays the container runtime: in a private mount namespace (gone with its last
//! process) it mounts what a pod's container has, `/proc`, `/sys`, a `/dev` tmpfs with the usual
//! device nodes plus `/dev/kvm` and `/dev/net/tun` (KubeVirt's device plugins), and writes the
//! kubelet's `/etc/resolv.conf`; the guest image stands where the containerDisk would be.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use testkit::guest;

use guest::GuestImages;
use std::path::Path;
use std::process::Command;
use testkit::run::{short_tempdir, Pod, Run, RESOLV_CONF, STEP};

/// The shell fragment (run by the test, outside the tree) that mounts a container's file systems
/// into `$T` and then execs `chroot "$T" "$@"`.
const MOUNT_AND_CHROOT: &str = r#"set -e
mount -t proc proc "$T/proc"
mount -t sysfs -o ro sysfs "$T/sys"
mount -t tmpfs -o mode=755,nosuid tmpfs "$T/dev"
mkdir "$T/dev/net" "$T/dev/pts" "$T/dev/shm"
for d in null zero full random urandom tty kvm net/tun; do
  [ -e "/dev/$d" ] || continue
  touch "$T/dev/$d"
  mount --bind "/dev/$d" "$T/dev/$d"
done
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$T/dev/pts"
ln -s pts/ptmx "$T/dev/ptmx"
mount -t tmpfs -o mode=1777 tmpfs "$T/dev/shm"
exec chroot "$T" "$@"
"#;

#[test]
fn qlauncher_chrooted_in_the_launcher_tree_boots_the_demo_vmi_and_stops_it() {
    let images = GuestImages::locate();
    let tmp = short_tempdir();
    let tree = tmp.path().join("t");
    let st =
        Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/assemble-launcher-tree"))
            .arg(&tree)
            .arg(env!("CARGO_BIN_EXE_qlauncher"))
            .status()
            .expect("run scripts/assemble-launcher-tree");
    assert!(st.success(), "assemble-launcher-tree failed");
    // The tree holds the EFI firmware the launcher picks with KubeVirt's `--ovmf-path` (absent
    // from the tree) and with `qlauncher run`'s default, and no other OVMF build.
    let ovmf = tree.join("usr/share/OVMF");
    for kubevirt_dir in ["usr/share/edk2/ovmf", "usr/share/OVMF"] {
        let efi = qlauncher::storage::detect_efi(&tree.join(kubevirt_dir), &ovmf);
        for f in [&efi.code, &efi.vars, &efi.secure_code, &efi.secure_vars] {
            assert!(
                Path::new(f).is_file(),
                "{kubevirt_dir}: {f} is not in the tree"
            );
        }
    }
    let mut shipped: Vec<String> = std::fs::read_dir(&ovmf)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    shipped.sort();
    assert_eq!(
        shipped,
        [
            "OVMF_CODE_4M.secboot.fd",
            "OVMF_VARS_4M.fd",
            "OVMF_VARS_4M.ms.fd"
        ]
    );
    std::fs::create_dir_all(tree.join("guest")).unwrap();
    std::fs::copy(&images.disk_qcow2, tree.join("guest/disk.qcow2")).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/demo.yaml"),
        tree.join("demo.yaml"),
    )
    .unwrap();
    std::fs::write(tree.join("etc/resolv.conf"), RESOLV_CONF).unwrap();

    let pod = Pod::new();
    let mut c = pod.command("unshare");
    c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(MOUNT_AND_CHROOT)
        .arg("mount-and-chroot")
        .args([
            "/usr/bin/qlauncher",
            "run",
            "/demo.yaml",
            "--root",
            "/r",
            "--emulation",
            "on",
            "--container-disk",
            "rootdisk=/guest/disk.qcow2",
        ])
        .env("T", &tree)
        .env_remove("QLAUNCHER_GUEST_DIR");
    let mut run = Run::spawn(c, &tree.join("r"), &tmp.path().join("run.log"));
    let mut console = run.console();
    assert_eq!(
        console.wait_for_marker("lease eth0 ", STEP).unwrap(),
        "lease eth0 ip=10.0.2.2/24 router=10.0.2.1 dns=10.96.0.10 \
         search=default.svc.cluster.local,svc.cluster.local,cluster.local mtu=1450 \
         hostname=demo domain=default.svc.cluster.local"
    );

    // Every process of the pod runs a program of the tree: the dedicated monitor binary
    // (`qlauncher run` execs it, as the image's PID 1 is), the launcher (`virt-launcher`, a link
    // to qlauncher: its executable is qlauncher's) or QEMU.
    let mut programs: Vec<String> = pod
        .pids()
        .into_iter()
        .filter_map(|p| std::fs::read_link(format!("/proc/{p}/exe")).ok())
        .map(|exe| {
            exe.strip_prefix(&tree)
                .map(|p| format!("/{}", p.display()))
                .unwrap_or_else(|_| exe.display().to_string())
        })
        .collect();
    programs.sort();
    programs.dedup();
    assert_eq!(
        programs,
        [
            "/usr/bin/qemu-system-x86_64",
            "/usr/bin/qlauncher",
            "/usr/bin/virt-launcher-monitor"
        ],
        "qlauncher run:\n{}",
        run.output()
    );
    // The monitor started the launcher by KubeVirt's name, the link in the tree.
    let launchers: Vec<String> = pod
        .pids()
        .into_iter()
        .filter(|p| {
            std::fs::read_link(format!("/proc/{p}/exe"))
                .is_ok_and(|e| e.ends_with("usr/bin/qlauncher"))
        })
        .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok())
        .map(|c| String::from_utf8_lossy(c.split(|b| *b == 0).next().unwrap_or_default()).into())
        .collect();
    assert_eq!(launchers, ["/usr/bin/virt-launcher"]);
    assert_eq!(
        std::fs::read_link(tree.join("usr/bin/virt-launcher")).unwrap(),
        Path::new("qlauncher")
    );

    run.stop(&mut console);
}

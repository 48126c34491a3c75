//! The test guest itself (scripts/build-guest, guest/README.md) under plain
//! `qemu-system-x86_64 -accel tcg`: kernelBoot pair and SeaBIOS disk boot, markers, shell, DHCP
//! lease from QEMU's user network, cidata user-data, disk and NIC hotplug, ACPI power button.

use testkit::guest;

use guest::{marker_fields, GuestImages, Vm};
use std::process::Command;
use std::time::Duration;

const STEP: Duration = Duration::from_secs(120);

/// Standard base64 (RFC 4648, with padding), to compare with the guest's `user-data` marker.
fn base64(data: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[test]
fn kernel_boot_lease_cidata_hotplug_and_power_button() {
    let img = GuestImages::locate();
    let user_data = "#cloud-config\nqlg: kernel-boot test\n";
    let mut vm = Vm::start(|dir| {
        std::fs::write(dir.join("user-data"), user_data).unwrap();
        std::fs::write(dir.join("meta-data"), "instance-id: qlg-test\n").unwrap();
        let iso = dir.join("cidata.iso");
        let st = Command::new("genisoimage")
            .args(["-quiet", "-V", "cidata", "-J", "-r", "-o"])
            .arg(&iso)
            .arg(dir.join("user-data"))
            .arg(dir.join("meta-data"))
            .status()
            .expect("run genisoimage");
        assert!(st.success(), "genisoimage failed");
        let mut a = s(&["-kernel"]);
        a.push(img.vmlinuz.display().to_string());
        a.push("-initrd".into());
        a.push(img.initrd.display().to_string());
        a.extend(s(&[
            "-append",
            "console=ttyS0",
            "-netdev",
            "user,id=n0,hostname=qlgtest,domainname=c.example,dnssearch=a.example,dnssearch=b.example",
            "-device",
            "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56",
            "-device",
            "pcie-root-port,id=rp1,chassis=1",
            "-device",
            "pcie-root-port,id=rp2,chassis=2",
            "-drive",
        ]));
        a.push(format!(
            "file={},if=none,id=ci,format=raw,readonly=on",
            iso.display()
        ));
        a.extend(s(&["-device", "virtio-blk-pci,drive=ci"]));
        a
    });
    vm.wait_booted();
    let c = &mut vm.console;

    let lease = c.wait_for_marker("lease eth0 ", STEP).unwrap();
    assert_eq!(
        lease,
        "lease eth0 ip=10.0.2.15/24 router=10.0.2.2 dns=10.0.2.3 search=a.example,b.example mtu= \
         hostname=qlgtest domain=c.example"
    );
    assert_eq!(
        c.wait_for_marker("nic eth0", STEP).unwrap(),
        "nic eth0 mac=52:54:00:12:34:56"
    );
    let iso_size = std::fs::metadata(vm.dir.path().join("cidata.iso"))
        .unwrap()
        .len();
    let c = &mut vm.console;
    assert_eq!(
        c.wait_for_marker("disk vda", STEP).unwrap(),
        format!("disk vda size={iso_size}")
    );
    assert_eq!(
        c.wait_for_marker("cidata ", STEP).unwrap(),
        "cidata vda type=nocloud label=cidata"
    );
    assert_eq!(
        c.wait_for_marker("user-data ", STEP).unwrap(),
        format!("user-data {}", base64(user_data.as_bytes()))
    );
    c.wait_for_marker("http ready", STEP).unwrap();

    assert_eq!(c.run("echo hello", STEP).unwrap(), (0, "hello".to_string()));
    assert_eq!(c.run("false", STEP).unwrap().0, 1);
    assert_eq!(
        c.run("wget -qO- http://127.0.0.1/", STEP).unwrap(),
        (0, "qlg-http-ok".to_string())
    );
    assert_eq!(c.run("hostname", STEP).unwrap(), (0, "qlgtest".to_string()));
    assert_eq!(
        c.run("cat /etc/resolv.conf", STEP).unwrap(),
        (
            0,
            "search a.example b.example\nnameserver 10.0.2.3".to_string()
        )
    );

    // Disk hotplug: a 1 MiB null block device on a PCIe root port, then unplugged.
    let mut qmp = vm.qmp().unwrap();
    let from = vm.console.position();
    qmp.execute(
        "blockdev-add",
        serde_json::json!({"driver": "null-co", "node-name": "hp0", "size": 1048576}),
    )
    .unwrap();
    qmp.execute(
        "device_add",
        serde_json::json!({"driver": "virtio-blk-pci", "drive": "hp0", "id": "hpdisk", "bus": "rp1"}),
    )
    .unwrap();
    assert_eq!(
        vm.console
            .wait_for_marker_after(from, "disk-added", STEP)
            .unwrap(),
        "disk-added vdb size=1048576"
    );

    // NIC hotplug: a second user network; the guest runs udhcpc on it.
    let from = vm.console.position();
    qmp.execute(
        "netdev_add",
        serde_json::json!({"type": "user", "id": "hpn"}),
    )
    .unwrap();
    qmp.execute(
        "device_add",
        serde_json::json!({"driver": "virtio-net-pci", "netdev": "hpn", "id": "hpnic", "bus": "rp2",
                           "mac": "52:54:00:00:00:42"}),
    )
    .unwrap();
    assert_eq!(
        vm.console
            .wait_for_marker_after(from, "nic-added", STEP)
            .unwrap(),
        "nic-added eth1 mac=52:54:00:00:00:42"
    );
    let lease1 = vm
        .console
        .wait_for_marker_after(from, "lease eth1 ", STEP)
        .unwrap();
    let (_, fields) = marker_fields(&lease1);
    assert_eq!(fields.get("ip").map(String::as_str), Some("10.0.2.15/24"));

    let from = vm.console.position();
    qmp.execute("device_del", serde_json::json!({"id": "hpdisk"}))
        .unwrap();
    assert_eq!(
        vm.console
            .wait_for_marker_after(from, "disk-removed", STEP)
            .unwrap(),
        "disk-removed vdb"
    );

    // ACPI power button.
    qmp.execute("system_powerdown", serde_json::json!({}))
        .unwrap();
    drop(qmp);
    vm.console.wait_for_marker("poweroff", STEP).unwrap();
    let status = vm
        .wait_exit(STEP)
        .expect("QEMU exits after the guest powers off");
    assert!(status.success(), "QEMU exit status {status}");
}

#[test]
fn disk_boot_with_seabios_writes_land_in_the_overlay() {
    let img = GuestImages::locate();
    let base_before = std::fs::read(&img.disk_qcow2).unwrap();
    let disk_size = std::fs::metadata(&img.disk_raw).unwrap().len();
    let mut vm = Vm::start(|dir| {
        let overlay = dir.join("overlay.qcow2");
        let st = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
            .arg(&img.disk_qcow2)
            .arg(&overlay)
            .status()
            .expect("run qemu-img");
        assert!(st.success(), "qemu-img create failed");
        let mut a = s(&["-drive"]);
        a.push(format!(
            "file={},if=none,id=d0,format=qcow2",
            overlay.display()
        ));
        a.extend(s(&["-device", "virtio-blk-pci,drive=d0,bootindex=1"]));
        a
    });
    vm.wait_booted();
    let c = &mut vm.console;
    assert_eq!(
        c.wait_for_marker("disk vda", STEP).unwrap(),
        format!("disk vda size={disk_size}")
    );
    assert_eq!(c.wait_for_marker("cidata", STEP).unwrap(), "cidata none");
    let (rc, cmdline) = c.run("cat /proc/cmdline", STEP).unwrap();
    assert_eq!(rc, 0);
    assert!(
        cmdline.contains("console=ttyS0 qlg.boot=disk"),
        "cmdline {cmdline:?}"
    );
    assert_eq!(
        c.run(
            "printf qlg-overlay-write | dd of=/dev/vda2 conv=fsync 2>/dev/null",
            STEP
        )
        .unwrap(),
        (0, String::new())
    );

    let status = vm.power_off(STEP);
    assert!(status.success(), "QEMU exit status {status}");

    // The write is in the overlay; the base image is unchanged.
    let flat = vm.dir.path().join("flat.raw");
    let st = Command::new("qemu-img")
        .args(["convert", "-O", "raw"])
        .arg(vm.dir.path().join("overlay.qcow2"))
        .arg(&flat)
        .status()
        .unwrap();
    assert!(st.success());
    let data = std::fs::read(&flat).unwrap();
    let off = img.scratch_offset as usize;
    assert_eq!(&data[off..off + 17], b"qlg-overlay-write");
    assert!(
        std::fs::read(&img.disk_qcow2).unwrap() == base_before,
        "base image changed"
    );
}

#[test]
fn disk_boot_with_ovmf() {
    let img = GuestImages::locate();
    let code = std::path::Path::new("/usr/share/OVMF/OVMF_CODE_4M.fd");
    let vars = std::path::Path::new("/usr/share/OVMF/OVMF_VARS_4M.fd");
    assert!(
        code.is_file(),
        "OVMF missing: run scripts/install-deps (package ovmf)"
    );
    let mut vm = Vm::start(|dir| {
        std::fs::copy(vars, dir.join("vars.fd")).unwrap();
        let mut a = s(&["-drive"]);
        a.push(format!(
            "if=pflash,format=raw,readonly=on,file={}",
            code.display()
        ));
        a.push("-drive".into());
        a.push(format!(
            "if=pflash,format=raw,file={}",
            dir.join("vars.fd").display()
        ));
        a.push("-drive".into());
        a.push(format!(
            "file={},if=none,id=d0,format=qcow2,snapshot=on",
            img.disk_qcow2.display()
        ));
        a.extend(s(&["-device", "virtio-blk-pci,drive=d0,bootindex=1"]));
        a
    });
    vm.wait_booted();
    let (rc, cmdline) = vm.console.run("cat /proc/cmdline", STEP).unwrap();
    assert_eq!(rc, 0);
    assert!(
        cmdline.contains("console=ttyS0 qlg.boot=disk-uefi"),
        "cmdline {cmdline:?}"
    );
    assert_eq!(
        vm.console
            .run("test -d /sys/firmware/efi && echo efi", STEP)
            .unwrap(),
        (0, "efi".to_string())
    );
    let status = vm.power_off(STEP);
    assert!(status.success(), "QEMU exit status {status}");
}

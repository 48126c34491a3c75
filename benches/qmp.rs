//! QMP benchmark against a real qemu-system-x86_64 (TCG, q35): launch-to-running time, QMP
//! round-trip time (sequential and 16 concurrent callers), hotplug time per device without a guest,
//! and, when the test guest exists (`scripts/build-guest`, `QLAUNCHER_GUEST_DIR`), PCIe unplug time
//! (device_del to DEVICE_DELETED) with the guest kernel releasing the device.
//! Run with `cargo bench --bench qmp` (needs root for the taps). Prints one line per figure.

use std::path::Path;
use std::time::{Duration, Instant};

use qlauncher::qmp::hotplug::{self, CdromChange, DiskAttach, DiskDetach, NicAttach};
use qlauncher::qmp::tap;
use serde_json::json;
use testkit::guest::GuestImages;
use testkit::qemu_launch::{launch, QemuProcess};
use testkit::qmp::{launch_spec, machine_args, monitor_args};

const ROOT_PORTS: usize = 8;

fn argv() -> Vec<String> {
    let mut a = machine_args();
    for i in 0..ROOT_PORTS {
        let mf = if i % 8 == 0 { ",multifunction=on" } else { "" };
        a.push("-device".into());
        a.push(format!(
            "pcie-root-port,port={:#x},chassis={},id=pci.{},bus=pcie.0,addr={:#x}.{:#x}{mf}",
            0x10 + i,
            i + 1,
            i + 1,
            2 + i / 8,
            i % 8
        ));
    }
    a.extend([
        "-device".into(),
        "virtio-scsi-pci,id=scsi0,bus=pcie.0,addr=0x9".into(),
        "-device".into(),
        "scsi-cd,bus=scsi0.0,scsi-id=0,lun=0,id=ua-cdrom".into(),
    ]);
    a.extend(monitor_args());
    a
}

async fn start(dir: &Path) -> QemuProcess {
    start_with(dir, vec![]).await
}

async fn start_with(dir: &Path, extra: Vec<String>) -> QemuProcess {
    let mut args = argv();
    args.extend(extra);
    let mut spec = launch_spec(args, dir);
    spec.env = vec![];
    spec.timeout = Duration::from_secs(30);
    launch(spec).await.expect("launch")
}

fn stats(name: &str, mut xs: Vec<Duration>) {
    xs.sort();
    let n = xs.len();
    let med = xs[n / 2];
    let p99 = xs[(n * 99 / 100).min(n - 1)];
    let mean = xs.iter().sum::<Duration>() / n as u32;
    println!(
        "{name:<40} n={n:<5} median={:>9.3} ms  mean={:>9.3} ms  p99={:>9.3} ms",
        med.as_secs_f64() * 1e3,
        mean.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
}

fn raw(path: &Path) {
    std::fs::File::create(path)
        .and_then(|f| f.set_len(1 << 20))
        .expect("image");
}

#[tokio::main]
async fn main() {
    let dir = tempfile::Builder::new()
        .prefix(&format!("qmp-bench-{}-", std::process::id()))
        .tempdir()
        .expect("tempdir");

    // Launch to running (spawn, QMP greeting, capabilities, cont), then quit.
    let mut launches = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mut p = start(dir.path()).await;
        launches.push(t.elapsed());
        let _ = p.client().execute("quit", None).await;
        let _ = p.wait().await;
    }
    stats("launch to running (spawn..cont)", launches);

    let mut p = start(dir.path()).await;
    let c = p.client().clone();

    let mut rtt = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        c.execute("query-status", None).await.expect("query-status");
        rtt.push(t.elapsed());
    }
    stats("QMP round trip (query-status)", rtt);

    let t = Instant::now();
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let c = c.clone();
            tokio::spawn(async move {
                for _ in 0..125 {
                    c.execute("query-status", None).await.expect("query-status");
                }
            })
        })
        .collect();
    for call in calls {
        call.await.expect("join");
    }
    let el = t.elapsed();
    println!(
        "{:<40} 2000 calls in {:.1} ms = {:.0} calls/s",
        "QMP 16 concurrent callers",
        el.as_secs_f64() * 1e3,
        2000.0 / el.as_secs_f64()
    );

    // virtio-blk onto free root ports (2 blockdev-add + device_add each).
    let mut blk = Vec::new();
    for i in 1..=ROOT_PORTS / 2 {
        let img = dir.path().join(format!("d{i}.raw"));
        raw(&img);
        let d = DiskAttach {
            blockdevs: vec![
                json!({"driver": "file", "filename": img, "node-name": format!("libvirt-{i}-storage")}),
                json!({"driver": "raw", "file": format!("libvirt-{i}-storage"), "node-name": format!("libvirt-{i}-format")}),
            ],
            device: json!({"driver": "virtio-blk-pci", "bus": format!("pci.{i}"), "addr": "0x0",
                           "drive": format!("libvirt-{i}-format"), "id": format!("ua-d{i}")}),
        };
        let t = Instant::now();
        hotplug::attach_disk(&c, &d).await.expect("attach");
        blk.push(t.elapsed());
    }
    stats("hotplug virtio-blk disk attach", blk);

    // scsi-hd attach and detach (SCSI unplug completes without a guest).
    let (mut att, mut det) = (Vec::new(), Vec::new());
    for i in 0..20u32 {
        let img = dir.path().join(format!("s{i}.raw"));
        raw(&img);
        let n = 100 + i;
        let d = DiskAttach {
            blockdevs: vec![
                json!({"driver": "file", "filename": img, "node-name": format!("libvirt-{n}-storage")}),
                json!({"driver": "raw", "file": format!("libvirt-{n}-storage"), "node-name": format!("libvirt-{n}-format")}),
            ],
            device: json!({"driver": "scsi-hd", "bus": "scsi0.0", "scsi-id": 1, "lun": 1,
                           "drive": format!("libvirt-{n}-format"), "id": format!("ua-s{i}")}),
        };
        let t = Instant::now();
        hotplug::attach_disk(&c, &d).await.expect("attach scsi");
        att.push(t.elapsed());
        let t = Instant::now();
        hotplug::detach_disk(
            &c,
            &DiskDetach {
                device_id: format!("ua-s{i}"),
                node_names: vec![
                    format!("libvirt-{n}-format"),
                    format!("libvirt-{n}-storage"),
                ],
            },
            Duration::from_secs(10),
        )
        .await
        .expect("detach scsi");
        det.push(t.elapsed());
    }
    stats("hotplug scsi-hd disk attach", att);
    stats("unplug scsi-hd disk (to DEVICE_DELETED+del)", det);

    // cdrom change + eject.
    let iso = dir.path().join("cd.iso");
    raw(&iso);
    let mut cd = Vec::new();
    for i in 0..10u32 {
        let n = 200 + i;
        let t = Instant::now();
        hotplug::change_cdrom(
            &c,
            &CdromChange {
                device_id: "ua-cdrom".into(),
                old_node_names: if i == 0 { vec![] } else { vec![format!("libvirt-{}-format", n - 1), format!("libvirt-{}-storage", n - 1)] },
                new_blockdevs: vec![
                    json!({"driver": "file", "filename": iso, "node-name": format!("libvirt-{n}-storage"), "read-only": true}),
                    json!({"driver": "raw", "file": format!("libvirt-{n}-storage"), "node-name": format!("libvirt-{n}-format"), "read-only": true}),
                ],
            },
        )
        .await
        .expect("cdrom change");
        cd.push(t.elapsed());
    }
    stats("cdrom media change", cd);

    // NICs on taps (getfd + netdev_add + device_add).
    let mut nics = Vec::new();
    let mut taps = Vec::new();
    for i in ROOT_PORTS / 2 + 1..=ROOT_PORTS {
        let name = format!("qb{}x{i}", std::process::id() % 100_000);
        let fd = tap::open_tap(&name, true).expect("tap");
        let dup = fd.try_clone().expect("dup");
        taps.push(dup);
        let nic = NicAttach {
            tap_fd: fd,
            fd_name: format!("tapfd{i}"),
            extra_fds: vec![],
            netdev: json!({"type": "tap", "fd": format!("tapfd{i}"), "id": format!("hostua-n{i}")}),
            device: json!({"driver": "virtio-net-pci", "netdev": format!("hostua-n{i}"), "id": format!("ua-n{i}"),
                           "mac": format!("02:00:00:00:01:{i:02x}"), "bus": format!("pci.{i}"), "addr": "0x0"}),
        };
        let t = Instant::now();
        hotplug::attach_nic(&c, &nic).await.expect("attach nic");
        nics.push(t.elapsed());
    }
    stats("hotplug virtio-net NIC attach", nics);

    let _ = c.execute("quit", None).await;
    let _ = p.wait().await;
    drop(taps);

    guest_unplug(dir.path()).await;
}

/// PCIe unplug with a booted guest: attach, wait until the guest reports the device, then time
/// device_del .. DEVICE_DELETED (+ blockdev-del / netdev_del).
async fn guest_unplug(dir: &Path) {
    let guest = match GuestImages::try_locate() {
        Ok(g) => g,
        Err(e) => {
            println!("guest unplug: skipped, {e}");
            return;
        }
    };
    let serial = dir.join("serial.log");
    let mut extra = guest.kernel_boot_args();
    extra.extend([
        "-chardev".into(),
        format!("file,id=charserial0,path={}", serial.display()),
        "-device".into(),
        "isa-serial,chardev=charserial0,id=serial0".into(),
    ]);
    let t = Instant::now();
    let mut p = start_with(dir, extra).await;
    let c = p.client().clone();
    wait_marker(&serial, "QLG: http ready", 1).await;
    println!(
        "{:<40} {:.0} ms",
        "guest boot to 'http ready' (TCG)",
        t.elapsed().as_secs_f64() * 1e3
    );
    let (mut blk, mut net) = (Vec::new(), Vec::new());
    for round in 0..3u32 {
        let img = dir.join(format!("g{round}.raw"));
        raw(&img);
        let n = 300 + round;
        hotplug::attach_disk(&c, &DiskAttach {
            blockdevs: vec![
                json!({"driver": "file", "filename": img, "node-name": format!("libvirt-{n}-storage")}),
                json!({"driver": "raw", "file": format!("libvirt-{n}-storage"), "node-name": format!("libvirt-{n}-format")}),
            ],
            device: json!({"driver": "virtio-blk-pci", "bus": "pci.1", "addr": "0x0",
                           "drive": format!("libvirt-{n}-format"), "id": "ua-g"}),
        }).await.expect("attach");
        wait_marker(&serial, "QLG: disk-added vda size=1048576", round + 1).await;
        let t = Instant::now();
        hotplug::detach_disk(
            &c,
            &DiskDetach {
                device_id: "ua-g".into(),
                node_names: vec![
                    format!("libvirt-{n}-format"),
                    format!("libvirt-{n}-storage"),
                ],
            },
            Duration::from_secs(60),
        )
        .await
        .expect("detach");
        blk.push(t.elapsed());
        wait_marker(&serial, "QLG: disk-removed vda", round + 1).await;

        let name = format!("qg{}x{round}", std::process::id() % 100_000);
        let nic = NicAttach {
            tap_fd: tap::open_tap(&name, true).expect("tap"),
            fd_name: "tapg".into(),
            extra_fds: vec![],
            netdev: json!({"type": "tap", "fd": "tapg", "id": "hostua-g"}),
            device: json!({"driver": "virtio-net-pci", "netdev": "hostua-g", "id": "ua-gn",
                           "mac": "02:00:00:00:02:01", "bus": "pci.2", "addr": "0x0"}),
        };
        hotplug::attach_nic(&c, &nic).await.expect("attach nic");
        wait_marker(
            &serial,
            "QLG: nic-added eth0 mac=02:00:00:00:02:01",
            round + 1,
        )
        .await;
        let t = Instant::now();
        hotplug::detach_nic(
            &c,
            &hotplug::NicDetach {
                device_id: "ua-gn".into(),
                netdev_id: "hostua-g".into(),
            },
            Duration::from_secs(60),
        )
        .await
        .expect("detach nic");
        net.push(t.elapsed());
        wait_marker(&serial, "QLG: nic-removed eth0", round + 1).await;
    }
    stats("unplug virtio-blk with guest", blk);
    stats("unplug virtio-net with guest", net);
    let _ = c.execute("quit", None).await;
    let _ = p.wait().await;
}

/// Waits until `marker` has appeared `count` times on the serial log.
async fn wait_marker(serial: &Path, marker: &str, count: u32) {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let text = std::fs::read_to_string(serial).unwrap_or_default();
        let seen = text
            .lines()
            .filter(|l| l.find("QLG: ").is_some_and(|i| l[i..].trim_end() == marker))
            .count() as u32;
        if seen >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {marker:?} x{count} on the serial port"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

//! End to end through `qlauncher run`, the path a user takes (README, `scripts/demo`): the example
//! VMIs under `examples/` booted in a throwaway pod network namespace, the guest driven through its
//! serial console (`<root>/var/run/kubevirt-private/<uid>/virt-serial0`, the `QLG# ` shell), and a
//! graceful stop by SIGTERM.
//!
//! - containerDisk: guest writes land in the overlay under `--root`, the base image is unchanged,
//!   and a second run in the same `--root` finds them again (the overlay is reused).
//!   The guest also reaches an HTTP server on the node through masquerade: the node sees the pod IP.
//! - emptyDisk (`examples/empty-disk.yaml`): the guest sees a 1 GiB disk.
//! - kernelBoot (`examples/kernel-boot.yaml`): the guest boots from the kernel and initrd given by
//!   `--kernel-boot-dir`, with the VMI's kernel arguments and no disk.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use testkit::guest;
use testkit::storage::{contains_bytes, sha256};

use guest::GuestImages;
use testkit::run::{example, short_tempdir, write_scratch_marker, Pod, Run, STEP};

/// The NoCloud meta-data the guest printed last (decoded).
fn meta_data(run: &mut Run) -> String {
    use base64::Engine as _;
    let marker = run
        .logged_markers()
        .into_iter()
        .rev()
        .find_map(|m| m.strip_prefix("meta-data ").map(str::to_string))
        .unwrap_or_else(|| panic!("no meta-data marker; qlauncher run:\n{}", run.output()));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(marker)
        .unwrap();
    String::from_utf8(bytes).unwrap()
}

/// examples/demo.yaml's meta-data: `qlauncher run` gives the VMI the firmware UUID KubeVirt gives
/// the VMIs of a VM named `demo`.
fn expected_meta_data() -> String {
    let uuid = uuid::Uuid::new_v5(&qlauncher::vmi::defaults::FIRMWARE_UUID_NAMESPACE, b"demo");
    format!(r#"{{"instance-id":"{uuid}","local-hostname":"demo"}}"#)
}

/// A one-shot HTTP server on the node at 10.244.0.1:`port` (a thread that entered the node's
/// network namespace). Returns the address of the peer it served and what it read.
fn node_http_server(
    node: &str,
    port: u16,
) -> std::thread::JoinHandle<(std::net::SocketAddr, String)> {
    let netns = std::fs::File::open(format!("/run/netns/{node}")).unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        use std::io::{Read, Write};
        nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let listener = std::net::TcpListener::bind(("10.244.0.1", port)).unwrap();
        ready_tx.send(()).unwrap();
        let (mut stream, peer) = listener.accept().unwrap();
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).unwrap_or(0);
        stream
            .write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 7\r\n\r\nnode-ok")
            .unwrap();
        (peer, String::from_utf8_lossy(&buf[..n]).into_owned())
    });
    ready_rx.recv().unwrap();
    handle
}

#[test]
fn container_disk_writes_land_in_the_overlay_and_survive_a_second_run() {
    let images = GuestImages::locate();
    let tmp = short_tempdir();
    // The base is the test's own copy, so that nothing else can change it meanwhile.
    let base = tmp.path().join("base.qcow2");
    std::fs::copy(&images.disk_qcow2, &base).unwrap();
    let base_sum = sha256(&base);
    let root = tmp.path().join("r");
    let disk = format!("rootdisk={}", base.display());
    let vmi = example("demo.yaml");
    let mark = format!("qle-mark-{}", testkit::unique());

    let pod = Pod::new();
    let mut run = Run::start(&pod, &vmi, &root, &["--container-disk", &disk]);
    let mut console = run.console();
    // The scratch partition vda2 is raw bytes on the root disk (guest/README.md).
    write_scratch_marker(&mut console, &mark);
    assert_eq!(meta_data(&mut run), expected_meta_data());
    // Guest to node through masquerade: the node sees the pod's address, not the guest's.
    let server = node_http_server(&pod.net.node.name, 8080);
    let (rc, out) = console
        .run(
            "for i in $(seq 1 60); do wget -q -O - http://10.244.0.1:8080/from-guest \
             && break; sleep 1; done; echo",
            STEP,
        )
        .unwrap();
    assert_eq!((rc, out.trim()), (0, "node-ok"));
    let (peer, request) = server.join().unwrap();
    assert_eq!(peer.ip().to_string(), "10.244.0.5");
    assert!(request.starts_with("GET /from-guest HTTP/1."), "{request}");
    run.stop(&mut console);
    drop(run);

    let overlay = root.join("var/run/kubevirt-ephemeral-disks/disk-data/rootdisk/disk.qcow2");
    let bytes = std::fs::read(&overlay).unwrap();
    assert!(
        contains_bytes(&bytes, mark.as_bytes()),
        "{} lacks the guest's write",
        overlay.display()
    );
    assert_eq!(sha256(&base), base_sum, "the base image changed");
    let overlay_inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&overlay).unwrap());

    // Second run, same --root: the same overlay, the write still there.
    let mut run = Run::start(&pod, &vmi, &root, &["--container-disk", &disk]);
    let mut console = run.console();
    let (rc, out) = console
        .run(
            &format!(
                "dd if=/dev/vda2 bs={} count=1 2>/dev/null; echo",
                mark.len()
            ),
            STEP,
        )
        .unwrap();
    assert_eq!((rc, out), (0, mark.clone()));
    // The same machine to cloud-init: the same NoCloud instance-id (the firmware UUID).
    assert_eq!(meta_data(&mut run), expected_meta_data());
    run.stop(&mut console);
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&overlay).unwrap()),
        overlay_inode,
        "the second run replaced the overlay"
    );
    assert_eq!(sha256(&base), base_sum, "the base image changed");
}

#[test]
fn empty_disk_example_gives_the_guest_a_1gib_disk() {
    let tmp = short_tempdir();
    let root = tmp.path().join("r");
    let pod = Pod::new();
    let mut run = Run::start_example(&pod, "empty-disk.yaml", &root);
    let mut console = run.console();
    assert_eq!(
        console.wait_for_marker("disk vdb ", STEP).unwrap(),
        "disk vdb size=1073741824"
    );
    // Empty to the guest (a fresh sparse image, no partition table).
    let (rc, out) = console
        .run(
            "dd if=/dev/vdb bs=4096 count=1 2>/dev/null | tr -d '\\000' | wc -c",
            STEP,
        )
        .unwrap();
    assert_eq!((rc, out.trim().to_string()), (0, "0".to_string()));
    run.stop(&mut console);
}

#[test]
fn kernel_boot_example_boots_the_given_kernel_with_its_arguments() {
    let images = GuestImages::locate();
    let tmp = short_tempdir();
    let root = tmp.path().join("r");
    let dir = images.dir.display().to_string();
    let pod = Pod::new();
    let mut run = Run::start(
        &pod,
        &example("kernel-boot.yaml"),
        &root,
        &["--kernel-boot-dir", &dir],
    );
    let mut console = run.console();
    let (rc, cmdline) = console.run("cat /proc/cmdline", STEP).unwrap();
    assert_eq!(
        (rc, cmdline.trim_end().to_string()),
        (0, "console=ttyS0".into())
    );
    // No disk at all: the kernel and initrd came through QEMU's -kernel/-initrd.
    let (rc, disks) = console
        .run("ls /sys/block | grep -v '^loop' || true", STEP)
        .unwrap();
    assert_eq!((rc, disks), (0, String::new()));
    let lease = console.wait_for_marker("lease eth0 ", STEP).unwrap();
    assert!(
        lease.starts_with("lease eth0 ip=10.0.2.2/24 router=10.0.2.1 "),
        "{lease}"
    );
    run.stop(&mut console);
}

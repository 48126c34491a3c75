//! Fault injection without the orchestrator: a QEMU that stops answering QMP (SIGSTOP), a base
//! image that vanishes between probing and overlay creation, and a DHCP flood from the guest side.
//! Disk-full during overlay/ISO creation is covered by `tests/storage_interrupted.rs`; 100
//! concurrent gRPC calls by `tests/sync_cmd_server.rs`.

use std::net::{Ipv4Addr, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dhcproto::v4::MessageType;
use qlauncher::net::dhcp::v4::{client_message, serve, DhcpV4Config, DhcpV4Server};
use qlauncher::net::dhcp::DhcpStats;
use qlauncher::net::DhcpExtraOptions;
use qlauncher::qmp::client::QmpClient;
use qlauncher::qmp::QmpError;
use qlauncher::storage::{create_overlay, probe_image, ChainPolicy, OverlaySpec, StorageError};
use testkit::qmp::{q35_args, TestVm};

/// A QEMU frozen with SIGSTOP: every command times out after its own timeout (also several
/// at once), nothing deadlocks, and after SIGCONT the same client works again. The QMP
/// socket is not world-writable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qmp_on_a_stopped_qemu_times_out_and_recovers() {
    let vm = TestVm::launch(q35_args())
        .await
        .map_err(|(e, _)| e)
        .expect("QEMU starts");
    let mode = std::fs::metadata(vm.path("monitor.sock"))
        .expect("socket")
        .permissions()
        .mode();
    assert_eq!(mode & 0o002, 0, "QMP socket is world-writable: {mode:o}");
    let client: &QmpClient = vm.client();
    client
        .execute("query-status", None)
        .await
        .expect("answers before SIGSTOP");

    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(vm.pid, libc::SIGSTOP) }, 0);
    let started = Instant::now();
    let calls =
        (0..5).map(|_| client.execute_timeout("query-status", None, Duration::from_millis(500)));
    let results = futures_util::future::join_all(calls).await;
    let elapsed = started.elapsed();
    for r in &results {
        assert!(matches!(r, Err(QmpError::Timeout { .. })), "{r:?}");
    }
    assert!(
        elapsed < Duration::from_secs(5),
        "five parallel 500 ms timeouts took {elapsed:?}"
    );

    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(vm.pid, libc::SIGCONT) }, 0);
    let status = client
        .execute_timeout("query-status", None, Duration::from_secs(10))
        .await
        .expect("answers after SIGCONT");
    assert_eq!(status["status"], "running", "{status}");
}

/// The base image is probed, then deleted before the overlay is created: creation fails with
/// the missing-base error naming the volume, and no overlay (or temporary) file is left.
#[test]
fn base_image_vanishing_before_overlay_creation_leaves_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join("base.raw");
    std::fs::write(&base, vec![0u8; 1 << 20]).expect("base");
    let policy = ChainPolicy {
        allowed_roots: vec![dir.path().to_path_buf()],
        ..ChainPolicy::default()
    };
    probe_image("vol", &base, &policy).expect("facts of the base");
    std::fs::remove_file(&base).expect("base vanishes");
    let eph = dir.path().join("eph");
    let mut spec = OverlaySpec::at_kubevirt_path("vol", &base, &eph);
    spec.policy = policy;
    let err = create_overlay(&spec).expect_err("no overlay over a vanished base");
    assert!(matches!(err, StorageError::MissingBase { .. }), "{err:?}");
    assert!(err.to_string().starts_with("volume vol:"), "{err}");
    assert!(!spec.overlay.exists());
    let leftovers: Vec<_> = std::fs::read_dir(spec.overlay.parent().expect("parent"))
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

fn flood_config() -> DhcpV4Config {
    DhcpV4Config {
        iface: "lo".into(),
        server_ip: Ipv4Addr::new(10, 0, 2, 1),
        client_ip: Ipv4Addr::new(10, 0, 2, 2),
        prefix_len: 24,
        router: Some(Ipv4Addr::new(10, 0, 2, 1)),
        dns: vec![],
        search: vec![],
        domain_name: None,
        hostname: "vm".into(),
        mtu: 1500,
        routes: vec![],
        lease_seconds: 3600,
        client_mac: None,
        extra: DhcpExtraOptions::default(),
    }
}

/// 20,000 datagrams from the guest side (garbage, DISCOVERs from random MACs, DECLINEs) at the
/// serving loop: every one is received and classified (garbage malformed, every DISCOVER
/// answered with an OFFER, DECLINEs ignored), and the loop is still serving at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dhcp_flood_is_counted_and_serving_continues() {
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let addr = sock.local_addr().expect("addr");
    // `serve` expects a socket from `dhcp::v4::bind`, which is non-blocking.
    sock.set_nonblocking(true).expect("nonblocking");
    let server = Arc::new(DhcpV4Server::new(flood_config()).expect("server"));
    let stats = Arc::new(DhcpStats::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve(sock, server.clone(), stats.clone(), async {
        let _ = stop_rx.await;
    }));
    let sender = UdpSocket::bind("127.0.0.1:0").expect("sender");
    let (mut garbage, mut discovers, mut declines) = (0u64, 0u64, 0u64);
    let total = 20_000u64;
    for i in 0..total {
        let pkt = match i % 3 {
            0 => {
                garbage += 1;
                vec![(i % 251) as u8; (i % 300) as usize]
            }
            1 => {
                discovers += 1;
                let mac = [2, 0, (i >> 16) as u8, (i >> 8) as u8, i as u8, 1];
                client_message(MessageType::Discover, mac, i as u32, None, None, &[1, 3, 6])
            }
            _ => {
                declines += 1;
                client_message(
                    MessageType::Decline,
                    [2, 0, 0, 0, 0, 2],
                    i as u32,
                    Some(Ipv4Addr::new(10, 0, 2, 2)),
                    Some(Ipv4Addr::new(10, 0, 2, 1)),
                    &[],
                )
            }
        };
        sender.send_to(&pkt, addr).expect("send");
        // Pace in bursts so the loopback receive buffer never drops (a drop would be the
        // kernel's, not the server's): wait until the server caught up.
        if i % 50 == 49 {
            wait_for(|| stats.snapshot().received == i + 1, &stats).await;
        }
    }
    wait_for(|| stats.snapshot().received == total, &stats).await;
    let s = stats.snapshot();
    assert_eq!(s.received, total);
    assert_eq!(s.malformed, garbage, "{s:?}");
    assert_eq!(s.replied, discovers, "{s:?}");
    assert_eq!(s.ignored, declines, "{s:?}");
    assert!(!task.is_finished(), "the serving loop stopped");
    let _ = stop_tx.send(());
    task.await
        .expect("join")
        .expect("serve returns Ok on shutdown");
}

async fn wait_for(mut cond: impl FnMut() -> bool, stats: &DhcpStats) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the DHCP server: {:?}",
            stats.snapshot()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Deletes the tap link on drop (if still there).
struct TapGuard(String);
impl Drop for TapGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.0])
            .output();
    }
}

/// The tap behind a running QEMU's NIC is deleted: QEMU keeps running and answering QMP, the
/// NIC is still there (`query-rx-filter`), and link state changes on it still apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tap_deleted_under_a_running_qemu_keeps_it_running() {
    let tap = testkit::qmp::unique("hqt");
    let guard = TapGuard(tap.clone());
    let mut args = q35_args();
    args.extend([
        "-netdev".to_string(),
        format!("tap,id=hostnet0,ifname={tap},script=no,downscript=no"),
        "-device".to_string(),
        "virtio-net-pci,netdev=hostnet0,id=ua-net0,bus=pci.1".to_string(),
    ]);
    let vm = TestVm::launch(args)
        .await
        .map_err(|(e, _)| e)
        .expect("QEMU starts");
    let client = vm.client();
    client.execute("cont", None).await.expect("cont");
    assert!(std::path::Path::new(&format!("/sys/class/net/{tap}")).exists());
    testkit::run(&["ip", "link", "del", &tap]);
    assert!(!std::path::Path::new(&format!("/sys/class/net/{tap}")).exists());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let status = client
        .execute("query-status", None)
        .await
        .expect("QMP answers");
    assert_eq!(status["status"], "running", "{status}");
    let rx = client
        .execute(
            "query-rx-filter",
            Some(serde_json::json!({"name": "ua-net0"})),
        )
        .await
        .expect("NIC still present");
    assert_eq!(rx[0]["name"], "ua-net0", "{rx}");
    client
        .execute(
            "set_link",
            Some(serde_json::json!({"name": "ua-net0", "up": false})),
        )
        .await
        .expect("link down");
    client
        .execute(
            "set_link",
            Some(serde_json::json!({"name": "ua-net0", "up": true})),
        )
        .await
        .expect("link up");
    drop(vm);
    drop(guard);
}

//! The pull backup's Export tunnel (`qlauncher::sync::backup::tunnel`) against a real
//! `qemu-nbd` serving a qcow2 with a dirty bitmap, and a stand-in for virt-exportserver: a
//! TLS (client certificates required, ALPN h2) HTTP/2 server that accepts the launcher's
//! `CONNECT` and then calls `kubevirt.nbd.NBD` Map and Read as the gRPC client over the
//! tunnelled stream, as KubeVirt v1.9.0's `virt-exportserver` does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use qlauncher::sync::backup::tunnel::{proto, TunnelOptions, TunnelSlot};
use testkit::export_server::{export_server, make_pki, map, read_all, Pki, Session};
use tokio::sync::mpsc;

const MIB: u64 = 1024 * 1024;
const SIZE: u64 = 4 * MIB;
const SERVER_NAME: &str = "virt-export-backup.default.svc";

/// A qcow2 of [`SIZE`] bytes: 0xaa at [0, 64 KiB) before the bitmap `bm0` was added, 0xbb at
/// [2 MiB, 2 MiB + 128 KiB) after (dirty), the rest unallocated; served read-only by qemu-nbd
/// as export `disk` with `bm0`. Returns (image raw bytes, socket, qemu-nbd).
fn qemu_nbd(dir: &Path) -> (Vec<u8>, PathBuf, Child) {
    let img = dir.join("disk.qcow2");
    let run = |args: &[&str]| {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    };
    let img_s = img.to_str().unwrap();
    run(&[
        "qemu-img",
        "create",
        "-q",
        "-f",
        "qcow2",
        img_s,
        &SIZE.to_string(),
    ]);
    run(&["qemu-io", "-c", "write -P 0xaa 0 64k", img_s]);
    run(&["qemu-img", "bitmap", "--add", img_s, "bm0"]);
    run(&["qemu-io", "-c", "write -P 0xbb 2M 128k", img_s]);
    let raw = dir.join("disk.raw");
    run(&[
        "qemu-img",
        "convert",
        "-O",
        "raw",
        img_s,
        raw.to_str().unwrap(),
    ]);
    let bytes = std::fs::read(&raw).unwrap();
    let socket = dir.join("backup-nbd-sock");
    let child = Command::new("qemu-nbd")
        .args([
            "-k",
            socket.to_str().unwrap(),
            "-f",
            "qcow2",
            "-x",
            "disk",
            "-B",
            "bm0",
            "-r",
            "-t",
        ])
        .arg(&img)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..500 {
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (bytes, socket, child)
}

fn options(addr: &str, server_name: &str, client: &Pki, ca_pem: &str) -> TunnelOptions {
    TunnelOptions {
        export_server_addr: addr.to_string(),
        export_server_name: server_name.to_string(),
        ca_cert: ca_pem.to_string(),
        backup_cert: client.client_cert.clone(),
        backup_key: client.client_key.clone(),
        backup_name: "backup1".into(),
        backup_start_time: "2026-12-04T01:00:00Z".into(),
    }
}

async fn next(rx: &mut mpsc::Receiver<Session>) -> Session {
    tokio::time::timeout(Duration::from_secs(60), rx.recv())
        .await
        .expect("the tunnel never reached the export server")
        .unwrap()
}

async fn expect_tls_failure(rx: &mut mpsc::Receiver<Session>) {
    match next(rx).await {
        Session::TlsFailed(e) => eprintln!("TLS refused as expected: {e}"),
        Session::Connected(..) => panic!("the tunnel connected with bad TLS material"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_tunnel_serves_map_and_read_and_reconnects() {
    let dir = tempfile::tempdir().unwrap();
    let (image, socket, mut nbd) = qemu_nbd(dir.path());
    let pki = make_pki(SERVER_NAME);
    let (addr, mut sessions) = export_server(&pki).await;
    let slot = TunnelSlot::default();
    let opts = options(&addr, SERVER_NAME, &pki, &pki.ca_pem);
    slot.export(opts.clone(), &socket, vec!["disk".into()])
        .unwrap();
    // A repeated Export of the same backup is a no-op: still one tunnel.
    slot.export(opts.clone(), &socket, vec!["disk".into()])
        .unwrap();

    let Session::Connected(authority, mut client, server) = next(&mut sessions).await else {
        panic!("TLS failed with the right CA and name");
    };
    assert_eq!(authority, addr);
    assert_eq!(
        read_all(&mut client, "disk").await,
        image,
        "the image read over the tunnel"
    );

    let k = 64 * 1024;
    let alloc = map(&mut client, "disk", "").await;
    assert_eq!(
        alloc,
        vec![
            (0, k, 0, "data".into()),
            (k, 2 * MIB - k, 3, "hole,zero".into()),
            (2 * MIB, 2 * k, 0, "data".into()),
            (2 * MIB + 2 * k, 2 * MIB - 2 * k, 3, "hole,zero".into()),
        ]
    );
    let dirty = map(&mut client, "disk", "bm0").await;
    assert_eq!(
        dirty,
        vec![
            (0, k, 0, "clean".into()),
            (k, 2 * MIB - k, 2, "zero".into()),
            (2 * MIB, 2 * k, 1, "dirty".into()),
            (2 * MIB + 2 * k, 2 * MIB - 2 * k, 2, "zero".into()),
        ]
    );
    // An unknown export is refused.
    let err = client
        .read(proto::ReadRequest {
            export_name: "other".into(),
            offset: 0,
            length: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);

    // The export server goes away: the launcher reconnects (backoff 1 s) and serves again.
    drop(client);
    server.abort();
    let Session::Connected(_, mut client, _server) = next(&mut sessions).await else {
        panic!("reconnect failed TLS");
    };
    assert_eq!(
        read_all(&mut client, "disk").await,
        image,
        "after the reconnect"
    );

    // The NBD socket goes away: the tunnel ends by itself.
    let _ = nbd.kill();
    let _ = nbd.wait();
    let _ = std::fs::remove_file(&socket);
    for _ in 0..300 {
        if !slot.running() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !slot.running(),
        "the tunnel ends when the NBD socket is removed"
    );

    // A stopped tunnel ends.
    let mut handle =
        qlauncher::sync::backup::tunnel::start_tunnel(opts, dir.path(), vec![]).unwrap();
    assert!(handle.is_match("backup1", "2026-12-04T01:00:00.000Z"));
    assert!(!handle.is_match("backup1", "2026-12-04T01:00:01Z"));
    handle.stop();
    tokio::time::timeout(Duration::from_secs(30), handle.finished())
        .await
        .expect("a stopped tunnel ends");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_tunnel_refuses_a_wrong_ca_or_server_name() {
    let dir = tempfile::tempdir().unwrap();
    let (_, socket, mut nbd) = qemu_nbd(dir.path());
    let pki = make_pki(SERVER_NAME);
    let other = make_pki(SERVER_NAME);
    let (addr, mut sessions) = export_server(&pki).await;

    // The launcher trusts another CA: it refuses the export server's certificate.
    let slot = TunnelSlot::default();
    slot.export(
        options(&addr, SERVER_NAME, &pki, &other.ca_pem),
        &socket,
        vec![],
    )
    .unwrap();
    expect_tls_failure(&mut sessions).await;
    slot.stop();

    // The right CA, but SNI/name not the certificate's.
    let slot = TunnelSlot::default();
    slot.export(
        options(&addr, "wrong.example", &pki, &pki.ca_pem),
        &socket,
        vec![],
    )
    .unwrap();
    expect_tls_failure(&mut sessions).await;
    slot.stop();

    // A client certificate of another CA: the export server refuses the launcher.
    let slot = TunnelSlot::default();
    let mut o = options(&addr, SERVER_NAME, &other, &pki.ca_pem);
    o.backup_name = "backup2".into();
    slot.export(o, &socket, vec![]).unwrap();
    expect_tls_failure(&mut sessions).await;
    slot.stop();

    // No socket: KubeVirt's error, with Go's `os.Stat` text.
    let absent = dir.path().join("absent");
    let err = TunnelSlot::default()
        .export(
            options(&addr, SERVER_NAME, &pki, &pki.ca_pem),
            &absent,
            vec![],
        )
        .unwrap_err();
    assert_eq!(
        err,
        format!(
            "cannot initialize backup tunnel: stat {}: no such file or directory",
            absent.display()
        )
    );
    let _ = nbd.kill();
    let _ = nbd.wait();
}

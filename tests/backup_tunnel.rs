//! The pull backup's Export tunnel (`qlauncher::sync::backup::tunnel`) against a real
//! `qemu-nbd` serving a qcow2 with a dirty bitmap, and a stand-in for virt-exportserver: a
//! TLS (client certificates required, ALPN h2) HTTP/2 server that accepts the launcher's
//! `CONNECT` and then calls `kubevirt.nbd.NBD` Map and Read as the gRPC client over the
//! tunnelled stream, as KubeVirt v1.9.0's `virt-exportserver` does.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use qlauncher::sync::backup::tunnel::{proto, H2Stream, TunnelOptions, TunnelSlot};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const MIB: u64 = 1024 * 1024;
const SIZE: u64 = 4 * MIB;
const SERVER_NAME: &str = "virt-export-backup.default.svc";

struct Pki {
    ca_pem: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

fn make_pki(server_name: &str) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "export-ca");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let server_key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec![server_name.to_string()])
        .unwrap()
        .signed_by(&server_key, &ca_cert, &ca_key)
        .unwrap();
    let client_key = KeyPair::generate().unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(DnType::CommonName, "kubevirt.io:system:client:backup-uid");
    let client = client.signed_by(&client_key, &ca_cert, &ca_key).unwrap();
    Pki {
        ca_pem: ca_cert.pem(),
        server_cert: server.pem(),
        server_key: server_key.serialize_pem(),
        client_cert: client.pem(),
        client_key: client_key.serialize_pem(),
    }
}

/// What the stand-in saw of one TLS connection.
enum Session {
    /// The launcher's CONNECT, its `:authority`, and the gRPC client over the stream.
    /// Aborting the handle drops the HTTP/2 connection (the export server goes away).
    Connected(
        String,
        proto::nbd_client::NbdClient<tonic::transport::Channel>,
        tokio::task::AbortHandle,
    ),
    /// The TLS handshake failed.
    TlsFailed(String),
}

/// The export-server stand-in: each accepted TLS connection's outcome on the channel.
async fn export_server(pki: &Pki) -> (String, mpsc::Receiver<Session>) {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(pki.ca_pem.as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(pki.server_cert.as_bytes()).unwrap()],
            PrivateKeyDer::from_pem_slice(pki.server_key.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(e) => {
                    let _ = tx.send(Session::TlsFailed(e.to_string())).await;
                    continue;
                }
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut conn = h2::server::handshake(tls).await.unwrap();
                let Some(Ok((request, mut respond))) = conn.accept().await else {
                    return;
                };
                assert_eq!(request.method(), http::Method::CONNECT);
                let authority = request.uri().authority().unwrap().to_string();
                let send = respond
                    .send_response(http::Response::new(()), false)
                    .unwrap();
                let stream = H2Stream::new(send, request.into_body());
                // Keep the HTTP/2 connection running (and refuse any second stream).
                let driver = tokio::spawn(async move {
                    while let Some(Ok((_, mut r))) = conn.accept().await {
                        r.send_reset(h2::Reason::REFUSED_STREAM);
                    }
                });
                let mut once = Some(stream);
                let channel = tonic::transport::Endpoint::from_static("http://backup")
                    .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                        let s = once.take();
                        async move {
                            s.map(TokioIo::new).ok_or_else(|| {
                                std::io::Error::other("tunnel connection is single-use")
                            })
                        }
                    }))
                    .await
                    .unwrap();
                let client = proto::nbd_client::NbdClient::new(channel);
                let abort = driver.abort_handle();
                let _ = tx.send(Session::Connected(authority, client, abort)).await;
                let _ = driver.await;
            });
        }
    });
    (addr, rx)
}

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

async fn read_all(client: &mut proto::nbd_client::NbdClient<tonic::transport::Channel>) -> Vec<u8> {
    let mut stream = client
        .read(proto::ReadRequest {
            export_name: "disk".into(),
            offset: 0,
            length: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        assert_eq!(chunk.offset, data.len() as u64);
        assert!(chunk.data.len() as u64 <= 256 * 1024);
        data.extend_from_slice(&chunk.data);
    }
    data
}

async fn map(
    client: &mut proto::nbd_client::NbdClient<tonic::transport::Channel>,
    bitmap: &str,
) -> Vec<(u64, u64, u64, String)> {
    let mut stream = client
        .map(proto::MapRequest {
            export_name: "disk".into(),
            bitmap_name: bitmap.into(),
            offset: 0,
            length: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(batch) = stream.message().await.unwrap() {
        let last = batch.extents.last().unwrap();
        assert_eq!(batch.next_offset, last.offset + last.length);
        out.extend(
            batch
                .extents
                .into_iter()
                .map(|e| (e.offset, e.length, e.flags, e.description)),
        );
    }
    out
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
        read_all(&mut client).await,
        image,
        "the image read over the tunnel"
    );

    let k = 64 * 1024;
    let alloc = map(&mut client, "").await;
    assert_eq!(
        alloc,
        vec![
            (0, k, 0, "data".into()),
            (k, 2 * MIB - k, 3, "hole,zero".into()),
            (2 * MIB, 2 * k, 0, "data".into()),
            (2 * MIB + 2 * k, 2 * MIB - 2 * k, 3, "hole,zero".into()),
        ]
    );
    let dirty = map(&mut client, "bm0").await;
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
    assert_eq!(read_all(&mut client).await, image, "after the reconnect");

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

    // No socket: KubeVirt's error.
    let err = TunnelSlot::default()
        .export(
            options(&addr, SERVER_NAME, &pki, &pki.ca_pem),
            &dir.path().join("absent"),
            vec![],
        )
        .unwrap_err();
    assert!(
        err.starts_with("cannot initialize backup tunnel: "),
        "{err}"
    );
    let _ = nbd.kill();
    let _ = nbd.wait();
}

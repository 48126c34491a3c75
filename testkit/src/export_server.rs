//! A stand-in for KubeVirt v1.9.0's `virt-exportserver` on the backup side: a TLS server
//! (client certificates of one CA required, ALPN h2) that accepts the launcher's HTTP/2
//! `CONNECT` and then is the `kubevirt.nbd.NBD` gRPC client over the tunnelled stream, as the
//! export server reads a pull backup. [`make_pki`] makes the CA, the server's and the
//! launcher's (`backupCert`) certificates with rcgen.

use std::sync::Arc;

use hyper_util::rt::TokioIo;
use qlauncher::sync::backup::tunnel::{proto, H2Stream};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// The gRPC client of one tunnel.
pub type NbdClient = proto::nbd_client::NbdClient<tonic::transport::Channel>;

/// One CA with a server certificate for a name and a client certificate (all PEM).
pub struct Pki {
    /// The CA certificate (KubeVirt's `caCert`).
    pub ca_pem: String,
    /// The export server's certificate for the name given to [`make_pki`].
    pub server_cert: String,
    /// Its key.
    pub server_key: String,
    /// The launcher's client certificate (`backupCert`).
    pub client_cert: String,
    /// Its key (`backupKey`).
    pub client_key: String,
}

/// A fresh CA, a server certificate for `server_name` and a client certificate, all signed by it.
pub fn make_pki(server_name: &str) -> Pki {
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
pub enum Session {
    /// The launcher's CONNECT, its `:authority`, and the gRPC client over the stream.
    /// Aborting the handle drops the HTTP/2 connection (the export server goes away).
    Connected(String, NbdClient, tokio::task::AbortHandle),
    /// The TLS handshake failed (the error's text).
    TlsFailed(String),
}

/// Starts the stand-in on `127.0.0.1:<free port>` with `pki`'s server certificate, trusting
/// client certificates of `pki`'s CA. Returns its address (`exportServerAddr`) and each
/// accepted TLS connection's outcome, in order. Runs on the current tokio runtime until it ends.
pub async fn export_server(pki: &Pki) -> (String, mpsc::Receiver<Session>) {
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

/// The whole export `export` read with `Read` (offset 0, length 0: to its end), checking that
/// the chunks come in order and none is over KubeVirt's 256 KiB.
pub async fn read_all(client: &mut NbdClient, export: &str) -> Vec<u8> {
    let mut stream = client
        .read(proto::ReadRequest {
            export_name: export.into(),
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

/// `Map` of export `export` (with the dirty bitmap `bitmap`, or `""` for allocation only), as
/// `(offset, length, flags, description)` extents; checks each batch's `next_offset`.
pub async fn map(
    client: &mut NbdClient,
    export: &str,
    bitmap: &str,
) -> Vec<(u64, u64, u64, String)> {
    let mut stream = client
        .map(proto::MapRequest {
            export_name: export.into(),
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

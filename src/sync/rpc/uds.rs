//! gRPC over Unix domain sockets, as KubeVirt's `pkg/util/net/grpc` does it: plaintext HTTP/2 with
//! authority `localhost` and a blocking dial (the connection exists when `connect` returns).

use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tonic::transport::{Channel, Endpoint, Uri};

/// Connects a gRPC channel to the Unix socket at `path`, waiting at most `connect_timeout` for the
/// connection (KubeVirt's `DialSocketWithTimeout` waits 2 s).
///
/// # Errors
/// The transport error when the socket is missing, refuses the connection, or the timeout runs out.
pub async fn connect(
    path: &Path,
    connect_timeout: Duration,
) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_owned();
    Endpoint::from_static("http://localhost")
        .connect_timeout(connect_timeout)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        }))
        .await
}

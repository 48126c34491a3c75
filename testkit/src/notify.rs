//! virt-handler's side of the notify API for tests: a gRPC server on a unix socket (KubeVirt's
//! `domain-notify-pipe.sock`) that answers NotifyInfo with version 1 and records every
//! DomainEvent as `(event type, domain)`, as virt-handler receives them.

use std::path::Path;
use std::sync::{Arc, Mutex};

use qlauncher::sync::domain::Domain;
use qlauncher::sync::proto::notify::info as notify_info;
use qlauncher::sync::proto::notify::v1 as notify;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// What the notify server received: (event type, domain), in arrival order.
pub type Received = Arc<Mutex<Vec<(String, Domain)>>>;

#[derive(Clone)]
struct Handler(Received);

#[tonic::async_trait]
impl notify::notify_server::Notify for Handler {
    async fn handle_domain_event(
        &self,
        request: Request<notify::DomainEventRequest>,
    ) -> Result<Response<notify::Response>, Status> {
        let request = request.into_inner();
        let domain: Domain = serde_json::from_slice(&request.domain_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.0.lock().unwrap().push((request.event_type, domain));
        Ok(Response::new(notify::Response {
            success: true,
            message: String::new(),
        }))
    }

    async fn handle_k8s_event(
        &self,
        _request: Request<notify::K8sEventRequest>,
    ) -> Result<Response<notify::Response>, Status> {
        Ok(Response::new(notify::Response {
            success: true,
            message: String::new(),
        }))
    }
}

struct Info;

#[tonic::async_trait]
impl notify_info::notify_info_server::NotifyInfo for Info {
    async fn info(
        &self,
        _request: Request<notify_info::NotifyInfoRequest>,
    ) -> Result<Response<notify_info::NotifyInfoResponse>, Status> {
        Ok(Response::new(notify_info::NotifyInfoResponse {
            supported_notify_versions: vec![1],
        }))
    }
}

/// Serves the notify API on `path` (bound now, served on the current tokio runtime) into
/// `received`, until the returned sender is sent to or dropped.
pub fn start_into(path: &Path, received: Received) -> tokio::sync::oneshot::Sender<()> {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(notify_info::notify_info_server::NotifyInfoServer::new(Info))
            .add_service(notify::notify_server::NotifyServer::new(Handler(received)))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = stopped.await;
            }),
    );
    stop
}

/// [`start_into`] a fresh [`Received`]; returns it and the stop sender (keep it alive).
pub fn start(path: &Path) -> (Received, tokio::sync::oneshot::Sender<()>) {
    let received = Received::default();
    let stop = start_into(path, received.clone());
    (received, stop)
}

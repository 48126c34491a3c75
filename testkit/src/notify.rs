//! virt-handler's side of the notify API for tests: a gRPC server on a unix socket (KubeVirt's
//! `domain-notify-pipe.sock`, `pkg/virt-handler/notify-server`) that answers NotifyInfo with the
//! notify versions it supports (1 by default) and records every DomainEvent as
//! `(event type, domain)` and every K8sEvent as JSON, as virt-handler receives them.

use std::path::Path;
use std::sync::{Arc, Mutex};

use qlauncher::sync::domain::ApiDomain;
use qlauncher::sync::rpc::proto::notify::info as notify_info;
use qlauncher::sync::rpc::proto::notify::v1 as notify;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// What the notify server received: (event type, domain), in arrival order.
pub type Received = Arc<Mutex<Vec<(String, ApiDomain)>>>;

/// The Kubernetes events the notify server received (their JSON), in arrival order.
pub type K8sEvents = Arc<Mutex<Vec<serde_json::Value>>>;

#[derive(Clone)]
struct Handler {
    received: Received,
    k8s_events: K8sEvents,
    reject_with: Option<String>,
}

fn answer(reject_with: &Option<String>) -> notify::Response {
    match reject_with {
        None => notify::Response {
            success: true,
            message: String::new(),
        },
        Some(message) => notify::Response {
            success: false,
            message: message.clone(),
        },
    }
}

#[tonic::async_trait]
impl notify::notify_server::Notify for Handler {
    async fn handle_domain_event(
        &self,
        request: Request<notify::DomainEventRequest>,
    ) -> Result<Response<notify::Response>, Status> {
        let request = request.into_inner();
        let domain: ApiDomain = serde_json::from_slice(&request.domain_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.received
            .lock()
            .unwrap()
            .push((request.event_type, domain));
        Ok(Response::new(answer(&self.reject_with)))
    }

    async fn handle_k8s_event(
        &self,
        request: Request<notify::K8sEventRequest>,
    ) -> Result<Response<notify::Response>, Status> {
        let event = serde_json::from_slice(&request.into_inner().event_json)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.k8s_events.lock().unwrap().push(event);
        Ok(Response::new(answer(&None)))
    }
}

struct Info(Vec<u32>);

#[tonic::async_trait]
impl notify_info::notify_info_server::NotifyInfo for Info {
    async fn info(
        &self,
        _request: Request<notify_info::NotifyInfoRequest>,
    ) -> Result<Response<notify_info::NotifyInfoResponse>, Status> {
        Ok(Response::new(notify_info::NotifyInfoResponse {
            supported_notify_versions: self.0.clone(),
        }))
    }
}

fn serve(path: &Path, versions: Vec<u32>, handler: Handler) -> tokio::sync::oneshot::Sender<()> {
    let listener = tokio::net::UnixListener::bind(path).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(notify_info::notify_info_server::NotifyInfoServer::new(
                Info(versions),
            ))
            .add_service(notify::notify_server::NotifyServer::new(handler))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = stopped.await;
            }),
    );
    stop
}

/// Serves the notify API (version 1, every event accepted) on `path` (bound now, served on the
/// current tokio runtime) into `received`, until the returned sender is sent to or dropped.
pub fn start_into(path: &Path, received: Received) -> tokio::sync::oneshot::Sender<()> {
    let handler = Handler {
        received,
        k8s_events: K8sEvents::default(),
        reject_with: None,
    };
    serve(path, vec![1], handler)
}

/// [`start_into`] a fresh [`Received`]; returns it and the stop sender (keep it alive).
pub fn start(path: &Path) -> (Received, tokio::sync::oneshot::Sender<()>) {
    let received = Received::default();
    let stop = start_into(path, received.clone());
    (received, stop)
}

/// A notify server with a choice of versions and answers; stops when dropped.
pub struct NotifyServer {
    /// The domain events received.
    pub received: Received,
    /// The Kubernetes events received.
    pub k8s_events: K8sEvents,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl NotifyServer {
    /// Serves on `path` (on the current tokio runtime), answering NotifyInfo with `versions` and
    /// every DomainEvent with success, or with `success: false` and `reject_with` when given.
    pub fn start(path: &Path, versions: Vec<u32>, reject_with: Option<String>) -> NotifyServer {
        let received = Received::default();
        let k8s_events = K8sEvents::default();
        let handler = Handler {
            received: received.clone(),
            k8s_events: k8s_events.clone(),
            reject_with,
        };
        NotifyServer {
            received,
            k8s_events,
            _stop: serve(path, versions, handler),
        }
    }

    /// The domain events so far.
    pub fn events(&self) -> Vec<(String, ApiDomain)> {
        self.received.lock().unwrap().clone()
    }
}

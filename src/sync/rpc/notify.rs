//! The notify client: reports domain events to virt-handler over `domain-notify-pipe.sock`, as
//! KubeVirt's `pkg/virt-launcher/notify-client/client.go` (v1.9.0) does.
//!
//! One worker task sends the notifications one at a time in the order they were queued, so
//! virt-handler sees `ADDED` before the `MODIFIED` that follows it. Each notification is retried
//! with KubeVirt's timing ([`NotifyTiming::KUBEVIRT`]): first try at once, then every 1 s, each
//! try bounded to 5 s, for at most 20 s in total; a broken connection is dropped and re-dialled (2 s
//! connect timeout, then `NotifyInfo.Info` version negotiation within 5 s). A notification that
//! still fails after 20 s is given up (logged, reported to whoever awaits its [`Delivery`]) and the
//! next one is sent.
//!
//! A domain notification that was given up is not lost: the worker keeps the latest such domain
//! state and, while nothing newer is queued, tries it once per interval whenever the socket file
//! exists, so virt-handler gets the current domain as soon as it creates the pipe (it does so only
//! after its first successful call on `launcher-sock`, `pkg/virt-handler/launcher-clients`). A newer
//! domain notification supersedes it; a Kubernetes event does not.
//!
//! The final notification of a launcher ([`Notifier::send_final_delete`]) is KubeVirt's: event type
//! `MODIFIED` with state `NoState`, reason `NonExistent` and a deletion timestamp; virt-handler
//! treats a domain with a deletion timestamp as deleted rather than waiting for a `DELETED` event
//! (`pkg/virt-handler/controller.go`, `getDomainFromCache`). [`Notifier::final_delete_sent`]
//! resolves once it has been delivered, for the launcher's shutdown (`waitForFinalNotify`).

use crate::sync::domain::{ApiDomain, DomainEventType};
use crate::sync::error::SyncError;
use crate::sync::rpc::proto::notify::info as notify_info;
use crate::sync::rpc::proto::notify::v1 as notify;
use crate::sync::rpc::uds;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tonic::transport::Channel;

/// Versions of `kubevirt.notify.vN` qlauncher speaks.
pub const SUPPORTED_NOTIFY_VERSIONS: [u32; 1] = [1];

/// The notify socket under the launcher's share directory: `<share-dir>/domain-notify-pipe.sock`
/// (virt-handler creates it inside the pod).
pub fn notify_socket_in_share_dir(share_dir: &Path) -> PathBuf {
    share_dir.join("domain-notify-pipe.sock")
}

/// Retry and timeout timing of the notify client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotifyTiming {
    /// Pause between two tries of one notification.
    pub interval: Duration,
    /// Bound on one `HandleDomainEvent` call.
    pub send_timeout: Duration,
    /// Bound on all tries of one notification.
    pub total_timeout: Duration,
    /// Bound on dialling the socket.
    pub connect_timeout: Duration,
    /// Bound on the `NotifyInfo.Info` version negotiation.
    pub info_timeout: Duration,
}

impl NotifyTiming {
    /// KubeVirt v1.9.0's numbers: 1 s interval, 5 s per send, 20 s in total
    /// (`notify-client/client.go`), 2 s to dial (`pkg/util/net/grpc`, `CONNECT_TIMEOUT_SECONDS`),
    /// 5 s for version negotiation (`negotiateVersion`).
    pub const KUBEVIRT: NotifyTiming = NotifyTiming {
        interval: Duration::from_secs(1),
        send_timeout: Duration::from_secs(5),
        total_timeout: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(2),
        info_timeout: Duration::from_secs(5),
    };
}

impl Default for NotifyTiming {
    fn default() -> Self {
        NotifyTiming::KUBEVIRT
    }
}

/// The outcome of one queued notification. Await it to learn whether virt-handler accepted it, or
/// drop it to fire and forget.
#[derive(Debug)]
pub struct Delivery(oneshot::Receiver<Result<(), SyncError>>);

impl Future for Delivery {
    type Output = Result<(), SyncError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|result| result.unwrap_or(Err(SyncError::NotifierStopped)))
    }
}

enum Payload {
    Domain(notify::DomainEventRequest),
    K8s(notify::K8sEventRequest),
}

struct Job {
    payload: Payload,
    label: &'static str,
    is_final_delete: bool,
    done: oneshot::Sender<Result<(), SyncError>>,
}

/// Handle to the notify client. Cheap to clone; the worker stops when the last handle is dropped,
/// after sending what was queued.
#[derive(Debug, Clone)]
pub struct Notifier {
    jobs: mpsc::UnboundedSender<Job>,
    final_sent: watch::Receiver<bool>,
    socket: PathBuf,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job").field("label", &self.label).finish()
    }
}

impl Notifier {
    /// Starts the notify worker for the socket at `socket` (usually
    /// [`notify_socket_in_share_dir`]). Must be called inside a tokio runtime. Nothing is dialled
    /// until the first notification.
    pub fn start(socket: PathBuf, timing: NotifyTiming) -> Notifier {
        let (jobs, queue) = mpsc::unbounded_channel();
        let (final_tx, final_sent) = watch::channel(false);
        let worker = Worker {
            socket: socket.clone(),
            timing,
            client: None,
        };
        tokio::spawn(worker.run(queue, final_tx));
        Notifier {
            jobs,
            final_sent,
            socket,
        }
    }

    /// Whether virt-handler's notify socket file exists now (it never does under `qlauncher run`).
    pub fn socket_present(&self) -> bool {
        self.socket.exists()
    }

    /// Queues `domain` as a domain event of type `event_type`.
    ///
    /// # Errors
    /// [`SyncError::EncodeDomain`] when the domain does not encode (nothing is queued);
    /// [`SyncError::NotifierStopped`] when the worker is gone.
    pub fn send(
        &self,
        event_type: DomainEventType,
        domain: &ApiDomain,
    ) -> Result<Delivery, SyncError> {
        self.queue_domain(event_type, domain, false)
    }

    /// Queues KubeVirt's final delete notification for `domain`: a copy marked with
    /// [`ApiDomain::mark_deleted`] at `now`, sent as `MODIFIED`. Once delivered,
    /// [`Notifier::final_delete_sent`] resolves.
    ///
    /// # Errors
    /// As [`Notifier::send`].
    pub fn send_final_delete(
        &self,
        domain: &ApiDomain,
        now: SystemTime,
    ) -> Result<Delivery, SyncError> {
        let mut domain = domain.clone();
        domain.mark_deleted(now);
        self.queue_domain(DomainEventType::Modified, &domain, true)
    }

    /// Queues a Kubernetes `core/v1` Event (already JSON-encoded) for `HandleK8sEvent`.
    ///
    /// # Errors
    /// [`SyncError::NotifierStopped`] when the worker is gone.
    pub fn send_k8s_event(&self, event_json: Vec<u8>) -> Result<Delivery, SyncError> {
        let payload = Payload::K8s(notify::K8sEventRequest { event_json });
        self.queue(payload, "K8S", false)
    }

    /// Resolves once the final delete notification has been delivered (true), or when the worker
    /// stopped without delivering it (false).
    pub async fn final_delete_sent(&self) -> bool {
        let mut final_sent = self.final_sent.clone();
        let sent = final_sent.wait_for(|sent| *sent).await.is_ok();
        sent
    }

    fn queue_domain(
        &self,
        event_type: DomainEventType,
        domain: &ApiDomain,
        is_final_delete: bool,
    ) -> Result<Delivery, SyncError> {
        let domain_json = serde_json::to_vec(domain).map_err(SyncError::EncodeDomain)?;
        let payload = Payload::Domain(notify::DomainEventRequest {
            domain_json,
            status_json: Vec::new(),
            event_type: event_type.as_str().to_owned(),
        });
        self.queue(payload, event_type.as_str(), is_final_delete)
    }

    fn queue(
        &self,
        payload: Payload,
        label: &'static str,
        is_final_delete: bool,
    ) -> Result<Delivery, SyncError> {
        let (done, delivery) = oneshot::channel();
        self.jobs
            .send(Job {
                payload,
                label,
                is_final_delete,
                done,
            })
            .map_err(|_| SyncError::NotifierStopped)?;
        Ok(Delivery(delivery))
    }
}

struct Worker {
    socket: PathBuf,
    timing: NotifyTiming,
    client: Option<notify::notify_client::NotifyClient<Channel>>,
}

/// A domain notification that was given up, kept to be delivered once the socket appears.
struct Undelivered {
    payload: Payload,
    label: &'static str,
    is_final_delete: bool,
}

impl Worker {
    async fn run(mut self, mut queue: mpsc::UnboundedReceiver<Job>, final_tx: watch::Sender<bool>) {
        let mut undelivered: Option<Undelivered> = None;
        loop {
            let job = match &undelivered {
                None => queue.recv().await,
                Some(_) => tokio::select! {
                    job = queue.recv() => job,
                    () = tokio::time::sleep(self.timing.interval) => {
                        self.retry_undelivered(&mut undelivered, &final_tx).await;
                        continue;
                    }
                },
            };
            let Some(job) = job else { break };
            if matches!(job.payload, Payload::Domain(_)) {
                // A newer domain state supersedes the one that was not delivered.
                undelivered = None;
            }
            let result = self.deliver(&job.payload, job.label).await;
            match &result {
                Ok(()) => {
                    tracing::debug!(event = job.label, "domain notification delivered");
                    if job.is_final_delete {
                        tracing::info!("Final Delete notification sent");
                        final_tx.send_replace(true);
                    }
                }
                Err(error @ SyncError::NotifyRejected { .. }) => {
                    tracing::error!(event = job.label, error = %error, "Could not send domain notify event")
                }
                Err(error) => {
                    tracing::error!(event = job.label, error = %error, "Could not send domain notify event");
                    if let Payload::Domain(request) = &job.payload {
                        undelivered = Some(Undelivered {
                            payload: Payload::Domain(request.clone()),
                            label: job.label,
                            is_final_delete: job.is_final_delete,
                        });
                    }
                }
            }
            let _ = job.done.send(result);
        }
    }

    /// One try of the kept domain state, when the socket file exists; cleared once delivered.
    async fn retry_undelivered(
        &mut self,
        undelivered: &mut Option<Undelivered>,
        final_tx: &watch::Sender<bool>,
    ) {
        let Some(kept) = undelivered.as_ref() else {
            return;
        };
        if !self.socket.exists() {
            return;
        }
        match self.try_once(&kept.payload).await {
            Ok(response) => {
                if response.success {
                    tracing::info!(
                        event = kept.label,
                        "latest domain state delivered after the notify socket appeared"
                    );
                    if kept.is_final_delete {
                        tracing::info!("Final Delete notification sent");
                        final_tx.send_replace(true);
                    }
                } else {
                    tracing::error!(event = kept.label, message = %response.message, "Could not send domain notify event");
                }
                *undelivered = None;
            }
            Err(error) => {
                tracing::debug!(event = kept.label, error = %error, "notify socket not ready yet");
            }
        }
    }

    /// Sends one notification, retrying per [`NotifyTiming`] (KubeVirt's `PollImmediately` loop).
    async fn deliver(&mut self, payload: &Payload, label: &'static str) -> Result<(), SyncError> {
        let deadline = Instant::now() + self.timing.total_timeout;
        let mut last: Option<SyncError> = None;
        loop {
            match tokio::time::timeout_at(deadline, self.try_once(payload)).await {
                Ok(Ok(response)) if response.success => return Ok(()),
                Ok(Ok(response)) => {
                    return Err(SyncError::NotifyRejected {
                        message: response.message,
                    })
                }
                Ok(Err(error)) => {
                    tracing::warn!(event = label, error = %error, "failed to send domain notify event");
                    last = Some(error);
                }
                Err(_) => {
                    // The total timeout cut this try short: report the last real failure if any.
                    self.client = None;
                    if last.is_none() {
                        last = Some(SyncError::NotifyCallTimeout {
                            call: call_name(payload),
                            waited: self.timing.total_timeout,
                        });
                    }
                }
            }
            if Instant::now() + self.timing.interval >= deadline {
                return Err(SyncError::NotifyGaveUp {
                    event_type: label,
                    waited: self.timing.total_timeout,
                    last: Box::new(last.unwrap_or(SyncError::NotifyCallTimeout {
                        call: call_name(payload),
                        waited: self.timing.total_timeout,
                    })),
                });
            }
            tokio::time::sleep(self.timing.interval).await;
        }
    }

    /// One try: dial and negotiate if not connected, then send. Any failure drops the connection.
    async fn try_once(&mut self, payload: &Payload) -> Result<notify::Response, SyncError> {
        let result = self.try_once_inner(payload).await;
        if result.is_err() {
            self.client = None;
        }
        result
    }

    async fn try_once_inner(&mut self, payload: &Payload) -> Result<notify::Response, SyncError> {
        let client = match &mut self.client {
            Some(client) => client,
            None => self.client.insert(self.connect().await?),
        };
        let call = call_name(payload);
        let sending = async {
            match payload {
                Payload::Domain(request) => client.handle_domain_event(request.clone()).await,
                Payload::K8s(request) => client.handle_k8s_event(request.clone()).await,
            }
        };
        match tokio::time::timeout(self.timing.send_timeout, sending).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(source)) => Err(SyncError::NotifyCall { call, source }),
            Err(_) => Err(SyncError::NotifyCallTimeout {
                call,
                waited: self.timing.send_timeout,
            }),
        }
    }

    async fn connect(&self) -> Result<notify::notify_client::NotifyClient<Channel>, SyncError> {
        let channel = uds::connect(&self.socket, self.timing.connect_timeout)
            .await
            .map_err(|source| SyncError::NotifyConnect {
                path: self.socket.clone(),
                source,
            })?;
        let mut info = notify_info::notify_info_client::NotifyInfoClient::new(channel.clone());
        let offered = match tokio::time::timeout(
            self.timing.info_timeout,
            info.info(notify_info::NotifyInfoRequest {}),
        )
        .await
        {
            Ok(Ok(response)) => response.into_inner().supported_notify_versions,
            Ok(Err(source)) => {
                return Err(SyncError::NotifyCall {
                    call: "Info",
                    source,
                })
            }
            Err(_) => {
                return Err(SyncError::NotifyCallTimeout {
                    call: "Info",
                    waited: self.timing.info_timeout,
                })
            }
        };
        if !offered
            .iter()
            .any(|version| SUPPORTED_NOTIFY_VERSIONS.contains(version))
        {
            return Err(SyncError::NotifyVersion { offered });
        }
        tracing::info!(socket = %self.socket.display(), "Successfully connected to domain notify socket");
        Ok(notify::notify_client::NotifyClient::new(channel))
    }
}

fn call_name(payload: &Payload) -> &'static str {
    match payload {
        Payload::Domain(_) => "HandleDomainEvent",
        Payload::K8s(_) => "HandleK8sEvent",
    }
}

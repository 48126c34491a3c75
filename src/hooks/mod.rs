//! KubeVirt's hook sidecars, the launcher's side (KubeVirt v1.9.0 `pkg/hooks/manager.go`).
//!
//! A hook sidecar is a container of the launcher pod serving gRPC on a Unix socket in its own
//! sub-directory of `/var/run/kubevirt-hooks/` ([`HOOK_DIR`]; virt-controller mounts
//! `hook-sidecar-<i>` of one emptyDir there in each sidecar). [`collect`] finds the
//! `--hook-sidecars N` sockets at start-up and asks each one `Info`; [`Sidecars`] then calls
//! them: [`Sidecars::on_define_domain`] (the domain XML, chained through every subscriber),
//! [`Sidecars::pre_cloud_init_iso`] (the cloud-init data, first subscriber only) and
//! [`Sidecars::shutdown`] (v1alpha3, once QEMU is gone).
//!
//! Where qlauncher differs from KubeVirt, on purpose:
//! - sockets are remembered by full path, not base name, so two sidecars that both call their
//!   socket `smbios.sock` count twice (KubeVirt counts them once and then times out);
//! - [`collect`] returns as soon as the N-th socket answers, not at the next 300 ms tick;
//! - [`Sidecars::shutdown`] calls every v1alpha3 subscriber even after one fails, within the
//!   time given, so a failing sidecar does not keep the others (and the pod) running.
//!
//! This room imports only `core` and `compat`; what the answers mean for the plan is
//! `qlauncher_libvirt_xml::hooks` (diff, edits, refusals), called by the launcher.

pub mod cloud_init;
pub mod plugins;
pub mod proto;

pub use qlauncher_libvirt_xml::hooks::{apply, diff_answer, HookEdit, Refusal};

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::{error, info, warn};

use crate::cmdline::{ConverterContext, DomainPlan};
use crate::vmi::Vmi;

/// Where the launcher looks for hook sockets (KubeVirt's `HookSocketsSharedDirectory`), one
/// sub-directory per sidecar.
pub const HOOK_DIR: &str = "/var/run/kubevirt-hooks";
/// How often [`collect`] looks again for sockets not there yet (KubeVirt's 300 ms ticker).
pub const POLL: Duration = Duration::from_millis(300);
/// How long a connection to a socket may take (KubeVirt's `DialSocketWithTimeout`, 2 s).
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(2);
/// Deadline of `Info` in [`collect`] (KubeVirt: 1 s).
pub const INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// Deadline of each callback, per sidecar (KubeVirt: 1 min).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Hook point names of `Info`'s `hookPoints` (KubeVirt's `pkg/hooks/hooks.go` constants).
pub const ON_DEFINE_DOMAIN: &str = "OnDefineDomain";
/// See [`ON_DEFINE_DOMAIN`].
pub const PRE_CLOUD_INIT_ISO: &str = "PreCloudInitIso";
/// See [`ON_DEFINE_DOMAIN`].
pub const SHUTDOWN: &str = "Shutdown";

/// A callback API version, newest last (so `max` is the newest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// `OnDefineDomain` only.
    V1alpha1,
    /// Adds `PreCloudInitIso`.
    V1alpha2,
    /// Adds `Shutdown`.
    V1alpha3,
}

impl Version {
    /// Newest first: the order [`collect`] matches a sidecar's `versions` in.
    pub const NEWEST_FIRST: [Version; 3] =
        [Version::V1alpha3, Version::V1alpha2, Version::V1alpha1];

    /// The wire name (`v1alpha1`).
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V1alpha1 => "v1alpha1",
            Version::V1alpha2 => "v1alpha2",
            Version::V1alpha3 => "v1alpha3",
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One collected sidecar: where it listens, what it said in `Info`, the version chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sidecar {
    /// The socket, `<HOOK_DIR>/<dir>/<name>`.
    pub socket: PathBuf,
    /// `Info`'s `name` (logged only, as in KubeVirt).
    pub name: String,
    /// The newest version both sides speak.
    pub version: Version,
    /// `Info`'s hook point names, in the sidecar's order (unknown names are kept, never called).
    pub hook_points: Vec<String>,
}

impl Sidecar {
    fn subscribes(&self, point: &str) -> bool {
        self.hook_points.iter().any(|p| p == point)
    }
}

/// The sidecars [`collect`] found, in the order they are called: discovery order (an earlier
/// pass first; within a pass by directory name, then socket name, bytewise, as Go's
/// `os.ReadDir` sorts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sidecars {
    /// The sidecars.
    pub list: Vec<Sidecar>,
}

/// One sidecar's `OnDefineDomain` answer in the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefineStep {
    /// The sidecar's socket.
    pub socket: PathBuf,
    /// The domain XML it answered (the next sidecar's input).
    pub domain_xml: String,
}

/// A `PreCloudInitIso` answer, undecoded; [`cloud_init::CloudInitData::from_answer`] reads it as
/// KubeVirt does (`preCloudInitIsoValidateResult` falls back to `cloud_init_no_cloud_source` when
/// `cloud_init_data` is not valid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudInitAnswer {
    /// The sidecar that answered.
    pub socket: PathBuf,
    /// `cloudInitNoCloudSource` (JSON of a `CloudInitNoCloudSource`, older sidecars).
    pub cloud_init_no_cloud_source: Vec<u8>,
    /// `cloudInitData` (JSON of KubeVirt's `cloudinit.CloudInitData`).
    pub cloud_init_data: Vec<u8>,
}

/// Why collecting or calling the sidecars failed. The texts start as KubeVirt's do and add the
/// socket path.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The hook directory or a sidecar's sub-directory cannot be read (KubeVirt: fatal).
    #[error("reading the hook socket directory {dir}: {source}")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// Fewer than the expected sockets answered within the time (KubeVirt: fatal).
    #[error(
        "Failed to collect all expected sidecar hook sockets within given timeout: {found} of \
         {expected} within {timeout:?} (collected: {collected:?})"
    )]
    Timeout {
        /// Sockets collected.
        found: usize,
        /// `--hook-sidecars`.
        expected: usize,
        /// The time given.
        timeout: Duration,
        /// Their paths.
        collected: Vec<PathBuf>,
    },
    /// A sidecar accepted the connection but `Info` failed (KubeVirt: fatal).
    #[error("Failed to process sidecar socket: {socket}: Info: {reason}")]
    Info {
        /// The socket.
        socket: PathBuf,
        /// The gRPC status or the deadline.
        reason: String,
    },
    /// A sidecar speaks none of v1alpha1..3 (KubeVirt: fatal).
    #[error(
        "Hook sidecar does not expose a supported version. Exposed versions: {exposed:?}, \
         supported versions: [\"v1alpha3\", \"v1alpha2\", \"v1alpha1\"] (socket {socket})"
    )]
    NoVersion {
        /// The socket.
        socket: PathBuf,
        /// Its `versions`.
        exposed: Vec<String>,
    },
    /// A collected sidecar cannot be reached for a callback.
    #[error("Failed to Dial hook socket: {socket}: {reason}")]
    Dial {
        /// The socket.
        socket: PathBuf,
        /// The transport error or the timeout.
        reason: String,
    },
    /// A callback failed, ran out of time, or answered something unreadable.
    #[error("Failed to call {hook_point} on {socket}: {reason}")]
    Call {
        /// `OnDefineDomain`, `PreCloudInitIso` or `Shutdown`.
        hook_point: &'static str,
        /// The socket.
        socket: PathBuf,
        /// The gRPC status, the deadline, or what is wrong with the answer.
        reason: String,
    },
}

/// The domain XML KubeVirt would send `OnDefineDomain` for `plan` (converted from `vmi` with
/// `ctx`): the libvirt model the exporter makes of it, printed as Go's `xml.MarshalIndent` prints
/// KubeVirt's `api.DomainSpec` ([`qlauncher_libvirt_xml::hooks::kubevirt_input`]).
///
/// # Errors
/// The exporter's error for a plan it cannot write.
pub fn domain_xml(
    vmi: &Vmi,
    ctx: &ConverterContext,
    plan: &DomainPlan,
) -> Result<String, qlauncher_libvirt_xml::CompatError> {
    qlauncher_libvirt_xml::hooks::kubevirt_input(&qlauncher_libvirt_xml::export(vmi, ctx, plan)?)
}

/// Connects to a hook socket as KubeVirt's `DialSocketWithTimeout` does: plaintext HTTP/2,
/// authority `localhost`, the connection made before returning, within [`DIAL_TIMEOUT`].
async fn dial(socket: &Path) -> Result<Channel, HookError> {
    dial_within(socket, DIAL_TIMEOUT).await
}

/// [`dial`] within `timeout` (a plugin sidecar's is KubeVirt's 5 s,
/// [`plugins::DIAL_TIMEOUT`]).
pub(crate) async fn dial_within(socket: &Path, timeout: Duration) -> Result<Channel, HookError> {
    let path = socket.to_owned();
    let endpoint = Endpoint::from_static("http://localhost").connect_timeout(timeout);
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(TokioIo::new(stream))
        }
    }));
    let dial_error = |reason: String| HookError::Dial {
        socket: socket.to_owned(),
        reason,
    };
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(dial_error(error_chain(&e))),
        Err(_) => Err(dial_error(format!("no connection within {timeout:?}"))),
    }
}

/// An error with its sources (`a: b: c`); tonic's transport error says little on its own.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// The non-directory entries of each sub-directory of `dir`, sub-directories by name, entries
/// by name (bytewise, as Go's `os.ReadDir`), the way KubeVirt's `collectSideCarSockets` walks.
/// Entries directly in `dir` are not sockets (each sidecar has its own sub-directory).
fn candidates(dir: &Path) -> Result<Vec<PathBuf>, HookError> {
    let read = |d: &Path| -> Result<Vec<(std::ffi::OsString, bool)>, HookError> {
        let io = |source| HookError::Dir {
            dir: d.to_owned(),
            source,
        };
        let mut entries = Vec::new();
        for e in std::fs::read_dir(d).map_err(io)? {
            let e = e.map_err(io)?;
            let is_dir = e.file_type().map_err(io)?.is_dir();
            entries.push((e.file_name(), is_dir));
        }
        entries.sort();
        Ok(entries)
    };
    let mut out = Vec::new();
    for (sub, is_dir) in read(dir)? {
        if !is_dir {
            continue;
        }
        let sub = dir.join(sub);
        for (name, is_dir) in read(&sub)? {
            if !is_dir {
                out.push(sub.join(name));
            }
        }
    }
    Ok(out)
}

/// `Info` of one socket: `Ok(None)` when nobody accepts the connection yet (tried again on the
/// next pass).
async fn info(socket: &Path) -> Result<Option<Sidecar>, HookError> {
    let channel = match dial(socket).await {
        Ok(c) => c,
        Err(e) => {
            info!(socket = %socket.display(), "Sidecar server might not be ready yet: {e}");
            return Ok(None);
        }
    };
    let mut client = proto::info::info_client::InfoClient::new(channel);
    let info_error = |reason: String| HookError::Info {
        socket: socket.to_owned(),
        reason,
    };
    let answer = tokio::time::timeout(INFO_TIMEOUT, client.info(proto::info::InfoParams {}))
        .await
        .map_err(|_| info_error(format!("no answer within {INFO_TIMEOUT:?}")))?
        .map_err(|status| info_error(status_text(&status)))?
        .into_inner();
    let version = Version::NEWEST_FIRST
        .into_iter()
        .find(|v| answer.versions.iter().any(|a| a == v.as_str()))
        .ok_or_else(|| HookError::NoVersion {
            socket: socket.to_owned(),
            exposed: answer.versions.clone(),
        })?;
    Ok(Some(Sidecar {
        socket: socket.to_owned(),
        name: answer.name,
        version,
        hook_points: answer.hook_points.into_iter().map(|p| p.name).collect(),
    }))
}

fn status_text(status: &tonic::Status) -> String {
    format!("{:?}: {}", status.code(), status.message())
}

/// Finds `expected` hook sidecars under `dir` (KubeVirt's `Collect`, called with
/// `--hook-sidecars` and `--qemu-timeout` before the command server starts): every
/// non-directory entry of every sub-directory is tried as a socket, again every [`POLL`] until
/// `expected` of them answered `Info` or `timeout` passed. A socket nobody accepts on is tried
/// again; one that accepts but fails `Info`, or speaks no supported version, is an error naming
/// it. With `expected` 0, `dir` is not looked at. The order found is logged.
///
/// # Errors
/// [`HookError::Dir`], [`HookError::Info`], [`HookError::NoVersion`], [`HookError::Timeout`].
pub async fn collect(
    dir: &Path,
    expected: usize,
    timeout: Duration,
) -> Result<Sidecars, HookError> {
    let mut found = Sidecars::default();
    if expected == 0 {
        return Ok(found);
    }
    let deadline = Instant::now() + timeout;
    let mut seen = BTreeSet::new();
    loop {
        for socket in candidates(dir)? {
            if seen.contains(&socket) {
                continue;
            }
            if let Some(sidecar) = info(&socket).await? {
                seen.insert(socket);
                found.list.push(sidecar);
            }
        }
        if found.list.len() >= expected {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(HookError::Timeout {
                found: found.list.len(),
                expected,
                timeout,
                collected: found.list.iter().map(|s| s.socket.clone()).collect(),
            });
        }
        tokio::time::sleep(POLL.min(deadline - now)).await;
    }
    info!("Collected all requested hook sidecar sockets");
    for (i, s) in found.list.iter().enumerate() {
        info!(
            order = i,
            socket = %s.socket.display(),
            name = %s.name,
            version = %s.version,
            hook_points = ?s.hook_points,
            "hook sidecar"
        );
    }
    Ok(found)
}

impl Sidecars {
    /// No sidecars (no `--hook-sidecars`).
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn subscribed<'a>(&'a self, point: &'a str) -> impl Iterator<Item = &'a Sidecar> + 'a {
        self.list.iter().filter(move |s| s.subscribes(point))
    }

    /// Whether any sidecar subscribed to the hook point `point` ([`ON_DEFINE_DOMAIN`],
    /// [`PRE_CLOUD_INIT_ISO`], [`SHUTDOWN`]) in its `Info`.
    pub fn subscribes(&self, point: &str) -> bool {
        self.subscribed(point).next().is_some()
    }

    /// `OnDefineDomain` through every subscriber in order, each getting the previous answer
    /// (KubeVirt's `hookManager.OnDefineDomain`): the last answer, or `domain_xml` when nobody
    /// subscribed. `vmi_json` is the VMI as virt-handler sent it.
    ///
    /// # Errors
    /// As [`Self::on_define_domain_steps`].
    pub async fn on_define_domain(
        &self,
        domain_xml: &str,
        vmi_json: &[u8],
    ) -> Result<String, HookError> {
        let steps = self.on_define_domain_steps(domain_xml, vmi_json).await?;
        Ok(steps
            .into_iter()
            .next_back()
            .map_or_else(|| domain_xml.to_owned(), |s| s.domain_xml))
    }

    /// [`Self::on_define_domain`] with every sidecar's answer, so a refusal can name the sidecar
    /// whose answer made it.
    ///
    /// # Errors
    /// [`HookError::Dial`], or [`HookError::Call`] for a failed call, one over
    /// [`CALL_TIMEOUT`], an answer larger than tonic's 4 MiB message limit, or not UTF-8.
    pub async fn on_define_domain_steps(
        &self,
        domain_xml: &str,
        vmi_json: &[u8],
    ) -> Result<Vec<DefineStep>, HookError> {
        let mut steps: Vec<DefineStep> = Vec::new();
        for s in self.subscribed(ON_DEFINE_DOMAIN) {
            let input = steps.last().map_or(domain_xml, |d| d.domain_xml.as_str());
            let answer = define_one(s, input.as_bytes().to_vec(), vmi_json.to_vec()).await?;
            let domain_xml = String::from_utf8(answer).map_err(|_| HookError::Call {
                hook_point: ON_DEFINE_DOMAIN,
                socket: s.socket.clone(),
                reason: "the domain XML answered is not UTF-8".into(),
            })?;
            steps.push(DefineStep {
                socket: s.socket.clone(),
                domain_xml,
            });
        }
        Ok(steps)
    }

    /// `PreCloudInitIso` of the first v1alpha2 or v1alpha3 subscriber, as KubeVirt calls it (a
    /// v1alpha1 subscriber is skipped with KubeVirt's "Unsupported callback version"; later
    /// subscribers are never called). `None` when nobody can serve it.
    ///
    /// # Errors
    /// [`HookError::Dial`] or [`HookError::Call`] of that sidecar.
    pub async fn pre_cloud_init_iso(
        &self,
        cloud_init_no_cloud_source: &[u8],
        cloud_init_data: &[u8],
        vmi_json: &[u8],
    ) -> Result<Option<CloudInitAnswer>, HookError> {
        for s in self.subscribed(PRE_CLOUD_INIT_ISO) {
            let call = |reason: String| HookError::Call {
                hook_point: PRE_CLOUD_INIT_ISO,
                socket: s.socket.clone(),
                reason,
            };
            let params = proto::v1alpha3::PreCloudInitIsoParams {
                cloud_init_no_cloud_source: cloud_init_no_cloud_source.to_vec(),
                vmi: vmi_json.to_vec(),
                cloud_init_data: cloud_init_data.to_vec(),
            };
            let (no_cloud, data) = match s.version {
                Version::V1alpha1 => {
                    error!(socket = %s.socket.display(), "Unsupported callback version: {}", s.version);
                    continue;
                }
                Version::V1alpha2 => {
                    let mut c = proto::v1alpha2::callbacks_client::CallbacksClient::new(
                        dial(&s.socket).await?,
                    );
                    let params = proto::v1alpha2::PreCloudInitIsoParams {
                        cloud_init_no_cloud_source: params.cloud_init_no_cloud_source,
                        vmi: params.vmi,
                        cloud_init_data: params.cloud_init_data,
                    };
                    let r = deadline(c.pre_cloud_init_iso(params)).await.map_err(call)?;
                    (r.cloud_init_no_cloud_source, r.cloud_init_data)
                }
                Version::V1alpha3 => {
                    let mut c = proto::v1alpha3::callbacks_client::CallbacksClient::new(
                        dial(&s.socket).await?,
                    );
                    let r = deadline(c.pre_cloud_init_iso(params)).await.map_err(call)?;
                    (r.cloud_init_no_cloud_source, r.cloud_init_data)
                }
            };
            return Ok(Some(CloudInitAnswer {
                socket: s.socket.clone(),
                cloud_init_no_cloud_source: no_cloud,
                cloud_init_data: data,
            }));
        }
        Ok(None)
    }

    /// `Shutdown` of every v1alpha3 subscriber, in order, all within `within` (what is left of
    /// the grace period; each call at most [`CALL_TIMEOUT`]). Called once QEMU is gone (KubeVirt's
    /// `main` after `RunForever`). Errors are logged and returned, never fatal; older versions are
    /// skipped with KubeVirt's "Unsupported callback version".
    pub async fn shutdown(&self, within: Duration) -> Vec<HookError> {
        let end = Instant::now() + within;
        let mut errors = Vec::new();
        for s in self.subscribed(SHUTDOWN) {
            if s.version != Version::V1alpha3 {
                error!(socket = %s.socket.display(), "Unsupported callback version: {}", s.version);
                continue;
            }
            let left = end
                .saturating_duration_since(Instant::now())
                .min(CALL_TIMEOUT);
            let call = async {
                let mut c =
                    proto::v1alpha3::callbacks_client::CallbacksClient::new(dial(&s.socket).await?);
                c.shutdown(proto::v1alpha3::ShutdownParams {})
                    .await
                    .map_err(|status| HookError::Call {
                        hook_point: SHUTDOWN,
                        socket: s.socket.clone(),
                        reason: status_text(&status),
                    })?;
                Ok::<(), HookError>(())
            };
            let result = match tokio::time::timeout(left, call).await {
                Ok(r) => r,
                Err(_) => Err(HookError::Call {
                    hook_point: SHUTDOWN,
                    socket: s.socket.clone(),
                    reason: format!("no answer within {left:?}"),
                }),
            };
            if let Err(e) = result {
                warn!("Failed to run Shutdown: {e}");
                errors.push(e);
            }
        }
        errors
    }
}

/// A callback under [`CALL_TIMEOUT`]: its answer, or the reason it has none.
async fn deadline<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(status)) => Err(status_text(&status)),
        Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
    }
}

/// One sidecar's `OnDefineDomain` in its version.
async fn define_one(s: &Sidecar, domain_xml: Vec<u8>, vmi: Vec<u8>) -> Result<Vec<u8>, HookError> {
    let channel = dial(&s.socket).await?;
    let answer = match s.version {
        Version::V1alpha1 => {
            let mut c = proto::v1alpha1::callbacks_client::CallbacksClient::new(channel);
            let p = proto::v1alpha1::OnDefineDomainParams { domain_xml, vmi };
            deadline(c.on_define_domain(p)).await.map(|r| r.domain_xml)
        }
        Version::V1alpha2 => {
            let mut c = proto::v1alpha2::callbacks_client::CallbacksClient::new(channel);
            let p = proto::v1alpha2::OnDefineDomainParams { domain_xml, vmi };
            deadline(c.on_define_domain(p)).await.map(|r| r.domain_xml)
        }
        Version::V1alpha3 => {
            let mut c = proto::v1alpha3::callbacks_client::CallbacksClient::new(channel);
            let p = proto::v1alpha3::OnDefineDomainParams { domain_xml, vmi };
            deadline(c.on_define_domain(p)).await.map(|r| r.domain_xml)
        }
    };
    answer.map_err(|reason| HookError::Call {
        hook_point: ON_DEFINE_DOMAIN,
        socket: s.socket.clone(),
        reason,
    })
}

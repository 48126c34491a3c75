//! A KubeVirt hook sidecar for tests: a gRPC server on a unix socket that answers `Info` (name,
//! hook points, versions) and serves the `Callbacks` of v1alpha1, v1alpha2 and v1alpha3 (all
//! three registered, as KubeVirt's `sidecar-shim` does whatever its `--version`), with scripted
//! answers and a record of every call.
//!
//! The launcher's side is `qlauncher::hooks`; the socket layout is KubeVirt's: one
//! sub-directory per sidecar under the hook directory ([`FakeSidecar::start_in`]).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use qlauncher::hooks::proto::{info, plugins_v1alpha1, v1alpha1, v1alpha2, v1alpha3};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// The board vendor [`kubevirt_e2e_smbios`] sets.
pub const E2E_BOARD_VENDOR: &str = "Radical Edward";

/// The `OnDefineDomain` edit of KubeVirt's own e2e test and `smbios` example, as their scripts
/// make it: a text replacement of the empty `<baseBoard></baseBoard>` by one with the
/// manufacturer [`E2E_BOARD_VENDOR`].
pub fn kubevirt_e2e_smbios(xml: &str) -> String {
    xml.replacen(
        "<baseBoard></baseBoard>",
        "<baseBoard>\n\t\t\t<entry name=\"manufacturer\">Radical Edward</entry>\n\t\t</baseBoard>",
        1,
    )
}

/// An `OnDefineDomain` script: the domain XML in, the answer (or a gRPC error message) out.
pub type DefineScript = Arc<dyn Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync>;

/// A `PreCloudInitIso` script: `(cloudInitNoCloudSource, cloudInitData)` in and out.
pub type CloudInitScript =
    Arc<dyn Fn(&[u8], &[u8]) -> Result<(Vec<u8>, Vec<u8>), String> + Send + Sync>;

/// What the sidecar says and does.
#[derive(Clone)]
pub struct Script {
    /// `Info`'s name.
    pub name: String,
    /// `Info`'s hook point names.
    pub hook_points: Vec<String>,
    /// `Info`'s versions.
    pub versions: Vec<String>,
    /// `Info` fails with this message instead.
    pub info_error: Option<String>,
    /// `OnDefineDomain` (default: the XML unchanged).
    pub on_define_domain: DefineScript,
    /// `PreCloudInitIso` (default: both inputs unchanged).
    pub pre_cloud_init_iso: CloudInitScript,
    /// `Shutdown` fails with this message instead.
    pub shutdown_error: Option<String>,
}

impl Script {
    /// A sidecar speaking `versions` and subscribed to `hook_points`, answering everything
    /// unchanged.
    pub fn new(versions: &[&str], hook_points: &[&str]) -> Script {
        Script {
            name: "fake".into(),
            hook_points: hook_points.iter().map(|s| s.to_string()).collect(),
            versions: versions.iter().map(|s| s.to_string()).collect(),
            info_error: None,
            on_define_domain: Arc::new(|x| Ok(x.to_vec())),
            pre_cloud_init_iso: Arc::new(|n, d| Ok((n.to_vec(), d.to_vec()))),
            shutdown_error: None,
        }
    }

    /// With `OnDefineDomain` answering `f(xml)` (as text).
    pub fn on_define(mut self, f: impl Fn(&str) -> String + Send + Sync + 'static) -> Script {
        self.on_define_domain = Arc::new(move |x| Ok(f(&String::from_utf8_lossy(x)).into_bytes()));
        self
    }
}

/// One call the sidecar received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The version whose service was called (`v1alpha2`).
    pub version: &'static str,
    /// `Info`, `OnDefineDomain`, `PreCloudInitIso`, `Shutdown`.
    pub method: &'static str,
    /// The main payload: the domain XML, or the cloud-init data (empty otherwise).
    pub payload: Vec<u8>,
    /// The VMI JSON (empty for `Info` and `Shutdown`).
    pub vmi: Vec<u8>,
}

/// The calls so far, in arrival order.
pub type Calls = Arc<Mutex<Vec<Call>>>;

#[derive(Clone)]
struct Handler {
    script: Arc<Script>,
    calls: Calls,
    version: &'static str,
}

impl Handler {
    fn record(&self, method: &'static str, payload: &[u8], vmi: &[u8]) {
        self.calls.lock().unwrap().push(Call {
            version: self.version,
            method,
            payload: payload.to_vec(),
            vmi: vmi.to_vec(),
        });
    }

    fn define(&self, xml: &[u8], vmi: &[u8]) -> Result<Vec<u8>, Status> {
        self.record("OnDefineDomain", xml, vmi);
        (self.script.on_define_domain)(xml).map_err(Status::internal)
    }

    fn cloud_init(
        &self,
        no_cloud: &[u8],
        data: &[u8],
        vmi: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), Status> {
        self.record("PreCloudInitIso", data, vmi);
        (self.script.pre_cloud_init_iso)(no_cloud, data).map_err(Status::internal)
    }

    fn shutdown(&self) -> Result<(), Status> {
        self.record("Shutdown", &[], &[]);
        match &self.script.shutdown_error {
            Some(m) => Err(Status::internal(m.clone())),
            None => Ok(()),
        }
    }
}

#[tonic::async_trait]
impl info::info_server::Info for Handler {
    async fn info(
        &self,
        _request: Request<info::InfoParams>,
    ) -> Result<Response<info::InfoResult>, Status> {
        self.record("Info", &[], &[]);
        if let Some(m) = &self.script.info_error {
            return Err(Status::unavailable(m.clone()));
        }
        Ok(Response::new(info::InfoResult {
            name: self.script.name.clone(),
            hook_points: self
                .script
                .hook_points
                .iter()
                .map(|name| info::HookPoint {
                    name: name.clone(),
                    priority: 0,
                })
                .collect(),
            versions: self.script.versions.clone(),
        }))
    }
}

#[tonic::async_trait]
impl v1alpha1::callbacks_server::Callbacks for Handler {
    async fn on_define_domain(
        &self,
        request: Request<v1alpha1::OnDefineDomainParams>,
    ) -> Result<Response<v1alpha1::OnDefineDomainResult>, Status> {
        let r = request.into_inner();
        Ok(Response::new(v1alpha1::OnDefineDomainResult {
            domain_xml: self.define(&r.domain_xml, &r.vmi)?,
        }))
    }
}

#[tonic::async_trait]
impl v1alpha2::callbacks_server::Callbacks for Handler {
    async fn on_define_domain(
        &self,
        request: Request<v1alpha2::OnDefineDomainParams>,
    ) -> Result<Response<v1alpha2::OnDefineDomainResult>, Status> {
        let r = request.into_inner();
        Ok(Response::new(v1alpha2::OnDefineDomainResult {
            domain_xml: self.define(&r.domain_xml, &r.vmi)?,
        }))
    }

    async fn pre_cloud_init_iso(
        &self,
        request: Request<v1alpha2::PreCloudInitIsoParams>,
    ) -> Result<Response<v1alpha2::PreCloudInitIsoResult>, Status> {
        let r = request.into_inner();
        let (n, d) = self.cloud_init(&r.cloud_init_no_cloud_source, &r.cloud_init_data, &r.vmi)?;
        Ok(Response::new(v1alpha2::PreCloudInitIsoResult {
            cloud_init_no_cloud_source: n,
            cloud_init_data: d,
        }))
    }
}

#[tonic::async_trait]
impl v1alpha3::callbacks_server::Callbacks for Handler {
    async fn on_define_domain(
        &self,
        request: Request<v1alpha3::OnDefineDomainParams>,
    ) -> Result<Response<v1alpha3::OnDefineDomainResult>, Status> {
        let r = request.into_inner();
        Ok(Response::new(v1alpha3::OnDefineDomainResult {
            domain_xml: self.define(&r.domain_xml, &r.vmi)?,
        }))
    }

    async fn pre_cloud_init_iso(
        &self,
        request: Request<v1alpha3::PreCloudInitIsoParams>,
    ) -> Result<Response<v1alpha3::PreCloudInitIsoResult>, Status> {
        let r = request.into_inner();
        let (n, d) = self.cloud_init(&r.cloud_init_no_cloud_source, &r.cloud_init_data, &r.vmi)?;
        Ok(Response::new(v1alpha3::PreCloudInitIsoResult {
            cloud_init_no_cloud_source: n,
            cloud_init_data: d,
        }))
    }

    async fn shutdown(
        &self,
        _request: Request<v1alpha3::ShutdownParams>,
    ) -> Result<Response<v1alpha3::ShutdownResult>, Status> {
        self.shutdown()?;
        Ok(Response::new(v1alpha3::ShutdownResult {}))
    }
}

/// A running fake sidecar; stops serving (and removes its socket) when dropped.
pub struct FakeSidecar {
    /// Its socket.
    pub socket: PathBuf,
    /// The calls it received.
    pub calls: Calls,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl FakeSidecar {
    /// Serves `script` on `socket` (bound now, served on the current tokio runtime).
    pub fn start(socket: &Path, script: Script) -> FakeSidecar {
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let calls = Calls::default();
        let handler = |version| Handler {
            script: Arc::new(script.clone()),
            calls: calls.clone(),
            version,
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(info::info_server::InfoServer::new(handler("info")))
                .add_service(v1alpha1::callbacks_server::CallbacksServer::new(handler(
                    "v1alpha1",
                )))
                .add_service(v1alpha2::callbacks_server::CallbacksServer::new(handler(
                    "v1alpha2",
                )))
                .add_service(v1alpha3::callbacks_server::CallbacksServer::new(handler(
                    "v1alpha3",
                )))
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = stopped.await;
                }),
        );
        FakeSidecar {
            socket: socket.to_owned(),
            calls,
            _stop: stop,
        }
    }

    /// Serves `script` on `<hook_dir>/<dir>/<socket_name>`, creating `<dir>` (virt-controller's
    /// `hook-sidecar-<i>` sub-directory).
    pub fn start_in(hook_dir: &Path, dir: &str, socket_name: &str, script: Script) -> FakeSidecar {
        let sub = hook_dir.join(dir);
        std::fs::create_dir_all(&sub).unwrap();
        FakeSidecar::start(&sub.join(socket_name), script)
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// The names of the methods called so far (`Info`, `OnDefineDomain`, ...), in order.
    pub fn methods(&self) -> Vec<&'static str> {
        self.calls().iter().map(|c| c.method).collect()
    }
}

impl Drop for FakeSidecar {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// A `MutateDomain` script of a [`FakePlugin`]: the domain XML in, the answer (or a gRPC error
/// message) out.
pub type MutateScript = Arc<dyn Fn(&str) -> Result<String, String> + Send + Sync>;

/// One `MutateDomain` call a [`FakePlugin`] received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MutateCall {
    /// `domain_type`.
    pub domain_type: String,
    /// `domain`, as text.
    pub domain: String,
    /// `vmi` (JSON).
    pub vmi: Vec<u8>,
    /// `sidecar_context.invocation_context` (empty without a context).
    pub invocation_context: String,
}

#[derive(Clone)]
struct PluginHandler {
    script: MutateScript,
    delay: std::time::Duration,
    calls: Arc<Mutex<Vec<MutateCall>>>,
}

#[tonic::async_trait]
impl plugins_v1alpha1::domain_hook_service_server::DomainHookService for PluginHandler {
    async fn mutate_domain(
        &self,
        request: Request<plugins_v1alpha1::MutateDomainRequest>,
    ) -> Result<Response<plugins_v1alpha1::MutateDomainResponse>, Status> {
        let r = request.into_inner();
        let domain = String::from_utf8_lossy(&r.domain).into_owned();
        self.calls.lock().unwrap().push(MutateCall {
            domain_type: r.domain_type,
            domain: domain.clone(),
            vmi: r.vmi,
            invocation_context: r
                .sidecar_context
                .map(|c| c.invocation_context)
                .unwrap_or_default(),
        });
        tokio::time::sleep(self.delay).await;
        let answer = (self.script)(&domain).map_err(Status::internal)?;
        Ok(Response::new(plugins_v1alpha1::MutateDomainResponse {
            domain: answer.into_bytes(),
        }))
    }
}

/// A VEP-190 plugin sidecar for tests: KubeVirt's `DomainHookService` (`MutateDomain`) on a unix
/// socket, with a scripted answer, an optional delay before it, and a record of every call.
/// Stops serving (and removes its socket) when dropped.
pub struct FakePlugin {
    /// Its socket.
    pub socket: PathBuf,
    /// The calls it received.
    pub calls: Arc<Mutex<Vec<MutateCall>>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl FakePlugin {
    /// Serves `script` on `<plugin_dir>/<plugin>/<socket_name>` (creating `<plugin>`, KubeVirt's
    /// per-plugin socket directory), answering after `delay`; bound now, served on the current
    /// tokio runtime.
    pub fn start_in(
        plugin_dir: &Path,
        plugin: &str,
        socket_name: &str,
        delay: std::time::Duration,
        script: impl Fn(&str) -> Result<String, String> + Send + Sync + 'static,
    ) -> FakePlugin {
        let sub = plugin_dir.join(plugin);
        std::fs::create_dir_all(&sub).unwrap();
        let socket = sub.join(socket_name);
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let handler = PluginHandler {
            script: Arc::new(script),
            delay,
            calls: calls.clone(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(
                    plugins_v1alpha1::domain_hook_service_server::DomainHookServiceServer::new(
                        handler,
                    ),
                )
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = stopped.await;
                }),
        );
        FakePlugin {
            socket,
            calls,
            _stop: stop,
        }
    }

    /// The calls so far.
    pub fn calls(&self) -> Vec<MutateCall> {
        self.calls.lock().unwrap().clone()
    }
}

impl Drop for FakePlugin {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

//! SyncVMI: the orchestrator behind the command server, KubeVirt's `LibvirtDomainManager.SyncVMI`
//! (`pkg/virt-launcher/virtwrap/manager.go`, v1.9.0) without libvirt.
//!
//! One sync at a time (a `tokio::sync::Mutex`, KubeVirt's `domainModifyLock`). The first sync of a
//! VMI prepares storage (containerDisk overlays at `<ephemeral>/disk-data/<volume>/disk.qcow2`,
//! emptyDisk images, the cloud-init NoCloud or ConfigDrive ISO), sets up the pod network binding in
//! the launcher's own network namespace (bridge, tap, nftables; [`crate::net::apply`]) and starts the
//! DHCP server once, converts the VMI ([`crate::cmdline::convert`]), and starts QEMU with `-S`.
//! Later syncs of the same VMI change nothing; a changed VMI has its hot-pluggable disks attached
//! and detached by diff against the running domain (QMP `blockdev-add`/`device_add`,
//! `device_del`/`blockdev-del`), cdrom media ejected and inserted ([`crate::sync::media`]), and
//! NICs on Multus networks plugged, unplugged and their links set ([`crate::sync::nic_hotplug`]);
//! other changes are not applied by SyncVMI. vCPUs and memory change through their own RPCs
//! ([`crate::sync::resources`]).
//!
//! QEMU start path: QEMU is started with [`crate::monitor::qemu::spawn_detached`] (double fork plus
//! `setsid`), so that it becomes a child of PID 1 of the compute container (the monitor, a child
//! subreaper), where virt-handler looks for it, as libvirt's daemonized QEMU is. It inherits no fds:
//! the QMP monitor is a socket path QEMU binds (`MonitorSocket::Path`) and the tap is opened by
//! name (`TapSource::Ifname`). [`crate::qmp::launch`] is not used because its QEMU is the caller's
//! own child, tied to it by `PR_SET_PDEATHSIG`. After QMP answers, `cont` runs unless
//! `spec.startStrategy` is `Paused`.
//!
//! The domain state follows QMP events through [`crate::qmp::lifecycle::next_status`] and is
//! published as KubeVirt's `api.Domain` with `ADDED` (first sync) and `MODIFIED` (every change)
//! notifications. QEMU runs with `-no-shutdown`, so a guest shutdown leaves it stopped; as libvirt
//! does, the launcher then ends QEMU (`quit`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{watch, Mutex};
use tracing::{info, warn};

use crate::cmdline::context::{
    IfaceFacts, MonitorSocket, PathRoots, QemuVersion, StorageKind, TapSource, VolumeFacts,
};
use crate::cmdline::{convert, render, ConverterContext};
use crate::monitor::grace::{DomainControl, Ending};
use crate::monitor::launcher::Domain as LauncherDomain;
use crate::monitor::MonitorError;
use crate::net::{self, Binding, NetConfig, NetPlan, Port, Protocol};
use crate::qmp::client::QmpClient;
use crate::qmp::lifecycle::{self, DomainStatus, LifecycleInput};
use crate::storage::{
    self, CloudInitData, CloudInitKind, CloudInitSpec, EmptyDiskSpec, OverlaySpec, VmiIdentity,
};
use crate::sync::domain::{
    Alias, Domain, DomainEventType, Interface as DomainIface, LifeCycle, Mac, StateChangeReason,
};
use crate::sync::media;
use crate::sync::nic_hotplug::{self, NicChanges, NicState};
use crate::sync::notify::Notifier;
use crate::sync::proto::cmd::v1::VirtualMachineOptions;
use crate::sync::resources;
use crate::sync::server::{DomainManager, ExecOutput};
use crate::sync::SyncError;
use crate::vmi::Vmi;

#[path = "recover.rs"]
mod recover;

/// How long a guest may take to release an unplugged device (`DEVICE_DELETED`).
pub const HOTPLUG_TIMEOUT: Duration = Duration::from_secs(30);

/// How long QEMU may take to answer on QMP after it was started.
pub const QMP_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything a [`SyncVmi`] needs from the launcher: where KubeVirt's paths are, which QEMU to run,
/// whether KVM is used.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// The converter's path roots (every KubeVirt path the VMI's devices use).
    pub paths: PathRoots,
    /// The QEMU binary (`qemu-system-x86_64`, looked up in `PATH` when relative).
    pub qemu: PathBuf,
    /// QEMU's version (chooses renderer details).
    pub qemu_version: QemuVersion,
    /// Use KVM.
    pub kvm: bool,
    /// `--allow-emulation`: TCG when KVM is not used.
    pub allow_emulation: bool,
    /// The pod's resolv.conf (`/etc/resolv.conf`), read for the DHCP server's DNS options.
    pub resolv_conf: PathBuf,
    /// Where QEMU binds its QMP socket.
    pub qmp_socket: PathBuf,
    /// A second QMP monitor socket for an operator's tools (`qlauncher qmp`, `qlauncher
    /// hotplug`), or None. QEMU serves one client per monitor and the launcher holds
    /// [`SyncConfig::qmp_socket`] for the domain's lifetime, so those tools need their own.
    /// `qlauncher run` sets it; a pod's launcher does not (KubeVirt's QEMU has only libvirt's).
    pub operator_qmp_socket: Option<PathBuf>,
    /// QEMU's stdout and stderr (appended).
    pub qemu_log: PathBuf,
    /// The uid QEMU's files and tap belong to (107 non-root, 0 root).
    pub runtime_uid: u32,
}

impl SyncConfig {
    /// KubeVirt's paths under `root` (`/` in a pod): `<root>/var/run/kubevirt-private`, ...;
    /// QMP socket `<private>/qlauncher/monitor.sock`, QEMU log `<private>/qlauncher/qemu.log`.
    pub fn under_root(root: &Path) -> SyncConfig {
        let r = |p: &str| root.join(p.trim_start_matches('/')).display().to_string();
        let d = PathRoots::default();
        let paths = PathRoots {
            private_dir: r(&d.private_dir),
            ephemeral_disks: r(&d.ephemeral_disks),
            container_disks: r(&d.container_disks),
            hotplug_disks: r(&d.hotplug_disks),
            empty_disks: r(&d.empty_disks),
            cloud_init: r(&d.cloud_init),
            dev: r(&d.dev),
            nvram: r(&d.nvram),
            virtiofs: r(&d.virtiofs),
        };
        let private = PathBuf::from(&paths.private_dir).join("qlauncher");
        SyncConfig {
            paths,
            qemu: "qemu-system-x86_64".into(),
            qemu_version: QemuVersion { major: 7, minor: 2 },
            kvm: false,
            allow_emulation: true,
            resolv_conf: "/etc/resolv.conf".into(),
            qmp_socket: private.join("monitor.sock"),
            operator_qmp_socket: None,
            qemu_log: private.join("qemu.log"),
            runtime_uid: if nix::unistd::geteuid().is_root() {
                0
            } else {
                107
            },
        }
    }
}

/// The running domain and what was set up for it.
struct Running {
    /// The VMI as last synced (`spec` compared on the next sync).
    spec: serde_json::Value,
    /// The converter context of the running domain (hotplug conversions reuse it).
    ctx: ConverterContext,
    /// The hot-pluggable disks present, by device id.
    disks: BTreeMap<String, render::DiskHotplug>,
    /// NICs plugged by diff and link states.
    nics: NicState,
    /// The media of the cdrom drives (not hot-pluggable), by device id, bottom node first.
    cdroms: BTreeMap<String, Vec<serde_json::Value>>,
    /// Boot memory, maxGuest and the virtio-mem request.
    memory: resources::MemoryState,
    /// The next free `libvirt-<N>-` block node index (libvirt numbers nodes per domain, never
    /// reusing one; the converter numbers them per plan, so hotplugged disks are renumbered).
    next_node: u32,
    /// Stops the DHCP servers.
    _dhcp_stop: watch::Sender<bool>,
}

/// State shared with the event task.
struct Shared {
    domain: StdMutex<Option<Domain>>,
    status: StdMutex<DomainStatus>,
    notifier: Option<Notifier>,
    graceful: AtomicBool,
    pid: watch::Sender<Option<i32>>,
    client: StdMutex<Option<QmpClient>>,
}

impl Shared {
    /// Applies a lifecycle input, updates the `api.Domain` and notifies MODIFIED on change.
    fn apply(&self, input: &LifecycleInput) -> DomainStatus {
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        // The `quit` that ends QEMU after a guest shutdown emits a second SHUTDOWN (host origin);
        // the first origin names the final reason.
        if let LifecycleInput::Event(ev) = input {
            if ev.name == "SHUTDOWN" && status.shutdown.is_some() {
                return *status;
            }
        }
        let next = lifecycle::next_status(*status, input);
        let changed = (next.state, next.reason) != (status.state, status.reason);
        *status = next;
        if changed {
            self.publish(next, DomainEventType::Modified);
        }
        next
    }

    /// Puts the guest agent's interfaces in the domain status and notifies MODIFIED (KubeVirt's
    /// agent-updated event).
    fn set_guest_interfaces(&self, list: Vec<crate::sync::domain::InterfaceStatus>) {
        {
            let mut domain = self.domain.lock().unwrap_or_else(|e| e.into_inner());
            let Some(d) = domain.as_mut() else { return };
            d.status.interfaces = list;
        }
        let status = *self.status.lock().unwrap_or_else(|e| e.into_inner());
        self.publish(status, DomainEventType::Modified);
    }

    fn publish(&self, status: DomainStatus, event: DomainEventType) {
        let mut domain = self.domain.lock().unwrap_or_else(|e| e.into_inner());
        let Some(d) = domain.as_mut() else { return };
        let (state, reason) = kubevirt_state(status);
        d.set_state(state, reason);
        if let Some(n) = &self.notifier {
            if let Err(e) = n.send(event, d) {
                warn!(
                    error = &e as &dyn std::error::Error,
                    "cannot queue a domain event"
                );
            }
        }
    }
}

/// Maps the QMP lifecycle status to `api.LifeCycle` and `api.StateChangeReason` (same names).
fn kubevirt_state(s: DomainStatus) -> (LifeCycle, StateChangeReason) {
    let state = serde_json::from_value(serde_json::Value::String(s.state.as_str().into()))
        .unwrap_or(LifeCycle::NoState);
    let reason = serde_json::from_value(serde_json::Value::String(s.reason.as_str().into()))
        .unwrap_or(StateChangeReason::Unknown);
    (state, reason)
}

/// KubeVirt's SyncVMI over QEMU: implements the command server's [`DomainManager`] and the
/// launcher's [`LauncherDomain`].
pub struct SyncVmi {
    config: SyncConfig,
    running: Mutex<Option<Running>>,
    shared: Arc<Shared>,
    /// Guest agent, stats names and start timings ([`crate::sync::info`]).
    info: crate::sync::info::DomainInfo,
}

impl std::fmt::Debug for SyncVmi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncVmi")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SyncVmi {
    /// A manager with no domain yet; `notifier` receives the domain events (none: not reported).
    pub fn new(config: SyncConfig, notifier: Option<Notifier>) -> SyncVmi {
        let (pid, _) = watch::channel(None);
        SyncVmi {
            config,
            running: Mutex::new(None),
            shared: Arc::new(Shared {
                domain: StdMutex::new(None),
                status: StdMutex::new(DomainStatus::default()),
                notifier,
                graceful: AtomicBool::new(false),
                pid,
                client: StdMutex::new(None),
            }),
            info: crate::sync::info::DomainInfo::default(),
        }
    }

    /// How long the first sync took, split by step (`None` before QEMU runs).
    pub fn start_timings(&self) -> Option<crate::sync::info::StartTimings> {
        self.info.timings()
    }

    /// The current domain (`None` before the first sync).
    pub fn domain(&self) -> Option<Domain> {
        self.shared
            .domain
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The QEMU pid once started.
    pub fn qemu_pid(&self) -> Option<i32> {
        *self.shared.pid.borrow()
    }

    /// Sends KubeVirt's final notification (domain deleted) and waits up to `wait` for its
    /// delivery. Without a notifier, does nothing.
    pub async fn final_notify(&self, wait: Duration) {
        let Some(n) = &self.shared.notifier else {
            return;
        };
        // The event task records QEMU's exit as Shutoff first (it watches the same exit).
        for _ in 0..40 {
            let state = self
                .shared
                .status
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .state;
            if state == lifecycle::DomainState::Shutoff {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let Some(d) = self.domain() else { return };
        match n.send_final_delete(&d, std::time::SystemTime::now()) {
            Ok(delivery) => {
                if tokio::time::timeout(wait, delivery).await.is_err() {
                    warn!("final notification not delivered in time");
                }
            }
            Err(e) => warn!(
                error = &e as &dyn std::error::Error,
                "cannot queue the final notification"
            ),
        }
    }

    /// Starts the guest agent's interface poll of the domain just started or adopted; changes
    /// land in the domain status with a MODIFIED event ([`crate::sync::info`]).
    fn start_agent_poll(&self) {
        let Ok(client) = self.client() else { return };
        let shared = self.shared.clone();
        self.info.start_interface_poller(
            client,
            Arc::new(move |list| shared.set_guest_interfaces(list)),
        );
    }

    fn client(&self) -> Result<QmpClient, SyncError> {
        self.shared
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(SyncError::NoDomain)
    }

    async fn sync(&self, mut vmi: Vmi) -> Result<(), SyncError> {
        let cfg = crate::vmi::DefaultsConfig::for_vmi(&vmi);
        vmi.apply_defaults(&cfg);
        if let Err(errors) = vmi.validate() {
            let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            return Err(SyncError::InvalidVmi(text.join("; ")));
        }
        let volume_status = vmi.status.as_ref().map(|s| &s.volume_status);
        let spec = serde_json::to_value((&vmi.spec, volume_status, nic_hotplug::status_key(&vmi)))
            .map_err(SyncError::EncodeDomain)?;
        let mut running = self.running.lock().await;
        if let Some(r) = running.as_mut() {
            if r.spec == spec {
                info!("domain is up to date");
            } else {
                self.hotplug(r, &vmi).await?;
                r.spec = spec;
            }
            return Ok(());
        }
        let r = self.start(&vmi, spec).await?;
        *running = Some(r);
        Ok(())
    }

    async fn start(&self, vmi: &Vmi, spec: serde_json::Value) -> Result<Running, SyncError> {
        let name = vmi.metadata.name.clone().unwrap_or_default();
        let namespace = vmi
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let uid = vmi.metadata.uid.clone().unwrap_or_default();
        let mut domain = Domain::for_vmi(&namespace, &name, &uid);

        let t0 = std::time::Instant::now();
        let mut ctx = ConverterContext {
            qemu: self.config.qemu_version,
            kvm: self.config.kvm,
            allow_emulation: self.config.allow_emulation,
            paths: self.config.paths.clone(),
            monitor: MonitorSocket::Path(self.config.qmp_socket.display().to_string()),
            runtime_uid: self.config.runtime_uid,
            now_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0),
            ..ConverterContext::default()
        };

        // Storage (blocking file work on a blocking thread).
        let storage_vmi = vmi.clone();
        let paths = self.config.paths.clone();
        let owner = (self.config.runtime_uid != 0).then_some(storage::Owner::QEMU);
        ctx.volumes = tokio::task::spawn_blocking(move || {
            prepare_storage(&storage_vmi, &paths, owner, &name, &namespace)
        })
        .await
        .map_err(|e| SyncError::Task(e.to_string()))??;

        let t_storage = t0.elapsed();
        // Network, in this (the pod's) network namespace.
        let (dhcp_stop, dhcp_rx) = watch::channel(false);
        for (index, (iface, cfg)) in net_configs(vmi, self.config.runtime_uid)?
            .into_iter()
            .enumerate()
        {
            let plan = self.setup_network(&cfg, dhcp_rx.clone()).await?;
            let mac = format_mac(plan.guest_mac);
            domain.spec.devices.interfaces.push(DomainIface {
                interface_type: "ethernet".into(),
                mac: Some(Mac { mac: mac.clone() }),
                alias: Some(Alias::user_defined(&iface)),
            });
            let _ = index;
            ctx.interfaces.insert(
                iface,
                IfaceFacts {
                    mac: Some(mac),
                    mtu: Some(plan.mtu),
                    tap: TapSource::Ifname(plan.tap.clone()),
                },
            );
        }

        let secondary = nic_hotplug::secondary_ifaces(vmi, self.config.runtime_uid)?;
        let mut nics = NicState::default();
        for (iface, mac, facts) in nics
            .setup_at_boot(&secondary, &self.config.resolv_conf)
            .await?
        {
            domain.spec.devices.interfaces.push(DomainIface {
                interface_type: "ethernet".into(),
                mac: Some(Mac { mac }),
                alias: Some(Alias::user_defined(&iface)),
            });
            ctx.interfaces.insert(iface, facts);
        }

        let t_network = t0.elapsed();
        add_hotplug_facts(vmi, &mut ctx)?;
        add_hardware_facts(vmi, &mut ctx);
        let plan = convert(&nic_hotplug::convert_view(vmi, &secondary), &ctx)
            .map_err(SyncError::Convert)?;
        // Refuse before QEMU starts when host hardware the VMI asks for is not here.
        if let Some(m) = plan.missing_hardware().into_iter().next() {
            return Err(SyncError::Convert(crate::cmdline::ConvertError::missing(
                m.path, m.reason,
            )));
        }
        nics.started(&plan);
        self.info.remember_plan(&plan, &ctx);
        let qmp_plan = render::qmp_plan(&plan);
        let disks = qmp_plan
            .disks
            .iter()
            .map(|d| (d.id.clone(), d.clone()))
            .collect();
        domain.spec.uuid = plan.uuid.clone();
        domain.spec.domain_type = "kvm".into();
        let mut argv = render::argv(&plan);
        if let Some(p) = &self.config.operator_qmp_socket {
            // QEMU's option syntax: a comma in a value is written twice.
            let path = p.display().to_string().replace(',', ",,");
            argv.push("-qmp".into());
            argv.push(format!("unix:{path},server=on,wait=off"));
        }
        let next_node = argv
            .iter()
            .flat_map(|w| node_indices(w))
            .max()
            .map_or(1, |n| n + 1);

        let t_convert = t0.elapsed();
        // QEMU, detached so that it is a child of PID 1.
        let qmp = self.config.qmp_socket.clone();
        for dir in [qmp.parent(), self.config.qemu_log.parent()]
            .into_iter()
            .flatten()
        {
            std::fs::create_dir_all(dir).map_err(|source| SyncError::PrepareQemu {
                what: format!("create {}", dir.display()),
                source,
            })?;
        }
        if let Some(dir) = qmp.parent() {
            super::privileges::prepare_socket_dir(dir, self.config.runtime_uid).map_err(
                |source| SyncError::PrepareQemu {
                    what: format!("give {} to the runtime user", dir.display()),
                    source,
                },
            )?;
        }
        // A QEMU left by an earlier launcher of this pod is adopted or replaced (`recover`).
        if let Some(found) = recover::find(&qmp, &plan.uuid).await {
            // What the plan says the adopted QEMU was started with; devices hot-plugged into it
            // since (NICs, virtio-mem, cdrom media) are re-applied by the next diff.
            let running = Running {
                spec,
                ctx,
                disks,
                next_node,
                _dhcp_stop: dhcp_stop,
                nics,
                memory: resources::MemoryState::at_boot(&plan),
                cdroms: media::cdroms(&plan),
            };
            let running = self.adopt(found, vmi, domain, running).await?;
            self.start_agent_poll();
            return Ok(running);
        }
        if qmp.exists() {
            let _ = std::fs::remove_file(&qmp);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.config.qemu_log)
            .map_err(|source| SyncError::PrepareQemu {
                what: format!("open {}", self.config.qemu_log.display()),
                source,
            })?;
        let log_err = log.try_clone().map_err(|source| SyncError::PrepareQemu {
            what: "duplicate the log fd".into(),
            source,
        })?;
        let mut command = std::process::Command::new(&self.config.qemu);
        command
            .args(&argv)
            .env_clear()
            .envs(plan.env.iter().cloned())
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log_err);
        if let Ok(p) = std::env::var("PATH") {
            command.env("PATH", p);
        }
        super::privileges::confine_qemu(&mut command, self.config.runtime_uid);
        let detached =
            crate::monitor::qemu::spawn_detached(command).map_err(SyncError::StartQemu)?;
        let pid = detached.pid;
        info!(pid, "QEMU started");
        let watcher = crate::monitor::qemu::Qemu::from_pid(pid).map_err(SyncError::StartQemu)?;
        let client = {
            let connect = connect_retry(&qmp, QMP_CONNECT_TIMEOUT);
            tokio::pin!(connect);
            tokio::select! {
                c = &mut connect => c?,
                _ = watcher.exited() => {
                    return Err(SyncError::QemuExitedEarly {
                        log_tail: log_tail(&self.config.qemu_log),
                    })
                }
            }
        };
        let events = client.events();
        let (_, initial) = lifecycle::query_status(&client)
            .await
            .map_err(SyncError::Qmp)?;
        *self.shared.status.lock().unwrap_or_else(|e| e.into_inner()) = initial;
        *self.shared.domain.lock().unwrap_or_else(|e| e.into_inner()) = Some(domain);
        *self.shared.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client.clone());
        self.shared.publish(initial, DomainEventType::Added);
        self.start_agent_poll();
        tokio::spawn(follow_events(
            self.shared.clone(),
            events,
            client.clone(),
            watcher,
        ));
        for step in &qmp_plan.startup {
            client
                .execute(step.execute, Some(step.arguments.clone()))
                .await
                .map_err(SyncError::Qmp)?;
        }
        let paused = vmi.spec.start_strategy.as_deref() == Some("Paused");
        if !paused {
            client.execute("cont", None).await.map_err(SyncError::Qmp)?;
        }
        let t_running = t0.elapsed();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        info!(
            storage_ms = ms(t_storage),
            network_ms = ms(t_network - t_storage),
            convert_ms = ms(t_convert - t_network),
            qemu_ms = ms(t_running - t_convert),
            total_ms = ms(t_running),
            "domain started (sync received to cont acknowledged)"
        );
        self.info
            .set_timings(t_storage, t_network, t_convert, t_running);
        self.shared.pid.send_replace(Some(pid));
        Ok(Running {
            spec,
            ctx,
            nics,
            memory: resources::MemoryState::at_boot(&plan),
            cdroms: media::cdroms(&plan),
            disks,
            next_node,
            _dhcp_stop: dhcp_stop,
        })
    }

    /// Applies the difference between the running domain and `vmi`: hot-pluggable disks that
    /// appeared are attached, those that disappeared detached (KubeVirt's `hotPlugHostDevices` /
    /// `syncDisks` in `manager.go`); then NICs on Multus networks are plugged and unplugged and
    /// link states set ([`nic_hotplug`], KubeVirt's `network.Sync`). Other changes are logged
    /// and left for a restart.
    async fn hotplug(&self, running: &mut Running, vmi: &Vmi) -> Result<(), SyncError> {
        let client = self.client()?;
        let mut ctx = running.ctx.clone();
        add_hotplug_facts(vmi, &mut ctx)?;
        let secondary = nic_hotplug::secondary_ifaces(vmi, self.config.runtime_uid)?;
        running
            .nics
            .prepare(&secondary, &mut ctx, &self.config.resolv_conf)
            .await?;
        let plan = convert(&nic_hotplug::convert_view(vmi, &secondary), &ctx)
            .map_err(SyncError::Convert)?;
        let qmp_plan = render::qmp_plan(&plan);
        let wanted: BTreeMap<String, render::DiskHotplug> = qmp_plan
            .disks
            .iter()
            .map(|d| (d.id.clone(), d.clone()))
            .collect();
        let gone: Vec<String> = running
            .disks
            .keys()
            .filter(|id| !wanted.contains_key(*id))
            .cloned()
            .collect();
        for id in gone {
            let Some(d) = running.disks.get(&id) else {
                continue;
            };
            let detach = crate::qmp::hotplug::DiskDetach {
                device_id: id.clone(),
                node_names: d
                    .blockdev_del
                    .iter()
                    .filter_map(|v| v["node-name"].as_str().map(String::from))
                    .collect(),
            };
            crate::qmp::hotplug::detach_disk(&client, &detach, HOTPLUG_TIMEOUT)
                .await
                .map_err(SyncError::Qmp)?;
            info!(device = %id, "disk detached");
            running.disks.remove(&id);
        }
        for (id, d) in wanted {
            if running.disks.contains_key(&id) {
                continue;
            }
            let mut d = renumber_nodes(&d, &mut running.next_node)?;
            // The re-plan may place the disk on a port in use; take a free root port instead.
            if d.device["bus"]
                .as_str()
                .is_some_and(|b| b.starts_with("pci."))
            {
                let ports = crate::qmp::hotplug::free_root_ports(&client)
                    .await
                    .map_err(SyncError::Qmp)?;
                let port = ports.first().ok_or_else(|| {
                    SyncError::Unsupported(format!("hotplug of {id}: no free PCIe root port"))
                })?;
                d.device["bus"] = port.clone().into();
                d.device["addr"] = "0x0".into();
            }
            let attach = crate::qmp::hotplug::DiskAttach {
                blockdevs: d.blockdevs.clone(),
                device: d.device.clone(),
            };
            crate::qmp::hotplug::attach_disk(&client, &attach)
                .await
                .map_err(SyncError::Qmp)?;
            info!(device = %id, "disk attached");
            running.disks.insert(id, d);
        }
        self.change_media(running, &plan).await?;
        crate::sync::resize::grow_disks(&client, vmi, &plan).await;
        let nics = running
            .nics
            .apply(&client, &plan, &qmp_plan.nics, &secondary, HOTPLUG_TIMEOUT)
            .await;
        running.ctx = ctx;
        self.publish_nic_changes(&nics?);
        Ok(())
    }

    /// The converter's plan of `vmi` (defaults applied, validated) against the running domain's
    /// facts: the vCPU and memory sizes a CPU or memory sync aims at.
    fn resource_plan(
        &self,
        running: &Running,
        mut vmi: Vmi,
    ) -> Result<crate::cmdline::DomainPlan, SyncError> {
        let cfg = crate::vmi::DefaultsConfig::for_vmi(&vmi);
        vmi.apply_defaults(&cfg);
        if let Err(errors) = vmi.validate() {
            let text: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
            return Err(SyncError::InvalidVmi(text.join("; ")));
        }
        let mut ctx = running.ctx.clone();
        add_hotplug_facts(&vmi, &mut ctx)?;
        let secondary = nic_hotplug::secondary_ifaces(&vmi, self.config.runtime_uid)?;
        let pending: Vec<nic_hotplug::SecondaryIface> = secondary
            .into_iter()
            .filter(|s| !ctx.interfaces.contains_key(&s.name))
            .map(|s| nic_hotplug::SecondaryIface { ready: false, ..s })
            .collect();
        convert(&nic_hotplug::convert_view(&vmi, &pending), &ctx).map_err(SyncError::Convert)
    }

    /// Inserts, changes or ejects the media of the domain's cdrom drives as `plan` has them
    /// ([`media`]). A drive the new plan lacks (its hotplug volume went away) is ejected.
    async fn change_media(
        &self,
        running: &mut Running,
        plan: &crate::cmdline::DomainPlan,
    ) -> Result<(), SyncError> {
        let client = self.client()?;
        let mut wanted = media::cdroms(plan);
        for (id, current) in running.cdroms.iter_mut() {
            let new = wanted.remove(id).unwrap_or_default();
            if media::same_medium(current, &new) {
                continue;
            }
            let carrier = render::DiskHotplug {
                name: String::new(),
                id: id.clone(),
                target: None,
                blockdevs: new,
                device: serde_json::Value::Null,
                device_del: serde_json::Value::Null,
                blockdev_del: vec![],
            };
            let new = renumber_nodes(&carrier, &mut running.next_node)?.blockdevs;
            let change = crate::qmp::hotplug::CdromChange {
                device_id: id.clone(),
                old_node_names: media::node_names_top_first(current),
                new_blockdevs: new.clone(),
            };
            crate::qmp::hotplug::change_cdrom(&client, &change)
                .await
                .map_err(SyncError::Qmp)?;
            info!(device = %id, inserted = !new.is_empty(), "cdrom medium changed");
            *current = new;
        }
        Ok(())
    }

    /// Records plugged and unplugged NICs in the domain's interfaces and notifies MODIFIED, as
    /// libvirt's device-added/removed events make KubeVirt do.
    fn publish_nic_changes(&self, changes: &NicChanges) {
        if changes.added.is_empty() && changes.removed.is_empty() {
            return;
        }
        {
            let mut domain = self.shared.domain.lock().unwrap_or_else(|e| e.into_inner());
            let Some(d) = domain.as_mut() else { return };
            let ifaces = &mut d.spec.devices.interfaces;
            ifaces.retain(|i| {
                !changes
                    .removed
                    .iter()
                    .any(|n| i.alias.as_ref() == Some(&Alias::user_defined(n)))
            });
            for (name, mac) in &changes.added {
                ifaces.push(DomainIface {
                    interface_type: "ethernet".into(),
                    mac: Some(Mac { mac: mac.clone() }),
                    alias: Some(Alias::user_defined(name)),
                });
            }
        }
        let status = *self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
        self.shared.publish(status, DomainEventType::Modified);
    }

    async fn setup_network(
        &self,
        cfg: &NetConfig,
        stop: watch::Receiver<bool>,
    ) -> Result<NetPlan, SyncError> {
        let (handle, conn) = net::apply::connect().await.map_err(SyncError::Net)?;
        let facts = net::discover(&handle, &cfg.pod_iface, &self.config.resolv_conf).await;
        conn.abort();
        let facts = facts.map_err(SyncError::Net)?;
        let plan = net::plan(cfg, &facts).map_err(SyncError::Net)?;
        net::apply(&plan).await.map_err(SyncError::Net)?;
        nic_hotplug::serve_dhcp(&plan, stop)?;
        info!(iface = %cfg.pod_iface, tap = %plan.tap, "pod network ready");
        Ok(plan)
    }
}

/// Follows QMP events until QEMU is gone: state changes, `quit` after a shutdown (QEMU runs with
/// `-no-shutdown`), and the final Shutoff.
async fn follow_events(
    shared: Arc<Shared>,
    mut events: crate::qmp::client::EventStream,
    client: QmpClient,
    qemu: crate::monitor::qemu::Qemu,
) {
    loop {
        tokio::select! {
            ev = events.recv() => {
                let Some(ev) = ev else { break };
                let is_shutdown = ev.name == "SHUTDOWN";
                shared.apply(&LifecycleInput::Event(ev));
                if is_shutdown {
                    // libvirt ends a QEMU whose guest shut down (qemuProcessShutdownOrReboot).
                    let c = client.clone();
                    tokio::spawn(async move { let _ = c.execute("quit", None).await; });
                }
            }
            _ = qemu.exited() => break,
        }
    }
    qemu.exited().await;
    info!(pid = qemu.pid(), "QEMU exited");
    shared.apply(&LifecycleInput::QemuExited);
}

async fn connect_retry(path: &Path, timeout: Duration) -> Result<QmpClient, SyncError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match QmpClient::connect(path, timeout).await {
            Ok(c) => return Ok(c),
            Err(e) => {
                if tokio::time::Instant::now() >= deadline {
                    return Err(SyncError::Qmp(e));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// `aa:bb:cc:dd:ee:ff`.
pub(crate) fn format_mac(mac: [u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Overlays, empty disks, the cloud-init ISO, config-volume ISOs, hostDisks and PVCs of `vmi`
/// ([`crate::sync::volumes`]); returns the converter's volume facts.
fn prepare_storage(
    vmi: &Vmi,
    paths: &PathRoots,
    owner: Option<storage::Owner>,
    name: &str,
    namespace: &str,
) -> Result<BTreeMap<String, VolumeFacts>, SyncError> {
    let mut facts = BTreeMap::new();
    let ephemeral = PathBuf::from(&paths.ephemeral_disks);
    let mut cloud_init_done = false;
    for (index, vol) in vmi.spec.volumes.iter().flatten().enumerate() {
        if vol.container_disk.is_some() {
            let base = PathBuf::from(&paths.container_disks).join(format!("disk_{index}.img"));
            let mut spec = OverlaySpec::at_kubevirt_path(&vol.name, &base, &ephemeral);
            spec.owner = owner;
            let (outcome, base_facts) =
                storage::create_overlay(&spec).map_err(SyncError::Storage)?;
            let base_facts = match base_facts {
                Some(f) => f,
                None => storage::probe_image(&vol.name, &base, &spec.policy)
                    .map_err(SyncError::Storage)?,
            };
            info!(volume = %vol.name, ?outcome, overlay = %spec.overlay.display(), "containerDisk overlay");
            facts.insert(
                vol.name.clone(),
                VolumeFacts {
                    kind: StorageKind::File,
                    format: base_facts.format,
                    virtual_size: Some(base_facts.virtual_size),
                    direct_io: false,
                    preallocated: false,
                },
            );
        } else if let Some(e) = &vol.empty_disk {
            let capacity = e
                .capacity
                .as_ref()
                .map(|q| q.to_bytes())
                .transpose()
                .map_err(|err| SyncError::InvalidVmi(format!("volume {}: {err}", vol.name)))?
                .unwrap_or(0);
            let mut spec =
                EmptyDiskSpec::at_kubevirt_path(&vol.name, capacity, Path::new(&paths.empty_disks));
            spec.owner = owner;
            let (outcome, size) = storage::create_empty_disk(&spec).map_err(SyncError::Storage)?;
            info!(volume = %vol.name, ?outcome, size, "emptyDisk");
            facts.insert(
                vol.name.clone(),
                VolumeFacts {
                    format: storage::ImageFormat::Qcow2,
                    virtual_size: Some(size),
                    ..VolumeFacts::default()
                },
            );
        } else if let Some((kind, src)) = vol
            .cloud_init_no_cloud
            .as_ref()
            .map(|s| (CloudInitKind::NoCloud, s))
            .or_else(|| {
                vol.cloud_init_config_drive
                    .as_ref()
                    .map(|s| (CloudInitKind::ConfigDrive, s))
            })
        {
            if cloud_init_done {
                continue;
            }
            cloud_init_done = true;
            let spec = CloudInitSpec {
                volume: vol.name.clone(),
                kind: Some(kind),
                user_data: src.user_data.clone(),
                user_data_base64: src.user_data_base64.clone(),
                user_data_secret_ref: src.user_data_secret_ref.as_ref().map(|r| r.name.clone()),
                network_data: src.network_data.clone(),
                network_data_base64: src.network_data_base64.clone(),
                network_data_secret_ref: src
                    .network_data_secret_ref
                    .as_ref()
                    .map(|r| r.name.clone()),
            };
            let identity = VmiIdentity {
                name: name.to_string(),
                namespace: namespace.to_string(),
                hostname: vmi.spec.hostname.clone(),
                // NoCloud's instance-id (KubeVirt: the firmware UUID, stable for a VM's VMIs).
                firmware_uuid: vmi
                    .spec
                    .domain
                    .firmware
                    .as_ref()
                    .and_then(|f| f.uuid.clone()),
                ..VmiIdentity::default()
            };
            let secret_dir = PathBuf::from(&paths.private_dir).join("secret");
            let data = CloudInitData::resolve(&spec, &identity, &secret_dir)
                .map_err(SyncError::Storage)?;
            let iso = storage::cloud_init::cloud_init_iso_path(&ephemeral, &identity, kind)
                .map_err(SyncError::Storage)?;
            if let Some(dir) = iso.parent() {
                std::fs::create_dir_all(dir).map_err(|source| SyncError::PrepareQemu {
                    what: format!("create {}", dir.display()),
                    source,
                })?;
            }
            storage::write_cloud_init_iso(&data, &iso, owner).map_err(SyncError::Storage)?;
            info!(volume = %vol.name, iso = %iso.display(), "cloud-init ISO");
            facts.insert(vol.name.clone(), VolumeFacts::default());
        } else if let Some(f) = crate::sync::volumes::prepare(vmi, vol, paths, owner)? {
            facts.insert(vol.name.clone(), f);
        }
    }
    Ok(facts)
}

/// The `N` of every `libvirt-N-` node name in `text`.
fn node_indices(text: &str) -> Vec<u32> {
    text.split("libvirt-")
        .skip(1)
        .filter_map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let after = rest[digits.len()..].starts_with('-');
            (after && !digits.is_empty())
                .then(|| digits.parse().ok())
                .flatten()
        })
        .collect()
}

/// `disk` with each of its `libvirt-N-` node indices replaced by a fresh one from `next`.
fn renumber_nodes(
    disk: &render::DiskHotplug,
    next: &mut u32,
) -> Result<render::DiskHotplug, SyncError> {
    let mut json = serde_json::to_string(&(&disk.blockdevs, &disk.device, &disk.blockdev_del))
        .map_err(SyncError::EncodeDomain)?;
    let mut old: Vec<u32> = node_indices(&json);
    old.sort_unstable();
    old.dedup();
    for k in old {
        json = json.replace(&format!("\"libvirt-{k}-"), &format!("\"qlnode-{next}-"));
        *next += 1;
    }
    let json = json.replace("\"qlnode-", "\"libvirt-");
    let (blockdevs, device, blockdev_del) =
        serde_json::from_str(&json).map_err(SyncError::EncodeDomain)?;
    Ok(render::DiskHotplug {
        blockdevs,
        device,
        blockdev_del,
        ..disk.clone()
    })
}

/// Host hardware facts: VFIO devices from the device plugins' `PCI_RESOURCE_*` variables, and
/// the virtiofsd sockets that exist. SEV and TDX are not probed (yet), so such VMIs are refused.
fn add_hardware_facts(vmi: &Vmi, ctx: &mut ConverterContext) {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    ctx.host_devices = crate::cmdline::context::host_devices_from_env(vmi, &env);
    for fs in vmi
        .spec
        .domain
        .devices
        .filesystems
        .as_deref()
        .unwrap_or_default()
    {
        if Path::new(&ctx.paths.virtiofs)
            .join(format!("{}.sock", fs.name))
            .exists()
        {
            ctx.virtiofs_ready.insert(fs.name.clone());
        }
    }
}

/// Facts of the hotplug volumes (`<hotplug-disks>/<volume>.img`, probed) not yet in `ctx`.
fn add_hotplug_facts(vmi: &Vmi, ctx: &mut ConverterContext) -> Result<(), SyncError> {
    for vol in vmi.spec.volumes.iter().flatten() {
        let hotpluggable = vol
            .persistent_volume_claim
            .as_ref()
            .and_then(|p| p.hotpluggable)
            .or(vol.data_volume.as_ref().and_then(|d| d.hotpluggable))
            .unwrap_or(false);
        if !hotpluggable || ctx.volumes.contains_key(&vol.name) {
            continue;
        }
        storage::validate_volume_name(&vol.name).map_err(SyncError::Storage)?;
        let path = PathBuf::from(&ctx.paths.hotplug_disks).join(format!("{}.img", vol.name));
        if !path.exists() {
            continue;
        }
        let facts = storage::probe_image(&vol.name, &path, &storage::ChainPolicy::default())
            .map_err(SyncError::Storage)?;
        ctx.volumes.insert(
            vol.name.clone(),
            VolumeFacts {
                format: facts.format,
                virtual_size: Some(facts.virtual_size),
                ..VolumeFacts::default()
            },
        );
    }
    Ok(())
}

/// The network setup of each VMI interface bound to the pod network (masquerade or bridge).
fn net_configs(vmi: &Vmi, runtime_uid: u32) -> Result<Vec<(String, NetConfig)>, SyncError> {
    let mut out = Vec::new();
    let hostname = storage::cloud_init::vmi_hostname(
        vmi.metadata.name.as_deref().unwrap_or_default(),
        vmi.spec.hostname.as_deref(),
    );
    for iface in vmi.spec.domain.devices.interfaces.iter().flatten() {
        let Some(network) = vmi.network(&iface.name) else {
            continue;
        };
        if network.multus.is_some() {
            // Secondary networks: `nic_hotplug`.
            continue;
        }
        if network.pod.is_none() {
            warn!(interface = %iface.name, "only pod and Multus networks are set up; interface skipped");
            continue;
        }
        let binding = if iface.masquerade.is_some() {
            Binding::Masquerade
        } else if iface.bridge.is_some() {
            Binding::Bridge
        } else {
            warn!(interface = %iface.name, "binding not supported; interface skipped");
            continue;
        };
        let mut ports = Vec::new();
        for (i, p) in iface.ports.iter().flatten().enumerate() {
            let field = || format!("spec.domain.devices.interfaces[{}].ports[{i}]", iface.name);
            let protocol = Protocol::parse(p.protocol.as_deref().unwrap_or(""))
                .ok_or_else(|| SyncError::InvalidVmi(format!("{}: bad protocol", field())))?;
            let port = u16::try_from(p.port)
                .map_err(|_| SyncError::InvalidVmi(format!("{}: bad port", field())))?;
            ports.push(Port { protocol, port });
        }
        let mac = match iface.mac_address.as_deref() {
            Some(m) => Some(parse_mac(m).ok_or_else(|| {
                SyncError::InvalidVmi(format!("interface {}: bad macAddress {m:?}", iface.name))
            })?),
            None => None,
        };
        out.push((
            iface.name.clone(),
            NetConfig {
                binding,
                pod_iface: "eth0".into(),
                ports,
                mac,
                runtime_uid,
                hostname: hostname.clone(),
                subdomain: vmi.spec.subdomain.clone(),
                ..NetConfig::default()
            },
        ));
        // Only the primary pod interface exists in a pod without Multus.
        break;
    }
    Ok(out)
}

pub(crate) fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (b, p) in mac.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

impl DomainControl for SyncVmi {
    fn mark_graceful_shutdown(&self) {
        self.shared.graceful.store(true, Ordering::SeqCst);
        let mut domain = self.shared.domain.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = domain.as_mut() {
            let gp = d
                .spec
                .metadata
                .kubevirt
                .grace_period
                .get_or_insert_with(Default::default);
            gp.marked_for_graceful_shutdown = Some(true);
        }
    }

    async fn power_button(&self) -> Result<(), MonitorError> {
        let client = self.client().map_err(|e| MonitorError::QemuExited {
            reason: e.to_string(),
        })?;
        lifecycle::powerdown(&client)
            .await
            .map_err(|e| MonitorError::PowerButton(std::io::Error::other(e.to_string())))
    }
}

impl LauncherDomain for SyncVmi {
    async fn started(&self) -> Result<i32, MonitorError> {
        let mut rx = self.shared.pid.subscribe();
        let pid = match rx.wait_for(|p| p.is_some()).await {
            Ok(p) => *p,
            Err(_) => None,
        };
        match pid {
            Some(pid) => Ok(pid),
            None => std::future::pending().await,
        }
    }

    fn check_exit(&self, ending: Ending) -> Result<(), MonitorError> {
        if ending != Ending::ExitedOnItsOwn || self.shared.graceful.load(Ordering::SeqCst) {
            return Ok(());
        }
        // Let the event task see the exit.
        std::thread::sleep(Duration::from_millis(200));
        let status = *self.shared.status.lock().unwrap_or_else(|e| e.into_inner());
        match status.shutdown {
            Some(lifecycle::ShutdownOrigin::Guest) | Some(lifecycle::ShutdownOrigin::Host) => {
                Ok(())
            }
            _ => Err(MonitorError::QemuExited {
                reason: format!(
                    "QEMU exited without a shutdown request: {}",
                    log_tail(&self.config.qemu_log)
                ),
            }),
        }
    }
}

fn decode_failed(what: &str) -> SyncError {
    SyncError::Unsupported(what.to_string())
}

impl DomainManager for SyncVmi {
    type Vmi = Vmi;
    type Error = SyncError;

    async fn sync_vmi(
        &self,
        vmi: Vmi,
        _options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        self.sync(vmi).await
    }

    async fn pause_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        lifecycle::pause(&self.client()?)
            .await
            .map_err(SyncError::Qmp)
    }

    async fn unpause_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        lifecycle::resume(&self.client()?)
            .await
            .map_err(SyncError::Qmp)
    }

    async fn reset_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        lifecycle::reset(&self.client()?)
            .await
            .map_err(SyncError::Qmp)
    }

    async fn soft_reboot_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        Err(decode_failed("soft reboot needs the guest agent"))
    }

    async fn shutdown_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        self.shared.graceful.store(true, Ordering::SeqCst);
        lifecycle::powerdown(&self.client()?)
            .await
            .map_err(SyncError::Qmp)
    }

    async fn kill_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        match self.qemu_pid() {
            Some(pid) => {
                let q = crate::monitor::qemu::Qemu::from_pid(pid).map_err(SyncError::StartQemu)?;
                crate::monitor::grace::kill(&q, crate::monitor::grace::KILL_ESCALATION)
                    .await
                    .map_err(SyncError::StartQemu)
            }
            None => Ok(()),
        }
    }

    async fn delete_vmi(&self, _vmi: Vmi) -> Result<(), SyncError> {
        Ok(())
    }

    async fn sync_vcpus(
        &self,
        vmi: Vmi,
        _options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        let running = self.running.lock().await;
        let r = running.as_ref().ok_or(SyncError::NoDomain)?;
        let plan = self.resource_plan(r, vmi)?;
        resources::set_vcpus(&self.client()?, plan.smp.cpus, HOTPLUG_TIMEOUT).await?;
        Ok(())
    }

    async fn sync_memory(
        &self,
        vmi: Vmi,
        _options: Option<VirtualMachineOptions>,
    ) -> Result<(), SyncError> {
        let mut running = self.running.lock().await;
        let r = running.as_mut().ok_or(SyncError::NoDomain)?;
        let plan = self.resource_plan(r, vmi)?;
        r.memory =
            resources::set_memory(&self.client()?, &r.memory, &plan, plan.memory.size).await?;
        Ok(())
    }

    async fn get_domain(&self) -> Result<Option<Domain>, SyncError> {
        self.info.refresh_interfaces();
        Ok(self.domain())
    }

    async fn get_domain_stats(&self) -> Result<serde_json::Value, SyncError> {
        let pid = self.qemu_pid().ok_or(SyncError::NoDomain)?;
        self.info.stats(&self.client()?, pid).await
    }

    async fn qemu_version(&self) -> Result<String, SyncError> {
        let client = self.client()?;
        let v = client
            .execute("query-version", None)
            .await
            .map_err(SyncError::Qmp)?;
        let q = &v["qemu"];
        Ok(format!("{}.{}.{}", q["major"], q["minor"], q["micro"]))
    }

    async fn guest_ping(&self, _domain_name: String, timeout: Duration) -> Result<(), SyncError> {
        self.info.agent.ping(timeout).await
    }

    async fn exec(
        &self,
        _domain_name: String,
        command: String,
        args: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, SyncError> {
        self.info.agent.exec(&command, &args, timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_parse_and_format() {
        assert_eq!(
            parse_mac("02:00:00:AB:cd:01"),
            Some([2, 0, 0, 0xab, 0xcd, 1])
        );
        assert_eq!(parse_mac("02:00:00:ab:cd"), None);
        assert_eq!(parse_mac("zz:00:00:ab:cd:01"), None);
        assert_eq!(format_mac([2, 0, 0, 0xab, 0xcd, 1]), "02:00:00:ab:cd:01");
    }

    #[test]
    fn hotplugged_disk_nodes_get_fresh_indices() {
        let disk = render::DiskHotplug {
            name: "hp1".into(),
            id: "ua-hp1".into(),
            target: None,
            blockdevs: vec![
                serde_json::json!({"node-name": "libvirt-1-storage", "filename": "/x"}),
                serde_json::json!({"node-name": "libvirt-1-format", "file": "libvirt-1-storage"}),
            ],
            device: serde_json::json!({"id": "ua-hp1", "drive": "libvirt-1-format"}),
            device_del: serde_json::json!({"id": "ua-hp1"}),
            blockdev_del: vec![
                serde_json::json!({"node-name": "libvirt-1-format"}),
                serde_json::json!({"node-name": "libvirt-1-storage"}),
            ],
        };
        let mut next = 4;
        let d = renumber_nodes(&disk, &mut next).unwrap();
        assert_eq!(next, 5);
        assert_eq!(
            d.blockdevs[1],
            serde_json::json!({"node-name": "libvirt-4-format", "file": "libvirt-4-storage"})
        );
        assert_eq!(d.device["drive"], "libvirt-4-format");
        assert_eq!(d.blockdev_del[1]["node-name"], "libvirt-4-storage");
        assert_eq!(
            node_indices("a libvirt-3-x libvirt-12-y libvirt-z"),
            vec![3, 12]
        );
    }

    #[test]
    fn paths_under_root() {
        let c = SyncConfig::under_root(Path::new("/tmp/r"));
        assert_eq!(
            c.paths.container_disks,
            "/tmp/r/var/run/kubevirt/container-disks"
        );
        assert_eq!(c.paths.empty_disks, "/tmp/r/var/run/libvirt/empty-disks");
        assert_eq!(
            c.qmp_socket,
            PathBuf::from("/tmp/r/var/run/kubevirt-private/qlauncher/monitor.sock")
        );
    }

    #[test]
    fn qmp_states_map_to_kubevirt_names() {
        use crate::qmp::lifecycle::{DomainState, StateReason};
        let s = DomainStatus::new(DomainState::Paused, StateReason::StartingUp);
        assert_eq!(
            kubevirt_state(s),
            (LifeCycle::Paused, StateChangeReason::StartingUp)
        );
        let s = DomainStatus::new(DomainState::Shutoff, StateReason::Shutdown);
        assert_eq!(
            kubevirt_state(s),
            (LifeCycle::Shutoff, StateChangeReason::Shutdown)
        );
    }
}

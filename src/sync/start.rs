//! Starting the domain on the first sync of a VMI, step by step as KubeVirt's `SyncVMI` does when
//! no domain exists (`manager.go`, v1.9.0): gather the facts (storage, pod network, secondary
//! interfaces, hotplug volumes, host hardware; [`crate::sync::facts`]), convert
//! ([`crate::cmdline::convert()`]), start QEMU with `-S` (or adopt the QEMU an earlier launcher of
//! this pod left; [`crate::sync::recover`]), connect on QMP, run the plan's start-up commands and
//! `cont` unless `spec.startStrategy` is `Paused`.
//!
//! QEMU is started with [`crate::monitor::qemu::spawn_detached`] (double fork plus `setsid`), so
//! that it becomes a child of PID 1 of the compute container (the monitor, a child subreaper),
//! where virt-handler looks for it, as libvirt's daemonized QEMU is. The QMP monitor's socket is
//! created, bound and listening before QEMU starts and QEMU inherits it as fd [`QMP_FD`]
//! (`MonitorSocket::Fd`: `-chardev socket,id=charmonitor,fd=3,server=on,wait=off`), so the
//! launcher connects at once, without polling for QEMU to bind a path; the socket file stays at
//! [`crate::sync::config::SyncConfig::qmp_socket`] for later launchers of the pod. The tap is opened by
//! name (`TapSource::Ifname`); the vhost-vsock fd, when any, is inherited as `VSOCK_FD`.

use std::path::Path;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tracing::{info, warn};

use crate::cmdline::{render, ConverterContext, DomainPlan};
use crate::hooks::plugins::pipeline::InvocationContext;
use crate::hooks::plugins::Plugin;
use crate::monitor::qemu::Qemu;
use crate::qmp::client::QmpClient;
use crate::qmp::commands::Cont;
use crate::qmp::lifecycle;
use crate::sync::admit::SpecKey;
use crate::sync::config::QMP_CONNECT_TIMEOUT;
use crate::sync::ctx::DomainCtx;
use crate::sync::define::{self, define, Defined};
use crate::sync::domain::{Alias, ApiDomain, Interface as DomainIface, Mac};
use crate::sync::domain_live;
use crate::sync::error::SyncError;
use crate::sync::facts::gather::{gather, BootFacts, Gathered, Purpose};
use crate::sync::facts::{self, hardware};
use crate::sync::reconcile::disks::next_node_index;
use crate::sync::reconcile::media;
use crate::sync::reconcile::nics::NicState;
use crate::sync::reconcile::resources;
use crate::sync::state::{follow_events, Running};
use crate::sync::{privileges, recover};
use crate::vmi::Vmi;

pub use crate::sync::facts::gather::QMP_FD;

/// A domain started (or adopted) by [`start`].
pub(crate) struct Started {
    /// What the running domain holds.
    pub(crate) running: Running,
    /// QEMU's argv as it was started (`-S` included): the plan's, or an adopted QEMU's own
    /// command line when it can be read. A migration sends it
    /// ([`crate::sync::migration::launcher::MigrationCtl::set_boot_argv`]).
    pub(crate) boot_argv: Vec<String>,
}

/// Starts (or adopts) the domain of `vmi`; `spec` is what later syncs compare against.
pub(crate) async fn start(
    d: &DomainCtx,
    vmi: &Vmi,
    spec: SpecKey,
    plugins: &[Plugin],
) -> Result<Started, SyncError> {
    let p = prepare(d, vmi, spec, plugins, InvocationContext::Boot).await?;
    prepare_qemu_dirs(d)?;
    // A QEMU left by an earlier launcher of this pod is adopted or replaced (`recover`).
    if let Some(found) = recover::find(&d.config.qmp_socket, &p.plan.uuid).await {
        // What the plan says the adopted QEMU was started with; devices hot-plugged into it
        // since (NICs, virtio-mem, cdrom media) are re-applied by the next diff.
        // The adopted QEMU's own command line replaces the plan's argv when it can be read.
        let (running, own_argv) =
            recover::adopt(d, found, vmi, p.domain, p.running, &p.qmp_plan.nics).await?;
        d.start_agent_poll();
        return Ok(Started {
            running,
            boot_argv: own_argv.unwrap_or(p.argv),
        });
    }
    let (pid, watcher) = spawn_qemu(d, &p.argv, &p.plan, p.vsock.as_ref())?;
    drop(p.vsock);
    let client = connect(d, &watcher).await?;
    // The follower's queries (status, machine, channels) and the start-up commands with
    // `cont` go out interleaved on the one connection instead of one after the other: QEMU
    // answers in order and `query-status` is sent first, so the domain is still seen in
    // `prelaunch` (ADDED Paused, then the RESUME event's MODIFIED Running, as before), and
    // the follower's round trips are off the path to `cont`. Events are subscribed before
    // anything is sent, so the follower misses none.
    let events = client.events();
    let paused = vmi.spec.start_strategy.as_deref() == Some("Paused");
    let (followed, started) = tokio::join!(
        follow(d, &client, events, p.domain, watcher),
        start_up(&client, &p.qmp_plan, p.plan.smp, paused)
    );
    followed?;
    started?;

    let t_running = p.t0.elapsed();
    let ms = |t: Duration| t.as_secs_f64() * 1000.0;
    info!(
        qemu_version_probe_ms = ms(p.t_probe),
        qemu_version_source = p.version_source,
        storage_ms = ms(p.t_storage - p.t_probe),
        network_ms = ms(p.t_network - p.t_storage),
        convert_ms = ms(p.t_convert - p.t_network),
        qemu_ms = ms(t_running - p.t_convert),
        total_ms = ms(t_running),
        "domain started (sync received to cont acknowledged)"
    );
    d.info
        .set_timings(p.t_storage, p.t_network, p.t_convert, t_running);
    d.shared.pid.send_replace(Some(pid));
    Ok(Started {
        running: p.running,
        boot_argv: p.argv,
    })
}

/// Starts the QEMU of a migration target from `prepared` with `argv` (the local argv with
/// the source's machine and `-incoming defer`), connects to it and follows its events (the
/// domain appears, Paused/Migration); returns the QMP client ([`crate::sync::migration`]).
pub(crate) async fn launch_incoming(
    d: &DomainCtx,
    domain: ApiDomain,
    plan: &DomainPlan,
    argv: &[String],
    vsock: Option<std::os::fd::OwnedFd>,
) -> Result<QmpClient, SyncError> {
    prepare_qemu_dirs(d)?;
    let (pid, watcher) = spawn_qemu(d, argv, plan, vsock.as_ref())?;
    drop(vsock);
    let client = connect(d, &watcher).await?;
    follow(d, &client, client.events(), domain, watcher).await?;
    d.shared.pid.send_replace(Some(pid));
    Ok(client)
}

/// Everything of a start before QEMU runs: storage, network, facts, conversion (KubeVirt's
/// preStartHook and converter). A migration target stops here until the source's
/// definition arrives. `plugins` (the SyncVirtualMachine options' `pluginsJson`) change the
/// domain after the hook sidecars, called with `context`.
pub(crate) async fn prepare(
    d: &DomainCtx,
    vmi: &Vmi,
    spec: SpecKey,
    plugins: &[Plugin],
    context: InvocationContext,
) -> Result<Prepared, SyncError> {
    let name = vmi.metadata.name.clone().unwrap_or_default();
    let namespace = vmi
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    let mut domain = ApiDomain::for_vmi(&namespace, &name, &uid);

    let mut boot = BootFacts::default();
    let Gathered {
        ctx, view, plan, ..
    } = gather(&d.config, vmi, Purpose::Boot(&mut boot)).await?;
    let BootFacts {
        interfaces,
        mut nics,
        vsock,
        dhcp_stop,
        t0,
        t_probe,
        version_source,
        t_storage,
        t_network,
    } = boot;
    for (iface, mac) in interfaces {
        push_interface(&mut domain, &iface, mac);
    }
    // Refuse before QEMU starts when host hardware the VMI asks for is not here.
    if let Some(m) = plan.missing_hardware().into_iter().next() {
        return Err(SyncError::Convert(crate::cmdline::ConvertError::missing(
            m.path, m.reason,
        )));
    }
    // EFI: the per-VM VARS file from its template (kept when it exists), as libvirt does.
    let owner = (d.config.runtime_uid != 0).then_some(crate::storage::Owner::QEMU);
    let nvram_plan = plan.firmware.clone();
    let vmi_name = vmi.metadata.name.clone().unwrap_or_default();
    tokio::task::spawn_blocking(move || {
        facts::storage::prepare_nvram(&nvram_plan, &vmi_name, owner)
    })
    .await
    .map_err(|e| SyncError::Task(e.to_string()))??;
    nics.started(&plan);
    d.info.remember_plan(&plan, &ctx);
    domain.spec.uuid = plan.uuid.clone();
    // The hook sidecars see the domain as KubeVirt would define it, and their edits go into
    // the plan before it is rendered.
    let run = define::PluginRun {
        plugins,
        dir: &d.config.plugin_dir,
        context,
    };
    let hooked = define::on_define_domain(&d.config.hooks, run, vmi, &view, &ctx, &plan).await?;
    let defined = define(d, plan, &hooked.edits);
    defined.report(&mut domain, &view, &ctx)?;
    let Defined {
        plan,
        argv,
        qmp_plan,
    } = defined;
    let next_node = next_node_index(&plan);
    let t_convert = t0.elapsed();

    let mut running = running_at_boot(spec, ctx, &plan, &qmp_plan, nics, next_node, dhcp_stop);
    running.hook_edits = hooked.edits;
    running.hooked = hooked.domain;
    Ok(Prepared {
        domain,
        plan,
        qmp_plan,
        argv,
        running,
        vsock,
        view,
        t0,
        t_probe,
        version_source,
        t_storage,
        t_network,
        t_convert,
    })
}

/// Creates the directories of the QMP socket and the QEMU log and gives the socket's to the
/// runtime user.
fn prepare_qemu_dirs(d: &DomainCtx) -> Result<(), SyncError> {
    let qmp = &d.config.qmp_socket;
    for dir in [qmp.parent(), d.config.qemu_log.parent()]
        .into_iter()
        .flatten()
    {
        std::fs::create_dir_all(dir).map_err(|source| SyncError::PrepareQemu {
            what: format!("create {}", dir.display()),
            source,
        })?;
    }
    if let Some(dir) = qmp.parent() {
        privileges::prepare_socket_dir(dir, d.config.runtime_uid).map_err(|source| {
            SyncError::PrepareQemu {
                what: format!("give {} to the runtime user", dir.display()),
                source,
            }
        })?;
    }
    Ok(())
}

/// Spawns QEMU detached (a child of PID 1), its output appended to the QEMU log; returns its
/// pid and a watcher of its exit.
fn spawn_qemu(
    d: &DomainCtx,
    argv: &[String],
    plan: &DomainPlan,
    vsock: Option<&std::os::fd::OwnedFd>,
) -> Result<(i32, Qemu), SyncError> {
    let qmp_listener = bind_qmp(d)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&d.config.qemu_log)
        .map_err(|source| SyncError::PrepareQemu {
            what: format!("open {}", d.config.qemu_log.display()),
            source,
        })?;
    let log_err = log.try_clone().map_err(|source| SyncError::PrepareQemu {
        what: "duplicate the log fd".into(),
        source,
    })?;
    let mut command = std::process::Command::new(&d.config.qemu);
    command
        .args(argv)
        .env_clear()
        .envs(plan.env.iter().chain(&plan.extra_env).cloned())
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(log_err);
    if let Ok(p) = std::env::var("PATH") {
        command.env("PATH", p);
    }
    // Confinement first: it marks every inherited fd close-on-exec, so the vhost-vsock fd is
    // placed after it (and after the switch to the runtime user: the fd was opened by us).
    privileges::confine_qemu(&mut command, d.config.runtime_uid);
    if let Some(fd) = vsock {
        hardware::inherit_fd(&mut command, fd, hardware::VSOCK_FD);
    }
    // After the vsock fd's placement: the listener's own number is 64 or above, so that
    // placement cannot have overwritten it.
    hardware::inherit_fd(&mut command, &qmp_listener, QMP_FD);
    let detached = crate::monitor::qemu::spawn_detached(command).map_err(SyncError::StartQemu)?;
    let pid = detached.pid;
    info!(pid, "QEMU started");
    // A QEMU that fails at once (a bad device, an fd it rejects) can be gone and reaped
    // before it is watched: that is an early exit with its log, not a failure to start it.
    // Exited means gone, or a zombie not yet reaped by whoever inherited it (QEMU is
    // detached: init or the pod's PID 1 reaps it), or on its way there.
    let exited =
        || crate::monitor::procfs::stat(pid).is_none_or(|s| s.is_zombie() || s.state == 'X');
    let watcher = Qemu::from_pid(pid).map_err(|e| {
        if exited() {
            SyncError::QemuExitedEarly {
                log_tail: log_tail(&d.config.qemu_log),
            }
        } else {
            warn!(pid, error = %crate::sys::error::error_chain(&e), "cannot watch QEMU");
            SyncError::StartQemu(e)
        }
    })?;
    Ok((pid, watcher))
}

/// Replaces a stale QMP socket file with a fresh listening socket bound at
/// [`crate::sync::config::SyncConfig::qmp_socket`], for QEMU to inherit: its fd is 64 or above and
/// close-on-exec (only [`hardware::inherit_fd`] hands it to QEMU). The socket file gets the
/// owner and mode QEMU would have given it (the runtime user's, mode `0775` from umask
/// [`privileges::QEMU_UMASK`]).
fn bind_qmp(d: &DomainCtx) -> Result<std::os::fd::OwnedFd, SyncError> {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::fs::PermissionsExt;
    let qmp = &d.config.qmp_socket;
    if qmp.symlink_metadata().is_ok() {
        let _ = std::fs::remove_file(qmp);
    }
    let failed = |source| SyncError::PrepareQemu {
        what: format!("listen on {}", qmp.display()),
        source,
    };
    let listener = std::os::unix::net::UnixListener::bind(qmp).map_err(failed)?;
    let mode = 0o777 & !privileges::QEMU_UMASK;
    std::fs::set_permissions(qmp, std::fs::Permissions::from_mode(mode)).map_err(failed)?;
    let uid = d.config.runtime_uid;
    if privileges::drops_privileges(uid) {
        std::os::unix::fs::chown(qmp, Some(uid), Some(uid)).map_err(failed)?;
    }
    // SAFETY: F_DUPFD_CLOEXEC on an open fd returns a new fd that nothing else owns.
    let fd = unsafe { libc::fcntl(listener.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 64) };
    if fd < 0 {
        return Err(failed(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by fcntl and is owned here alone.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Connects to QEMU's QMP socket, which listens already (QEMU accepts once it is up); fails
/// with the log's tail when QEMU exits first.
async fn connect(d: &DomainCtx, watcher: &Qemu) -> Result<QmpClient, SyncError> {
    let connect = QmpClient::connect(&d.config.qmp_socket, QMP_CONNECT_TIMEOUT);
    tokio::pin!(connect);
    let exited_early = || SyncError::QemuExitedEarly {
        log_tail: log_tail(&d.config.qemu_log),
    };
    tokio::select! {
        c = &mut connect => match c {
            Ok(c) => Ok(c),
            // The listener was bound before QEMU ran, so the connection itself succeeds and a
            // QEMU that exits during start-up shows as a greeting cut short: report its log.
            Err(e) => {
                let exited = tokio::time::timeout(Duration::from_secs(1), watcher.exited());
                if exited.await.is_ok() {
                    Err(exited_early())
                } else {
                    Err(SyncError::Qmp(e))
                }
            }
        },
        _ = watcher.exited() => Err(exited_early()),
    }
}

/// Records the domain's state and client, notifies ADDED, and starts the guest agent poll and
/// the event follower on `events` (subscribed by the caller before `cont`).
async fn follow(
    d: &DomainCtx,
    client: &QmpClient,
    events: crate::qmp::client::EventStream,
    domain: ApiDomain,
    watcher: Qemu,
) -> Result<(), SyncError> {
    let (_, initial) = lifecycle::query_status(client)
        .await
        .map_err(SyncError::Qmp)?;
    let mut domain = domain;
    domain_live::apply_live_facts(&mut domain, &domain_live::live_facts(client).await);
    d.shared.take_over(initial, domain, client.clone());
    d.start_agent_poll();
    tokio::spawn(follow_events(
        d.shared.clone(),
        events,
        client.clone(),
        watcher,
    ));
    Ok(())
}

/// A domain prepared but not started ([`prepare`]).
pub(crate) struct Prepared {
    /// The `api.Domain` to publish once QEMU runs.
    pub(crate) domain: ApiDomain,
    /// The converted plan.
    pub(crate) plan: DomainPlan,
    /// Its QMP start-up and hotplug plan.
    pub(crate) qmp_plan: render::QmpPlan,
    /// QEMU's argv (with `-S`).
    pub(crate) argv: Vec<String>,
    /// What the running domain will hold.
    pub(crate) running: Running,
    /// The vhost-vsock fd QEMU inherits.
    pub(crate) vsock: Option<std::os::fd::OwnedFd>,
    /// The VMI as the converter saw it (a migration target converts it again without the
    /// source's hot-plugged devices).
    pub(crate) view: Vmi,
    t0: Instant,
    /// Waiting for QEMU's version (the record read at launcher start, or the `qemu --version`
    /// probe started with the launcher).
    t_probe: Duration,
    /// Where the version came from: `record`, `probe` or `configured` (no probe configured).
    version_source: &'static str,
    t_storage: Duration,
    t_network: Duration,
    t_convert: Duration,
}

/// Adds a VMI interface `name` with guest MAC `mac` to the `api.Domain`'s interfaces.
fn push_interface(domain: &mut ApiDomain, name: &str, mac: String) {
    domain.spec.devices.interfaces.push(DomainIface {
        interface_type: "ethernet".into(),
        mac: Some(Mac { mac }),
        alias: Some(Alias::user_defined(name)),
        ..Default::default()
    });
}

/// What a domain started (or adopted) from `plan` holds.
fn running_at_boot(
    spec: SpecKey,
    ctx: ConverterContext,
    plan: &DomainPlan,
    qmp_plan: &render::QmpPlan,
    nics: NicState,
    next_node: u32,
    dhcp_stop: watch::Sender<bool>,
) -> Running {
    Running {
        spec,
        ctx,
        disks: qmp_plan
            .disks
            .iter()
            .map(|d| (d.id.clone(), d.clone()))
            .collect(),
        nics,
        cdroms: media::cdroms(plan),
        memory: resources::MemoryState::at_boot(plan),
        next_node,
        _dhcp_stop: dhcp_stop,
        firmware_uuid: plan.uuid.clone(),
        cpu: plan.cpu.clone(),
        hook_edits: Vec::new(),
        hooked: None,
    }
}

/// The vCPUs beyond QEMU's own (`smp.stable`, the first socket with CPU hotplug) plugged up to
/// `smp.cpus` before the guest runs, as libvirt plugs its enabled `hotpluggable='yes'` vCPUs
/// (`qemuProcessSetupHotpluggableVcpus`); then the plan's start-up commands, then `cont` unless
/// the VMI starts paused.
async fn start_up(
    client: &QmpClient,
    qmp_plan: &render::QmpPlan,
    smp: crate::cmdline::plan::SmpPlan,
    paused: bool,
) -> Result<(), SyncError> {
    plug_boot_vcpus(client, smp).await?;
    for step in &qmp_plan.startup {
        client.run(step).await.map_err(SyncError::Qmp)?;
    }
    if !paused {
        client.run(&Cont).await.map_err(SyncError::Qmp)?;
    }
    Ok(())
}

/// Plugs the boot vCPUs QEMU did not create itself (`smp.stable` to `smp.cpus`, see
/// [`crate::cmdline::plan::SmpPlan`]) into a QEMU started with `-S`, as `vcpu<index>`.
///
/// # Errors
/// [`SyncError::Qmp`] when QEMU refuses.
pub(crate) async fn plug_boot_vcpus(
    client: &QmpClient,
    smp: crate::cmdline::plan::SmpPlan,
) -> Result<(), SyncError> {
    if smp.cpus > smp.stable {
        crate::sync::reconcile::resources::set_vcpus(
            client,
            smp.cpus,
            None,
            crate::sync::config::HOTPLUG_TIMEOUT,
        )
        .await?;
    }
    Ok(())
}

/// The last 10 lines of QEMU's log.
pub(crate) fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

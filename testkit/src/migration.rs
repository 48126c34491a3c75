//! Both virt-handlers of a live migration, for tests: the migration proxy between two launcher pods
//! ([`Relay`]: unix sockets in each pod, TCP between them, as virt-handler's
//! `pkg/virt-handler/migration-proxy` forwards), the VMI with `status.migrationState` as
//! virt-controller hands it off, and the migration RPCs as virt-handler's cmd client sends them.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use qlauncher::sync::domain::MigrationMetadata;
use qlauncher::sync::domain::{ApiDomain, LifeCycle, StateChangeReason};
use qlauncher::sync::migration::protocol::RunningDomain;
use qlauncher::sync::migration::target::TargetSockets;
use qlauncher::sync::migration::{proxy_socket, BLOCK_MIGRATION_PORT, DIRECT_MIGRATION_PORT};
use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::handler::{sync, vmi_only, vmi_request, Client};
use crate::launcher::Pod;

/// virt-handler's migration proxy between `source` and `target` for the VMI `uid`: per role (0,
/// 49152, 49153) a unix listener in the source pod's `migrationproxy/` (the source handler's),
/// dialling a TCP listener on the node's loopback (the target handler's) that dials the target
/// pod's socket for the role. One new outbound connection per accepted one, both directions
/// copied; tasks end when dropped.
pub struct Relay {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    frozen: tokio::sync::watch::Sender<bool>,
    rate: tokio::sync::watch::Sender<u64>,
    nbd_frozen: tokio::sync::watch::Sender<bool>,
}

/// The controls of the source-to-target direction of the stream leg.
#[derive(Clone)]
struct Gate {
    frozen: tokio::sync::watch::Receiver<bool>,
    /// Bytes per second; 0 for unlimited.
    rate: tokio::sync::watch::Receiver<u64>,
}

/// In which order a relay passes on the connections of the migration stream (role 49152) to the
/// target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamOrder {
    /// Each connection as soon as it is accepted (the order it came in, as a proxy usually
    /// delivers it).
    AsAccepted,
    /// The worst order KubeVirt's proxy can produce (its per-connection dials to the target
    /// race): up to `connections` connections are collected (a batch ends 2 s after its last
    /// arrival), then passed on last first, so the main channel, which the source opens first,
    /// reaches the target last.
    Reversed {
        /// The batch size: 1 + the multifd channels.
        connections: usize,
    },
}

/// Passes on what `rx` delivers with `forward`, in `order` ([`StreamOrder`]); each `forward`
/// is awaited before the next (it returns once its connection to the target is queued).
async fn pass_on<C, F, Fut>(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<C>,
    order: StreamOrder,
    forward: F,
) where
    F: Fn(C) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        let Some(first) = rx.recv().await else { return };
        let StreamOrder::Reversed { connections } = order else {
            forward(first).await;
            continue;
        };
        let mut batch = vec![first];
        let mut closed = false;
        while batch.len() < connections {
            match tokio::time::timeout(Duration::from_secs(2), rx.recv()).await {
                Ok(Some(c)) => batch.push(c),
                Ok(None) => {
                    closed = true;
                    break;
                }
                Err(_) => break,
            }
        }
        for c in batch.into_iter().rev() {
            forward(c).await;
        }
        if closed {
            return;
        }
    }
}

/// A unix-socket relay from `listen` to `dial` that passes the connections on in `order`
/// (KubeVirt's migration proxy as seen from the two QEMUs, for tests of the migration stream
/// alone); stops when dropped.
pub struct StreamRelay {
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl StreamRelay {
    /// Binds `listen` and starts relaying (inside a tokio runtime).
    pub fn start(listen: &Path, dial: &Path, order: StreamOrder) -> StreamRelay {
        let _ = std::fs::remove_file(listen);
        let unix = UnixListener::bind(listen).unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let accept = tokio::spawn(async move {
            while let Ok((conn, _)) = unix.accept().await {
                if tx.send(conn).is_err() {
                    return;
                }
            }
        });
        let dial = dial.to_owned();
        let relay = tokio::spawn(pass_on(rx, order, move |conn: UnixStream| {
            let dial = dial.clone();
            async move {
                if let Ok(out) = UnixStream::connect(&dial).await {
                    tokio::spawn(pipe(conn, out, None));
                }
            }
        }));
        StreamRelay {
            tasks: vec![accept, relay],
        }
    }
}

impl Drop for StreamRelay {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Relay {
    /// Starts the relay (inside a tokio runtime), the stream's connections passed on as they
    /// come ([`StreamOrder::AsAccepted`]).
    pub async fn start(source: &Pod, target: &Pod, uid: &str) -> Relay {
        Relay::start_with(source, target, uid, StreamOrder::AsAccepted).await
    }

    /// [`Relay::start`], passing the stream's connections to the target in `order`.
    pub async fn start_with(source: &Pod, target: &Pod, uid: &str, order: StreamOrder) -> Relay {
        let src_dir = source.share().join("migrationproxy");
        std::fs::create_dir_all(&src_dir).unwrap();
        // virt-handler gives the directory and its sockets to qemu (107): a non-root QEMU
        // connects to them.
        let owner = source.nonroot.then_some(107);
        std::os::unix::fs::chown(&src_dir, owner, owner).unwrap();
        let dst_dir = target.share().join("migrationproxy");
        let mut tasks = Vec::new();
        let (frozen, frozen_rx) = tokio::sync::watch::channel(false);
        let (rate, rate_rx) = tokio::sync::watch::channel(0u64);
        let gate = Gate {
            frozen: frozen_rx,
            rate: rate_rx,
        };
        let (nbd_frozen, nbd_frozen_rx) = tokio::sync::watch::channel(false);
        let (_, unlimited) = tokio::sync::watch::channel(0u64);
        let nbd_gate = Gate {
            frozen: nbd_frozen_rx,
            rate: unlimited,
        };
        for role in [0, DIRECT_MIGRATION_PORT, BLOCK_MIGRATION_PORT] {
            let dial: PathBuf = if role == 0 {
                target.root.join("var/run/libvirt/virtqemud-sock")
            } else {
                proxy_socket(&dst_dir, uid, role)
            };
            let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = tcp.local_addr().unwrap().port();
            let gate = match role {
                DIRECT_MIGRATION_PORT => Some(gate.clone()),
                BLOCK_MIGRATION_PORT => Some(nbd_gate.clone()),
                _ => None,
            };
            let order = if role == DIRECT_MIGRATION_PORT {
                order
            } else {
                StreamOrder::AsAccepted
            };
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tasks.push(tokio::spawn(async move {
                while let Ok((conn, _)) = tcp.accept().await {
                    if tx.send(conn).is_err() {
                        return;
                    }
                }
            }));
            tasks.push(tokio::spawn(pass_on(rx, order, move |conn: TcpStream| {
                let dial = dial.clone();
                let gate = gate.clone();
                async move {
                    // The target handler dials lazily; a missing socket closes the leg.
                    if let Ok(out) = UnixStream::connect(&dial).await {
                        tokio::spawn(pipe(conn, out, gate));
                    }
                }
            })));
            let sock = proxy_socket(&src_dir, uid, role);
            let _ = std::fs::remove_file(&sock);
            let unix = UnixListener::bind(&sock).unwrap();
            std::os::unix::fs::chown(&sock, owner, owner).unwrap();
            tasks.push(tokio::spawn(async move {
                while let Ok((conn, _)) = unix.accept().await {
                    tokio::spawn(async move {
                        if let Ok(out) = TcpStream::connect(("127.0.0.1", port)).await {
                            pipe(conn, out, None).await;
                        }
                    });
                }
            }));
        }
        Relay {
            tasks,
            frozen,
            rate,
            nbd_frozen,
        }
    }

    /// Stops (true) or resumes (false) forwarding the QEMU migration stream (role 49152) from the
    /// source to the target: a network that stalls, while the control and NBD channels flow.
    pub fn freeze_stream(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// Stops (true) or resumes (false) forwarding the NBD leg (role 49153) from the source to the
    /// target: the disk mirrors' writes stall, as with a frozen target.
    pub fn freeze_nbd(&self, frozen: bool) {
        self.nbd_frozen.send_replace(frozen);
    }

    /// Limits the migration stream (role 49152) from the source to the target to
    /// `bytes_per_sec` (0: unlimited): a slow network, which keeps a post-copy migration (QEMU
    /// sends it at full speed) running long enough to act on it.
    pub fn throttle_stream(&self, bytes_per_sec: u64) {
        self.rate.send_replace(bytes_per_sec);
    }
}

/// Copies both ways until either side ends, then drops both (no half-close, as the proxy).
/// With a `gate`, the `a` to `b` direction waits while it is frozen and keeps to its rate.
async fn pipe<A, B>(a: A, b: B, gate: Option<Gate>)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let forward = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let mut rate = 0;
            if let Some(g) = &gate {
                let mut f = g.frozen.clone();
                if f.wait_for(|f| !*f).await.is_err() {
                    return;
                }
                rate = *g.rate.borrow();
            }
            // Throttled: small reads, each followed by the time it takes at the rate.
            let max = if rate == 0 { buf.len() } else { 16 * 1024 };
            match ar.read(&mut buf[..max]).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if bw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                    if rate > 0 {
                        tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
                    }
                }
            }
        }
    };
    tokio::select! {
        _ = forward => {}
        _ = tokio::io::copy(&mut br, &mut aw) => {}
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The launcher pod's VMI ([`crate::launcher::vmi`]) as virt-handler sends it during the
/// migration `migration_uid` to the pod `target_pod`: `status.migrationState`, the Unix transport,
/// and `status.interfaces` with the guest MAC `guest_mac` virt-handler read from the source's
/// domain.
pub fn migrating_vmi(
    uid: &str,
    migration_uid: &str,
    target_pod: &str,
    guest_mac: &str,
) -> serde_json::Value {
    let mut v = crate::launcher::vmi(uid);
    v["status"] = serde_json::json!({
        "migrationTransport": "Unix",
        "interfaces": [{"name": "default", "mac": guest_mac, "ipAddress": "10.0.2.2"}],
        "migrationState": {
            "migrationUid": migration_uid,
            "sourcePod": "virt-launcher-hv-source",
            "targetPod": target_pod,
        }
    });
    v
}

/// virt-handler's `MigrationOptions` JSON with KubeVirt's defaults, `bandwidth` (a quantity) and
/// `progress_timeout` seconds.
pub fn options(bandwidth: &str, progress_timeout: i64) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "Bandwidth": bandwidth, "ProgressTimeout": progress_timeout,
        "CompletionTimeoutPerGiB": 150, "MaxDowntimeMs": 900, "UnsafeMigration": false,
        "AllowAutoConverge": false, "AllowPostCopy": false, "ParallelMigrationThreads": null,
        "AllowWorkloadDisruption": false, "StallDetectorOptions": null, "Compression": null
    }))
    .unwrap()
}

/// [`options`] with `ParallelMigrationThreads: 8`, as virt-handler sends them for a VMI without a
/// CPU limit or dedicated CPUs (`configureParallelMigrationThreads`,
/// `pkg/virt-handler/migration-source.go`, v1.9.0): KubeVirt's default multifd migration.
pub fn multifd_options(bandwidth: &str, progress_timeout: i64) -> Vec<u8> {
    let mut o: serde_json::Value =
        serde_json::from_slice(&options(bandwidth, progress_timeout)).expect("options are JSON");
    o["ParallelMigrationThreads"] = 8.into();
    serde_json::to_vec(&o).unwrap()
}

fn answer(r: Result<tonic::Response<cmd::Response>, tonic::Status>, rpc: &str) -> (bool, String) {
    let r = r.unwrap_or_else(|e| panic!("{rpc}: {e}")).into_inner();
    (r.success, r.message)
}

/// The RPCs of the migration, each timed against virt-handler's 20 s deadline (panics beyond).
pub struct Rpc;

const DEADLINE: Duration = Duration::from_secs(20);

async fn timed<F: std::future::Future>(rpc: &str, f: F) -> F::Output {
    let t0 = Instant::now();
    let out = tokio::time::timeout(DEADLINE, f)
        .await
        .unwrap_or_else(|_| panic!("{rpc} took more than {DEADLINE:?}"));
    eprintln!("{rpc} answered in {:?}", t0.elapsed());
    out
}

impl Rpc {
    /// `SyncMigrationTarget` (default options, as the target handler builds them).
    pub async fn sync_target(c: &mut Client, vmi: &serde_json::Value) -> (bool, String) {
        answer(
            timed(
                "SyncMigrationTarget",
                c.sync_migration_target(vmi_request(vmi)),
            )
            .await,
            "SyncMigrationTarget",
        )
    }

    /// `SyncMigrationTarget` with the VEP-190 plugins `plugins_json` in its options.
    pub async fn sync_target_with_plugins(
        c: &mut Client,
        vmi: &serde_json::Value,
        plugins_json: &serde_json::Value,
    ) -> (bool, String) {
        let request = crate::handler::vmi_request_with_plugins(vmi, plugins_json);
        answer(
            timed("SyncMigrationTarget", c.sync_migration_target(request)).await,
            "SyncMigrationTarget",
        )
    }

    /// `MigrateVirtualMachine`.
    pub async fn migrate(c: &mut Client, vmi: &serde_json::Value, opts: &[u8]) -> (bool, String) {
        let req = cmd::MigrationRequest {
            vmi: Some(cmd::Vmi {
                vmi_json: serde_json::to_vec(vmi).unwrap(),
            }),
            options: opts.to_vec(),
        };
        answer(
            timed("MigrateVirtualMachine", c.migrate_virtual_machine(req)).await,
            "MigrateVirtualMachine",
        )
    }

    /// `CancelVirtualMachineMigration`.
    pub async fn cancel(c: &mut Client, vmi: &serde_json::Value) -> (bool, String) {
        answer(
            timed(
                "CancelVirtualMachineMigration",
                c.cancel_virtual_machine_migration(vmi_only(vmi)),
            )
            .await,
            "CancelVirtualMachineMigration",
        )
    }

    /// `FinalizeVirtualMachineMigration`.
    pub async fn finalize(c: &mut Client, vmi: &serde_json::Value) -> (bool, String) {
        answer(
            timed(
                "FinalizeVirtualMachineMigration",
                c.finalize_virtual_machine_migration(vmi_request(vmi)),
            )
            .await,
            "FinalizeVirtualMachineMigration",
        )
    }

    /// `SignalTargetPodCleanup`.
    pub async fn signal_cleanup(c: &mut Client, vmi: &serde_json::Value) -> (bool, String) {
        answer(
            timed(
                "SignalTargetPodCleanup",
                c.signal_target_pod_cleanup(vmi_only(vmi)),
            )
            .await,
            "SignalTargetPodCleanup",
        )
    }

    /// `DeleteVirtualMachine`.
    pub async fn delete(c: &mut Client, vmi: &serde_json::Value) -> (bool, String) {
        answer(
            timed(
                "DeleteVirtualMachine",
                c.delete_virtual_machine(vmi_only(vmi)),
            )
            .await,
            "DeleteVirtualMachine",
        )
    }
}

/// Runs `sh -c script` in the guest through the agent (`Exec` on domain `default_hv`); returns
/// (exit code, stdout), or None when the agent did not answer.
pub async fn exec(c: &mut Client, script: &str) -> Option<(i32, String)> {
    exec_in(c, "default_hv", script).await
}

/// [`exec`] in the domain `domain` (`<namespace>_<name>`).
pub async fn exec_in(c: &mut Client, domain: &str, script: &str) -> Option<(i32, String)> {
    let out = c
        .exec(cmd::ExecRequest {
            domain_name: domain.into(),
            command: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            timeout_seconds: 20,
        })
        .await
        .ok()?
        .into_inner();
    Some((out.exit_code, out.std_out))
}

/// Polls [`exec`] until the agent answers (up to `timeout`); panics then.
pub async fn exec_until_ok(c: &mut Client, script: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some((0, out)) = exec(c, script).await {
            return out;
        }
        assert!(Instant::now() < deadline, "the agent never ran {script:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The guest workload's counter (`/tmp/counter`, rewritten every 50 ms by a shell loop that
/// truncates the file before it writes the next number): [`read_number`] of it.
pub async fn read_counter(c: &mut Client, timeout: Duration) -> u64 {
    read_number(c, "/tmp/counter", timeout).await
}

/// The number in the guest's file `path`, read through the agent until it holds one, so a read
/// between a writer's truncation and its write is retried. Panics after `timeout`.
pub async fn read_number(c: &mut Client, path: &str, timeout: Duration) -> u64 {
    let deadline = Instant::now() + timeout;
    let script = format!("cat {path}");
    loop {
        if let Some((0, out)) = exec(c, &script).await {
            if let Ok(n) = out.trim().parse() {
                return n;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the guest's {path} never held a number"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `MigrateDomainJobInfo` of GetDomainStats: (DataTotal, DataRemaining) in bytes, zeros when
/// no migration job runs.
pub async fn job_data(c: &mut Client) -> (u64, u64) {
    let stats = c
        .get_domain_stats(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    let stats: serde_json::Value = serde_json::from_str(&stats.domain_stats).unwrap_or_default();
    let job = &stats["MigrateDomainJobInfo"];
    (
        job["DataTotal"].as_u64().unwrap_or(0),
        job["DataRemaining"].as_u64().unwrap_or(0),
    )
}

/// The migration record of a domain.
pub fn metadata(d: &ApiDomain) -> Option<MigrationMetadata> {
    d.spec.metadata.kubevirt.migration.clone()
}

/// Waits until a notification of `pod` satisfies `ok`; returns it.
pub async fn wait_notified(
    pod: &Pod,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&ApiDomain) -> bool,
) -> ApiDomain {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some((_, d)) = pod.received.lock().unwrap().iter().find(|(_, d)| ok(d)) {
            return d.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no notification {what}; got {:?}",
            pod.events()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The (event type, state, reason, migration record) of each notification of `pod`, consecutive
/// repeats folded.
pub fn history(pod: &Pod) -> Vec<(String, String, String, Option<MigrationMetadata>)> {
    let mut out: Vec<(String, String, String, Option<MigrationMetadata>)> = Vec::new();
    for (t, d) in pod.received.lock().unwrap().iter() {
        let e = (
            t.clone(),
            format!("{:?}", d.status.status),
            format!("{:?}", d.status.reason),
            metadata(d),
        );
        if out.last() != Some(&e) {
            out.push(e);
        }
    }
    out
}

/// The socket directory of `pod`'s migration proxy.
pub fn proxy_dir(pod: &Pod) -> PathBuf {
    pod.share().join("migrationproxy")
}

/// True when `path` exists.
pub fn exists(path: &Path) -> bool {
    path.exists()
}

/// The stream and NBD sockets a target listens on in `dir`, named as for the VMI UID `u`
/// (`u-49152-source.sock`, `u-49153-source.sock`), and QEMU's own stream socket behind the
/// launcher's channel ordering (`u-qemu-stream.sock`).
pub fn target_sockets(dir: &Path) -> TargetSockets {
    TargetSockets {
        stream: dir.join("u-49152-source.sock"),
        nbd: dir.join("u-49153-source.sock"),
        ordered_stream: dir.join("u-qemu-stream.sock"),
    }
}

/// The definition of a source domain started by hand: VMI `vmi_uid`, migration
/// `migration_uid`, the resolved `machine`; no argv, hot-plugged or copied disks, extra
/// capabilities or multifd, not paused, no CPU definition, no hooked domain.
pub fn running_domain(vmi_uid: &str, migration_uid: &str, machine: String) -> RunningDomain {
    RunningDomain {
        vmi_uid: vmi_uid.into(),
        migration_uid: migration_uid.into(),
        machine,
        argv: Vec::new(),
        hotplugged: Vec::new(),
        copied_disks: Vec::new(),
        capabilities: Vec::new(),
        multifd_channels: None,
        paused: false,
        cpu: None,
        hooked: None,
    }
}

/// Starts a launcher in `pod`, syncs `vmi` and waits (within `boot`) until the domain is Running
/// and the guest agent runs a command. Returns the launcher's index and its client.
pub async fn boot(pod: &mut Pod, vmi: &serde_json::Value, boot: Duration) -> (usize, Client) {
    let n = pod.start_launcher();
    let mut c = pod.client(n).await;
    assert_eq!(sync(&mut c, vmi).await, (true, String::new()));
    pod.wait_event((LifeCycle::Running, StateChangeReason::Unknown), boot)
        .await;
    exec_until_ok(&mut c, "true", boot).await;
    (n, c)
}

/// Migrates the VMI on once more (KubeVirt's repeated migration), from the pod `from` whose
/// launcher's client is `fc` to a fresh pod `to` that has the VMI's UID: starts a launcher in
/// `to`, syncs it as the target of `vmi` (the migration `migration_uid`), relays `from` → `to`,
/// migrates with `opts` and waits (within `timeout`) until `to` notifies Running with that
/// migration ended. Returns `to`'s launcher index, its client and the relay (keep it alive).
pub async fn migrate_on(
    from: &Pod,
    fc: &mut Client,
    to: &mut Pod,
    vmi: &serde_json::Value,
    migration_uid: &str,
    opts: &[u8],
    timeout: Duration,
) -> (usize, Client, Relay) {
    migrate_on_with(from, fc, to, (vmi, vmi), migration_uid, opts, timeout).await
}

/// [`migrate_on`] with one VMI per side, `(source_vmi, target_vmi)`: the source handler sends
/// the first, the target handler the second (a decentralized migration, where each cluster has
/// its own VMI, [`decentralized_vmis`]). The relay names its sockets after `from`'s VMI UID, as
/// virt-handler's proxies do (`migrationProxyKey`).
pub async fn migrate_on_with(
    from: &Pod,
    fc: &mut Client,
    to: &mut Pod,
    (source_vmi, target_vmi): (&serde_json::Value, &serde_json::Value),
    migration_uid: &str,
    opts: &[u8],
    timeout: Duration,
) -> (usize, Client, Relay) {
    let n = to.start_launcher();
    let mut c = to.client(n).await;
    assert_eq!(
        Rpc::sync_target(&mut c, target_vmi).await,
        (true, String::new())
    );
    let relay = Relay::start(from, to, &from.uid.clone()).await;
    assert_eq!(
        Rpc::migrate(fc, source_vmi, opts).await,
        (true, String::new())
    );
    wait_notified(
        to,
        &format!("{} Running with EndTimestamp", to.pod_name()),
        timeout,
        |d| {
            d.status.status == LifeCycle::Running
                && metadata(d).is_some_and(|m| m.uid == migration_uid && m.end_timestamp.is_some())
        },
    )
    .await;
    (n, c, relay)
}

/// A migration of `vmi` from the launcher `s` of `source` (client `sc`) to a fresh launcher in
/// `target`, virt-handler's whole part of it: starts the launcher and syncs it as the target,
/// relays `source` → `target` (sockets named after `source`'s VMI UID), migrates with `opts`,
/// waits (within `timeout`) until the source's migration ended, not failed (else panics with the
/// source launcher's log), and the target notifies Running with it ended, then finalizes it on
/// the target. Returns the target's launcher index, its client and the relay (keep it alive).
pub async fn migrate_and_finalize(
    source: &Pod,
    s: usize,
    sc: &mut Client,
    target: &mut Pod,
    vmi: &serde_json::Value,
    opts: &[u8],
    timeout: Duration,
) -> (usize, Client, Relay) {
    let t = target.start_launcher();
    let mut tc = target.client(t).await;
    assert_eq!(Rpc::sync_target(&mut tc, vmi).await, (true, String::new()));
    let relay = Relay::start(source, target, &source.uid.clone()).await;
    assert_eq!(Rpc::migrate(sc, vmi, opts).await, (true, String::new()));
    let ended = wait_notified(source, "source migration ended", timeout, |d| {
        metadata(d).is_some_and(|m| m.end_timestamp.is_some())
    })
    .await;
    let m = metadata(&ended).unwrap();
    assert!(!m.failed, "{m:?}\nsource log:\n{}", source.log(s));
    wait_notified(target, "target Running with EndTimestamp", timeout, |d| {
        d.status.status == LifeCycle::Running
            && metadata(d).is_some_and(|m| m.end_timestamp.is_some())
    })
    .await;
    assert_eq!(Rpc::finalize(&mut tc, vmi).await, (true, String::new()));
    (t, tc, relay)
}

/// The two VMIs of a decentralized (cross-cluster) migration `migration_uid` of the VMI
/// `source_uid` to a copy of it, `target_uid`, in the pod `target_pod` ([`migrating_vmi`] for
/// each): both carry `sourceState` and `targetState` with their side's VMI UID
/// (`virtualMachineInstanceUID`) and the source's migration UID; the target VMI keeps the
/// source's `firmware.uuid` (the same VM). Returns `(source VMI, target VMI)`.
pub fn decentralized_vmis(
    source_uid: &str,
    target_uid: &str,
    migration_uid: &str,
    target_pod: &str,
    guest_mac: &str,
) -> (serde_json::Value, serde_json::Value) {
    let states = serde_json::json!({
        "sourceState": {"migrationUID": migration_uid, "virtualMachineInstanceUID": source_uid},
        "targetState": {"migrationUID": format!("{migration_uid}-target"),
                        "virtualMachineInstanceUID": target_uid, "pod": target_pod},
    });
    let mut source = migrating_vmi(source_uid, migration_uid, target_pod, guest_mac);
    let mut target = migrating_vmi(target_uid, migration_uid, target_pod, guest_mac);
    target["spec"]["domain"]["firmware"] = source["spec"]["domain"]["firmware"].clone();
    for v in [&mut source, &mut target] {
        for (k, state) in states.as_object().unwrap() {
            v["status"]["migrationState"][k] = state.clone();
        }
    }
    (source, target)
}

/// A source and a target pod of one VMI on the guest `guest_qcow2`, both KubeVirt's default
/// non-root pods (launcher and QEMU as 107 over kubelet-made emptyDirs, the network set up by
/// virt-handler: [`crate::launcher`]): the target takes the source's UID.
pub fn pod_pair(guest_qcow2: &Path) -> (Pod, Pod) {
    pod_pair_as(guest_qcow2, true)
}

/// [`pod_pair`] with non-root pods when `nonroot`, else root pods (the `Root` feature gate).
pub fn pod_pair_as(guest_qcow2: &Path, nonroot: bool) -> (Pod, Pod) {
    let source = Pod::new(guest_qcow2, nonroot);
    let mut target = Pod::new(guest_qcow2, nonroot);
    target.uid = source.uid.clone();
    (source, target)
}

/// The VMI `uid` before the hand-off: no migration state, the Unix migration transport.
pub fn plain_vmi(uid: &str) -> serde_json::Value {
    let mut vmi = crate::launcher::vmi(uid);
    vmi["status"] = serde_json::json!({"migrationTransport": "Unix"});
    vmi
}

/// The format node of the disk whose device id contains `alias` (`ua-rootdisk`), from a
/// `query-block` answer `block` (its `return` or the bare list).
///
/// # Panics
/// When no such disk is in the answer.
pub fn disk_node(block: &serde_json::Value, alias: &str) -> String {
    let list = block.get("return").unwrap_or(block);
    list.as_array()
        .into_iter()
        .flatten()
        .find(|b| b["qdev"].as_str().is_some_and(|q| q.contains(alias)))
        .and_then(|b| b["inserted"]["node-name"].as_str())
        .unwrap_or_else(|| panic!("no disk {alias} in {block}"))
        .to_owned()
}

/// Bitmap `name` of block node `node`, from a `query-named-block-nodes` answer `nodes` (its
/// `return` or the bare list), if the node has one.
pub fn dirty_bitmap(
    nodes: &serde_json::Value,
    node: &str,
    name: &str,
) -> Option<serde_json::Value> {
    let list = nodes.get("return").unwrap_or(nodes);
    list.as_array()?
        .iter()
        .find(|n| n["node-name"] == node)?
        .get("dirty-bitmaps")?
        .as_array()?
        .iter()
        .find(|b| b["name"] == name)
        .cloned()
}

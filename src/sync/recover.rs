//! Recovery after a launcher restart: the first sync of a fresh launcher looks for a QEMU that an
//! earlier launcher of the same pod started (it holds the socket listening at this launcher's QMP
//! path, which a launcher hands QEMU as fd 3, or its command line names that path) and either
//! adopts it or removes it before starting a new one.
//!
//! KubeVirt gets this from libvirt, which re-attaches to running domains when `virtqemud`
//! restarts (`qemuProcessReconnect`: reconnect to the monitor, keep the domain running; a domain
//! still starting up is killed). qlauncher does the same over QMP: a QEMU whose QMP monitor answers,
//! whose `query-uuid` is the planned domain's UUID and whose run state is past start-up (`running`,
//! `paused`, ...) is adopted: no second QEMU, the overlays, tap and nftables rules in place are
//! kept (storage and network preparation are idempotent and run again before this), the DHCP server
//! is started again, and the domain is reported with an `ADDED` notification. Any other QEMU of
//! that socket (still in `prelaunch`, not answering, another UUID, or several) is killed and
//! waited for, and the sync starts a fresh one.
//!
//! Adopting fills the same `Running` state a fresh start does (`start.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use tracing::{info, warn};

use crate::cmdline::qemu::{node_index, renamed_node};
use crate::cmdline::render::{DiskHotplug, NicHotplug};
use crate::monitor::procfs;
use crate::monitor::qemu::Qemu;
use crate::qmp::client::QmpClient;
use crate::qmp::commands::{QomGet, QomList, QueryBlock, QueryNamedBlockNodes, QueryUuid};
use crate::qmp::lifecycle;
use crate::sync::ctx::DomainCtx;
use crate::sync::domain::ApiDomain;
use crate::sync::error::SyncError;
use crate::sync::reconcile::nics::Placement;
use crate::sync::state::{follow_events, Running};
use crate::vmi::Vmi;

/// How long a found QEMU may take to answer on QMP before it is considered hung and replaced.
pub const ADOPT_QMP_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a replaced QEMU may take to exit after SIGKILL.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Run states (`query-status`) of a QEMU that is adopted; the rest (`prelaunch`: the earlier
/// launcher died before `cont`; `shutdown`: the guest is gone) are replaced.
const ADOPTABLE: &[&str] = &[
    "running",
    "paused",
    "io-error",
    "watchdog",
    "suspended",
    "debug",
];

/// A running QEMU found for the domain, connected on QMP.
pub(crate) struct Found {
    pid: i32,
    client: QmpClient,
}

/// The live QEMU processes whose command line names `qmp_socket` (exact path within an argument).
/// Under the monitor (`QLAUNCHER_MONITOR_PID` set, see `qlauncher_monitor::pid1`) only its
/// children are looked at: a detached QEMU is re-parented to it. Without it, every process.
pub fn qemu_processes(qmp_socket: &Path) -> Vec<i32> {
    let monitor = std::env::var(crate::monitor::pid1::MONITOR_PID_ENV)
        .ok()
        .and_then(|p| p.parse::<i32>().ok());
    let candidates: Vec<i32> = match monitor {
        Some(monitor) => procfs::children(monitor)
            .into_iter()
            .map(|s| s.pid)
            .collect(),
        None => match std::fs::read_dir("/proc") {
            Ok(dir) => dir
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .collect(),
            Err(_) => Vec::new(),
        },
    };
    qemu_among(candidates, qmp_socket)
}

/// The live QEMU processes among `candidates` whose command line names `qmp_socket`, or that hold
/// the socket listening there (QEMU started with the launcher's pre-bound QMP fd,
/// `crate::sync::start::QMP_FD`, whose command line names only the fd).
fn qemu_among(candidates: Vec<i32>, qmp_socket: &Path) -> Vec<i32> {
    let needle = qmp_socket.display().to_string();
    let inodes = listening_inodes(&needle);
    let mut pids: Vec<i32> = candidates
        .into_iter()
        .filter(|pid| procfs::stat(*pid).is_some_and(|s| !s.is_zombie()))
        .filter(|pid| {
            procfs::cmdline(*pid).is_some_and(|argv| {
                argv.first().is_some_and(|a| procfs::is_qemu_name(a))
                    && (argv.iter().any(|a| names_path(a, &needle)) || holds_any(*pid, &inodes))
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The inodes of the unix sockets bound at `path` in this network namespace (`/proc/net/unix`:
/// `Num RefCount Protocol Flags Type St Inode Path`).
fn listening_inodes(path: &str) -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.get(7) == Some(&path)).then(|| fields.get(6)?.parse().ok())?
        })
        .collect()
}

/// True when one of `pid`'s fds is a socket whose inode is in `inodes`.
fn holds_any(pid: i32, inodes: &[u64]) -> bool {
    if inodes.is_empty() {
        return false;
    }
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path()).is_ok_and(|target| {
            let target = target.to_string_lossy();
            target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok())
                .is_some_and(|n| inodes.contains(&n))
        })
    })
}

/// True when `arg` holds `path` as a whole value (preceded by the start, `=`, `:`, `,` or a JSON
/// quote, followed by an option separator, a JSON quote or the end), so `/x/monitor.sock` matches
/// neither `/x/monitor.sock2` nor `/y/x/monitor.sock` (another launcher's socket under a longer
/// root: the pod's own `/var/run/...` path is a suffix of every `qlauncher run` QEMU's on a host).
fn names_path(arg: &str, path: &str) -> bool {
    arg.match_indices(path).any(|(at, _)| {
        matches!(
            arg[..at].chars().next_back(),
            None | Some('=') | Some(':') | Some(',') | Some('"')
        ) && matches!(
            arg[at + path.len()..].chars().next(),
            None | Some(',') | Some('"')
        )
    })
}

/// Looks for a QEMU of this domain (see the module doc). Returns the one to adopt, or `None`
/// after removing every other QEMU of `qmp_socket` (nothing found: `None` at once).
pub(crate) async fn find(qmp_socket: &Path, uuid: &str) -> Option<Found> {
    let pids = qemu_processes(qmp_socket);
    if pids.is_empty() {
        return None;
    }
    if let [pid] = pids[..] {
        match check(qmp_socket, uuid).await {
            Ok(client) => return Some(Found { pid, client }),
            Err(reason) => warn!(pid, %reason, "found QEMU not adoptable, replacing it"),
        }
    } else {
        warn!(?pids, "several QEMU for one domain, replacing them");
    }
    for pid in pids {
        let Ok(q) = Qemu::from_pid(pid) else { continue };
        let _ = q.signal(nix::sys::signal::Signal::SIGKILL);
        if tokio::time::timeout(KILL_WAIT, q.exited()).await.is_err() {
            warn!(pid, "replaced QEMU did not exit after SIGKILL");
        }
    }
    // The socket file of the killed QEMU is removed by the fresh start.
    None
}

/// Connects and checks the UUID and run state; the error says why the QEMU is not adopted.
async fn check(qmp_socket: &Path, uuid: &str) -> Result<QmpClient, String> {
    let client = QmpClient::connect(qmp_socket, ADOPT_QMP_TIMEOUT)
        .await
        .map_err(|e| format!("QMP: {e}"))?;
    let found = client
        .run(&QueryUuid)
        .await
        .map_err(|e| format!("query-uuid: {e}"))?;
    let found = found.uuid.as_str();
    if !found.eq_ignore_ascii_case(uuid) {
        return Err(format!("UUID {found:?}, the domain's is {uuid:?}"));
    }
    let (state, _) = lifecycle::query_status(&client)
        .await
        .map_err(|e| format!("query-status: {e}"))?;
    if !ADOPTABLE.contains(&state.as_str()) {
        return Err(format!("run state {state}"));
    }
    Ok(client)
}

/// The device ids QEMU has (`qom-list /machine/peripheral`).
async fn device_ids(client: &QmpClient) -> Result<Vec<String>, SyncError> {
    let list = client
        .run(&QomList {
            path: "/machine/peripheral".into(),
        })
        .await
        .map_err(SyncError::Qmp)?;
    Ok(list.into_iter().map(|p| p.name).collect())
}

/// The argv QEMU `pid` was started with (its `/proc/<pid>/cmdline` without the binary and
/// without the `-incoming defer` a migration target's QEMU was started with); `None` when it
/// cannot be read.
fn started_argv(pid: i32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut words: Vec<String> = raw
        .strip_suffix(b"\0")
        .unwrap_or(&raw)
        .split(|b| *b == 0)
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    if words.len() < 2 {
        return None;
    }
    words.remove(0);
    if words.ends_with(&["-incoming".to_owned(), "defer".to_owned()]) {
        words.truncate(words.len() - 2);
    }
    Some(words)
}

/// Where QEMU runs the device `id` (`qom-get` of its `parent_bus` and `addr`), as
/// [`Placement::from_qom`] reads them; `None` when QEMU does not say.
async fn placement(client: &QmpClient, id: &str) -> Option<Placement> {
    let get = |property: &str| QomGet {
        path: format!("/machine/peripheral/{id}"),
        property: property.into(),
    };
    let bus = client.run(&get("parent_bus")).await.ok()?;
    let addr = client.run(&get("addr")).await.ok()?;
    Placement::from_qom(bus.as_str()?, addr.as_i64()?)
}

/// The top block node of each drive QEMU runs, by device id (`query-block`: `qdev` is the id
/// or the device's QOM path, `/machine/peripheral/<id>/virtio-backend`). Empty when QEMU does
/// not answer.
async fn top_nodes(client: &QmpClient) -> BTreeMap<String, String> {
    let Ok(drives) = client.run(&QueryBlock).await else {
        return BTreeMap::new();
    };
    drives
        .into_iter()
        .filter_map(|b| {
            let qdev = b.qdev?;
            let id = qdev
                .strip_prefix("/machine/peripheral/")
                .map_or(qdev.as_str(), |p| p.split('/').next().unwrap_or(p))
                .to_owned();
            Some((id, b.inserted?.node_name?))
        })
        .collect()
}

/// The plan's hot-plug disk `d` as the adopted QEMU runs it: its nodes renamed to the libvirt
/// index of `top` (QEMU's top node of the drive, `libvirt-<N>-format`), when the plan's nodes
/// all share one index (a hot-plugged volume's storage and format nodes; a chain of several
/// indices is left as planned), and its device on the bus and address QOM reports (`at`, PCI
/// devices only: a SCSI disk keeps its planned place). Pure.
fn disk_as_running(d: &DiskHotplug, top: Option<&str>, at: Option<&Placement>) -> DiskHotplug {
    let mut out = d.clone();
    let indices: Vec<u32> = d.node_indices().into_iter().collect();
    if let (Some(n), &[m]) = (top.and_then(node_index), indices.as_slice()) {
        if n != m {
            let map = BTreeMap::from([(m, n)]);
            out = d.with_nodes_renamed(|name| renamed_node(name, &map));
        }
    }
    if let Some(at) = at {
        out.device.bus = Some(at.bus.clone());
        out.device.addr = Some(at.addr.clone());
    }
    out
}

/// Takes over `found` as the running domain: the state from `query-status`, an `ADDED`
/// notification, the event follower, the QEMU pid for the launcher's supervision. Hot-pluggable
/// disks of `vmi` that QEMU lacks (the earlier launcher died while attaching them) are attached;
/// new block nodes are numbered after QEMU's highest. QEMU's own command line is returned beside
/// the running domain (the boot argv a migration sends; `None` when it cannot be read), and the
/// secondary NICs QEMU runs without having them on it count as
/// hot-plugged again, with the plan of `nic_plans` (the converter's NICs) at the bus and
/// address QOM reports ([`crate::sync::reconcile::nics::NicState::recover_hotplugged`]);
/// the hot-plugged disks get QEMU's node names and place ([`disk_as_running`]).
pub(crate) async fn adopt(
    d: &DomainCtx,
    found: Found,
    vmi: &Vmi,
    domain: ApiDomain,
    mut running: Running,
    nic_plans: &[NicHotplug],
) -> Result<(Running, Option<Vec<String>>), SyncError> {
    let Found { pid, client } = found;
    let mut own_argv = None;
    let watcher = Qemu::from_pid(pid).map_err(SyncError::StartQemu)?;
    let events = client.events();
    let (_, status) = lifecycle::query_status(&client)
        .await
        .map_err(SyncError::Qmp)?;
    let nodes = client
        .run(&QueryNamedBlockNodes)
        .await
        .map_err(SyncError::Qmp)?;
    let max = nodes.iter().filter_map(|n| node_index(&n.node_name)).max();
    if let Some(max) = max {
        running.next_node = running.next_node.max(max + 1);
    }
    let present = device_ids(&client).await?;
    // What the adopted QEMU was started with is its own command line (the plan converted
    // now has the interfaces attached since as boot NICs): a later migration sends it, and
    // the NICs QEMU runs without them on it were hot-plugged.
    if let Some(argv) = started_argv(pid) {
        let boot_ids = argv_device_ids(&argv);
        let mut placements = BTreeMap::new();
        for id in running.nics.unplaced() {
            if boot_ids.contains(&id) || !present.contains(&id) {
                continue;
            }
            if let Some(at) = placement(&client, &id).await {
                placements.insert(id, at);
            }
        }
        let recovered = running
            .nics
            .recover_hotplugged(nic_plans, &boot_ids, &placements);
        if !recovered.is_empty() {
            info!(interfaces = ?recovered, "hot-plugged NICs of the adopted QEMU recovered");
        }
        // The hot-plugged disks QEMU runs: their nodes and place as QEMU has them (the plan
        // converted now numbers its nodes per plan and puts no disk on a root port).
        let tops = top_nodes(&client).await;
        for (id, d) in running.disks.iter_mut() {
            if boot_ids.contains(id) || !present.contains(id) {
                continue;
            }
            let at = placement(&client, id).await;
            let top = tops.get(id).map(String::as_str);
            *d = disk_as_running(d, top, at.as_ref());
            info!(device = %id, top = ?top, at = ?at, "hot-plugged disk of the adopted QEMU recovered");
        }
        own_argv = Some(argv);
    }
    let wanted = std::mem::take(&mut running.disks);
    let mut missing = false;
    for (id, d) in wanted {
        if present.contains(&id) {
            running.disks.insert(id, d);
        } else {
            missing = true;
        }
    }
    // The guest opened its channels before this launcher listened: read their state (and the
    // resolved machine type) from QEMU, as a start does, so that the agent channel reads
    // `connected` for the graceful shutdown and virt-handler's AgentConnected.
    let mut domain = domain;
    crate::sync::domain_live::apply_live_facts(
        &mut domain,
        &crate::sync::domain_live::live_facts(&client).await,
    );
    d.shared.take_over(status, domain, client.clone());
    tokio::spawn(follow_events(d.shared.clone(), events, client, watcher));
    info!(pid, state = %status.state.as_str(), "adopted the running QEMU of an earlier launcher");
    if missing {
        crate::sync::reconcile::hotplug(d, &mut running, vmi).await?;
    }
    d.shared.pid.send_replace(Some(pid));
    Ok((running, own_argv))
}

/// The `id` of a `-device` word (the rest of its properties are not read).
#[derive(serde::Deserialize)]
struct DeviceWord {
    id: Option<String>,
}

/// The qdev ids of the `-device` words of `argv` (each a JSON object, as the argv renderer
/// writes them): the devices QEMU started with, as opposed to those hot-plugged since (an
/// adopted QEMU's own command line here, the boot argv a migration sends in
/// [`crate::sync::migration::hotplug`]).
pub(crate) fn argv_device_ids(argv: &[String]) -> BTreeSet<String> {
    argv.windows(2)
        .filter(|w| w[0] == "-device")
        .filter_map(|w| serde_json::from_str::<DeviceWord>(&w[1]).ok())
        .filter_map(|w| w.id)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::names_path;

    #[test]
    fn a_hot_plugged_disk_reads_as_qemu_runs_it() {
        use crate::sync::reconcile::disks::fixtures::hotplug_disk;
        use crate::sync::reconcile::nics::Placement;
        // The plan converted after the restart numbers the volume's nodes 3 and places it on
        // pci.5; QEMU runs it on nodes 7 (numbered after its highest when it was plugged) on
        // the root port pci.9.
        let planned = hotplug_disk("hp1", 3, "/d/hp1.img".into(), Some("S".into()), "pci.5");
        let at = Placement {
            bus: "pci.9".into(),
            addr: "0x0".into(),
        };
        let d = super::disk_as_running(&planned, Some("libvirt-7-format"), Some(&at));
        assert_eq!(
            d,
            hotplug_disk("hp1", 7, "/d/hp1.img".into(), Some("S".into()), "pci.9")
        );
        // The node names are QEMU's (the serial, the user's, is no node name).
        let nodes: Vec<&str> = d.blockdevs.iter().map(|b| b.node_name()).collect();
        assert_eq!(nodes, ["libvirt-7-storage", "libvirt-7-format"]);
        // Nothing known: as planned; a top node without an index: names as planned.
        assert_eq!(super::disk_as_running(&planned, None, None), planned);
        assert_eq!(
            super::disk_as_running(&planned, Some("drive-x"), None),
            planned
        );
    }

    #[test]
    fn the_started_argv_is_the_process_s_own_without_its_binary() {
        // A process of known argv (this test binary's own may have no arguments, which no
        // QEMU has and which reads as `None`).
        let mut child = std::process::Command::new("sleep")
            .args(["100", "200"])
            .spawn()
            .unwrap();
        // Right after the spawn the child may not have exec'd yet: wait until it shows its own
        // command line.
        let pid = child.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut argv = super::started_argv(pid);
        while argv
            .as_deref()
            .is_none_or(|a| a.first().map(String::as_str) != Some("100"))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
            argv = super::started_argv(pid);
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(argv, Some(vec!["100".to_owned(), "200".to_owned()]));
        assert_eq!(super::started_argv(i32::MAX), None);
    }

    #[test]
    fn socket_path_matches_whole_values_only() {
        let p = "/r/qlauncher/monitor.sock";
        assert!(names_path(
            "socket,id=charmonitor,path=/r/qlauncher/monitor.sock,server=on",
            p
        ));
        assert!(names_path(r#"{"path":"/r/qlauncher/monitor.sock"}"#, p));
        assert!(names_path("/r/qlauncher/monitor.sock", p));
        assert!(!names_path("path=/r/qlauncher/monitor.sock2,server=on", p));
        assert!(!names_path("path=/other/monitor.sock", p));
        // Another launcher's socket under a longer root.
        assert!(!names_path(
            "socket,id=charmonitor,path=/tmp/q1/r/qlauncher/monitor.sock,server=on",
            p
        ));
        assert!(!names_path(
            r#"{"path":"/tmp/q1/r/qlauncher/monitor.sock"}"#,
            p
        ));
        assert!(names_path("unix:/r/qlauncher/monitor.sock,server=on", p));
    }
}

//! The guest agent poller and its store: what `GetGuestInfo`, `GetUsers` and `GetFilesystems`
//! answer, and the OS info and freeze state of the domain status.
//!
//! Mirrors KubeVirt's agent poller (`pkg/virt-launcher/virtwrap/agent-poller/agent_poller.go`,
//! `agent_parser.go`, v1.9.0): the RPCs never talk to the agent, they read a store that workers
//! fill on their own schedule. Workers and default intervals (virt-launcher's flags):
//!
//! | worker | agent commands | interval |
//! |---|---|---|
//! | version | `guest-info` | 300 s (`--qemu-agent-version-interval`) |
//! | filesystems | `guest-get-fsinfo` | 300 s (`--qemu-agent-file-interval`) |
//! | freeze status | `guest-fsfreeze-status` | 5 s (`--qemu-fsfreeze-status-interval`) |
//! | sys info | `guest-get-osinfo`, `guest-get-host-name`, `guest-get-timezone` | 120 s (`--qemu-agent-sys-interval`) |
//! | users | `guest-get-users` | 10 s (`--qemu-agent-user-interval`) |
//!
//! (`guest-network-get-interfaces`, also sys info in KubeVirt, is polled by
//! [`crate::sync::guest::info`].) Each worker runs once at once, then after `min(10 s, interval)`,
//! doubling up to its interval. Agent errors are skipped silently; the store is never cleared, so
//! the last data keeps being served after the agent goes away. KubeVirt starts the workers on
//! libvirt's agent CONNECTED event; [`AgentPoller::start`] first waits for the agent to answer a
//! `guest-ping` (every [`CONNECT_PROBE`]), which is the same moment seen from the launcher, and
//! a caller that sees the channel connect (`VSERPORT_CHANGE`) may [`AgentPoller::stop`] it and start
//! it again.
//!
//! A change of the OS info or of the freeze state is reported with [`AgentUpdate`] (KubeVirt sends
//! a MODIFIED domain event with `Status.OSInfo` / `Status.FSFreezeStatus`); users and filesystems
//! changes are not.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::qmp::client::EventStream;

use crate::sync::config::PollIntervals;
use crate::sync::domain::GuestOsInfo;
use crate::sync::guest::agent::{GuestAgent, DEFAULT_AGENT_TIMEOUT};

/// How often [`AgentPoller::start`] asks `guest-ping` until the agent answers.
pub const CONNECT_PROBE: Duration = Duration::from_secs(1);

/// First interval of every worker (KubeVirt `pollInitialInterval`).
pub const POLL_INITIAL: Duration = Duration::from_secs(10);

/// Most users and filesystems `GetGuestInfo` lists (KubeVirt `maxUsers`, `maxFilesystems`... in
/// `manager.go`: the first 10 of each).
pub const GUEST_INFO_MAX_ITEMS: usize = 10;

/// One command the agent supports (`GuestAgentCommandInfo`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AgentCommand {
    /// Command name.
    pub name: String,
    /// Whether it is enabled.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub enabled: bool,
}

/// `VirtualMachineInstanceGuestOSInfo` (JSON names of the VMI API, all omitted when empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
#[allow(missing_docs)]
pub struct OsInfo {
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kernel_release: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub pretty_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub version_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kernel_version: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub machine: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub id: String,
}

impl OsInfo {
    /// From a `guest-get-osinfo` return.
    pub fn from_agent(v: &Value) -> OsInfo {
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        OsInfo {
            name: s("name"),
            kernel_release: s("kernel-release"),
            version: s("version"),
            pretty_name: s("pretty-name"),
            version_id: s("version-id"),
            kernel_version: s("kernel-version"),
            machine: s("machine"),
            id: s("id"),
        }
    }

    /// The domain status form (`api.GuestOSInfo`).
    pub fn to_domain(&self) -> GuestOsInfo {
        GuestOsInfo {
            name: self.name.clone(),
            kernel_release: self.kernel_release.clone(),
            version: self.version.clone(),
            pretty_name: self.pretty_name.clone(),
            version_id: self.version_id.clone(),
            kernel_version: self.kernel_version.clone(),
            machine: self.machine.clone(),
            id: self.id.clone(),
        }
    }
}

/// A logged-in guest user (`VirtualMachineInstanceGuestOSUser`).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestUser {
    /// User name.
    pub user_name: String,
    /// Windows domain; empty on Linux.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub domain: String,
    /// Earliest login, seconds since the epoch, at millisecond precision (libvirt hands QGA's
    /// float seconds over as integer milliseconds, KubeVirt divides by 1000).
    #[serde(skip_serializing_if = "is_zero")]
    pub login_time: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// A disk under a guest file system (`VirtualMachineInstanceFileSystemDisk`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FilesystemDisk {
    /// Disk serial, when the agent knows it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub serial: String,
    /// Bus type (`virtio`, `scsi`, `sata`, ...).
    pub bus_type: String,
}

/// A mounted guest file system (`VirtualMachineInstanceFileSystem`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Filesystem {
    /// Device name in the guest (`vda3`).
    pub disk_name: String,
    /// Mount point.
    pub mount_point: String,
    /// File system type (`ext4`).
    pub file_system_type: String,
    /// Used bytes (0 when the agent does not say).
    pub used_bytes: u64,
    /// Total bytes (0 when the agent does not say).
    pub total_bytes: u64,
    /// The disks it lives on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub disk: Vec<FilesystemDisk>,
}

/// `fsInfo` of `GetGuestInfo`: `{"disks": null}` when there is none, as Go encodes a nil slice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FilesystemInfo {
    /// The file systems.
    pub disks: Option<Vec<Filesystem>>,
}

/// `VirtualMachineInstanceGuestAgentInfo`, the JSON string of `GetGuestInfo`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestAgentInfo {
    /// `guest-info` version.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub guest_agent_version: String,
    /// `guest-info` supported commands.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub supported_commands: Vec<AgentCommand>,
    /// `guest-get-host-name`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub hostname: String,
    /// `guest-get-osinfo`.
    pub os: OsInfo,
    /// `"<zone>, <offset seconds>"` (`", 0"` when unknown).
    pub timezone: String,
    /// The first [`GUEST_INFO_MAX_ITEMS`] users.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub user_list: Vec<GuestUser>,
    /// The first [`GUEST_INFO_MAX_ITEMS`] file systems.
    pub fs_info: FilesystemInfo,
    /// Raw `guest-fsfreeze-status` (`thawed`, `frozen`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fs_freeze_status: String,
}

/// What the workers learned (the store).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GuestData {
    /// `guest-info` version.
    pub version: String,
    /// `guest-info` supported commands.
    pub supported_commands: Vec<AgentCommand>,
    /// `guest-get-host-name`.
    pub hostname: String,
    /// `guest-get-osinfo`.
    pub os: OsInfo,
    /// `guest-get-timezone` zone name.
    pub timezone_zone: String,
    /// `guest-get-timezone` offset in seconds.
    pub timezone_offset: i64,
    /// `guest-get-users`.
    pub users: Vec<GuestUser>,
    /// `guest-get-fsinfo`.
    pub filesystems: Vec<Filesystem>,
    /// `guest-fsfreeze-status`.
    pub fsfreeze: String,
}

impl GuestData {
    /// The `GetGuestInfo` answer (always succeeds; empty store: `{"os":{},"timezone":", 0",
    /// "fsInfo":{"disks":null}}`).
    pub fn guest_info(&self) -> GuestAgentInfo {
        let fs: Vec<Filesystem> = self
            .filesystems
            .iter()
            .take(GUEST_INFO_MAX_ITEMS)
            .cloned()
            .collect();
        GuestAgentInfo {
            guest_agent_version: self.version.clone(),
            supported_commands: self.supported_commands.clone(),
            hostname: self.hostname.clone(),
            os: self.os.clone(),
            timezone: format!("{}, {}", self.timezone_zone, self.timezone_offset),
            user_list: self
                .users
                .iter()
                .take(GUEST_INFO_MAX_ITEMS)
                .cloned()
                .collect(),
            fs_info: FilesystemInfo {
                disks: (!fs.is_empty()).then_some(fs),
            },
            fs_freeze_status: self.fsfreeze.clone(),
        }
    }
}

/// A change the domain status carries.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentUpdate {
    /// `guest-get-osinfo` changed.
    OsInfo(GuestOsInfo),
    /// `guest-fsfreeze-status` changed (`thawed` / `frozen`).
    FsFreeze(String),
}

/// Called with each [`AgentUpdate`].
pub type OnAgentUpdate = Arc<dyn Fn(AgentUpdate) + Send + Sync>;

/// The store the workers fill and the RPCs read.
#[derive(Debug, Default)]
pub struct GuestStore {
    data: StdMutex<GuestData>,
}

impl GuestStore {
    /// A copy of what is known.
    pub fn snapshot(&self) -> GuestData {
        self.data.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `GetGuestInfo`'s JSON string.
    pub fn guest_info_json(&self) -> String {
        serde_json::to_string(&self.snapshot().guest_info()).unwrap_or_default()
    }

    /// `GetUsers`'s JSON string: every user, `[]` when none.
    pub fn users_json(&self) -> String {
        serde_json::to_string(&self.snapshot().users).unwrap_or_else(|_| "[]".into())
    }

    /// `GetFilesystems`'s JSON string: every file system, `[]` when none.
    pub fn filesystems_json(&self) -> String {
        serde_json::to_string(&self.snapshot().filesystems).unwrap_or_else(|_| "[]".into())
    }

    /// Applies `f` to the data; true when it changed.
    fn update(&self, f: impl FnOnce(&mut GuestData)) -> bool {
        let mut d = self.data.lock().unwrap_or_else(|e| e.into_inner());
        let before = d.clone();
        f(&mut d);
        *d != before
    }

    /// Records a freeze state learned outside the poller (after Freeze / Unfreeze); true when
    /// it changed.
    pub fn set_fsfreeze(&self, status: &str) -> bool {
        self.update(|d| d.fsfreeze = status.to_string())
    }
}

/// `guest-info` → version and commands.
pub fn parse_guest_info(v: &Value) -> (String, Vec<AgentCommand>) {
    let version = v["version"].as_str().unwrap_or_default().to_string();
    let commands = v["supported_commands"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|c| AgentCommand {
            name: c["name"].as_str().unwrap_or_default().to_string(),
            enabled: c["enabled"].as_bool().unwrap_or(false),
        })
        .collect();
    (version, commands)
}

/// `guest-get-users` → users, one per name with its earliest login (QGA already merges them).
pub fn parse_users(v: &Value) -> Vec<GuestUser> {
    v.as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|u| {
            let seconds = u["login-time"].as_f64().unwrap_or(0.0);
            GuestUser {
                user_name: u["user"].as_str().unwrap_or_default().to_string(),
                domain: u["domain"].as_str().unwrap_or_default().to_string(),
                login_time: (seconds * 1000.0).trunc() / 1000.0,
            }
        })
        .collect()
}

/// `guest-get-fsinfo` → file systems (only the members KubeVirt reads).
pub fn parse_fsinfo(v: &Value) -> Vec<Filesystem> {
    v.as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|f| Filesystem {
            disk_name: f["name"].as_str().unwrap_or_default().to_string(),
            mount_point: f["mountpoint"].as_str().unwrap_or_default().to_string(),
            file_system_type: f["type"].as_str().unwrap_or_default().to_string(),
            used_bytes: f["used-bytes"].as_u64().unwrap_or(0),
            total_bytes: f["total-bytes"].as_u64().unwrap_or(0),
            disk: f["disk"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|d| FilesystemDisk {
                    serial: d["serial"].as_str().unwrap_or_default().to_string(),
                    bus_type: d["bus-type"].as_str().unwrap_or_default().to_string(),
                })
                .collect(),
        })
        .collect()
}

/// The running workers; dropping it stops them.
#[derive(Debug)]
pub struct AgentPoller {
    tasks: Vec<JoinHandle<()>>,
}

/// What a worker does with one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Worker {
    Version,
    Filesystems,
    FsFreeze,
    Sys,
    Users,
}

impl AgentPoller {
    /// Starts the workers once the agent answers `guest-ping`, with `intervals`, filling `store`
    /// and reporting OS-info and freeze-state changes to `on_update`.
    ///
    /// With the domain's QMP `events`, a `VSERPORT_CHANGE` that opens a port (the guest agent
    /// opening its channel: libvirt's agent CONNECTED, on which KubeVirt starts its poller, and
    /// the moment the domain's channel turns `connected`) makes it ask `guest-ping` at once
    /// instead of after the probe interval, so `GetGuestInfo` has the agent's data about when
    /// virt-handler sees the channel connected.
    pub fn start(
        agent: Arc<GuestAgent>,
        store: Arc<GuestStore>,
        intervals: PollIntervals,
        on_update: OnAgentUpdate,
        events: Option<EventStream>,
    ) -> AgentPoller {
        let workers = [
            (Worker::Version, intervals.version),
            (Worker::Filesystems, intervals.filesystems),
            (Worker::FsFreeze, intervals.fsfreeze),
            (Worker::Sys, intervals.sys),
            (Worker::Users, intervals.users),
        ];
        let (connected_tx, connected_rx) = tokio::sync::watch::channel(false);
        let mut tasks = Vec::new();
        {
            let agent = agent.clone();
            let mut events = events;
            tasks.push(tokio::spawn(async move {
                loop {
                    match events.as_mut() {
                        Some(ev) => {
                            tokio::select! {
                                r = agent.ping(CONNECT_PROBE) => if r.is_ok() { break },
                                // A ping sent before the agent listened may go unanswered.
                                () = port_opened(ev) => continue,
                            }
                            if tokio::time::timeout(CONNECT_PROBE, port_opened(ev))
                                .await
                                .is_ok()
                            {
                                continue;
                            }
                        }
                        None => {
                            if agent.ping(CONNECT_PROBE).await.is_ok() {
                                break;
                            }
                            tokio::time::sleep(CONNECT_PROBE).await;
                        }
                    }
                }
                let _ = connected_tx.send(true);
            }));
        }
        for (worker, interval) in workers {
            let agent = agent.clone();
            let store = store.clone();
            let on_update = on_update.clone();
            let mut connected = connected_rx.clone();
            tasks.push(tokio::spawn(async move {
                if connected.wait_for(|c| *c).await.is_err() {
                    return;
                }
                let mut wait = POLL_INITIAL.min(interval);
                loop {
                    poll_once(worker, &agent, &store, &on_update).await;
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(interval);
                }
            }));
        }
        AgentPoller { tasks }
    }

    /// Stops the workers (agent disconnected, domain paused or gone).
    pub fn stop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

impl Drop for AgentPoller {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Returns when QEMU reports a virtio-serial port opened by the guest (`VSERPORT_CHANGE` with
/// `open: true`); never when the event stream ended.
async fn port_opened(events: &mut EventStream) {
    loop {
        match events.recv().await {
            Some(e) if e.name == "VSERPORT_CHANGE" && e.data["open"].as_bool() == Some(true) => {
                return
            }
            Some(_) => {}
            None => std::future::pending::<()>().await,
        }
    }
}

/// Runs one command, errors skipped (KubeVirt logs nothing either).
async fn ask(agent: &GuestAgent, command: &str) -> Option<Value> {
    agent
        .command(command, None, DEFAULT_AGENT_TIMEOUT)
        .await
        .ok()
}

async fn poll_once(worker: Worker, agent: &GuestAgent, store: &GuestStore, on: &OnAgentUpdate) {
    match worker {
        Worker::Version => {
            if let Some(v) = ask(agent, "guest-info").await {
                let (version, commands) = parse_guest_info(&v);
                store.update(|d| {
                    d.version = version;
                    d.supported_commands = commands;
                });
            }
        }
        Worker::Filesystems => {
            if let Some(v) = ask(agent, "guest-get-fsinfo").await {
                let fs = parse_fsinfo(&v);
                store.update(|d| d.filesystems = fs);
            }
        }
        Worker::FsFreeze => {
            if let Some(v) = ask(agent, "guest-fsfreeze-status").await {
                let status = v.as_str().unwrap_or_default().to_string();
                if store.set_fsfreeze(&status) {
                    on(AgentUpdate::FsFreeze(status));
                }
            }
        }
        Worker::Sys => {
            // Asked together and stored at once, as libvirt's `virDomainGetGuestInfo` answers
            // them: `GetGuestInfo` never shows an OS without its host name and time zone.
            let os = ask(agent, "guest-get-osinfo")
                .await
                .map(|v| OsInfo::from_agent(&v));
            let name = ask(agent, "guest-get-host-name")
                .await
                .map(|v| v["host-name"].as_str().unwrap_or_default().to_string());
            let zone = ask(agent, "guest-get-timezone").await.map(|v| {
                (
                    v["zone"].as_str().unwrap_or_default().to_string(),
                    v["offset"].as_i64().unwrap_or(0),
                )
            });
            let os_changed = os.as_ref().map(|os| (os.clone(), os.to_domain()));
            let mut os_update = None;
            store.update(|d| {
                if let Some((os, domain)) = os_changed {
                    if d.os != os {
                        d.os = os;
                        os_update = Some(domain);
                    }
                }
                if let Some(name) = name {
                    d.hostname = name;
                }
                if let Some((zone, offset)) = zone {
                    d.timezone_zone = zone;
                    d.timezone_offset = offset;
                }
            });
            if let Some(domain) = os_update {
                on(AgentUpdate::OsInfo(domain));
            }
        }
        Worker::Users => {
            if let Some(v) = ask(agent, "guest-get-users").await {
                let users = parse_users(&v);
                store.update(|d| d.users = users);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_store_answers_like_kubevirt() {
        let s = GuestStore::default();
        assert_eq!(
            s.guest_info_json(),
            r#"{"os":{},"timezone":", 0","fsInfo":{"disks":null}}"#
        );
        assert_eq!(s.users_json(), "[]");
        assert_eq!(s.filesystems_json(), "[]");
    }

    #[test]
    fn agent_replies_map_to_vmi_api_names() {
        let fs = parse_fsinfo(&json!([{"name": "vda3", "total-bytes": 6160384,
            "mountpoint": "/data", "disk": [{"bus-type": "virtio", "bus": 0, "unit": 0,
            "dev": "/dev/vda3", "target": 0}], "used-bytes": 15360, "type": "ext4"}]));
        assert_eq!(
            serde_json::to_value(&fs).unwrap(),
            json!([{"diskName": "vda3", "mountPoint": "/data", "fileSystemType": "ext4",
                "usedBytes": 15360, "totalBytes": 6160384, "disk": [{"busType": "virtio"}]}])
        );
        let users = parse_users(&json!([{"login-time": 1796118178.123456, "user": "root"}]));
        assert_eq!(
            serde_json::to_value(&users).unwrap(),
            json!([{"userName": "root", "loginTime": 1796118178.123}])
        );
        let (version, commands) = parse_guest_info(&json!({"version": "7.2.22",
            "supported_commands": [{"enabled": true, "name": "guest-ping",
            "success-response": true}, {"enabled": false, "name": "guest-get-devices"}]}));
        let d = GuestData {
            version,
            supported_commands: commands,
            hostname: "qlg".into(),
            os: OsInfo::from_agent(&json!({"name": "Debian", "id": "debian",
                "version-id": "12"})),
            timezone_zone: "UTC".into(),
            timezone_offset: 0,
            users,
            filesystems: fs,
            fsfreeze: "thawed".into(),
        };
        let v = serde_json::to_value(d.guest_info()).unwrap();
        assert_eq!(v["guestAgentVersion"], "7.2.22");
        assert_eq!(
            v["supportedCommands"],
            json!([{"name": "guest-ping", "enabled": true}, {"name": "guest-get-devices"}])
        );
        assert_eq!(
            v["os"],
            json!({"name": "Debian", "versionId": "12", "id": "debian"})
        );
        assert_eq!(v["timezone"], "UTC, 0");
        assert_eq!(v["fsInfo"]["disks"][0]["mountPoint"], "/data");
        assert_eq!(v["fsFreezeStatus"], "thawed");
        assert_eq!(v["hostname"], "qlg");
    }

    #[test]
    fn guest_info_lists_at_most_ten() {
        let d = GuestData {
            users: vec![GuestUser::default(); 12],
            filesystems: vec![Filesystem::default(); 11],
            ..GuestData::default()
        };
        let info = d.guest_info();
        assert_eq!(info.user_list.len(), 10);
        assert_eq!(info.fs_info.disks.unwrap().len(), 10);
    }
}

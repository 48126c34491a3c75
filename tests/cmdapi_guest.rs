//! KubeVirt's guest-agent, freeze, screenshot, memory-dump, dirty-rate and VM-stats RPCs against
//! the test guest with Debian's real `qemu-guest-agent` (TCG), played the way virt-handler and
//! virt-api call them; one boot, many checks:
//! - `GetGuestInfo`, `GetUsers`, `GetFilesystems` return what the guest has (OS id and version
//!   from its `/etc/os-release`, host name, the root shell's login, the ext4 `/data` on `vda3`);
//!   the domain status carries the OS info.
//! - `FreezeVirtualMachine` makes a guest write to `/data` wait until `UnfreezeVirtualMachine`,
//!   and a freeze with `unfreezeTimeoutSeconds` thaws by itself; `GetGuestInfo` shows `frozen`.
//! - `GetScreenshot` is a PNG of the console's size (compared with QEMU's own PPM dump).
//! - `VirtualMachineMemoryDump` writes an ELF core holding all guest memory into the memory-dump
//!   volume, and the domain metadata says completed; the guest runs again afterwards.
//! - `GetDomainDirtyRateStats` reports a rate while the guest writes memory.
//! - `GetVMStats` answers domain stats, dirty rate and agent data.
//! - `GetQemuVersion` answers `QEMU <x.y.z>`; `InjectLaunchSecret` and `GetLaunchMeasurement` on
//!   this domain without SEV answer as KubeVirt's launcher (libvirt's refusal; the loader's hash).
//! - `SoftRebootVirtualMachine` with `AgentConnected` reboots the guest through the agent.
//!
//! The launcher runs in-process in a private network namespace of the test thread. Needs root and
//! the test guest (`scripts/build-guest`).

use testkit::guest;
use testkit::guest::wait_log_marker as wait_marker;
use testkit::handler::{self, get_domain, Client};
use testkit::in_process::{InProcess, LauncherRoot};

use guest::GuestImages;
use qlauncher::sync::domain::{LifeCycle, StateChangeReason};
use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Guest memory (the memory dump must hold all of it).
const MEMORY_MIB: u64 = 256;

fn vmi(uid: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "agent", "namespace": "default", "uid": uid},
        "spec": {
            "domain": {
                "resources": {"requests": {"memory": format!("{MEMORY_MIB}Mi")}},
                "devices": {
                    "autoattachPodInterface": false,
                    "disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}]
                }
            },
            "volumes": [
                {"name": "rootdisk", "containerDisk": {"image": "qlauncher/test-guest:latest"}}
            ]
        }
    })
}

/// Runs `sh -c script` in the guest through the agent; returns (exit code, stdout).
async fn sh(client: &mut Client, script: &str) -> (i32, String) {
    let out = client
        .exec(cmd::ExecRequest {
            domain_name: "default_agent".into(),
            command: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            timeout_seconds: 20,
        })
        .await
        .unwrap_or_else(|e| panic!("exec {script:?}: {e}"))
        .into_inner();
    (out.exit_code, out.std_out)
}

async fn guest_info(client: &mut Client) -> Value {
    let answer = client
        .get_guest_info(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(answer.response.as_ref().unwrap().success, "{answer:?}");
    serde_json::from_str(&answer.guest_info_response).unwrap()
}

/// Polls `GetGuestInfo` until `ok` holds.
async fn guest_info_until(
    client: &mut Client,
    what: &str,
    timeout: Duration,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let info = guest_info(client).await;
        if ok(&info) {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "no {what} within {timeout:?}: {info:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The longest gap in seconds between two consecutive lines of the guest's `/data/ticks`, after
/// checking the ticks go on (the last one is less than 2 s old in guest time).
async fn longest_tick_gap(client: &mut Client) -> i64 {
    let (code, out) = sh(client, "cat /data/ticks; date +%s").await;
    assert_eq!(code, 0);
    let ticks: Vec<i64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert!(ticks.len() > 3, "too few ticks: {out}");
    let (now, ticks) = ticks.split_last().unwrap();
    assert!(
        now - ticks.last().unwrap() <= 2,
        "the writes stopped: {out}"
    );
    ticks.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
}

/// The sum of the `PT_LOAD` segments' sizes of an ELF64 core, checking the header.
fn elf_core_memory(path: &Path) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).unwrap();
    let mut h = [0u8; 64];
    f.read_exact(&mut h).unwrap();
    assert_eq!(&h[..4], b"\x7fELF", "not an ELF file");
    assert_eq!(h[4], 2, "not ELF64");
    assert_eq!(
        u16::from_le_bytes([h[16], h[17]]),
        4,
        "not a core (ET_CORE)"
    );
    let phoff = u64::from_le_bytes(h[32..40].try_into().unwrap());
    let phentsize = u16::from_le_bytes([h[54], h[55]]) as usize;
    let phnum = u16::from_le_bytes([h[56], h[57]]) as usize;
    let mut table = vec![0u8; phentsize * phnum];
    f.seek(SeekFrom::Start(phoff)).unwrap();
    f.read_exact(&mut table).unwrap();
    table
        .chunks(phentsize)
        .filter(|p| u32::from_le_bytes(p[0..4].try_into().unwrap()) == 1)
        .map(|p| u64::from_le_bytes(p[32..40].try_into().unwrap()))
        .sum()
}

#[test]
fn guest_agent_freeze_screenshot_memory_dump_dirty_rate_and_stats_on_a_real_guest() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    testkit::in_process::runtime().block_on(scenario());
}

async fn scenario() {
    let images = GuestImages::locate();
    let uid = format!("5f0c1a2e-0000-4000-8001-{:012}", std::process::id());
    let mut root = LauncherRoot::new(&images.disk_qcow2, &uid);
    let operator_qmp = root.path().join("operator-qmp.sock");
    root.config.operator_qmp_socket = Some(operator_qmp.clone());
    root.config.vm_stats_collector = true;
    // The OVMF directory (the VMI boots BIOS; only GetLaunchMeasurement reads it).
    let ovmf = root.path().join("ovmf");
    std::fs::create_dir_all(&ovmf).unwrap();
    std::fs::write(ovmf.join("OVMF_CODE.cc.fd"), OVMF_CC).unwrap();
    root.config.ovmf_dir = ovmf;
    let private = root.private.clone();
    let hotplug = root.share_dir().join("hotplug-disks/memdump");
    std::fs::create_dir_all(&hotplug).unwrap();
    let launcher = InProcess::start(root.config.clone(), &root.share_dir()).await;
    let received = launcher.received.clone();
    let mut client = launcher.client.clone();
    let vmi = vmi(&uid);

    // Before any domain: GetGuestInfo still answers, with the empty store.
    assert_eq!(
        guest_info(&mut client).await,
        json!({"os": {}, "timezone": ", 0", "fsInfo": {"disks": null}})
    );

    let answer = client
        .sync_virtual_machine(handler::vmi_only(&vmi))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.success, "{}", answer.message);
    let serial = private.join(&uid).join("virt-serial0-log");
    let boot = guest::BOOT_TIMEOUT;
    let data = wait_marker(&serial, "QLG: data ", boot).await;
    assert_eq!(data, "QLG: data /dev/vda3 mounted=/data");
    wait_marker(&serial, "QLG: agent ready", boot).await;

    // GetGuestInfo: what the guest has.
    let info = guest_info_until(&mut client, "agent data", Duration::from_secs(60), |i| {
        i["guestAgentVersion"].is_string()
            && i["os"]["id"] == "qlg"
            && i["hostname"].is_string()
            && i["fsInfo"]["disks"].is_array()
            && i["userList"].is_array()
    })
    .await;
    assert_eq!(
        info["os"],
        json!({"name": "qlauncher test guest", "kernelRelease": info["os"]["kernelRelease"],
            "version": "1 (busybox and Debian 12 packages)", "prettyName": "qlauncher test guest 1",
            "versionId": "1", "kernelVersion": info["os"]["kernelVersion"], "machine": "x86_64",
            "id": "qlg"}),
        "{info:#}"
    );
    assert!(
        info["os"]["kernelRelease"]
            .as_str()
            .unwrap()
            .ends_with("cloud-amd64"),
        "{info:#}"
    );
    assert_eq!(info["hostname"], "qlg");
    assert_eq!(info["timezone"], "UTC, 0");
    assert!(
        info["guestAgentVersion"]
            .as_str()
            .unwrap()
            .starts_with("7."),
        "{info:#}"
    );
    let commands: Vec<&str> = info["supportedCommands"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["enabled"] == true)
        .filter_map(|c| c["name"].as_str())
        .collect();
    // What virt-handler requires of a "supported" agent.
    for required in [
        "guest-ping",
        "guest-get-time",
        "guest-info",
        "guest-shutdown",
        "guest-network-get-interfaces",
        "guest-get-fsinfo",
        "guest-get-host-name",
        "guest-get-users",
        "guest-get-timezone",
        "guest-get-osinfo",
    ] {
        assert!(
            commands.contains(&required),
            "{required} missing: {commands:?}"
        );
    }
    let data_fs = json!({"diskName": "vda3", "mountPoint": "/data", "fileSystemType": "ext4",
        "usedBytes": info["fsInfo"]["disks"][0]["usedBytes"],
        "totalBytes": info["fsInfo"]["disks"][0]["totalBytes"],
        "disk": [{"busType": "virtio"}]});
    assert_eq!(info["fsInfo"]["disks"], json!([data_fs]), "{info:#}");
    assert!(
        data_fs["totalBytes"].as_u64().unwrap() > 4 << 20,
        "{info:#}"
    );

    // GetUsers: the root shell on ttyS0, logged in at boot.
    let users = client
        .get_users(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(users.response.unwrap().success);
    let users: Value = serde_json::from_str(&users.guest_user_list_response).unwrap();
    assert_eq!(users.as_array().unwrap().len(), 1, "{users}");
    assert_eq!(users[0]["userName"], "root");
    let login = users[0]["loginTime"].as_f64().unwrap();
    assert!(
        (login - now_secs() as f64).abs() < 600.0,
        "login time {login} is not about now: {users}"
    );

    // GetFilesystems: every file system, same shape.
    let fs = client
        .get_filesystems(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(fs.response.unwrap().success);
    let fs: Value = serde_json::from_str(&fs.guest_filesystems_response).unwrap();
    assert_eq!(fs, json!([data_fs]));

    // The domain status carries the OS info (KubeVirt's agent-updated domain event).
    let domain = get_domain(&mut client).await.expect("a domain");
    assert_eq!(domain.status.os_info.id, "qlg");
    assert_eq!(domain.status.os_info.version_id, "1");
    assert!(received
        .lock()
        .unwrap()
        .iter()
        .any(|(t, d)| t == "MODIFIED" && d.status.os_info.id == "qlg"));

    // Freeze: a guest process appending a timestamp to /data every 0.2 s stops while the file
    // systems are frozen and goes on after Unfreeze (the longest gap between its ticks is the
    // freeze; no clock comparison between host and guest).
    let (code, _) = sh(
        &mut client,
        "(while :; do date +%s >>/data/ticks; sleep 0.2; done) </dev/null >/dev/null 2>&1 & \
         echo $! >/tmp/ticker.pid",
    )
    .await;
    assert_eq!(code, 0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let freeze = client
        .freeze_virtual_machine(cmd::FreezeRequest {
            vmi: Some(handler::vmi_message(&vmi)),
            unfreeze_timeout_seconds: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(freeze.success, "{}", freeze.message);
    let frozen = Instant::now();
    guest_info_until(
        &mut client,
        "fsFreezeStatus frozen",
        Duration::from_secs(15),
        |i| i["fsFreezeStatus"] == "frozen",
    )
    .await;
    assert_eq!(
        get_domain(&mut client)
            .await
            .expect("a domain")
            .status
            .fs_freeze_status
            .status,
        "frozen"
    );
    // A second Freeze of a frozen guest is a no-op success.
    let again = client
        .freeze_virtual_machine(cmd::FreezeRequest {
            vmi: Some(handler::vmi_message(&vmi)),
            unfreeze_timeout_seconds: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(again.success, "{}", again.message);
    if let Some(rest) = Duration::from_secs(5).checked_sub(frozen.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let unfreeze = client
        .unfreeze_virtual_machine(handler::vmi_only(&vmi))
        .await
        .unwrap()
        .into_inner();
    assert!(unfreeze.success, "{}", unfreeze.message);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let gap = longest_tick_gap(&mut client).await;
    assert!(
        gap >= 4,
        "writes went on while frozen (longest gap {gap} s)"
    );
    guest_info_until(
        &mut client,
        "fsFreezeStatus thawed",
        Duration::from_secs(15),
        |i| i["fsFreezeStatus"] == "thawed",
    )
    .await;
    // Unfreeze of a thawed guest is a no-op success.
    let again = client
        .unfreeze_virtual_machine(handler::vmi_only(&vmi))
        .await
        .unwrap()
        .into_inner();
    assert!(again.success, "{}", again.message);

    // Freeze with a 3 s unfreeze timeout thaws by itself: the ticks pause for about 3 s and go
    // on (the agent refuses guest-exec while frozen, so the Exec below also needs the thaw).
    sh(&mut client, ": >/data/ticks").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let freeze = client
        .freeze_virtual_machine(cmd::FreezeRequest {
            vmi: Some(handler::vmi_message(&vmi)),
            unfreeze_timeout_seconds: 3,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(freeze.success, "{}", freeze.message);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let gap = longest_tick_gap(&mut client).await;
    assert!(
        (2..=5).contains(&gap),
        "a 3 s auto-thaw should pause the writes for about 3 s (longest gap {gap} s)"
    );
    sh(&mut client, "kill $(cat /tmp/ticker.pid)").await;
    // GetScreenshot: a PNG of the console's size (QEMU's own PPM dump through the operator
    // socket gives the size).
    let shot = client
        .get_screenshot(handler::vmi_only(&vmi))
        .await
        .unwrap()
        .into_inner();
    assert!(shot.response.as_ref().unwrap().success, "{shot:?}");
    assert_eq!(shot.mime, "image/png");
    let decoder = png::Decoder::new(std::io::Cursor::new(shot.data.clone()));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
    let frame = reader.next_frame(&mut pixels).expect("PNG pixels decode");
    let ppm = root.path().join("console.ppm");
    {
        let ppm = ppm.clone();
        let operator_qmp = operator_qmp.clone();
        tokio::task::spawn_blocking(move || {
            let mut qmp = guest::Qmp::connect(&operator_qmp, Duration::from_secs(10)).unwrap();
            qmp.execute("screendump", json!({"filename": ppm})).unwrap();
        })
        .await
        .unwrap();
    }
    let header = std::fs::read(&ppm).unwrap();
    let header: Vec<String> = String::from_utf8_lossy(&header[..32])
        .split_whitespace()
        .take(3)
        .map(String::from)
        .collect();
    assert_eq!(header[0], "P6");
    assert_eq!(
        (frame.width.to_string(), frame.height.to_string()),
        (header[1].clone(), header[2].clone())
    );

    // VirtualMachineMemoryDump: an ELF core of all guest memory in the volume, metadata
    // completed; old dumps in the volume are removed first.
    std::fs::write(hotplug.join("old.memory.dump"), b"old").unwrap();
    let name = "agent-memdump-20261201-100000.memory.dump";
    let dump_path = hotplug.join(name);
    let dump = |client: &mut Client| {
        let mut client = client.clone();
        let vmi = Some(handler::vmi_message(&vmi));
        let dump_path = dump_path.clone();
        async move {
            client
                .virtual_machine_memory_dump(cmd::MemoryDumpRequest {
                    vmi,
                    dump_path: dump_path.display().to_string(),
                })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let answer = dump(&mut client).await;
    assert!(answer.success, "{}", answer.message);
    // virt-handler repeats the call on every sync while the dump runs: no second dump.
    let answer = dump(&mut client).await;
    assert!(answer.success, "{}", answer.message);
    let deadline = Instant::now() + Duration::from_secs(120);
    let metadata = loop {
        let d = get_domain(&mut client).await.expect("a domain");
        let m = d.spec.metadata.kubevirt.memory_dump.clone();
        if m.as_ref().is_some_and(|m| m.completed) {
            break m.unwrap();
        }
        assert!(Instant::now() < deadline, "dump not completed: {m:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(metadata.file_name, name);
    assert!(!metadata.failed, "{metadata:?}");
    assert!(metadata.start_timestamp.is_some() && metadata.end_timestamp.is_some());
    assert!(!hotplug.join("old.memory.dump").exists());
    // All guest RAM, plus the video RAM QEMU dumps with it (16 MiB for the VGA device).
    let dumped = elf_core_memory(&dump_path);
    assert!(
        (MEMORY_MIB << 20..=(MEMORY_MIB + 32) << 20).contains(&dumped),
        "the core holds {dumped} bytes of memory, the guest has {MEMORY_MIB} MiB"
    );
    assert!(std::fs::metadata(&dump_path).unwrap().len() >= dumped);
    assert!(received.lock().unwrap().iter().any(|(_, d)| d
        .spec
        .metadata
        .kubevirt
        .memory_dump
        .as_ref()
        .is_some_and(|m| m.completed && m.file_name == name)));
    // The guest was paused for the dump (Paused/Dump, not a user's pause) and runs again.
    {
        let events = received.lock().unwrap().clone();
        let paused: Vec<_> = events
            .iter()
            .filter(|(_, d)| d.status.status == LifeCycle::Paused)
            .map(|(_, d)| d.status.reason)
            .collect();
        assert!(
            paused.contains(&StateChangeReason::Dump) && !paused.contains(&StateChangeReason::User),
            "paused events: {paused:?}"
        );
    }
    assert_eq!(sh(&mut client, "echo alive").await, (0, "alive\n".into()));
    assert_eq!(
        get_domain(&mut client)
            .await
            .expect("a domain")
            .status
            .status,
        LifeCycle::Running
    );

    // GetDomainDirtyRateStats while the guest rewrites 32 MiB of tmpfs in a loop.
    sh(
        &mut client,
        "(while :; do dd if=/dev/urandom of=/tmp/dirty bs=1M count=32 2>/dev/null; done) \
         </dev/null >/dev/null 2>&1 & echo $! >/tmp/dirty.pid",
    )
    .await;
    let rate = client
        .get_domain_dirty_rate_stats(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(rate.response.as_ref().unwrap().success, "{rate:?}");
    assert!(rate.dirty_rate_mbs > 0, "{rate:?}");

    // GetVMStats (the launcher runs with --vm-stats-collector).
    let stats = client
        .get_vm_stats(cmd::VmStatsRequest {
            domain_stats: Some(cmd::DomainStatsRequest {}),
            dirty_rate: Some(cmd::DirtyRateRequest {}),
            guest_get_host_name: Some(cmd::AgentHostNameRequest {}),
            guest_get_users: Some(cmd::AgentUsersRequest {}),
            ..cmd::VmStatsRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(stats.response.as_ref().unwrap().success, "{stats:?}");
    let domain_stats: Value =
        serde_json::from_str(&stats.domain_stats.as_ref().unwrap().domain_stats).unwrap();
    assert_eq!(domain_stats["Name"], "default_agent");
    assert!(stats.dirty_rate_stats.as_ref().unwrap().dirty_rate_mbs > 0);
    assert_eq!(
        stats.guest_agent_version.as_ref().unwrap().message,
        info["guestAgentVersion"].as_str().unwrap()
    );
    let host: Value =
        serde_json::from_str(&stats.guest_get_host_name.as_ref().unwrap().message).unwrap();
    assert_eq!(host, json!({"return": {"host-name": "qlg"}}));
    let users: Value =
        serde_json::from_str(&stats.guest_get_users.as_ref().unwrap().message).unwrap();
    assert_eq!(users["return"][0]["user"], "root");
    sh(&mut client, "kill $(cat /tmp/dirty.pid)").await;

    // GetQemuVersion answers as KubeVirt formats libvirt's hypervisor version.
    let version = client
        .get_qemu_version(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner()
        .version;
    let qemu = std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&qemu.stdout).into_owned();
    let micro_version = line.split_whitespace().nth(3).unwrap_or_default();
    assert_eq!(version, format!("QEMU {micro_version}"));

    // SEV attestation on a domain without SEV, as KubeVirt answers: InjectLaunchSecret is
    // libvirt's refusal; GetLaunchMeasurement hashes the SEV OVMF code file only (libvirt
    // reports no launch-security parameters for such a domain).
    let secret = client
        .inject_launch_secret(cmd::InjectLaunchSecretRequest {
            vmi: Some(handler::vmi_message(&vmi)),
            options: br#"{"header":"aGVhZGVy","secret":"c2VjcmV0"}"#.to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (secret.success, secret.message.as_str()),
        (
            false,
            "LibvirtError(Code=84, Domain=10, Message='Operation not supported: setting a launch \
             secret is only supported in SEV-enabled domains')"
        )
    );
    let measurement = client
        .get_launch_measurement(handler::vmi_only(&vmi))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        measurement.response,
        Some(cmd::Response {
            success: true,
            message: String::new()
        })
    );
    let loader_sha: String = sha2::Digest::finalize(sha2::Digest::chain_update(
        <sha2::Sha256 as sha2::Digest>::new(),
        OVMF_CC,
    ))
    .iter()
    .map(|b| format!("{b:02x}"))
    .collect();
    assert_eq!(
        serde_json::from_slice::<Value>(&measurement.launch_measurement).unwrap(),
        json!({"loaderSHA": loader_sha})
    );

    // A backup of a VMI without changed block tracking: KubeVirt's refusal (tests/sync_backup.rs
    // runs backups).
    let backup = client
        .backup_virtual_machine(cmd::BackupRequest {
            vmi: Some(handler::vmi_message(&vmi)),
            options: vec![],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!backup.success);
    assert_eq!(
        backup.message,
        "Backup failed ChangedBlockTracking is not enabled"
    );

    // SoftRebootVirtualMachine with the agent connected (virt-handler's AgentConnected
    // condition): the guest reboots through the agent (`guest-shutdown` mode `reboot`).
    let mut connected = vmi.clone();
    connected["status"]["conditions"] = json!([{"type": "AgentConnected", "status": "True"}]);
    let answer = client
        .soft_reboot_virtual_machine(handler::vmi_only(&connected))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.success, "{}", answer.message);
    wait_marker(&serial, "QLG: reboot", Duration::from_secs(60)).await;

    let answer = client
        .kill_virtual_machine(handler::vmi_only(&vmi))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.success, "{}", answer.message);
}

/// What the test puts at `<ovmf-path>/OVMF_CODE.cc.fd`, the file GetLaunchMeasurement hashes.
const OVMF_CC: &[u8] = b"qlauncher test: SEV OVMF code";

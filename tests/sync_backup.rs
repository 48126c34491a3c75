//! KubeVirt v1.9 push backups with changed block tracking on a real guest (TCG), through the
//! real cmd socket as virt-handler calls `BackupVirtualMachine` and `RedefineCheckpoint`, and
//! the backup metadata as virt-handler reads it from the domain events:
//! - the guest writes known blocks to its CBT disk (`data`, a 16 MiB filesystem PVC behind
//!   `<private>/libvirt/qemu/cbt/data.qcow2`); a full backup's qcow2 restores to the disk
//!   block for block; after more writes an incremental backup holds exactly the touched 64 KiB
//!   clusters, and the pair (rebased) restores to the disk block for block;
//! - the same Start again is a no-op while it runs and "already executed" after; an
//!   incremental from a checkpoint this launcher does not know fails (never a silent full);
//! - a freeze the guest's agent refuses (`qemu-ga -b guest-fsfreeze-freeze`) is reported as
//!   KubeVirt does: `QuiesceStatus: Failed` and the agent's error in `BackupMsg` while the
//!   backup runs, which still completes;
//! - an abort mid-backup (the backup jobs run at `backup_speed`) ends failed with `backup
//!   aborted: Operation canceled` and no target file;
//! - after the guest powers off and a new launcher boots the VM, `RedefineCheckpoint` of the
//!   last checkpoint is valid and an incremental from it restores correctly; after QEMU is
//!   SIGKILLed, the bitmap is inconsistent: `checkpointInvalid`, and the next backup is full;
//! - a Start that cannot begin clears the metadata to `{}` and removes its directory.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use guest::{Console, GuestImages};
use qlauncher::sync::domain::BackupMetadata;
use serde_json::{json, Value};
use testkit::backup::{
    backup, backup_events, cbt_vmi, checkpoint, completed, redefine, restore, sh, write,
};
use testkit::guest;
use testkit::handler;
use testkit::in_process::{InProcess, LauncherRoot};
use testkit::storage::run;

const MIB: usize = 1 << 20;
const CLUSTER: usize = 64 << 10;
/// The data disk's size.
const DISK: usize = 16 * MIB;

/// Guest shell: replaces the test guest's agent (`/etc/qlg/agent`, which restarts `qemu-ga`)
/// by a `qemu-ga` that refuses `guest-fsfreeze-freeze`.
const AGENT_WITHOUT_FREEZE: &str = "for d in /proc/[0-9]*; do \
    grep -q '/etc/qlg/agen[t]' $d/cmdline 2>/dev/null && kill ${d#/proc/}; done; \
    for d in /proc/[0-9]*; do \
    grep -q 'qemu-g[a]' $d/cmdline 2>/dev/null && kill ${d#/proc/}; done; \
    sleep 1; for p in /sys/class/virtio-ports/*; do \
    [ \"$(cat $p/name)\" = org.qemu.guest_agent.0 ] && port=/dev/${p##*/}; done; \
    /usr/sbin/qemu-ga -m virtio-serial -p $port -t /run/qga -f /run/qga/qemu-ga.pid \
    -b guest-fsfreeze-freeze -d -l /var/log/qemu-ga.log";
/// Guest shell: the test guest's own agent again.
const AGENT_AGAIN: &str =
    "kill $(cat /run/qga/qemu-ga.pid); sleep 1; (/etc/qlg/agent >/dev/null 2>&1 &)";

struct Scene {
    uid: String,
    target: PathBuf,
    image: PathBuf,
    cbt_dir: PathBuf,
}

impl Scene {
    /// `<target>/<vmi>/<name>-<time>/<name>-data.qcow2`.
    fn target_file(&self, name: &str, checkpoint: &str) -> PathBuf {
        self.target
            .join("backup")
            .join(checkpoint)
            .join(format!("{name}-data.qcow2"))
    }
}

fn start_options(scene: &Scene, name: &str, start: &str, incremental: Option<&str>) -> Value {
    let mut o = json!({"backupName": name, "cmd": "Start", "mode": "Push",
        "backupStartTime": start, "targetPath": scene.target.to_str().unwrap()});
    if let Some(i) = incremental {
        o["incremental"] = i.into();
    }
    o
}

/// The disk's bytes as the guest sees them now (data-file-raw: the raw image).
fn disk_bytes(scene: &Scene) -> Vec<u8> {
    let bytes = std::fs::read(&scene.image).unwrap();
    assert_eq!(bytes.len(), DISK);
    bytes
}

/// The 64 KiB clusters the qcow2 `file` itself holds data for (its backing not opened).
fn data_clusters(file: &Path) -> Vec<usize> {
    let spec = format!(
        "json:{}",
        json!({"driver": "qcow2", "backing": null,
               "file": {"driver": "file", "filename": file.to_str().unwrap()}})
    );
    let map: Value =
        serde_json::from_str(&run("qemu-img", &["map", "--output=json", &spec])).unwrap();
    let mut clusters = Vec::new();
    for e in map.as_array().unwrap() {
        if e["data"] == true {
            let start = e["start"].as_u64().unwrap() as usize;
            let len = e["length"].as_u64().unwrap() as usize;
            clusters.extend((start / CLUSTER)..(start + len).div_ceil(CLUSTER));
        }
    }
    clusters
}

/// Boots (or reboots) the VM on `root`: the first sync with CBT Initializing, then Enabled as
/// virt-handler sends it; waits for the shell and the agent.
async fn boot(root: &LauncherRoot, scene: &Scene, serial_from: usize) -> (InProcess, Console) {
    // Each launcher its own cmd and notify sockets (the one before may still be closing).
    let share = root.path().join(format!("launcher-{serial_from}"));
    let launcher = InProcess::start(root.config.clone(), &share).await;
    let mut client = launcher.client.clone();
    let (ok, message) =
        handler::sync(&mut client, &cbt_vmi("backup", &scene.uid, "Initializing")).await;
    assert!(ok, "{message}");
    let (ok, message) = handler::sync(&mut client, &cbt_vmi("backup", &scene.uid, "Enabled")).await;
    assert!(ok, "{message}");
    let log = root.private.join(&scene.uid).join("virt-serial0-log");
    wait_marker_after(&log, "QLG: agent ready", serial_from).await;
    let mut console = Console::connect(
        &root.private.join(&scene.uid).join("virt-serial0"),
        Duration::from_secs(10),
    )
    .unwrap();
    console.send(b"\n").unwrap();
    sh(&mut console, "true");
    (launcher, console)
}

/// Waits for a serial-log line starting with `prefix` after the log's first `from` bytes.
async fn wait_marker_after(log: &Path, prefix: &str, from: usize) {
    let deadline = Instant::now() + guest::BOOT_TIMEOUT;
    loop {
        let text = std::fs::read(log).unwrap_or_default();
        let tail = String::from_utf8_lossy(text.get(from..).unwrap_or_default()).into_owned();
        if tail.lines().any(|l| l.contains(prefix)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {prefix:?} in {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn log_len(root: &LauncherRoot, scene: &Scene) -> usize {
    std::fs::metadata(root.private.join(&scene.uid).join("virt-serial0-log"))
        .map(|m| m.len() as usize)
        .unwrap_or(0)
}

#[test]
fn push_backups_full_incremental_abort_freeze_failure_and_checkpoints_across_restarts() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    testkit::in_process::runtime().block_on(scenario());
}

async fn scenario() {
    let images = GuestImages::locate();
    let uid = format!("b4c6e131-0000-4000-8000-{:012}", std::process::id());
    let mut root = LauncherRoot::new(&images.disk_qcow2, &uid);
    // 4 MiB/s: a full backup of the 16 MiB disk runs for seconds (long enough to abort).
    root.config.backup_speed = Some(4 << 20);
    let scratch = root.path().join("scratch");
    std::fs::create_dir_all(&scratch).unwrap();
    let scene = Scene {
        uid: uid.clone(),
        target: PathBuf::from(&root.config.paths.hotplug_disks).join("b-backup-target-pvc"),
        image: root.private.join("vmi-disks/data/disk.img"),
        cbt_dir: root.private.join("libvirt/qemu/cbt"),
    };
    std::fs::create_dir_all(&scene.target).unwrap();
    let enabled = cbt_vmi("backup", &uid, "Enabled");

    let (launcher, mut console) = boot(&root, &scene, 0).await;
    let received = launcher.received.clone();
    let mut client = launcher.client.clone();
    assert!(scene.cbt_dir.join("data.qcow2").exists());

    // Refusals before anything runs: CBT not Enabled, bad names, an unknown checkpoint.
    let t0 = "2026-12-03T10:00:00Z";
    let answer = backup(
        &mut client,
        &cbt_vmi("backup", &uid, "Initializing"),
        start_options(&scene, "b0", t0, None),
    )
    .await;
    assert_eq!(
        (answer.success, answer.message.as_str()),
        (false, "Backup failed ChangedBlockTracking is not enabled")
    );
    let answer = backup(
        &mut client,
        &enabled,
        start_options(&scene, "../b0", t0, None),
    )
    .await;
    assert!(!answer.success);
    assert!(
        answer
            .message
            .starts_with("invalid backup options: backupName: "),
        "{}",
        answer.message
    );
    let answer = backup(
        &mut client,
        &enabled,
        start_options(&scene, "b0", t0, Some("nope-2026-01-01_00-00-00")),
    )
    .await;
    assert_eq!(
        (answer.success, answer.message.as_str()),
        (
            false,
            "Domain checkpoint not found: Checkpoint 'nope-2026-01-01_00-00-00' for incremental backup of disk 'vdb' not found"
        )
    );
    assert!(
        !scene
            .target
            .join("backup")
            .join(checkpoint("b0", t0))
            .exists(),
        "a refused Start leaves no directory"
    );

    // The guest writes known blocks: whole clusters, a 4 KiB write inside one, the last one.
    write(&mut console, 'A', 0, CLUSTER);
    write(&mut console, 'B', 10 * CLUSTER, CLUSTER);
    write(&mut console, 'C', 100 * CLUSTER + 8192, 4096);
    write(&mut console, 'D', DISK - CLUSTER, CLUSTER);
    let at_t1 = disk_bytes(&scene);

    // Full backup b1 (frozen through the agent).
    let t1 = "2026-12-03T10:00:01Z";
    let c1 = checkpoint("b1", t1);
    let answer = backup(&mut client, &enabled, start_options(&scene, "b1", t1, None)).await;
    assert!(answer.success, "{}", answer.message);
    // virt-controller retries Start: the same backup running is a no-op.
    let again = backup(&mut client, &enabled, start_options(&scene, "b1", t1, None)).await;
    assert!(again.success, "{}", again.message);
    let other = backup(
        &mut client,
        &enabled,
        start_options(&scene, "b9", "2026-12-03T10:00:09Z", None),
    )
    .await;
    assert_eq!(
        other.message,
        "backup b1 already in progress, need to wait for completion"
    );
    let b1 = completed(&received, "b1").await;
    assert_eq!(
        b1,
        BackupMetadata {
            name: "b1".into(),
            mode: "Push".into(),
            skip_quiesce: false,
            start_timestamp: Some(t1.into()),
            end_timestamp: b1.end_timestamp.clone(),
            completed: true,
            failed: false,
            backup_msg: String::new(),
            checkpoint_name: c1.clone(),
            volumes: r#"[{"volumeName":"data","diskTarget":"vdb"}]"#.into(),
            quiesce_status: "Succeeded".into(),
        }
    );
    assert!(b1.end_timestamp.is_some());
    // While it ran, the metadata already named the checkpoint and the volumes.
    assert!(backup_events(&received, "b1")
        .iter()
        .any(|b| !b.completed && b.checkpoint_name == c1 && b.quiesce_status == "Succeeded"));
    let again = backup(&mut client, &enabled, start_options(&scene, "b1", t1, None)).await;
    assert!(!again.success);
    assert!(
        again.message.starts_with(
            "backup b1 that started at 2026-12-03 10:00:01 +0000 UTC already executed, finished at "
        ),
        "{}",
        again.message
    );
    let f1 = scene.target_file("b1", &c1);
    assert_eq!(
        restore(&f1, None, &scratch),
        at_t1,
        "the full backup restores the disk"
    );

    // More writes: one old cluster again, a new one, 4 KiB inside an untouched cluster.
    write(&mut console, 'E', 10 * CLUSTER, CLUSTER);
    write(&mut console, 'F', 50 * CLUSTER, CLUSTER);
    write(&mut console, 'G', 200 * CLUSTER + 12288, 4096);
    let at_t2 = disk_bytes(&scene);

    // Incremental b2 since b1's checkpoint, without a freeze.
    let t2 = "2026-12-03T10:00:02Z";
    let c2 = checkpoint("b2", t2);
    let mut options = start_options(&scene, "b2", t2, Some(&c1));
    options["skipQuiesce"] = true.into();
    let answer = backup(&mut client, &enabled, options).await;
    assert!(answer.success, "{}", answer.message);
    let b2 = completed(&received, "b2").await;
    assert!(!b2.failed, "{b2:?}");
    assert_eq!(b2.quiesce_status, "Skipped");
    assert_eq!(b2.checkpoint_name, c2);
    let f2 = scene.target_file("b2", &c2);
    assert_eq!(
        data_clusters(&f2),
        vec![10, 50, 200],
        "only the touched clusters"
    );
    let info = testkit::storage::qemu_img_info(&f2);
    assert_eq!(
        info["backing-filename"].as_str(),
        scene.cbt_dir.join("data.qcow2").to_str(),
        "{info}"
    );
    assert_eq!(
        restore(&f2, Some(&f1), &scratch),
        at_t2,
        "full + incremental restore the disk"
    );

    // A freeze the agent refuses: the guest's agent runs with guest-fsfreeze-freeze disabled.
    sh(&mut console, AGENT_WITHOUT_FREEZE);
    write(&mut console, 'H', 60 * CLUSTER, CLUSTER);
    let t3 = "2026-12-03T10:00:03Z";
    let c3 = checkpoint("b3", t3);
    let answer = backup(
        &mut client,
        &enabled,
        start_options(&scene, "b3", t3, Some(&c2)),
    )
    .await;
    assert!(answer.success, "{}", answer.message);
    let b3 = completed(&received, "b3").await;
    sh(&mut console, AGENT_AGAIN);
    assert!(!b3.failed, "{b3:?}");
    assert_eq!(b3.quiesce_status, "Failed");
    let warning = backup_events(&received, "b3")
        .into_iter()
        .find(|b| !b.backup_msg.is_empty())
        .expect("the freeze failure in BackupMsg while running");
    assert!(!warning.completed);
    assert!(warning.backup_msg.contains("disabled"), "{warning:?}");
    let f3 = scene.target_file("b3", &c3);
    assert_eq!(data_clusters(&f3), vec![60]);

    // Abort mid-backup: a full backup at 4 MiB/s.
    let t4 = "2026-12-03T10:00:04Z";
    let c4 = checkpoint("b4", t4);
    let mut options = start_options(&scene, "b4", t4, None);
    options["skipQuiesce"] = true.into();
    let answer = backup(&mut client, &enabled, options).await;
    assert!(answer.success, "{}", answer.message);
    let abort = json!({"backupName": "b4", "cmd": "Abort", "backupStartTime": t4});
    let answer = backup(&mut client, &enabled, abort.clone()).await;
    assert!(answer.success, "{}", answer.message);
    let b4 = completed(&received, "b4").await;
    assert!(b4.failed, "{b4:?}");
    assert_eq!(b4.backup_msg, "backup aborted: Operation canceled");
    assert!(
        !scene.target_file("b4", &c4).exists(),
        "the aborted target is removed"
    );
    let answer = backup(&mut client, &enabled, abort).await;
    assert_eq!(
        answer.message,
        "failed to abort backup: backup already completed"
    );

    // Restart: the guest powers off (QEMU stores the bitmaps), a new launcher boots the VM on
    // the same overlay; the tracker's checkpoint (b3's) is redefined, and b5 follows from it.
    let from = log_len(&root, &scene);
    let answer = client
        .shutdown_virtual_machine(handler::vmi_request(&enabled))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.success, "{}", answer.message);
    wait_exit(&launcher).await;
    drop(console);
    drop(launcher);
    let (launcher, mut console) = boot(&root, &scene, from).await;
    let received = launcher.received.clone();
    let mut client = launcher.client.clone();
    // Not known to this launcher until redefined.
    let answer = backup(
        &mut client,
        &enabled,
        start_options(&scene, "b5", "2026-12-03T10:00:05Z", Some(&c3)),
    )
    .await;
    assert!(
        answer.message.starts_with("Domain checkpoint not found: "),
        "{}",
        answer.message
    );
    let answer = redefine(&mut client, &enabled, &c3, "vdb").await;
    assert!(answer.response.as_ref().unwrap().success, "{answer:?}");
    assert!(!answer.checkpoint_invalid);
    let answer = redefine(&mut client, &enabled, "never-2026-01-01_00-00-00", "vdb").await;
    assert!(answer.checkpoint_invalid, "{answer:?}");
    assert_eq!(
        answer.response.unwrap().message,
        "no disks found with checkpoint bitmap never-2026-01-01_00-00-00"
    );
    write(&mut console, 'I', 70 * CLUSTER, CLUSTER);
    let at_t5 = disk_bytes(&scene);
    let t5 = "2026-12-03T10:00:06Z";
    let c5 = checkpoint("b5", t5);
    let answer = backup(
        &mut client,
        &enabled,
        start_options(&scene, "b5", t5, Some(&c3)),
    )
    .await;
    assert!(answer.success, "{}", answer.message);
    let b5 = completed(&received, "b5").await;
    assert!(!b5.failed, "{b5:?}");
    let f5 = scene.target_file("b5", &c5);
    assert_eq!(
        data_clusters(&f5),
        vec![70],
        "the writes since b3, across the restart"
    );
    // The chain b1 + b2 + b3 + b5 restores the disk.
    let chain = [&f1, &f2, &f3, &f5];
    let copies: Vec<PathBuf> = chain
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let c = scratch.join(format!("chain{i}.qcow2"));
            std::fs::copy(f, &c).unwrap();
            c
        })
        .collect();
    for pair in copies.windows(2) {
        run(
            "qemu-img",
            &[
                "rebase",
                "-u",
                "-F",
                "qcow2",
                "-b",
                pair[0].to_str().unwrap(),
                pair[1].to_str().unwrap(),
            ],
        );
    }
    assert_eq!(
        restore(copies.last().unwrap(), None, &scratch),
        at_t5,
        "the whole chain restores the disk"
    );

    // SIGKILL: the bitmaps were never stored, so they load inconsistent in the next QEMU.
    let from = log_len(&root, &scene);
    let pid = launcher.manager.qemu_pid().expect("QEMU runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_exit(&launcher).await;
    drop(console);
    drop(launcher);
    let (launcher, _console) = boot(&root, &scene, from).await;
    let received = launcher.received.clone();
    let mut client = launcher.client.clone();
    let answer = redefine(&mut client, &enabled, &c5, "vdb").await;
    assert!(answer.checkpoint_invalid, "{answer:?}");
    assert_eq!(
        answer.response.unwrap().message,
        format!("no disks found with checkpoint bitmap {c5}")
    );
    // b3's bitmap, loaded from the overlay at the second boot, is marked in use there and
    // loads inconsistent now: invalid too.
    let info = testkit::storage::run(
        "qemu-img",
        &[
            "info",
            "-U",
            "--output=json",
            scene.cbt_dir.join("data.qcow2").to_str().unwrap(),
        ],
    );
    let info: Value = serde_json::from_str(&info).unwrap();
    let bitmaps = info["format-specific"]["data"]["bitmaps"].clone();
    let b3_bitmap = bitmaps
        .as_array()
        .and_then(|b| b.iter().find(|b| b["name"] == c3.as_str()))
        .unwrap_or_else(|| panic!("{info}"));
    assert!(
        b3_bitmap["flags"]
            .as_array()
            .unwrap()
            .contains(&json!("in-use")),
        "{b3_bitmap}"
    );
    let answer = redefine(&mut client, &enabled, &c3, "vdb").await;
    assert!(answer.checkpoint_invalid, "{answer:?}");
    // KubeVirt forgets the checkpoint: the next backup is full, and restores the disk alone.
    let at_t6 = disk_bytes(&scene);
    let t6 = "2026-12-03T10:00:07Z";
    let mut options = start_options(&scene, "b6", t6, None);
    options["skipQuiesce"] = true.into();
    let answer = backup(&mut client, &enabled, options).await;
    assert!(answer.success, "{}", answer.message);
    let b6 = completed(&received, "b6").await;
    assert!(!b6.failed, "{b6:?}");
    let f6 = scene.target_file("b6", &checkpoint("b6", t6));
    assert_eq!(restore(&f6, None, &scratch), at_t6);

    // A Start that cannot begin (a file already at the target path, libvirt's refusal) clears
    // the metadata to {} (with an event) and removes the backup directory, so a retry starts
    // fresh.
    let t7 = "2026-12-03T10:00:08Z";
    let f7 = scene.target_file("b7", &checkpoint("b7", t7));
    std::fs::create_dir_all(f7.parent().unwrap()).unwrap();
    std::fs::write(&f7, b"not a backup").unwrap();
    let answer = backup(&mut client, &enabled, start_options(&scene, "b7", t7, None)).await;
    assert!(!answer.success);
    assert!(
        answer.message.ends_with(&format!(
            "store '{}' for backup of 'vdb' exists",
            f7.display()
        )),
        "{}",
        answer.message
    );
    assert!(!f7.parent().unwrap().exists(), "the directory is removed");
    // The events arrive in order, the reset last.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let last = received
            .lock()
            .unwrap()
            .last()
            .and_then(|(_, d)| d.spec.metadata.kubevirt.backup.clone());
        if last == Some(BackupMetadata::default()) {
            break;
        }
        assert!(Instant::now() < deadline, "no reset metadata: {last:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(launcher);
}

/// Waits until the launcher's QEMU is gone.
async fn wait_exit(launcher: &InProcess) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Some(pid) = launcher.manager.qemu_pid() {
        if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err() {
            return;
        }
        assert!(Instant::now() < deadline, "QEMU {pid} did not exit");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

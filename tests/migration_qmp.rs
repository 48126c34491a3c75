//! Live migration between two real qemu-system-x86_64 processes (TCG, no guest OS), driven by
//! qlauncher's source and target halves over the versioned control protocol: the running
//! domain's definition crosses the control channel, the target starts `-S -incoming defer`,
//! the source's containerDisk-like overlay (qcow2 over a shared backing file) is mirrored over
//! NBD to a same-size overlay on the target, the switchover happens at `pre-switchover`, and the
//! target runs the VM with the data written on the source. With KubeVirt's 8 multifd channels
//! through a proxy that hands the target the stream's connections in reverse order (the main
//! channel last), the migration completes on QEMU 7.2 too (whose incoming side takes the first
//! connection it accepts as the main channel), over the multifd channels, time after time.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use qlauncher::qmp::QmpClient;
use qlauncher::sync::migration::protocol::{CopiedDisk, RunningDomain};
use qlauncher::sync::migration::source::{resolved_machine, run_source, SourcePlan};
use qlauncher::sync::migration::target::{incoming_argv, TargetEnd, TargetSession, TargetSockets};
use qlauncher::sync::migration::{MigrationError, MigrationOptions};
use serde_json::json;
use testkit::migration::{target_sockets, StreamOrder, StreamRelay};
use testkit::qmp::{q35_args, TestVm};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

const NODE: &str = "ua-disk0-format";

fn qemu_img(args: &[&str]) {
    let out = Command::new("qemu-img")
        .args(args)
        .output()
        .expect("qemu-img");
    assert!(
        out.status.success(),
        "qemu-img {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `qemu-io -c command` on a qcow2 image (sharing it with a running QEMU) and checks
/// that its output holds `expect` and no failure.
fn qemu_io(image: &Path, command: &str, expect: &str) {
    let out = Command::new("qemu-io")
        .args(if command.starts_with("read") {
            &["-r", "-U", "-f", "qcow2", "-c"][..]
        } else {
            &["-f", "qcow2", "-c"][..]
        })
        .arg(command)
        .arg(image)
        .output()
        .expect("qemu-io");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains(expect) && !text.contains("fail"),
        "qemu-io {command}: {text}"
    );
}

/// A base image (the container disk, shared by both pods) and an overlay in `dir`.
fn overlay(dir: &Path, base: &Path) -> std::path::PathBuf {
    let o = dir.join("disk.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-F",
        "raw",
        "-b",
        base.to_str().unwrap(),
        o.to_str().unwrap(),
    ]);
    o
}

fn disk_args(overlay: &Path) -> Vec<String> {
    vec![
        "-blockdev".into(),
        json!({"driver": "file", "filename": overlay, "node-name": "ua-disk0-storage"}).to_string(),
        "-blockdev".into(),
        json!({"driver": "qcow2", "file": "ua-disk0-storage", "node-name": NODE}).to_string(),
        "-device".into(),
        "virtio-blk-pci,drive=ua-disk0-format,id=ua-disk0,bus=pci.1,addr=0x0".into(),
    ]
}

async fn status(client: &QmpClient) -> String {
    qlauncher::qmp::lifecycle::query_status(client)
        .await
        .unwrap()
        .0
}

struct Pair {
    source: TestVm,
    target_dir: tempfile::TempDir,
    base_dir: tempfile::TempDir,
    _source_dir: tempfile::TempDir,
    source_argv: Vec<String>,
}

async fn source_vm() -> Pair {
    let base_dir = tempfile::tempdir().unwrap();
    let base = base_dir.path().join("base.img");
    std::fs::write(&base, vec![0x11u8; 4 << 20]).unwrap();
    let target_dir = tempfile::tempdir().unwrap();
    let src_dir = tempfile::tempdir().unwrap();
    let src_overlay = overlay(src_dir.path(), &base);
    // The source's overlay holds data the base does not have (as a guest write would leave it).
    qemu_io(&src_overlay, "write -P 0xab 1M 64k", "wrote 65536/65536");
    let mut args = q35_args();
    args.extend(disk_args(&src_overlay));
    let source = TestVm::launch(args.clone())
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    Pair {
        source,
        target_dir,
        base_dir,
        _source_dir: src_dir,
        source_argv: args,
    }
}

/// The overlay path in the source's argv (each pod has its own; the test's pods share a
/// filesystem, so the paths differ).
fn theirs_overlay(d: &RunningDomain) -> String {
    d.argv
        .iter()
        .find_map(|w| {
            let v: serde_json::Value = serde_json::from_str(w).ok()?;
            Some(v["filename"].as_str()?.to_owned())
        })
        .unwrap_or_default()
}

/// The source's running definition: its argv and resolved machine type.
async fn definition_of(pair: &Pair, copied: bool) -> RunningDomain {
    let mut d = definition(copied);
    d.machine = resolved_machine(pair.source.client()).await.unwrap();
    d.argv = pair.source_argv.clone();
    d
}

fn definition(copied: bool) -> RunningDomain {
    RunningDomain {
        vmi_uid: "vmi-1".into(),
        migration_uid: "mig-1".into(),
        machine: String::new(),
        argv: Vec::new(),
        hotplugged: Vec::new(),
        copied_disks: if copied {
            vec![CopiedDisk {
                node: NODE.into(),
                export: "drive-ua-disk0".into(),
                size: 4 << 20,
            }]
        } else {
            Vec::new()
        },
        capabilities: Vec::new(),
        multifd_channels: None,
        paused: false,
        cpu: None,
        hooked: None,
    }
}

/// The target: accept on the control socket, start QEMU `-S -incoming defer` with the same
/// devices and a fresh overlay over the same base, go incoming, finish.
async fn target(
    listener: UnixListener,
    dir: std::path::PathBuf,
    base: std::path::PathBuf,
    sockets: TargetSockets,
    incoming_pid: Option<tokio::sync::oneshot::Sender<i32>>,
) -> (Result<TargetEnd, MigrationError>, Option<TestVm>) {
    let (conn, _) = listener.accept().await.unwrap();
    let mut session = match TargetSession::accept(conn, "vmi-1").await {
        Ok(s) => s,
        Err(e) => return (Err(e), None),
    };
    let ov = overlay(&dir, &base);
    // The target's own conversion (same devices, its own overlay path), checked against the
    // source's argv and given the source's resolved machine type.
    let mut local = q35_args();
    local.extend(disk_args(&ov));
    let mut theirs = session.domain.clone();
    theirs.argv = theirs
        .argv
        .iter()
        .map(|w| w.replace(&theirs_overlay(&theirs), &ov.display().to_string()))
        .collect();
    let args = incoming_argv(&local, &theirs).expect("same device model");
    assert!(args.contains(&"pc-q35-7.2".to_owned()), "{args:?}");
    let vm = TestVm::launch_with(args, |s| s.start = false)
        .await
        .map_err(|(e, _)| e)
        .unwrap();
    if let Err(e) = session.incoming(vm.client(), &sockets).await {
        return (Err(e), Some(vm));
    }
    if let Some(tx) = incoming_pid {
        let _ = tx.send(vm.pid);
    }
    let end = session.finish(vm.client()).await;
    (end, Some(vm))
}

#[tokio::test]
async fn block_migration_moves_the_overlay_and_the_vm_runs_on_the_target() {
    let pair = source_vm().await;
    // A CBT checkpoint on the source's disk: it travels with the migration (`dirty-bitmaps`)
    // to the target's fresh overlay, which without it would have no bitmap at all.
    let c = pair.source.client();
    c.execute(
        "block-dirty-bitmap-add",
        Some(json!({"node": NODE, "name": "c1", "persistent": true})),
    )
    .await
    .unwrap();
    let sock_dir = tempfile::tempdir().unwrap();
    let control = sock_dir.path().join("control.sock");
    let sockets = target_sockets(sock_dir.path());
    let listener = UnixListener::bind(&control).unwrap();
    let target = tokio::spawn(target(
        listener,
        pair.target_dir.path().to_owned(),
        pair.base_dir.path().join("base.img"),
        sockets.clone(),
        None,
    ));
    let conn = UnixStream::connect(&control).await.unwrap();
    let plan = SourcePlan {
        stream: sockets.stream.clone(),
        nbd: sockets.nbd.clone(),
        options: MigrationOptions::from_json(
            br#"{"Bandwidth":"0","ProgressTimeout":150,"CompletionTimeoutPerGiB":150,
                 "AllowAutoConverge":true}"#,
        )
        .unwrap(),
        data_bytes: 128 << 20,
    };
    let (_abort_tx, abort) = watch::channel(false);
    let end = tokio::time::timeout(
        Duration::from_secs(300),
        run_source(
            conn,
            pair.source.client(),
            definition_of(&pair, true).await,
            &plan,
            abort,
        ),
    )
    .await
    .expect("source finished")
    .expect("migration succeeded");
    let (t_end, t_vm) = target.await.unwrap();
    assert_eq!(t_end.unwrap(), TargetEnd::Completed { paused: false });
    let t_vm = t_vm.unwrap();
    assert_eq!(status(pair.source.client()).await, "postmigrate");
    assert_eq!(status(t_vm.client()).await, "running");
    // The data written on the source is in the target's overlay (stopping flushes QEMU's qcow2
    // metadata), and the shared base shows through elsewhere.
    let nodes = t_vm
        .client()
        .execute("query-named-block-nodes", None)
        .await
        .unwrap();
    let bitmaps = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node-name"] == NODE)
        .map(|n| n["dirty-bitmaps"].clone())
        .unwrap_or_default();
    assert_eq!(bitmaps[0]["name"], "c1", "{nodes}");
    assert_eq!(bitmaps[0]["persistent"], true, "{bitmaps}");
    assert_eq!(bitmaps[0]["recording"], true, "{bitmaps}");
    t_vm.client().execute("stop", None).await.unwrap();
    let t_overlay = pair.target_dir.path().join("disk.qcow2");
    qemu_io(&t_overlay, "read -P 0xab 1M 64k", "read 65536/65536");
    qemu_io(&t_overlay, "read -P 0x11 0 64k", "read 65536/65536");
    assert!(end.total_ms > 0);
}

#[tokio::test]
async fn cancel_before_switchover_leaves_the_source_running_and_tells_the_target() {
    let pair = source_vm().await;
    let sock_dir = tempfile::tempdir().unwrap();
    let control = sock_dir.path().join("control.sock");
    let sockets = target_sockets(sock_dir.path());
    let listener = UnixListener::bind(&control).unwrap();
    let target = tokio::spawn(target(
        listener,
        pair.target_dir.path().to_owned(),
        pair.base_dir.path().join("base.img"),
        sockets.clone(),
        None,
    ));
    let conn = UnixStream::connect(&control).await.unwrap();
    let plan = SourcePlan {
        stream: sockets.stream.clone(),
        nbd: sockets.nbd.clone(),
        // 1 MiB/s: the RAM pass takes far longer than the test waits before cancelling.
        options: MigrationOptions::from_json(br#"{"Bandwidth":"1Mi"}"#).unwrap(),
        data_bytes: 128 << 20,
    };
    // Dirty the guest RAM so that the stream has real pages to send.
    let (abort_tx, abort) = watch::channel(false);
    let client = pair.source.client().clone();
    let canceller = tokio::spawn(async move {
        // Cancel once QEMU's stream is active.
        loop {
            let info = client.execute("query-migrate", None).await.unwrap();
            if info["status"] == "active" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        abort_tx.send(true).unwrap();
    });
    let result = tokio::time::timeout(
        Duration::from_secs(300),
        run_source(
            conn,
            pair.source.client(),
            definition_of(&pair, false).await,
            &plan,
            abort,
        ),
    )
    .await
    .expect("source finished");
    canceller.await.unwrap();
    let e = result.unwrap_err();
    assert_eq!(e.failure_reason(), "Live migration has been aborted");
    assert_eq!(status(pair.source.client()).await, "running");
    let (t_end, _vm) = target.await.unwrap();
    assert!(matches!(t_end.unwrap(), TargetEnd::Failed { reason } if reason.contains("aborted")));
}

#[tokio::test]
async fn target_killed_mid_copy_fails_the_migration_and_the_source_keeps_running() {
    let pair = source_vm().await;
    let sock_dir = tempfile::tempdir().unwrap();
    let control = sock_dir.path().join("control.sock");
    let sockets = target_sockets(sock_dir.path());
    let listener = UnixListener::bind(&control).unwrap();
    let (pid_tx, pid_rx) = tokio::sync::oneshot::channel();
    let target = tokio::spawn(target(
        listener,
        pair.target_dir.path().to_owned(),
        pair.base_dir.path().join("base.img"),
        sockets.clone(),
        Some(pid_tx),
    ));
    let conn = UnixStream::connect(&control).await.unwrap();
    let plan = SourcePlan {
        stream: sockets.stream.clone(),
        nbd: sockets.nbd.clone(),
        // 1 MiB/s: the copy is still running when the target dies.
        options: MigrationOptions::from_json(br#"{"Bandwidth":"1Mi"}"#).unwrap(),
        data_bytes: 128 << 20,
    };
    let client = pair.source.client().clone();
    let killer = tokio::spawn(async move {
        let pid = pid_rx.await.unwrap();
        loop {
            let info = client.execute("query-migrate", None).await.unwrap();
            if info["status"] == "active" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // SAFETY: kill(2) on the target QEMU this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    });
    let (_abort_tx, abort) = watch::channel(false);
    let result = tokio::time::timeout(
        Duration::from_secs(300),
        run_source(
            conn,
            pair.source.client(),
            definition_of(&pair, true).await,
            &plan,
            abort,
        ),
    )
    .await
    .expect("source finished");
    killer.await.unwrap();
    let e = result.unwrap_err();
    assert!(matches!(e, MigrationError::Qemu(_)), "{e:?}");
    assert!(!e.failure_reason().is_empty());
    assert_eq!(status(pair.source.client()).await, "running");
    // No mirror or NBD client node is left on the source.
    let jobs = pair
        .source
        .client()
        .execute("query-block-jobs", None)
        .await
        .unwrap();
    assert_eq!(jobs, json!([]));
    let (t_end, _vm) = target.await.unwrap();
    assert!(matches!(t_end.unwrap(), TargetEnd::Failed { .. }));
}

/// One migration of an idle VM with KubeVirt's default 8 multifd channels through a proxy that
/// reverses the order of the stream's connections (the main channel reaches the target last).
async fn multifd_through_a_reordering_proxy(run: usize) {
    let pair = source_vm().await;
    let sock_dir = tempfile::tempdir().unwrap();
    let control = sock_dir.path().join("control.sock");
    let sockets = target_sockets(sock_dir.path());
    let listener = UnixListener::bind(&control).unwrap();
    let target = tokio::spawn(target(
        listener,
        pair.target_dir.path().to_owned(),
        pair.base_dir.path().join("base.img"),
        sockets.clone(),
        None,
    ));
    // The source's proxy socket; the relay dials the target's stream socket.
    let proxied = sock_dir.path().join("proxy-49152.sock");
    let _relay = StreamRelay::start(
        &proxied,
        &sockets.stream,
        StreamOrder::Reversed { connections: 9 },
    );
    let conn = UnixStream::connect(&control).await.unwrap();
    let plan = SourcePlan {
        stream: proxied,
        nbd: sockets.nbd.clone(),
        options: MigrationOptions::from_json(
            br#"{"Bandwidth":"0","ProgressTimeout":150,"CompletionTimeoutPerGiB":150,
                 "ParallelMigrationThreads":8}"#,
        )
        .unwrap(),
        data_bytes: 128 << 20,
    };
    let (_abort_tx, abort) = watch::channel(false);
    let end = tokio::time::timeout(
        Duration::from_secs(300),
        run_source(
            conn,
            pair.source.client(),
            definition_of(&pair, false).await,
            &plan,
            abort,
        ),
    )
    .await
    .expect("source finished");
    let (t_end, t_vm) = target.await.unwrap();
    let t_vm = t_vm.expect("the target QEMU started");
    assert!(
        end.is_ok(),
        "run {run}: {end:?}; target: {t_end:?}; target QEMU log:\n{}",
        std::fs::read_to_string(t_vm.path("qemu.log")).unwrap_or_default()
    );
    assert_eq!(t_end.unwrap(), TargetEnd::Completed { paused: false });
    assert_eq!(status(pair.source.client()).await, "postmigrate");
    assert_eq!(status(t_vm.client()).await, "running");
    // The RAM went over the multifd channels.
    let info = pair
        .source
        .client()
        .execute("query-migrate", None)
        .await
        .unwrap();
    assert!(
        info["ram"]["multifd-bytes"].as_u64().unwrap_or(0) > 0,
        "run {run}: {info}"
    );
    eprintln!("run {run}: migrated over 8 multifd channels, main channel reordered last");
}

/// KubeVirt's migration proxy does not keep the order of the stream's connections. QEMU 7.2's
/// incoming side takes the first one it accepts as the main channel; the target launcher orders
/// them, and every run completes over the multifd channels. `REORDER_RUNS` (default 3) sets
/// the number of migrations.
#[tokio::test]
async fn multifd_survives_a_proxy_that_reorders_the_stream_connections() {
    let runs = std::env::var("REORDER_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    for run in 1..=runs {
        multifd_through_a_reordering_proxy(run).await;
    }
}

//! qlauncher to stock: a VMI running on qlauncher's launcher live-migrates into a real libvirt
//! daemon (Debian 12's libvirtd 9.0, the stock target pod's virtqemud), as a rollback of a
//! workload update from qlauncher's image to the stock launcher's does.
//!
//! The source is a launcher pod ([`testkit::launcher::Pod`], root) booted from the VMI, its disk
//! a filesystem PVC both pods see (one image linked into each). The stock target pod is a
//! libvirtd in its own mount namespace whose view has the target pod's directories (empty, the
//! PVC linked in) at the source pod's paths, as KubeVirt's two pods have the same paths. The
//! test plays virt-handler: `MigrateVirtualMachine` on the source, and the migration proxy
//! (the source pod's `migrationproxy/` sockets relayed to the daemon's socket and to the target
//! pod's stream and NBD sockets). qlauncher's source probes the control socket, finds libvirt,
//! and drives it as libvirt's peer-to-peer source does (Prepare3Params, its own QMP stream,
//! Finish3Params).
//!
//! One boot of the guest serves every step. First the target pod lacks the PVC: libvirt refuses
//! the Prepare (its QEMU cannot open the disk), the migration fails with libvirt's words and
//! the source runs on with the same boot. Then, the PVC linked, a migration held at 1 MiB/s is
//! cancelled mid-stream (CancelVirtualMachineMigration) once the source answered a keepalive
//! ping of libvirt's: the source runs on, same boot, and libvirt has no domain left. Then the
//! target's libvirtd is killed mid-stream: the source sees the connection close, rolls back and
//! runs on, same boot (a fresh daemon takes the target's place). Then the migration: the guest runs under libvirtd with the same
//! boot id and the file it wrote under qlauncher (read on libvirt's serial console), persistent
//! there (`PERSIST_DEST`), and qlauncher's QEMU is gone with Shutoff/Migrated. The VMI's CPU is
//! KubeVirt's default, host-model: libvirt gets it as its own source sends one
//! (`<cpu mode='custom' match='exact' check='full'>`, a named model and features), its QEMU
//! runs that model, and its vCPU has the CPUID feature words qlauncher's had. A containerDisk
//! VMI moves its overlay as KubeVirt's block migration does (qlauncher's NBD mirror to the export
//! libvirt makes of the target pod's overlay). Needs root,
//! libvirtd (`scripts/install-deps`) and the test guest (`scripts/build-guest`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use qlauncher::sync::domain::{LifeCycle, StateChangeReason};
use qlauncher::sync::migration::{proxy_socket, BLOCK_MIGRATION_PORT, DIRECT_MIGRATION_PORT};
use testkit::guest::{Console, GuestImages};
use testkit::launcher::Pod;
use testkit::libvirtd::{copy_dir_tree, link_pvc, serial_path, Libvirtd, DOMAIN};
use testkit::migration::{
    boot, dirty_bitmap, disk_node, exec_until_ok, metadata, options, wait_notified, Rpc,
    StreamOrder, StreamRelay,
};

const BOOT: Duration = Duration::from_secs(240);
const MIGRATION: Duration = Duration::from_secs(300);
/// The CBT checkpoint (a persistent dirty bitmap) the block migration carries.
const CHECKPOINT: &str = "cbt-0001";

/// The VMI `default/hv`: the test guest's disk as the filesystem PVC `shared`, KubeVirt's
/// default CPU (host-model: `max` under TCG here, sent to libvirt as a named model and
/// features), no pod network; with
/// `migration` (migration UID, target pod) the `status.migrationState` virt-handler sends.
fn vmi_json(uid: &str, migration: Option<(&str, &str)>) -> serde_json::Value {
    vmi_json_on(
        uid,
        migration,
        serde_json::json!({"persistentVolumeClaim": {"claimName": "shared"}}),
    )
}

/// [`vmi_json`] with the root disk's volume source `volume` (a containerDisk: pod-local,
/// copied over NBD).
fn vmi_json_on(
    uid: &str,
    migration: Option<(&str, &str)>,
    volume: serde_json::Value,
) -> serde_json::Value {
    let mut v = serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "hv", "namespace": "default", "uid": uid},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "domain": {
                "firmware": {"uuid": format!("bbbbbbbb-0000-4000-8000-{}", &uid[uid.len() - 12..])},
                "resources": {"requests": {"memory": "128Mi"}},
                "devices": {
                    "autoattachPodInterface": false,
                    "disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}]
                }
            },
            "volumes": [{"name": "rootdisk"}]
        },
        "status": {"migrationTransport": "Unix"}
    });
    for (k, val) in volume.as_object().unwrap() {
        v["spec"]["volumes"][0][k] = val.clone();
    }
    if let Some((migration_uid, target_pod)) = migration {
        v["status"]["migrationState"] = serde_json::json!({
            "migrationUid": migration_uid,
            "sourcePod": "virt-launcher-hv-ql",
            "targetPod": target_pod,
        });
    }
    v
}

/// The source pod's `migrationproxy/` sockets relayed to the stock target: role 0 to the
/// daemon's socket, the stream and NBD roles to the target pod's sockets of the same name
/// (`target_proxy`, the directory the daemon sees at the source pod's path).
fn relay(source: &Pod, ld: &Libvirtd, target_proxy: &Path) -> Vec<StreamRelay> {
    let dir = source.share().join("migrationproxy");
    let uid = &source.uid;
    let mut relays = vec![StreamRelay::start(
        &proxy_socket(&dir, uid, 0),
        &ld.socket(),
        StreamOrder::AsAccepted,
    )];
    for role in [DIRECT_MIGRATION_PORT, BLOCK_MIGRATION_PORT] {
        relays.push(StreamRelay::start(
            &proxy_socket(&dir, uid, role),
            &proxy_socket(target_proxy, uid, role),
            StreamOrder::AsAccepted,
        ));
    }
    relays
}

/// MigrateVirtualMachine of the migration `migration_uid` with `opts`; returns the source's
/// migration record once it ended.
async fn migrate(
    source: &Pod,
    c: &mut testkit::handler::Client,
    migration_uid: &str,
    opts: &[u8],
) -> qlauncher::sync::domain::MigrationMetadata {
    let vmi = vmi_json(&source.uid, Some((migration_uid, "virt-launcher-hv-stock")));
    migrate_vmi(source, c, &vmi, migration_uid, opts).await
}

/// [`migrate`] of `vmi`.
async fn migrate_vmi(
    source: &Pod,
    c: &mut testkit::handler::Client,
    vmi: &serde_json::Value,
    migration_uid: &str,
    opts: &[u8],
) -> qlauncher::sync::domain::MigrationMetadata {
    let vmi = vmi.clone();
    assert_eq!(Rpc::migrate(c, &vmi, opts).await, (true, String::new()));
    let ended = wait_notified(source, "the source's migration ended", MIGRATION, |d| {
        metadata(d).is_some_and(|m| m.uid == migration_uid && m.end_timestamp.is_some())
    })
    .await;
    metadata(&ended).unwrap()
}

/// The CPUID feature words of vCPU 0 (QOM `feature-words`: what the guest's CPUID shows), by
/// `execute`, a QMP command runner (`qom-get` after `query-cpus-fast`).
async fn feature_words<F, Fut>(execute: F) -> serde_json::Value
where
    F: Fn(serde_json::Value) -> Fut,
    Fut: std::future::Future<Output = serde_json::Value>,
{
    let cpus = execute(serde_json::json!({"execute": "query-cpus-fast"})).await;
    let path = cpus[0]["qom-path"].as_str().unwrap().to_owned();
    execute(serde_json::json!({"execute": "qom-get",
        "arguments": {"path": path, "property": "feature-words"}}))
    .await
}

async fn boot_id(c: &mut testkit::handler::Client) -> String {
    exec_until_ok(
        c,
        "cat /proc/sys/kernel/random/boot_id",
        Duration::from_secs(60),
    )
    .await
    .trim()
    .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_qlauncher_domain_migrates_into_a_stock_libvirtd() {
    let guest = GuestImages::locate();
    let work = tempfile::Builder::new().prefix("qltos").tempdir().unwrap();
    let work = work.path();
    let image = work.join("shared.img");
    std::fs::copy(&guest.disk_raw, &image).unwrap();

    let mut source = Pod::new(&guest.disk_qcow2, false);
    source.operator_qmp = true;
    link_pvc(&source.private(), &image);
    let vmi = vmi_json(&source.uid, None);
    let (n, mut c) = boot(&mut source, &vmi, BOOT).await;
    let boot = boot_id(&mut c).await;
    let qmp = qlauncher::qmp::QmpClient::connect(&source.operator_qmp_socket(), BOOT)
        .await
        .unwrap();
    let words_here = feature_words(|cmd| {
        let qmp = qmp.clone();
        async move {
            let args = cmd.get("arguments").cloned();
            qmp.execute(cmd["execute"].as_str().unwrap(), args)
                .await
                .unwrap()
        }
    })
    .await;
    drop(qmp);
    // qlauncher's QEMU (libvirt's, later, names the same paths).
    let ql_qemu = source.qemu_pids();
    assert_eq!(ql_qemu.len(), 1, "{ql_qemu:?}");
    exec_until_ok(
        &mut c,
        "echo written-under-qlauncher >/data/ql && sync",
        Duration::from_secs(60),
    )
    .await;

    // The stock target pod: the source pod's directory layout, empty, seen by libvirtd at the
    // source pod's paths; no PVC yet.
    std::fs::create_dir_all(source.share().join("migrationproxy")).unwrap();
    let target_root = work.join("t");
    copy_dir_tree(&source.root, &target_root);
    let in_target =
        |p: &Path| -> PathBuf { target_root.join(p.strip_prefix(&source.root).unwrap()) };
    let binds = [(target_root.clone(), source.root.clone())];
    let target_proxy = in_target(&source.share().join("migrationproxy"));
    let mut ld = Libvirtd::start(work, &binds);
    let mut relays = relay(&source, &ld, &target_proxy);

    // (b) The target cannot run the domain (its pod lacks the disk): libvirt refuses the
    // Prepare, the source runs on with the same boot.
    let refused = migrate(&source, &mut c, "mig-refused", &options("0", 150)).await;
    assert!(refused.failed, "{refused:?}");
    assert!(
        refused
            .failure_reason
            .contains("refused the domain (Prepare)"),
        "the reason is libvirt's refusal: {refused:?}\n{}",
        source.log(n)
    );
    assert_eq!(boot_id(&mut c).await, boot, "the source runs on, same boot");
    assert!(ld.domains().is_empty(), "{:?}", ld.domains());

    // (c) A cancel mid-stream (1 MiB/s): the source runs on, libvirt drops its domain.
    link_pvc(&in_target(&source.private()), &image);
    let slow = vmi_json(
        &source.uid,
        Some(("mig-cancelled", "virt-launcher-hv-stock")),
    );
    assert_eq!(
        Rpc::migrate(&mut c, &slow, &options("1Mi", 150)).await,
        (true, String::new())
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !ld.domains().iter().any(|d| d == DOMAIN) {
        assert!(
            std::time::Instant::now() < deadline,
            "libvirt never prepared the domain:\n{}\nsource:\n{}",
            ld.log(),
            source.log(n)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // libvirt pings a connection that is quiet for 5 s (its keepalive_interval): the stream
    // runs past one ping, answered.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !source.log(n).contains("answering its keepalive pings") {
        assert!(
            std::time::Instant::now() < deadline,
            "no keepalive answered:\n{}",
            source.log(n)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(Rpc::cancel(&mut c, &slow).await, (true, String::new()));
    let ended = wait_notified(&source, "the cancelled migration ended", MIGRATION, |d| {
        metadata(d).is_some_and(|m| m.uid == "mig-cancelled" && m.end_timestamp.is_some())
    })
    .await;
    let m = metadata(&ended).unwrap();
    assert!(
        m.failed && m.abort_status == "Succeeded",
        "{m:?}\n{}",
        source.log(n)
    );
    assert_eq!(boot_id(&mut c).await, boot, "the source runs on, same boot");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !ld.domains().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "libvirt kept {:?}:\n{}",
            ld.domains(),
            ld.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // (d) The target's libvirt dies mid-stream: the source sees its connection close, rolls
    // back and runs on, same boot.
    let dying = vmi_json(
        &source.uid,
        Some(("mig-target-died", "virt-launcher-hv-stock")),
    );
    assert_eq!(
        Rpc::migrate(&mut c, &dying, &options("1Mi", 150)).await,
        (true, String::new())
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ld.qemu_pid().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "libvirt never started the incoming QEMU:\n{}",
            ld.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let orphan = ld.qemu_pid();
    ld.child.kill().unwrap();
    ld.child.wait().unwrap();
    let ended = wait_notified(
        &source,
        "the migration to a dead target ended",
        MIGRATION,
        |d| metadata(d).is_some_and(|m| m.uid == "mig-target-died" && m.end_timestamp.is_some()),
    )
    .await;
    let m = metadata(&ended).unwrap();
    assert!(
        m.failed && m.failure_reason.contains("connection failed mid-stream"),
        "{m:?}\n{}",
        source.log(n)
    );
    if let Some(pid) = orphan {
        // SAFETY: kill(2) of the incoming QEMU the killed libvirtd left behind.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert_eq!(boot_id(&mut c).await, boot, "the source runs on, same boot");
    drop(relays);
    ld = Libvirtd::start(work, &binds);
    relays = relay(&source, &ld, &target_proxy);

    // (a) The migration: the guest runs under libvirt, same boot, its file; qlauncher's QEMU
    // gone (Shutoff/Migrated).
    let moved = migrate(&source, &mut c, "mig-moved", &options("0", 150)).await;
    assert!(
        !moved.failed,
        "{moved:?}\nsource:\n{}\nlibvirtd:\n{}",
        source.log(n),
        ld.log()
    );
    source
        .wait_event((LifeCycle::Shutoff, StateChangeReason::Migrated), MIGRATION)
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while source.qemu_pids().contains(&ql_qemu[0]) {
        assert!(
            std::time::Instant::now() < deadline,
            "qlauncher's QEMU runs on"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ld.domstate(), "running");
    // The host-model CPU: libvirt's live XML has the named model qlauncher sent, its QEMU runs
    // it, and the vCPU's CPUID feature words are the ones it had under qlauncher.
    let live = ld.virsh_ok(&["dumpxml", DOMAIN]);
    assert!(
        live.contains("<cpu mode='custom' match='exact' check='full'>"),
        "{live}"
    );
    let model = live
        .split("<model fallback='forbid'>")
        .nth(1)
        .and_then(|r| r.split('<').next())
        .unwrap_or_else(|| panic!("no model:\n{live}"))
        .to_owned();
    let pid = ld.qemu_pid().expect("libvirt's QEMU");
    let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv: Vec<String> = argv
        .split(|b| *b == 0)
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    let cpu = argv
        .iter()
        .position(|w| w == "-cpu")
        .map(|i| argv[i + 1].clone())
        .unwrap_or_default();
    assert!(
        cpu.starts_with(&format!("{model},")) || cpu == model,
        "libvirt's QEMU runs -cpu {cpu}, not {model}"
    );
    let words_there = feature_words(|cmd| {
        let out = ld.virsh_ok(&["qemu-monitor-command", DOMAIN, &cmd.to_string()]);
        async move {
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            v["return"].clone()
        }
    })
    .await;
    eprintln!("libvirt's QEMU runs -cpu {cpu}");
    assert_eq!(
        words_there, words_here,
        "the guest's CPUID feature words under libvirt (-cpu {cpu})"
    );
    assert!(
        ld.virsh_ok(&["dominfo", DOMAIN])
            .lines()
            .any(|l| l.starts_with("Persistent:") && l.ends_with("yes")),
        "PERSIST_DEST: the domain is defined on the target"
    );
    let mut console = Console::connect(&in_target(&serial_path(&live)), Duration::from_secs(30))
        .expect("libvirt's serial console");
    // A fresh connection: the shell prints its prompt for a new line.
    console.send(b"\n").unwrap();
    let (rc, id) = console
        .run(
            "cat /proc/sys/kernel/random/boot_id",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(
        (rc, id.trim()),
        (0, boot.as_str()),
        "the same boot runs under libvirt"
    );
    let (rc, data) = console
        .run("cat /data/ql", Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        (rc, data.trim()),
        (0, "written-under-qlauncher"),
        "{}",
        console.transcript()
    );
    drop(relays);
}

/// KubeVirt's block migration to a stock target: the containerDisk's overlay (pod-local) is
/// mirrored by qlauncher's source over NBD to the export libvirt's Prepare made of the target
/// pod's own overlay (the cookie's `<nbd>`, `migrate_disks`, `disks_uri` on the proxy's NBD
/// socket), and the file the guest wrote under qlauncher is read from the disk under libvirt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_disk_moves_to_a_stock_libvirtd_over_nbd() {
    let guest = GuestImages::locate();
    let work = tempfile::Builder::new().prefix("qltob").tempdir().unwrap();
    let work = work.path();
    let container = serde_json::json!({"containerDisk": {"image": "qlauncher/test-guest:latest"}});
    let mut source = Pod::new(&guest.disk_qcow2, false);
    source.operator_qmp = true;
    let vmi = vmi_json_on(&source.uid, None, container.clone());
    let (n, mut c) = boot(&mut source, &vmi, BOOT).await;
    let boot = boot_id(&mut c).await;
    // A CBT checkpoint under qlauncher: a persistent dirty bitmap on the overlay's node, made
    // before the guest writes.
    let qmp = qlauncher::qmp::QmpClient::connect(&source.operator_qmp_socket(), BOOT)
        .await
        .unwrap();
    let node = disk_node(
        &qmp.execute("query-block", None).await.unwrap(),
        "ua-rootdisk",
    );
    qmp.execute(
        "block-dirty-bitmap-add",
        Some(serde_json::json!({"node": node, "name": CHECKPOINT, "persistent": true})),
    )
    .await
    .unwrap();
    exec_until_ok(
        &mut c,
        "echo copied-to-libvirt >/data/nbd && sync",
        Duration::from_secs(60),
    )
    .await;
    let nodes = qmp.execute("query-named-block-nodes", None).await.unwrap();
    let count = dirty_bitmap(&nodes, &node, CHECKPOINT).unwrap()["count"]
        .as_u64()
        .unwrap();
    assert!(count > 0, "{nodes}");
    drop(qmp);

    // The target pod: the same containerDisk and an overlay of its own on it, as KubeVirt's
    // target launcher makes before libvirt's Prepare.
    std::fs::create_dir_all(source.share().join("migrationproxy")).unwrap();
    let target_root = work.join("t");
    copy_dir_tree(&source.root, &target_root);
    let in_target =
        |p: &Path| -> PathBuf { target_root.join(p.strip_prefix(&source.root).unwrap()) };
    let disk = source.share().join("container-disks/disk_0.img");
    std::os::unix::fs::symlink(&guest.disk_qcow2, in_target(&disk)).unwrap();
    let made = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(&disk)
        .arg(in_target(&source.overlay()))
        .status()
        .unwrap();
    assert!(made.success());
    let ld = Libvirtd::start(work, &[(target_root.clone(), source.root.clone())]);
    let _relays = relay(
        &source,
        &ld,
        &in_target(&source.share().join("migrationproxy")),
    );

    let migrating = vmi_json_on(
        &source.uid,
        Some(("mig-nbd", "virt-launcher-hv-stock")),
        container,
    );
    let moved = migrate_vmi(&source, &mut c, &migrating, "mig-nbd", &options("0", 150)).await;
    assert!(
        !moved.failed,
        "{moved:?}\nsource:\n{}\nlibvirtd:\n{}",
        source.log(n),
        ld.log()
    );
    assert!(
        source
            .log(n)
            .contains("the disks go to the stock target's NBD server"),
        "the overlay was mirrored:\n{}",
        source.log(n)
    );
    assert_eq!(ld.domstate(), "running");
    let live = ld.virsh_ok(&["dumpxml", DOMAIN]);
    let mut console = Console::connect(&in_target(&serial_path(&live)), Duration::from_secs(30))
        .expect("libvirt's serial console");
    console.send(b"\n").unwrap();
    let (rc, id) = console
        .run(
            "cat /proc/sys/kernel/random/boot_id",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(
        (rc, id.trim()),
        (0, boot.as_str()),
        "the same boot runs under libvirt"
    );
    let (rc, data) = console
        .run(
            "echo 3 >/proc/sys/vm/drop_caches; cat /data/nbd",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(
        (rc, data.trim()),
        (0, "copied-to-libvirt"),
        "{}",
        console.transcript()
    );
    // The checkpoint is on libvirt's disk: offered in qlauncher's cookie, kept in libvirtd's
    // answer, carried with block-bitmap-mapping; persistent and recording.
    assert!(
        source
            .log(n)
            .contains("dirty bitmaps go to the stock target in the stream"),
        "{}",
        source.log(n)
    );
    let monitor = |cmd: serde_json::Value| -> serde_json::Value {
        let out = ld.virsh_ok(&["qemu-monitor-command", DOMAIN, &cmd.to_string()]);
        serde_json::from_str(&out).unwrap()
    };
    let theirs = disk_node(
        &monitor(serde_json::json!({"execute": "query-block"})),
        "ua-rootdisk",
    );
    let nodes = monitor(serde_json::json!({"execute": "query-named-block-nodes"}));
    let moved = dirty_bitmap(&nodes, &theirs, CHECKPOINT).unwrap_or_else(|| {
        panic!(
            "no {CHECKPOINT} on {theirs}: {nodes}\nlibvirtd:\n{}",
            ld.log()
        )
    });
    assert_eq!(moved["persistent"], true, "{moved}");
    assert_eq!(moved["recording"], true, "{moved}");
    assert!(
        moved["count"].as_u64().unwrap() >= count,
        "{count} -> {moved}"
    );
}

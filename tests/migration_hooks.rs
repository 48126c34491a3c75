//! A VM whose domain a hook sidecar edited migrates with the edits intact, between two real
//! launchers in KubeVirt's default non-root pods, each pod with its own sidecar (as
//! virt-controller renders both pods from the same `hooks.kubevirt.io/hookSidecars`
//! annotation). The source carries its hooked domain to the target, which runs with the
//! source's edits and calls its own sidecar only for its side effects, as KubeVirt's target does:
//! here the target's sidecar answers another vendor, and the SMBIOS board vendor the source's
//! hook set is still what the guest reads before and after, what the target's QEMU runs with and
//! what the target's domain reports, also after a later sync. The hook's disk I/O limits
//! (`<iotune>`), which QEMU does not migrate, are set on the target's QEMU before
//! `migrate-incoming` as libvirt sets them (QEMU refusing them would fail the migration), and so
//! is the balloon's stats polling interval; both are read back from the target's QEMU. The
//! hook's shifted RTC (`<clock adjustment>`) starts the target from the source's date.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use qlauncher::hooks::ON_DEFINE_DOMAIN;
use qlauncher::sync::domain::{LifeCycle as L, StateChangeReason as R};
use testkit::guest::GuestImages;
use testkit::handler::sync_with_plugins;
use testkit::hook_sidecar::{kubevirt_e2e_smbios, FakePlugin, FakeSidecar, Script};
use testkit::launcher::{get_domain, sync, Pod};
use testkit::migration::{
    exec_until_ok, migrating_vmi, options, plain_vmi, pod_pair, wait_notified, Relay, Rpc,
};

const BOOT: Duration = Duration::from_secs(240);
const MIGRATION: Duration = Duration::from_secs(240);
const VENDOR: &str = "cat /sys/class/dmi/id/board_vendor";

/// KubeVirt's e2e SMBIOS edit, I/O limits on the root disk, and an RTC a day ahead that
/// catches up (`-rtc base=<date>,driftfix=slew`: each launcher computes the date from its own
/// time, the target takes the source's).
fn source_edit(xml: &str) -> String {
    kubevirt_e2e_smbios(xml)
        .replacen(
            "<alias name=\"ua-rootdisk\"></alias>",
            "<iotune><total_iops_sec>5000</total_iops_sec></iotune><alias name=\"ua-rootdisk\"></alias>",
            1,
        )
        .replacen(
            "\t<features>",
            "\t<clock offset=\"utc\" adjustment=\"86400\"><timer name=\"rtc\" tickpolicy=\"catchup\">\
             </timer></clock>\n\t<features>",
            1,
        )
}

/// The pod's sidecar, its socket open to the launcher's user (in a pod the sidecar runs as 107
/// too).
fn sidecar(pod: &Pod, edit: fn(&str) -> String) -> FakeSidecar {
    let dir = pod.root.join("var/run/kubevirt-hooks");
    let script = Script::new(&["v1alpha3"], &[ON_DEFINE_DOMAIN]).on_define(edit);
    let fake = FakeSidecar::start_in(&dir, "hook-sidecar-0", "smbios.sock", script);
    let socket = dir.join("hook-sidecar-0/smbios.sock");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    fake
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hooked_domain_migrates_with_its_edits() {
    let images = GuestImages::locate();
    let (mut source, mut target) = pod_pair(&images.disk_qcow2);
    let uid = source.uid.clone();
    let source_hook = sidecar(&source, source_edit);
    // The target's sidecar would set another vendor: its answer must not be used.
    let target_hook = sidecar(&target, |xml| {
        kubevirt_e2e_smbios(xml).replace("Radical Edward", "Target Pod")
    });

    let s = source.start_launcher_with(&["--hook-sidecars", "1"]);
    let mut sc = source.client(s).await;
    assert_eq!(sync(&mut sc, &plain_vmi(&uid)).await, (true, String::new()));
    source.wait_event((L::Running, R::Unknown), BOOT).await;
    assert_eq!(
        exec_until_ok(&mut sc, VENDOR, BOOT).await.trim(),
        "Radical Edward"
    );
    let guest_mac = get_domain(&mut sc).await.unwrap().spec.devices.interfaces[0]
        .mac
        .clone()
        .unwrap()
        .mac;
    let vmi = migrating_vmi(&uid, "mig-hooks", &target.pod_name(), &guest_mac);

    target.operator_qmp = true;
    let t = target.start_launcher_with(&["--hook-sidecars", "1"]);
    let mut tc = target.client(t).await;
    assert_eq!(Rpc::sync_target(&mut tc, &vmi).await, (true, String::new()));
    let _relay = Relay::start(&source, &target, &uid).await;
    assert_eq!(
        Rpc::migrate(&mut sc, &vmi, &options("0", 150)).await,
        (true, String::new())
    );
    let done = wait_notified(
        &target,
        "target Running after the migration",
        MIGRATION,
        |d| {
            d.status.status == L::Running
                && d.spec
                    .metadata
                    .kubevirt
                    .migration
                    .as_ref()
                    .is_some_and(|m| m.end_timestamp.is_some() && !m.failed)
        },
    )
    .await;
    let sysinfo = serde_json::to_value(&done.spec).unwrap()["SysInfo"].to_string();
    assert!(sysinfo.contains("Radical Edward"), "{sysinfo}");

    let qemu = target.wait_qemu(t, Duration::from_secs(5)).await;
    let argv = std::fs::read(format!("/proc/{qemu}/cmdline")).unwrap();
    let argv = String::from_utf8_lossy(&argv);
    assert!(
        argv.split('\0')
            .any(|w| w.starts_with("type=2,") && w.contains("manufacturer=Radical Edward")),
        "{argv:?}"
    );
    // The hooked clock: a start date (not base=utc) that catches up.
    let rtc: Vec<&str> = argv
        .split('\0')
        .skip_while(|w| *w != "-rtc")
        .take(2)
        .collect();
    assert!(
        rtc.len() == 2 && !rtc[1].starts_with("base=utc") && rtc[1].ends_with(",driftfix=slew"),
        "{rtc:?}"
    );
    assert_eq!(
        exec_until_ok(&mut tc, VENDOR, Duration::from_secs(30))
            .await
            .trim(),
        "Radical Edward"
    );
    // What QEMU does not migrate, the target's QEMU was given as at a start: the hook's I/O
    // limits on the root disk and the balloon's stats polling interval.
    let (block, period) = target_qemu_state(target.operator_qmp_socket()).await;
    let root = block
        .as_array()
        .unwrap()
        .iter()
        .find(|b| {
            b["qdev"]
                .as_str()
                .is_some_and(|q| q.contains("ua-rootdisk"))
        })
        .unwrap_or_else(|| panic!("no ua-rootdisk in {block}"));
    assert_eq!(root["inserted"]["iops"], 5000, "{root}");
    assert_eq!(period, 10);
    // A later sync of the migrated VMI on the target keeps the source's edits.
    assert_eq!(sync(&mut tc, &vmi).await, (true, String::new()));
    let after = get_domain(&mut tc).await.unwrap();
    let sysinfo = serde_json::to_value(&after.spec).unwrap()["SysInfo"].to_string();
    assert!(sysinfo.contains("Radical Edward"), "{sysinfo}");
    assert!(!sysinfo.contains("Target Pod"), "{sysinfo}");
    let clock = serde_json::to_value(&after.spec).unwrap()["Clock"].to_string();
    assert!(clock.contains("86400"), "{clock}");
    assert_eq!(source_hook.methods(), ["Info", "OnDefineDomain"]);
    // Called, for its side effects only.
    assert_eq!(target_hook.methods(), ["Info", "OnDefineDomain"]);
    source.wait_launcher(s, Duration::from_secs(60)).await;
}

/// `query-block` and the balloon's `guest-stats-polling-interval` (seconds) of the QEMU behind
/// the operator's QMP socket `qmp`.
async fn target_qemu_state(qmp: std::path::PathBuf) -> (serde_json::Value, i64) {
    tokio::task::spawn_blocking(move || {
        let mut qmp = testkit::guest::Qmp::connect(&qmp, Duration::from_secs(10)).unwrap();
        let block = qmp.execute("query-block", serde_json::json!({})).unwrap();
        let period = qmp
            .execute(
                "qom-get",
                serde_json::json!({
                    "path": "/machine/peripheral/balloon0",
                    "property": "guest-stats-polling-interval",
                }),
            )
            .unwrap();
        (block, period.as_i64().unwrap())
    })
    .await
    .unwrap()
}

/// The pod's VEP-190 plugin sidecar `b-board` answering `vendor` as the board vendor, its socket
/// open to the launcher's user.
fn plugin(pod: &Pod, vendor: &'static str) -> FakePlugin {
    let dir = pod.root.join("var/run/kubevirt-plugin");
    let fake = FakePlugin::start_in(&dir, "b-board", "hook.sock", Duration::ZERO, move |xml| {
        Ok(kubevirt_e2e_smbios(xml).replace("Radical Edward", vendor))
    });
    std::fs::set_permissions(&fake.socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    fake
}

fn plugins() -> serde_json::Value {
    serde_json::json!([{"metadata": {"name": "b-board"}, "spec": {"domainHooks": [
        {"sidecar": {"socketPath": "/var/run/kubevirt-plugin/b-board/hook.sock"}}]}}])
}

/// The same with a VEP-190 plugin in both pods: the source's plugin edit (invocation context
/// `Boot`) migrates; the target's plugin is called with `MigrationTarget` (KubeVirt's
/// `PrepareMigrationTarget`) and its answer is not what the migrated domain runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_hooked_domain_migrates_with_its_edits() {
    let images = GuestImages::locate();
    let (mut source, mut target) = pod_pair(&images.disk_qcow2);
    let uid = source.uid.clone();
    let source_plugin = plugin(&source, "Plugin Source");
    let target_plugin = plugin(&target, "Plugin Target");

    let s = source.start_launcher_with(&[]);
    let mut sc = source.client(s).await;
    assert_eq!(
        sync_with_plugins(&mut sc, &plain_vmi(&uid), &plugins()).await,
        (true, String::new())
    );
    source.wait_event((L::Running, R::Unknown), BOOT).await;
    assert_eq!(
        exec_until_ok(&mut sc, VENDOR, BOOT).await.trim(),
        "Plugin Source"
    );
    let guest_mac = get_domain(&mut sc).await.unwrap().spec.devices.interfaces[0]
        .mac
        .clone()
        .unwrap()
        .mac;
    let vmi = migrating_vmi(&uid, "mig-plugins", &target.pod_name(), &guest_mac);

    let t = target.start_launcher_with(&[]);
    let mut tc = target.client(t).await;
    assert_eq!(
        Rpc::sync_target_with_plugins(&mut tc, &vmi, &plugins()).await,
        (true, String::new())
    );
    let contexts: Vec<_> = target_plugin
        .calls()
        .into_iter()
        .map(|c| c.invocation_context)
        .collect();
    assert_eq!(contexts, ["MigrationTarget"]);
    let _relay = Relay::start(&source, &target, &uid).await;
    assert_eq!(
        Rpc::migrate(&mut sc, &vmi, &options("0", 150)).await,
        (true, String::new())
    );
    wait_notified(
        &target,
        "target Running after the migration",
        MIGRATION,
        |d| {
            d.status.status == L::Running
                && d.spec
                    .metadata
                    .kubevirt
                    .migration
                    .as_ref()
                    .is_some_and(|m| m.end_timestamp.is_some() && !m.failed)
        },
    )
    .await;
    assert_eq!(
        exec_until_ok(&mut tc, VENDOR, Duration::from_secs(30))
            .await
            .trim(),
        "Plugin Source"
    );
    // A later sync on the target keeps the source's edits.
    assert_eq!(
        sync_with_plugins(&mut tc, &vmi, &plugins()).await,
        (true, String::new())
    );
    let after = get_domain(&mut tc).await.unwrap();
    let sysinfo = serde_json::to_value(&after.spec).unwrap()["SysInfo"].to_string();
    assert!(sysinfo.contains("Plugin Source"), "{sysinfo}");
    assert!(!sysinfo.contains("Plugin Target"), "{sysinfo}");
    let contexts: Vec<_> = source_plugin
        .calls()
        .into_iter()
        .map(|c| c.invocation_context)
        .collect();
    assert_eq!(contexts, ["Boot"]);
    source.wait_launcher(s, Duration::from_secs(60)).await;
}

//! VEP-190 plugins' domain hooks (`qlauncher::hooks::plugins::pipeline`, KubeVirt v1.9.0
//! `ApplyDomainHooks`), with testkit's fake plugin sidecar serving `MutateDomain` over a real
//! unix socket:
//! - the pipeline on a converted domain: plugins in name order whatever the JSON order, plugin
//!   and hook conditions, a CEL mutation and a sidecar each editing the SMBIOS, `Ignore` hooks
//!   (a CEL error, a sidecar past its timeout, a refused answer) skipped with the domain as it
//!   was, and `Fail` hooks (timeout, refusal, socket outside the plugin's directory) and
//!   conditions that cannot be evaluated stopping it, naming the plugin and the hook;
//! - a boot of the test guest through the launcher's SyncVirtualMachine with `pluginsJson`:
//!   a CEL plugin sets the system serial and a sidecar plugin the board vendor and the root
//!   disk's cache mode; the guest reads both from `/sys/class/dmi/id` and QEMU reports the cache
//!   (`query-block`).
//!
//! The boot needs root and the test guest (`scripts/build-guest`); the pipeline tests neither.

use std::path::Path;
use std::time::Duration;

use qlauncher::cmdline::{convert, ConverterContext};
use qlauncher::hooks::plugins::pipeline::{
    apply_domain_hooks, HookTarget, InvocationContext, PlannedDomain, PluginError, Times,
};
use qlauncher::hooks::plugins::{decode, Plugin};
use qlauncher::vmi::Vmi;
use serde_json::{json, Value};
use testkit::hook_sidecar::{kubevirt_e2e_smbios, FakePlugin, E2E_BOARD_VENDOR};

fn vmi(uid: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "plugged", "namespace": "default", "uid": uid},
        "spec": {
            "domain": {
                "resources": {"requests": {"memory": "256Mi"}},
                "devices": {
                    "autoattachPodInterface": false,
                    "disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}},
                        {"name": "cloudinitdisk", "disk": {"bus": "virtio"}}]
                }
            },
            "volumes": [
                {"name": "rootdisk", "containerDisk": {"image": "qlauncher/test-guest:latest"}},
                {"name": "cloudinitdisk", "cloudInitNoCloud": {"userData": "#cloud-config\n"}}
            ]
        }
    })
}

/// The CEL mutation of the tests: the system serial `plugin-<vmi name>`, the other system
/// entries kept.
const SERIAL: &str = r#"Domain{SysInfo: [DomainSysInfo{SMBIOS: DomainSysInfoSMBIOS{
    System: DomainSysInfoSystem{Entry: domainSpec.SysInfo[0].SMBIOS.System.Entry +
        [DomainSysInfoEntry{Name: "serial", Value: "plugin-" + vmi.Name}]}}}]}"#;

/// The sidecar plugin's edit: KubeVirt's e2e board vendor and the first disk's cache `unsafe`,
/// as text edits of the domain XML.
fn board_and_cache(xml: &str) -> Result<String, String> {
    let xml = match xml.split_once("<driver cache=\"") {
        Some((head, rest)) => {
            let (_, tail) = rest.split_once('"').unwrap_or(("", rest));
            format!("{head}<driver cache=\"unsafe\"{tail}")
        }
        None => return Err("no disk driver in the domain".into()),
    };
    Ok(kubevirt_e2e_smbios(&xml))
}

fn socket(plugin: &str, name: &str) -> String {
    format!("/var/run/kubevirt-plugin/{plugin}/{name}")
}

fn plugins(json: Value) -> Vec<Plugin> {
    decode(&serde_json::to_vec(&json).unwrap()).expect("plugins JSON")
}

/// Runs `plugins` on the converted test VMI, the sockets under `dir`: the result and the XML
/// the domain ended with.
async fn run(plugins: &[Plugin], dir: &Path) -> (Result<(), PluginError>, String) {
    let json = vmi("6a1c0b3e-0000-4000-8010-000000000001");
    let view = Vmi::from_json_or_yaml(&json.to_string()).unwrap();
    let ctx = ConverterContext::default();
    let plan = convert(&view, &ctx).expect("convert");
    let mut target = PlannedDomain::new(&view, &ctx, &plan, Vec::new()).expect("export");
    let times = Times {
        socket_wait: Duration::from_secs(5),
        dial: Duration::from_secs(5),
    };
    let r = apply_domain_hooks(
        plugins,
        &json,
        InvocationContext::Boot,
        dir,
        times,
        &mut target,
    )
    .await;
    (r, target.xml().to_owned())
}

#[tokio::test]
async fn the_pipeline_orders_conditions_and_failure_strategies() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let board = FakePlugin::start_in(dir, "b-board", "hook.sock", Duration::ZERO, board_and_cache);
    let slow = FakePlugin::start_in(
        dir,
        "d-ignored",
        "slow.sock",
        Duration::from_secs(60),
        |x| Ok(x.to_owned()),
    );
    let refuse = FakePlugin::start_in(dir, "d-ignored", "refuse.sock", Duration::ZERO, |x| {
        Ok(x.replacen("name=\"qemu\"", "name=\"tap\"", 1))
    });
    let list = plugins(json!([
        {"metadata": {"name": "d-ignored"}, "spec": {"failureStrategy": "Ignore", "domainHooks": [
            {"sidecar": {"socketPath": socket("d-ignored", "slow.sock")}, "timeout": "100ms"},
            {"sidecar": {"socketPath": socket("d-ignored", "refuse.sock")}}
        ]}},
        {"metadata": {"name": "c-skipped"}, "spec": {
            "condition": "vmi.Namespace == \"kube-system\"",
            "domainHooks": [{"cel": {"expression": "Domain{Title: \"t\"}"}}]}},
        {"metadata": {"name": "b-board"}, "spec": {"domainHooks": [
            {"sidecar": {"socketPath": socket("b-board", "hook.sock")}}
        ]}},
        {"metadata": {"name": "a-serial"}, "spec": {
            "condition": "vmi.Namespace == \"default\"",
            "domainHooks": [
                {"condition": "vmi.Name == \"someone-else\"",
                    "cel": {"expression": "Domain{SysInfo: []}"}},
                {"cel": {"expression": SERIAL}},
                {"cel": {"expression": "Domain{Title: \"t\"}"}, "failureStrategy": "Ignore"}
            ]}}
    ]));
    let (r, xml) = run(&list, dir).await;
    r.expect("the pipeline");
    assert!(
        xml.contains("<entry name=\"serial\">plugin-plugged</entry>"),
        "{xml}"
    );
    assert!(xml.contains(E2E_BOARD_VENDOR), "{xml}");
    assert!(xml.contains("cache=\"unsafe\""), "{xml}");
    assert!(!xml.contains("name=\"tap\""), "{xml}");
    // a-serial ran before b-board: the sidecar got the serial.
    let calls = board.calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert!(call.domain.contains("plugin-plugged"), "{}", call.domain);
    assert_eq!(call.domain_type, "libvirt");
    assert_eq!(call.invocation_context, "Boot");
    let sent: Value = serde_json::from_slice(&call.vmi).unwrap();
    assert_eq!(sent["metadata"]["name"], "plugged");
    // d-ignored ran last: both its hooks were called, got the board vendor, and were skipped.
    assert_eq!(slow.calls().len(), 1);
    assert!(slow.calls()[0].domain.contains(E2E_BOARD_VENDOR));
    assert_eq!(refuse.calls().len(), 1);
}

#[tokio::test]
async fn failing_hooks_stop_the_definition_naming_the_plugin() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let _slow = FakePlugin::start_in(dir, "p", "slow.sock", Duration::from_secs(60), |x| {
        Ok(x.to_owned())
    });
    let _refuse = FakePlugin::start_in(dir, "p", "refuse.sock", Duration::ZERO, |x| {
        Ok(x.replacen("name=\"qemu\"", "name=\"tap\"", 1))
    });
    let one = |hook: Value| {
        plugins(json!([{"metadata": {"name": "p"}, "spec": {"domainHooks": [hook]}}]))
    };

    let (r, _) = run(
        &one(json!({"sidecar": {"socketPath": socket("p", "slow.sock")}, "timeout": "100ms"})),
        dir,
    )
    .await;
    match r {
        Err(PluginError::Hook {
            plugin,
            hook,
            reason,
        }) => {
            assert_eq!((plugin.as_str(), hook), ("p", 0));
            assert!(reason.contains("DeadlineExceeded"), "{reason}");
        }
        other => panic!("a timed-out Fail hook: {other:?}"),
    }

    let (r, xml) = run(
        &one(json!({"sidecar": {"socketPath": socket("p", "refuse.sock")}})),
        dir,
    )
    .await;
    match &r {
        Err(PluginError::Refused {
            plugin,
            hook,
            refusal,
        }) => {
            assert_eq!((plugin.as_str(), *hook), ("p", 0));
            assert!(refusal.path.contains("driver@name"), "{refusal}");
        }
        other => panic!("a refused Fail hook: {other:?}"),
    }
    assert!(!xml.contains("name=\"tap\""));
    let text = r.unwrap_err().to_string();
    assert!(
        text.contains("plugin p hook 0") && text.contains("driver@name"),
        "{text}"
    );

    // KubeVirt's socket path check: under /var/run/kubevirt-plugin/<plugin>/ only.
    let (r, _) = run(
        &one(json!({"sidecar": {"socketPath": socket("q", "refuse.sock")}})),
        dir,
    )
    .await;
    assert!(
        matches!(&r, Err(PluginError::Hook { reason, .. }) if reason.contains("outside")),
        "{r:?}"
    );

    // Hostile answers: not XML, and more than the 4 MiB a hook answer may have.
    let _garbage = FakePlugin::start_in(dir, "p", "garbage.sock", Duration::ZERO, |_| {
        Ok("<domain><<<".into())
    });
    let _huge = FakePlugin::start_in(dir, "p", "huge.sock", Duration::ZERO, |x| {
        Ok(x.replacen(
            "</domain>",
            &format!("<!--{}--></domain>", "x".repeat(5 << 20)),
            1,
        ))
    });
    let (r, _) = run(
        &one(json!({"sidecar": {"socketPath": socket("p", "garbage.sock")}})),
        dir,
    )
    .await;
    assert!(
        matches!(&r, Err(PluginError::Refused { refusal, .. }) if refusal.reason.contains("malformed")),
        "{r:?}"
    );
    let (r, _) = run(
        &one(json!({"sidecar": {"socketPath": socket("p", "huge.sock")}})),
        dir,
    )
    .await;
    assert!(matches!(&r, Err(PluginError::Hook { .. })), "{r:?}");

    // A CEL mutation that fails under Fail.
    let (r, _) = run(
        &one(json!({"cel": {"expression": "Domain{Title: \"t\"}"}})),
        dir,
    )
    .await;
    assert!(
        matches!(&r, Err(PluginError::Hook { hook: 0, .. })),
        "{r:?}"
    );

    // A condition that is not a bool fails whatever the strategy.
    let bad = plugins(json!([{"metadata": {"name": "p"}, "spec": {
        "failureStrategy": "Ignore", "condition": "vmi.Name",
        "domainHooks": [{"cel": {"expression": SERIAL}}]}}]));
    let (r, _) = run(&bad, dir).await;
    assert!(
        matches!(&r, Err(PluginError::Condition { hook: None, .. })),
        "{r:?}"
    );
    let text = r.unwrap_err().to_string();
    assert!(
        text.starts_with("plugin p condition evaluation failed: "),
        "{text}"
    );
}

/// One boot through SyncVirtualMachine with `pluginsJson`: the CEL plugin's serial and the
/// sidecar plugin's board vendor reach the guest's DMI, its cache mode QEMU's root disk, and
/// GetDomain shows the hooked domain.
#[test]
fn plugins_edit_the_domain_the_guest_runs() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    testkit::in_process::runtime().block_on(async {
        refused().await;
        boot().await;
    });
}

/// A `Fail` plugin hook, and `pluginsJson` that is not a list of plugins, fail the sync with
/// the plugin and hook named (KubeVirt's texts), before any QEMU runs.
async fn refused() {
    use testkit::guest::GuestImages;
    use testkit::handler;
    use testkit::in_process::{InProcess, LauncherRoot};

    let uid = format!("6a1c0b3e-0000-4000-8012-{:012}", std::process::id());
    let images = GuestImages::locate();
    let root = LauncherRoot::new(&images.disk_qcow2, &uid);
    let launcher = InProcess::start(root.config.clone(), &root.share_dir()).await;
    let mut client = launcher.client.clone();
    let (ok, message) =
        handler::sync_with_plugins(&mut client, &vmi(&uid), &json!({"not": "a list"})).await;
    assert!(!ok);
    assert!(
        message.contains("failed to deserialize plugins from options"),
        "{message}"
    );
    let failing = json!([{"metadata": {"name": "p"}, "spec": {"domainHooks": [
        {"cel": {"expression": "Domain{Title: \"t\"}"}}]}}]);
    let (ok, message) = handler::sync_with_plugins(&mut client, &vmi(&uid), &failing).await;
    assert!(!ok);
    assert!(
        message.contains("applying plugin domain hooks failed: plugin p hook 0 failed"),
        "{message}"
    );
    assert!(launcher.manager.qemu_pid().is_none(), "QEMU started");
}

async fn boot() {
    use testkit::guest::{self, wait_log_marker, GuestImages};
    use testkit::handler::{self, get_domain};
    use testkit::in_process::{InProcess, LauncherRoot};
    use testkit::migration::exec_in;

    let uid = format!("6a1c0b3e-0000-4000-8011-{:012}", std::process::id());
    let images = GuestImages::locate();
    let mut root = LauncherRoot::new(&images.disk_qcow2, &uid);
    let plugin_dir = root.config.plugin_dir.clone();
    let board = FakePlugin::start_in(
        &plugin_dir,
        "b-board",
        "hook.sock",
        Duration::ZERO,
        board_and_cache,
    );
    let operator_qmp = root.path().join("operator-qmp.sock");
    root.config.operator_qmp_socket = Some(operator_qmp.clone());
    let private = root.private.clone();
    let launcher = InProcess::start(root.config.clone(), &root.share_dir()).await;
    let mut client = launcher.client.clone();
    let list = json!([
        {"metadata": {"name": "b-board"}, "spec": {"domainHooks": [
            {"sidecar": {"socketPath": socket("b-board", "hook.sock")}}]}},
        {"metadata": {"name": "a-serial"}, "spec": {"domainHooks": [{"cel": {"expression": SERIAL}}]}}
    ]);
    assert_eq!(
        handler::sync_with_plugins(&mut client, &vmi(&uid), &list).await,
        (true, String::new())
    );
    let calls = board.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].invocation_context, "Boot");

    let domain = get_domain(&mut client).await.expect("a domain");
    let spec = serde_json::to_value(&domain.spec).unwrap();
    let sysinfo = spec["SysInfo"].to_string();
    assert!(
        sysinfo.contains(E2E_BOARD_VENDOR) && sysinfo.contains("plugin-plugged"),
        "{sysinfo}"
    );
    let block = tokio::task::spawn_blocking(move || {
        let mut qmp = guest::Qmp::connect(&operator_qmp, Duration::from_secs(10)).unwrap();
        qmp.execute("query-block", json!({})).unwrap()
    })
    .await
    .unwrap();
    let root_block = block
        .as_array()
        .unwrap()
        .iter()
        .find(|b| {
            b["qdev"]
                .as_str()
                .is_some_and(|q| q.contains("ua-rootdisk"))
        })
        .unwrap_or_else(|| panic!("no ua-rootdisk in {block}"));
    assert_eq!(
        root_block["inserted"]["cache"],
        json!({"writeback": true, "direct": false, "no-flush": true}),
        "{root_block}"
    );

    let serial = private.join(&uid).join("virt-serial0-log");
    wait_log_marker(&serial, "QLG: agent ready", guest::BOOT_TIMEOUT).await;
    let read = "cat /sys/class/dmi/id/board_vendor /sys/class/dmi/id/product_serial";
    let mut out = None;
    for _ in 0..100 {
        if let Some((0, text)) = exec_in(&mut client, "default_plugged", read).await {
            out = Some(text);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = out.expect("the guest agent answers");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [E2E_BOARD_VENDOR, "plugin-plugged"]
    );
}

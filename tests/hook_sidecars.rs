//! The launcher's side of KubeVirt's hook sidecars (`qlauncher::hooks`) against testkit's fake
//! sidecar over the real socket protocol: collecting the sockets (version choice, order,
//! deduplication, waiting, the fatal cases), the `OnDefineDomain` chain, `PreCloudInitIso`,
//! `Shutdown`, and answers a hostile sidecar may give.

use std::path::Path;
use std::time::{Duration, Instant};

use qlauncher::hooks::{self, HookError, Version, ON_DEFINE_DOMAIN, PRE_CLOUD_INIT_ISO, SHUTDOWN};
use testkit::hook_sidecar::{FakeSidecar, Script};

const SHORT: Duration = Duration::from_secs(5);

fn all_points() -> [&'static str; 3] {
    [ON_DEFINE_DOMAIN, PRE_CLOUD_INIT_ISO, SHUTDOWN]
}

fn sockets(s: &hooks::Sidecars) -> Vec<String> {
    s.list
        .iter()
        .map(|s| {
            let p = s.socket.as_path();
            let dir = p.parent().and_then(Path::file_name).unwrap();
            format!(
                "{}/{}",
                dir.to_string_lossy(),
                p.file_name().unwrap().to_string_lossy()
            )
        })
        .collect()
}

#[tokio::test]
async fn collect_picks_the_newest_common_version_in_directory_order() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Go's os.ReadDir order: hook-sidecar-0, -1, -10, -2.
    let _a = FakeSidecar::start_in(
        d,
        "hook-sidecar-2",
        "a.sock",
        Script::new(&["v1alpha1"], &[]),
    );
    let _b = FakeSidecar::start_in(
        d,
        "hook-sidecar-10",
        "b.sock",
        Script::new(&["v1alpha2", "v1alpha1"], &[]),
    );
    let _c = FakeSidecar::start_in(
        d,
        "hook-sidecar-0",
        "c.sock",
        Script::new(&["v1alpha1", "v1alpha3", "v9"], &all_points()),
    );
    let _d = FakeSidecar::start_in(
        d,
        "hook-sidecar-1",
        "d.sock",
        Script::new(&["v1alpha2"], &[]),
    );
    // A plain file directly in the hook directory is not a sidecar.
    std::fs::write(d.join("stray.sock"), b"").unwrap();
    let found = hooks::collect(d, 4, SHORT).await.unwrap();
    assert_eq!(
        sockets(&found),
        [
            "hook-sidecar-0/c.sock",
            "hook-sidecar-1/d.sock",
            "hook-sidecar-10/b.sock",
            "hook-sidecar-2/a.sock"
        ]
    );
    let versions: Vec<Version> = found.list.iter().map(|s| s.version).collect();
    assert_eq!(
        versions,
        [
            Version::V1alpha3,
            Version::V1alpha2,
            Version::V1alpha2,
            Version::V1alpha1
        ]
    );
    assert_eq!(found.list[0].hook_points, all_points());
    assert_eq!(found.list[0].name, "fake");
}

#[tokio::test]
async fn collect_of_zero_sidecars_does_not_need_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let found = hooks::collect(&missing, 0, SHORT).await.unwrap();
    assert!(found.is_empty());
    let err = hooks::collect(&missing, 1, SHORT).await.unwrap_err();
    assert!(matches!(err, HookError::Dir { .. }), "{err}");
    assert!(err.to_string().contains("missing"), "{err}");
}

/// Two sidecars that both call their socket `smbios.sock` (public hooks copied that name) are
/// two sidecars: deduplication is by full path.
#[tokio::test]
async fn collect_deduplicates_by_full_path_not_base_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let s = || Script::new(&["v1alpha3"], &[ON_DEFINE_DOMAIN]);
    let _a = FakeSidecar::start_in(d, "hook-sidecar-0", "smbios.sock", s());
    let _b = FakeSidecar::start_in(d, "hook-sidecar-1", "smbios.sock", s());
    let found = hooks::collect(d, 2, SHORT).await.unwrap();
    assert_eq!(
        sockets(&found),
        ["hook-sidecar-0/smbios.sock", "hook-sidecar-1/smbios.sock"]
    );
    // Each is asked Info once, however many passes it takes.
    assert_eq!(_a.methods(), ["Info"]);
}

#[tokio::test]
async fn collect_waits_for_a_late_sidecar_and_retries_a_dead_socket() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_owned();
    // A socket file nobody listens on: tried on every pass, never an error.
    std::fs::create_dir_all(d.join("hook-sidecar-0")).unwrap();
    drop(std::os::unix::net::UnixListener::bind(d.join("hook-sidecar-0/dead.sock")).unwrap());
    let late = {
        let d = d.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            FakeSidecar::start_in(
                &d,
                "hook-sidecar-1",
                "late.sock",
                Script::new(&["v1alpha2"], &[ON_DEFINE_DOMAIN]),
            )
        })
    };
    let t = Instant::now();
    let found = hooks::collect(&d, 1, SHORT).await.unwrap();
    let took = t.elapsed();
    assert_eq!(sockets(&found), ["hook-sidecar-1/late.sock"]);
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let _late = late.await.unwrap();

    // Only the dead socket: the timeout, with the count in the message.
    let dead_only = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dead_only.path().join("hook-sidecar-0")).unwrap();
    drop(
        std::os::unix::net::UnixListener::bind(dead_only.path().join("hook-sidecar-0/dead.sock"))
            .unwrap(),
    );
    let t = Instant::now();
    let err = hooks::collect(dead_only.path(), 1, Duration::from_millis(700))
        .await
        .unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(
        matches!(
            err,
            HookError::Timeout {
                found: 0,
                expected: 1,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().starts_with(
            "Failed to collect all expected sidecar hook sockets within given timeout"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_sidecar_failing_info_or_without_a_version_stops_collect_naming_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut broken = Script::new(&["v1alpha3"], &[]);
    broken.info_error = Some("not today".into());
    let b = FakeSidecar::start_in(d, "hook-sidecar-0", "broken.sock", broken);
    let err = hooks::collect(d, 1, SHORT).await.unwrap_err();
    assert!(matches!(err, HookError::Info { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains(&b.socket.display().to_string()), "{text}");
    assert!(text.contains("not today"), "{text}");

    for versions in [vec![], vec!["v2"]] {
        let dir = tempfile::tempdir().unwrap();
        let s = FakeSidecar::start_in(
            dir.path(),
            "hook-sidecar-0",
            "old.sock",
            Script::new(&versions, &[ON_DEFINE_DOMAIN]),
        );
        let err = hooks::collect(dir.path(), 1, SHORT).await.unwrap_err();
        assert!(matches!(err, HookError::NoVersion { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.starts_with("Hook sidecar does not expose a supported version"),
            "{text}"
        );
        assert!(text.contains(&s.socket.display().to_string()), "{text}");
    }
}

#[tokio::test]
async fn on_define_domain_chains_the_subscribers_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let first = FakeSidecar::start_in(
        d,
        "hook-sidecar-0",
        "first.sock",
        Script::new(&["v1alpha1"], &[ON_DEFINE_DOMAIN]).on_define(|x| x.replace("A", "B")),
    );
    // Not subscribed: never called for it.
    let idle = FakeSidecar::start_in(
        d,
        "hook-sidecar-1",
        "idle.sock",
        Script::new(&["v1alpha3"], &[SHUTDOWN]),
    );
    let second = FakeSidecar::start_in(
        d,
        "hook-sidecar-2",
        "second.sock",
        Script::new(&["v1alpha3", "v1alpha2"], &[ON_DEFINE_DOMAIN]).on_define(|x| format!("{x}C")),
    );
    let found = hooks::collect(d, 3, SHORT).await.unwrap();
    let steps = found
        .on_define_domain_steps("<A/>", br#"{"kind":"VirtualMachineInstance"}"#)
        .await
        .unwrap();
    assert_eq!(steps.len(), 2);
    assert_eq!(steps[0].socket, first.socket);
    assert_eq!(steps[0].domain_xml, "<B/>");
    assert_eq!(steps[1].domain_xml, "<B/>C");
    let answer = found.on_define_domain("<A/>", b"{}").await.unwrap();
    assert_eq!(answer, "<B/>C");

    let c1 = first.calls();
    assert_eq!(c1[1].version, "v1alpha1");
    assert_eq!(c1[1].payload, b"<A/>");
    assert_eq!(c1[1].vmi, br#"{"kind":"VirtualMachineInstance"}"#);
    let c2 = second.calls();
    assert_eq!(c2[1].version, "v1alpha3");
    assert_eq!(c2[1].payload, b"<B/>", "the second gets the first's answer");
    assert_eq!(idle.methods(), ["Info"]);

    // Nobody subscribed: the input as it is.
    let none = hooks::Sidecars::default();
    assert_eq!(none.on_define_domain("<x/>", b"{}").await.unwrap(), "<x/>");
}

#[tokio::test]
async fn pre_cloud_init_iso_goes_to_the_first_v1alpha2_or_later_subscriber_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v1 = FakeSidecar::start_in(
        d,
        "hook-sidecar-0",
        "v1.sock",
        Script::new(&["v1alpha1"], &[PRE_CLOUD_INIT_ISO]),
    );
    let mut s = Script::new(&["v1alpha2"], &[PRE_CLOUD_INIT_ISO]);
    s.pre_cloud_init_iso =
        std::sync::Arc::new(|n, _| Ok((n.to_vec(), br#"{"UserData":"x"}"#.to_vec())));
    let v2 = FakeSidecar::start_in(d, "hook-sidecar-1", "v2.sock", s);
    let v3 = FakeSidecar::start_in(
        d,
        "hook-sidecar-2",
        "v3.sock",
        Script::new(&["v1alpha3"], &[PRE_CLOUD_INIT_ISO]),
    );
    let found = hooks::collect(d, 3, SHORT).await.unwrap();
    let answer = found
        .pre_cloud_init_iso(b"{\"userData\":\"u\"}", b"{\"UserData\":\"u\"}", b"{}")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.socket, v2.socket);
    assert_eq!(answer.cloud_init_data, br#"{"UserData":"x"}"#);
    assert_eq!(answer.cloud_init_no_cloud_source, b"{\"userData\":\"u\"}");
    assert_eq!(v1.methods(), ["Info"]);
    assert_eq!(v2.methods(), ["Info", "PreCloudInitIso"]);
    assert_eq!(v3.methods(), ["Info"]);
    assert_eq!(v2.calls()[1].payload, b"{\"UserData\":\"u\"}");

    let only_v1 = hooks::Sidecars {
        list: vec![found.list[0].clone()],
    };
    assert!(only_v1
        .pre_cloud_init_iso(b"{}", b"{}", b"{}")
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn shutdown_calls_every_v1alpha3_subscriber_and_never_fails() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let v2 = FakeSidecar::start_in(
        d,
        "hook-sidecar-0",
        "v2.sock",
        Script::new(&["v1alpha2"], &[SHUTDOWN]),
    );
    let mut failing = Script::new(&["v1alpha3"], &[SHUTDOWN]);
    failing.shutdown_error = Some("busy".into());
    let bad = FakeSidecar::start_in(d, "hook-sidecar-1", "bad.sock", failing);
    let good = FakeSidecar::start_in(
        d,
        "hook-sidecar-2",
        "good.sock",
        Script::new(&["v1alpha3"], &[SHUTDOWN, ON_DEFINE_DOMAIN]),
    );
    let found = hooks::collect(d, 3, SHORT).await.unwrap();
    let errors = found.shutdown(Duration::from_secs(10)).await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0]
        .to_string()
        .contains(&bad.socket.display().to_string()));
    assert!(errors[0].to_string().contains("busy"));
    assert_eq!(v2.methods(), ["Info"]);
    assert_eq!(bad.methods(), ["Info", "Shutdown"]);
    assert_eq!(good.methods(), ["Info", "Shutdown"]);

    // A sidecar gone by then: an error, not a hang or a panic.
    drop(good);
    let errors = found.shutdown(Duration::from_secs(10)).await;
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(matches!(errors[1], HookError::Dial { .. }), "{}", errors[1]);
}

#[tokio::test]
async fn hostile_answers_are_errors_or_refusals_not_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut failing = Script::new(&["v1alpha3"], &[ON_DEFINE_DOMAIN]);
    failing.on_define_domain = std::sync::Arc::new(|_| Err("script exited 1".into()));
    let mut huge = Script::new(&["v1alpha3"], &[ON_DEFINE_DOMAIN]);
    huge.on_define_domain = std::sync::Arc::new(|_| Ok(vec![b' '; 5 << 20]));
    let mut binary = Script::new(&["v1alpha2"], &[ON_DEFINE_DOMAIN]);
    binary.on_define_domain = std::sync::Arc::new(|_| Ok(vec![0xff, 0xfe, b'<']));
    let sent = "<domain type=\"kvm\">\n\t<name>x</name>\n</domain>";
    let entity = Script::new(&["v1alpha1"], &[ON_DEFINE_DOMAIN]).on_define(|_| {
        "<!DOCTYPE d [<!ENTITY a \"aaaaaaaa\"><!ENTITY b \"&a;&a;&a;&a;\">]><domain>&b;</domain>"
            .into()
    });
    let renamed =
        Script::new(&["v1alpha1"], &[ON_DEFINE_DOMAIN]).on_define(|x| x.replace(">x<", ">y<"));
    let cases: [(&str, Script); 5] = [
        ("failing", failing),
        ("huge", huge),
        ("binary", binary),
        ("entity", entity),
        ("renamed", renamed),
    ];
    for (name, script) in cases {
        let case = d.join(name);
        let s = FakeSidecar::start_in(&case, "hook-sidecar-0", "s.sock", script);
        let found = hooks::collect(&case, 1, SHORT).await.unwrap();
        let socket = s.socket.display().to_string();
        match name {
            "failing" | "huge" | "binary" => {
                let err = found.on_define_domain(sent, b"{}").await.unwrap_err();
                assert!(matches!(err, HookError::Call { .. }), "{name}: {err}");
                let text = err.to_string();
                assert!(text.contains(&socket), "{name}: {text}");
                assert!(text.contains("OnDefineDomain"), "{name}: {text}");
            }
            _ => {
                // Transported fine; the compat diff refuses it with the element path.
                let answer = found.on_define_domain(sent, b"{}").await.unwrap();
                let refusal = qlauncher_libvirt_xml::hooks::diff_answer(sent, &answer).unwrap_err();
                let want = if name == "entity" {
                    "domain"
                } else {
                    "domain/name#text"
                };
                assert_eq!(refusal.path, want, "{name}: {refusal}");
            }
        }
    }
}

/// KubeVirt's `cloudinit` example hook over the wire: it sets `UserData` to `#cloud-config\n`
/// and keeps the rest; the launcher reads the answer as KubeVirt does.
#[tokio::test]
async fn the_cloudinit_example_hook_replaces_the_user_data() {
    use qlauncher::hooks::cloud_init::{CloudInitData, DataSource, NoCloudMetadata};
    let dir = tempfile::tempdir().unwrap();
    let mut s = Script::new(&["v1alpha3"], &[PRE_CLOUD_INIT_ISO]);
    s.pre_cloud_init_iso = std::sync::Arc::new(|_, data| {
        let mut v: serde_json::Value = serde_json::from_slice(data).map_err(|e| e.to_string())?;
        v["UserData"] = "#cloud-config\n".into();
        Ok((Vec::new(), serde_json::to_vec(&v).unwrap()))
    });
    let _s = FakeSidecar::start_in(dir.path(), "hook-sidecar-0", "shim-abcd.sock", s);
    let found = hooks::collect(dir.path(), 1, SHORT).await.unwrap();
    let sent = CloudInitData {
        data_source: DataSource::NoCloud,
        no_cloud_meta_data: Some(NoCloudMetadata {
            instance_id: "vm1.ns1".into(),
            ..Default::default()
        }),
        config_drive_meta_data: None,
        user_data: "#!/bin/sh\necho hi\n".into(),
        network_data: String::new(),
        devices_data: None,
        volume_name: "cloudinitdisk".into(),
    };
    let (legacy, data) = sent.hook_payloads().unwrap();
    let answer = found
        .pre_cloud_init_iso(&legacy, &data, b"{}")
        .await
        .unwrap()
        .expect("the sidecar serves PreCloudInitIso");
    let got = CloudInitData::from_answer(DataSource::NoCloud, &answer).unwrap();
    assert_eq!(got.user_data, "#cloud-config\n");
    assert_eq!(got.no_cloud_meta_data, sent.no_cloud_meta_data);
    assert_eq!(got.volume_name, "cloudinitdisk");
}

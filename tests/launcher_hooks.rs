//! The launcher program with KubeVirt's `--hook-sidecars`, as virt-launcher-monitor starts it in
//! a pod, against testkit's fake sidecar under `<root>/var/run/kubevirt-hooks/hook-sidecar-0/`:
//! - it collects the sidecar before it serves, the domain runs, and once QEMU is gone the
//!   v1alpha3 sidecar gets `Shutdown` exactly once;
//! - a sidecar whose `Info` fails stops the launcher, naming its socket, and no QEMU starts.
//!
//! Needs root (network namespaces) and the test guest (`scripts/build-guest`).

use std::time::Duration;

use qlauncher::hooks::{ON_DEFINE_DOMAIN, SHUTDOWN};
use qlauncher::sync::domain::{LifeCycle as L, StateChangeReason as R};
use testkit::guest::GuestImages;
use testkit::hook_sidecar::{FakeSidecar, Script};
use testkit::launcher::{sync, vmi, Pod};

const START: Duration = Duration::from_secs(90);

fn sidecar(pod: &Pod, script: Script) -> FakeSidecar {
    let dir = pod.root.join("var/run/kubevirt-hooks");
    FakeSidecar::start_in(&dir, "hook-sidecar-0", "shim.sock", script)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_launcher_collects_its_sidecars_and_calls_shutdown_once_qemu_is_gone() {
    let images = GuestImages::locate();
    let mut pod = Pod::new(&images.disk_qcow2, false);
    let fake = sidecar(
        &pod,
        Script::new(&["v1alpha3", "v1alpha2"], &[ON_DEFINE_DOMAIN, SHUTDOWN]),
    );
    let n = pod.start_launcher_with(&["--hook-sidecars", "1"]);
    let mut client = pod.client(n).await;
    assert_eq!(
        sync(&mut client, &vmi(&pod.uid)).await,
        (true, String::new())
    );
    pod.wait_event((L::Running, R::Unknown), START).await;
    let qemu = pod.wait_qemu(n, START).await;
    assert_eq!(fake.methods(), ["Info", "OnDefineDomain"]);
    assert!(
        pod.log(n)
            .contains("Collected all requested hook sidecar sockets"),
        "{}",
        pod.log(n)
    );

    // SAFETY: a signal to the QEMU this test's launcher started.
    assert_eq!(unsafe { libc::kill(qemu, libc::SIGKILL) }, 0);
    pod.wait_launcher(n, Duration::from_secs(60)).await;
    assert_eq!(fake.methods(), ["Info", "OnDefineDomain", "Shutdown"]);
    assert_eq!(pod.qemu_pids(), Vec::<i32>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_failing_info_stops_the_launcher_naming_its_socket() {
    let images = GuestImages::locate();
    let mut pod = Pod::new(&images.disk_qcow2, false);
    let mut script = Script::new(&["v1alpha3"], &[ON_DEFINE_DOMAIN]);
    script.info_error = Some("not ready".into());
    let _fake = sidecar(&pod, script);
    let n = pod.start_launcher_with(&["--hook-sidecars", "1"]);
    let status = pod.wait_launcher(n, Duration::from_secs(60)).await;
    let log = pod.log(n);
    assert_ne!(status.code(), Some(0), "log:\n{log}");
    assert!(
        log.contains("hook-sidecar-0/shim.sock") && log.contains("Info"),
        "log:\n{log}"
    );
    // The launcher's own step failed; no QEMU ever ran, and the log does not say one exited.
    assert!(
        log.contains("the launcher failed: collecting the hook sidecars")
            && !log.contains("QEMU exited"),
        "log:\n{log}"
    );
    assert_eq!(pod.qemu_pids(), Vec::<i32>::new());
}

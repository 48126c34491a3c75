//! The README's first command, `scripts/demo`, run as written (with this build of qlauncher): it
//! must exit 0 after showing the guest's lease, fetching the guest's HTTP reply through the pod IP
//! and stopping the VM gracefully, and leave no network namespace behind.
//!
//! Needs root and the test guest (the script builds it when missing).

use std::process::Command;

fn netns_list() -> String {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn demo_script_boots_the_guest_serves_http_and_stops_gracefully() {
    let repo = env!("CARGO_MANIFEST_DIR");
    let out = Command::new(format!("{repo}/scripts/demo"))
        .current_dir(repo)
        .env("QLAUNCHER_BIN", env!("CARGO_BIN_EXE_qlauncher"))
        .output()
        .expect("run scripts/demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    let pod = lines
        .iter()
        .find_map(|l| l.strip_prefix("== pod network: netns "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_else(|| panic!("no pod network line:\n{stdout}"))
        .to_string();
    for expected in [
        "QLG: boot ok",
        "QLG: lease eth0 ip=10.0.2.2/24 router=10.0.2.1 dns=10.96.0.10 \
         search=default.svc.cluster.local,svc.cluster.local,cluster.local mtu=1450 \
         hostname=demo domain=default.svc.cluster.local",
        "qlg-http-ok",
        "QLG: poweroff",
        "qlauncher exited with status 0",
    ] {
        assert!(
            lines.contains(&expected),
            "no line {expected:?} in:\n{stdout}"
        );
    }
    assert!(
        !netns_list().contains(&pod),
        "{pod} left behind:\n{}",
        netns_list()
    );
}

//! Fault injection and privilege boundaries through the orchestrator: the real launcher
//! (`qlauncher launcher` with virt-launcher's flags) in a pod network namespace, driven over
//! `launcher-sock` as virt-handler does, with a notify server on `domain-notify-pipe.sock`.
//!
//! - QEMU killed with SIGKILL mid-run: the domain goes Shutoff with reason Crashed (libvirt's
//!   `VIR_DOMAIN_SHUTOFF_CRASHED`) in a MODIFIED notification, then the final delete
//!   notification; the launcher exits 1 and logs why.
//! - The launcher killed with SIGKILL mid-sync, then after a completed sync, each time restarted
//!   on the same directories: the next sync succeeds with one QEMU (the running one adopted), the
//!   overlay kept (same inode, same header), the nftables ruleset, links, addresses and routes
//!   exactly as after the first setup, and the adopted domain still paused, resumed and shut down.
//! - KubeVirt's default non-root pod (the launcher as 107 with `--run-as-nonroot`): QEMU runs as
//!   107:107 with no capabilities and only the pod's fsGroup as supplementary group,
//!   holds no descriptor of the launcher (gRPC, notify, netlink, logs), only its own sockets, the
//!   tap and its images; its sockets (QMP, serial console, VNC, guest agent channel) are 107's,
//!   mode 0775 (umask 0002, as libvirt starts QEMU): not world-writable.
//! - KubeVirt's default pod at start: the launcher as uid 107 (groups [107], no capabilities) over
//!   kubelet-made emptyDirs (root:107, 2777) serves, makes only what is missing and re-modes none.
//!
//! Needs root and the test guest (`scripts/build-guest`).

use testkit::guest;
use testkit::launcher;

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use guest::GuestImages;
use launcher::{get_domain, sync, vmi, Pod};
use qlauncher::sync::domain::{LifeCycle as L, StateChangeReason as R};

const START: Duration = Duration::from_secs(90);

fn ev(t: &str, s: L, r: R, deleted: bool) -> (String, L, R, bool) {
    (t.to_string(), s, r, deleted)
}

/// QEMU SIGKILLed while the guest runs: MODIFIED Shutoff/Crashed, the final delete notification,
/// the launcher exits 1 with the reason in its log, and no QEMU is left. Before the kill, the
/// QMP, serial console and VNC sockets of this root launcher's QEMU are mode 0775.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_killed_mid_run_reports_crashed_and_the_launcher_fails() {
    let images = GuestImages::locate();
    let mut pod = Pod::new(&images.disk_qcow2, false);
    let n = pod.start_launcher();
    let mut client = pod.client(n).await;
    assert_eq!(
        sync(&mut client, &vmi(&pod.uid)).await,
        (true, String::new())
    );
    pod.wait_event((L::Running, R::Unknown), START).await;
    let qemu = pod.wait_qemu(n, START).await;
    // A root launcher's QEMU binds its sockets with umask 0002 too: not world-writable.
    let vmi_dir = pod.private().join(&pod.uid);
    for socket in [
        pod.qmp_socket(),
        vmi_dir.join("virt-serial0"),
        vmi_dir.join("virt-vnc"),
    ] {
        let mode = std::fs::metadata(&socket)
            .expect("socket")
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(mode, 0o775, "{}", socket.display());
    }

    // SAFETY: a signal to the QEMU this test's launcher started.
    assert_eq!(unsafe { libc::kill(qemu, libc::SIGKILL) }, 0);
    let status = pod.wait_launcher(n, Duration::from_secs(60)).await;
    let log = pod.log(n);
    assert_eq!(status.code(), Some(1), "log:\n{log}");
    let failed = log
        .lines()
        .find(|l| l.contains("virt-launcher failed"))
        .unwrap_or_else(|| panic!("no failure line in the log:\n{log}"));
    assert!(
        failed.contains("QEMU exited without a shutdown request"),
        "{failed}"
    );
    // Repeated MODIFIED events of one state only carry guest-agent data.
    let mut events = pod.events();
    events.dedup();
    assert_eq!(
        events,
        vec![
            ev("ADDED", L::Paused, R::StartingUp, false),
            ev("MODIFIED", L::Running, R::Unknown, false),
            ev("MODIFIED", L::Shutoff, R::Crashed, false),
            ev("MODIFIED", L::NoState, R::NonExistent, true),
        ]
    );
    assert_eq!(pod.qemu_pids(), Vec::<i32>::new());
}

/// The pod network as the kernel has it: nftables ruleset, links (with their ifindex, so a
/// re-created link shows), IPv4 addresses and routes (the IPv6 link-local ones come and go with
/// duplicate address detection; the pod has no IPv6 address).
fn network_state(pod: &Pod) -> String {
    let ns = &pod.net.pod;
    // What changes by itself is left out: bridge timers, DAD flags, the rule counters (`nft -s`,
    // stateless), and what follows QEMU attaching the tap (carrier, queue flags, port state).
    let volatile = |text: String| -> String {
        text.lines()
            .map(|l| {
                let words: Vec<&str> = l.split_whitespace().collect();
                let mut out = Vec::new();
                let mut i = 0;
                while i < words.len() {
                    let w = words[i];
                    // Timers; the tap's queue flags and bridge port state follow QEMU
                    // attaching it.
                    if w.ends_with("_timer") || w == "pi" || w == "vnet_hdr" {
                        i += 2;
                        continue;
                    }
                    if w == "bridge_slave" && words.get(i + 1) == Some(&"state") {
                        out.push(w.to_string());
                        i += 3;
                        continue;
                    }
                    if !["tentative", "NO-CARRIER", "linkdown"].contains(&w) {
                        out.push(w.replace("NO-CARRIER,", "").replace(",LOWER_UP", ""));
                    }
                    i += 1;
                }
                out.join(" ")
                    .replace("state DOWN", "state X")
                    .replace("state UNKNOWN", "state X")
                    .replace("state UP", "state X")
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "{}\n--\n{}\n--\n{}\n--\n{}",
        ns.sh(&["nft", "-s", "list", "ruleset"]),
        volatile(ns.ip(&["-d", "-o", "link", "show"])),
        volatile(ns.ip(&["-o", "-4", "addr", "show"])),
        volatile(ns.ip(&["-4", "route", "show", "table", "all"])),
    )
}

/// Asserts two network states are equal, showing the differing lines.
fn assert_same_network(got: &str, want: &str, when: &str) {
    let diff: Vec<String> = got
        .lines()
        .zip(want.lines())
        .filter(|(g, w)| g != w)
        .map(|(g, w)| format!("now:    {g}\nbefore: {w}"))
        .collect();
    assert!(
        diff.is_empty() && got.lines().count() == want.lines().count(),
        "{when}: network changed:\n{}\n(now {} lines, before {})",
        diff.join("\n"),
        got.lines().count(),
        want.lines().count()
    );
}

fn overlay_identity(path: &Path) -> (u64, Vec<u8>) {
    let meta = std::fs::metadata(path).expect("overlay");
    let data = std::fs::read(path).expect("overlay");
    (meta.ino(), data[..512].to_vec())
}

/// The launcher is SIGKILLed while a sync is starting QEMU, restarted on the same directories and
/// synced; then SIGKILLed again with the domain running, restarted and synced. Each recovery
/// leaves exactly one QEMU (after the second, the very same process, adopted), the overlay and the
/// network exactly as the first setup made them; the adopted domain is reported (ADDED Running),
/// pauses and resumes over gRPC, and is shut down by the launcher's stop path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn launcher_killed_mid_sync_restarts_without_a_second_qemu() {
    let images = GuestImages::locate();
    let mut pod = Pod::new(&images.disk_qcow2, false);
    let vmi = vmi(&pod.uid);

    // 1: killed while the sync is in flight, as soon as its QEMU exists.
    let n = pod.start_launcher();
    let client = pod.client(n).await;
    let in_flight = {
        let mut c = client.clone();
        let v = vmi.clone();
        tokio::spawn(async move { launcher::try_sync(&mut c, &v).await })
    };
    let first_qemu = pod.wait_qemu(n, START).await;
    pod.kill_launcher(n);
    let _ = in_flight.await;
    let net_first = network_state(&pod);
    let overlay_first = overlay_identity(&pod.overlay());
    assert_eq!(pod.qemu_pids(), vec![first_qemu]);

    // 2: restarted; the sync recovers.
    let n = pod.start_launcher();
    let mut client = pod.client(n).await;
    assert_eq!(sync(&mut client, &vmi).await, (true, String::new()));
    let qemu = pod.wait_qemu(n, START).await;
    let domain = get_domain(&mut client).await.expect("a domain");
    assert_eq!(domain.status.status, L::Running, "{domain:?}");
    assert_same_network(&network_state(&pod), &net_first, "after the first recovery");
    assert_eq!(overlay_identity(&pod.overlay()), overlay_first);
    // The QEMU of the killed sync was adopted (it had passed `cont`) or replaced (still starting).
    let log = pod.log(n);
    let adopted = log.contains("adopted the running QEMU of an earlier launcher");
    let replaced = log.contains("found QEMU not adoptable, replacing it");
    assert!(adopted != replaced, "log:\n{log}");
    assert_eq!(adopted, qemu == first_qemu);
    println!(
        "HARDEN_RECOVERY mid-sync QEMU {}",
        if adopted { "adopted" } else { "replaced" }
    );
    // A resync changes nothing.
    assert_eq!(sync(&mut client, &vmi).await, (true, String::new()));
    assert_eq!(pod.qemu_pids(), vec![qemu]);

    // 3: killed with the domain running; the restarted launcher adopts that QEMU.
    pod.kill_launcher(n);
    pod.received.lock().unwrap().clear();
    let n = pod.start_launcher();
    let mut client = pod.client(n).await;
    assert_eq!(sync(&mut client, &vmi).await, (true, String::new()));
    assert_eq!(pod.qemu_pids(), vec![qemu], "log:\n{}", pod.log(n));
    assert_same_network(&network_state(&pod), &net_first, "after the adoption");
    assert_eq!(overlay_identity(&pod.overlay()), overlay_first);
    assert!(
        pod.log(n)
            .contains("adopted the running QEMU of an earlier launcher"),
        "{}",
        pod.log(n)
    );
    // The notification is sent after the sync answers: wait for it. Later MODIFIED events with
    // the same state only carry guest-agent data.
    pod.wait_event((L::Running, R::Unknown), Duration::from_secs(10))
        .await;
    let events = pod.events();
    assert_eq!(
        events.first(),
        Some(&ev("ADDED", L::Running, R::Unknown, false)),
        "{events:?}"
    );
    assert!(
        events[1..]
            .iter()
            .all(|e| *e == ev("MODIFIED", L::Running, R::Unknown, false)),
        "{events:?}"
    );

    // The adopted domain is the launcher's: pause, resume, and the stop path ends it.
    let request = || testkit::handler::vmi_only(&vmi);
    let answer = client.pause_virtual_machine(request()).await.unwrap();
    assert!(answer.into_inner().success);
    pod.wait_event((L::Paused, R::User), Duration::from_secs(10))
        .await;
    let answer = client.unpause_virtual_machine(request()).await.unwrap();
    assert!(answer.into_inner().success);
    // SAFETY: a signal to the launcher this test started.
    assert_eq!(unsafe { libc::kill(pod.launcher_pid(n), libc::SIGTERM) }, 0);
    pod.wait_launcher(n, Duration::from_secs(60)).await;
    assert_eq!(pod.qemu_pids(), Vec::<i32>::new());
    let events = pod.events();
    assert_eq!(
        events.last(),
        Some(&ev("MODIFIED", L::NoState, R::NonExistent, true)),
        "{events:?}"
    );
}

/// `/proc/<pid>/status` fields.
fn status_field(pid: i32, field: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The targets of a process's descriptors: fd number → link target.
fn fds(pid: i32) -> Vec<(i32, String)> {
    let mut out: Vec<(i32, String)> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let fd = e.file_name().to_string_lossy().parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            Some((fd, target.display().to_string()))
        })
        .collect();
    out.sort();
    out
}

/// Socket inode → bound path, from `/proc/<pid>/net/unix` (the process's network namespace).
fn unix_sockets(pid: i32) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            Some((
                cols.get(6)?.to_string(),
                cols.get(7).map(|s| s.to_string()).unwrap_or_default(),
            ))
        })
        .collect()
}

/// In KubeVirt's default non-root pod (the launcher as 107 over kubelet-made emptyDirs, with
/// `--run-as-nonroot`), QEMU runs as 107:107 without capabilities, holds only its own
/// descriptors, and its sockets have KubeVirt's owner and modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonroot_qemu_runs_as_107_with_only_its_own_fds_and_private_sockets() {
    let images = GuestImages::locate();
    let mut pod = Pod::new(&images.disk_qcow2, true);
    let n = pod.start_launcher();
    let mut client = pod.client(n).await;
    assert_eq!(
        sync(&mut client, &vmi(&pod.uid)).await,
        (true, String::new()),
        "{}",
        pod.log(n)
    );
    pod.wait_event((L::Running, R::Unknown), START).await;
    let qemu = pod.wait_qemu(n, START).await;
    let launcher = pod.launcher_pid(n);

    // Identity: the qemu user, no capabilities (the launcher's NET_BIND_SERVICE stays its own),
    // and only the pod's fsGroup as supplementary group: the compute container's, which a
    // process without CAP_SETGID cannot leave.
    assert_eq!(status_field(pod.launcher_pid(n), "Uid"), "107 107 107 107");
    assert_eq!(status_field(qemu, "Uid"), "107 107 107 107");
    assert_eq!(status_field(qemu, "Gid"), "107 107 107 107");
    assert_eq!(status_field(qemu, "Groups"), "107");
    for caps in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        assert_eq!(status_field(qemu, caps), "0000000000000000", "{caps}");
    }

    // Descriptors: nothing the launcher holds (gRPC and notify sockets, netlink, its log).
    let qemu_fds = fds(qemu);
    let launcher_targets: BTreeSet<String> = fds(launcher)
        .into_iter()
        .map(|(_, t)| t)
        // Anonymous inodes (eventfd, signalfd) carry no identity in their link; pipes and
        // sockets carry their inode.
        .filter(|t| t != "/dev/null" && !t.starts_with("anon_inode:"))
        .collect();
    let shared: Vec<&(i32, String)> = qemu_fds
        .iter()
        .filter(|(_, t)| launcher_targets.contains(t))
        .collect();
    assert!(
        shared.is_empty(),
        "QEMU holds launcher descriptors {shared:?}\nQEMU: {qemu_fds:?}"
    );

    let private = pod.private();
    let vmi_dir = private.join(&pod.uid);
    let qemu_log = private.join("qlauncher/qemu.log");
    let sockets = unix_sockets(qemu);
    let mut socket_paths = BTreeSet::new();
    let mut files = BTreeSet::new();
    let mut other = Vec::new();
    for (fd, target) in &qemu_fds {
        if let Some(ino) = target
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'))
        {
            let path = sockets
                .iter()
                .find(|(i, _)| i == ino)
                .map(|(_, p)| p.clone())
                .unwrap_or_else(|| format!("non-unix socket {ino}"));
            socket_paths.insert(path);
        } else if target.starts_with('/') {
            files.insert(target.clone());
        } else {
            // pipe:[..], anon_inode:[eventfd] ...: QEMU's own (the launcher's would have shown
            // above as shared).
            other.push((*fd, target.clone()));
        }
    }
    let p = |p: PathBuf| p.display().to_string();
    assert_eq!(
        qemu_fds[..3]
            .iter()
            .map(|(_, t)| t.clone())
            .collect::<Vec<_>>(),
        vec!["/dev/null".to_string(), p(qemu_log.clone()), p(qemu_log)]
    );
    assert_eq!(
        socket_paths,
        BTreeSet::from([
            p(pod.qmp_socket()),
            p(vmi_dir.join("virt-serial0")),
            p(vmi_dir.join("virt-vnc")),
            p(vmi_dir.join("org.qemu.guest_agent.0")),
        ]),
        "QEMU fds: {qemu_fds:?}"
    );
    let ephemeral = pod.root.join("var/run/kubevirt-ephemeral-disks");
    assert_eq!(
        files,
        BTreeSet::from([
            "/dev/null".to_string(),
            "/dev/net/tun".to_string(),
            p(private.join("qlauncher/qemu.log")),
            p(vmi_dir.join("virt-serial0-log")),
            p(pod.overlay()),
            p(images.disk_qcow2.clone()),
            p(ephemeral.join("cloud-init-data/default/hv/noCloud.iso")),
        ]),
        "QEMU fds: {qemu_fds:?}"
    );

    // Owners and modes: KubeVirt's directories, QEMU's sockets 107's and not world-writable.
    let owner_mode = |path: &Path| {
        let m =
            std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        (m.uid(), m.gid(), m.permissions().mode() & 0o7777)
    };
    // Made inside the setgid emptyDir: the bit is inherited (as KubeVirt's MkdirAll keeps it).
    assert_eq!(owner_mode(&vmi_dir), (107, 107, 0o2755));
    assert_eq!(owner_mode(&private.join("qlauncher")), (107, 107, 0o750));
    for socket in [
        pod.qmp_socket(),
        vmi_dir.join("virt-serial0"),
        vmi_dir.join("virt-vnc"),
        vmi_dir.join("org.qemu.guest_agent.0"),
    ] {
        assert_eq!(
            owner_mode(&socket),
            (107, 107, 0o775),
            "{}",
            socket.display()
        );
    }
    assert_eq!(owner_mode(&pod.overlay()).0, 107);
}

/// KubeVirt's default (non-root) pod at start: the launcher as uid 107 with groups [107] and no
/// capabilities, over the compute container's emptyDirs as the kubelet makes them (root:107,
/// 2777). It serves `launcher-sock`, makes only what is missing (107's, with KubeVirt's modes),
/// leaves every emptyDir's owner and mode as it was, and exits 0 on SIGTERM before any domain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonroot_launcher_starts_over_kubelet_emptydirs() {
    use testkit::kubelet;
    let tmp = tempfile::Builder::new().prefix("qlk").tempdir().unwrap();
    let root = tmp.path();
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let empty_dirs = kubelet::compute_empty_dirs(root);
    let share = root.join("var/run/kubevirt");
    let private = root.join("var/run/kubevirt-private");
    let ephemeral = root.join("var/run/kubevirt-ephemeral-disks");
    let uid = "5a0c1b2a-7bbc-4d1e-9a7b-5e6f7a8b9c0e";
    let log_path = root.join("launcher.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let p = |p: PathBuf| p.display().to_string();
    let mut launcher = testkit::process::ChildGuard::spawn(
        std::process::Command::new("setpriv")
            .args(&kubelet::compute_user_argv()[1..])
            .arg(testkit::qlauncher_bin())
            .arg("launcher")
            .args([
                "--qemu-timeout",
                "240s",
                "--name",
                "hv",
                "--namespace",
                "default",
            ])
            .args(["--uid", uid, "--run-as-nonroot", "--allow-emulation"])
            .args(["--kubevirt-share-dir", &p(share.clone())])
            .args(["--ephemeral-disk-dir", &p(ephemeral.clone())])
            .args(["--container-disk-dir", &p(share.join("container-disks"))])
            .args(["--hotplug-disk-dir", &p(share.join("hotplug-disks"))])
            .args(["--private-dir", &p(private.clone())])
            .envs(kubelet::compute_user_env(root))
            .env("QLAUNCHER_ROOT", root)
            .env("QLAUNCHER_EMULATION", "on")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log),
    );
    let launcher_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let mut client = testkit::handler::connect(
        &share.join("sockets/launcher-sock"),
        Duration::from_secs(60),
        launcher_log,
    )
    .await;
    assert!(get_domain(&mut client).await.is_none());

    let owner_mode = |path: &Path| {
        let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        (m.uid(), m.gid(), m.permissions().mode() & 0o7777)
    };
    for d in &empty_dirs {
        assert_eq!(owner_mode(d), (0, 107, 0o2777), "{}", d.display());
    }
    // Made by the launcher inside setgid emptyDirs: 107's; `MkdirAll` keeps the inherited
    // setgid bit, `InitializeDisksDirectories`' chmod clears it.
    assert_eq!(owner_mode(&private.join(uid)), (107, 107, 0o2755));
    for sub in ["vm-disks", "secret-disks", "downwardmetrics-channel"] {
        assert_eq!(owner_mode(&private.join(sub)), (107, 107, 0o750), "{sub}");
    }
    for sub in ["cloud-init-data", "disk-data"] {
        assert_eq!(
            owner_mode(&ephemeral.join(sub)),
            (107, 107, 0o2755),
            "{sub}"
        );
    }

    let child = launcher.0.as_mut().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no exit; log:\n{}",
            launcher_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status}; log:\n{}", launcher_log());
}

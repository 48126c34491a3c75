//! virt-probe and virt-freezer against a running launcher and the test guest with Debian's real
//! `qemu-guest-agent` (TCG), called as KubeVirt calls them (`kubevirt-launcher-image.md` §1.4,
//! §1.5, §3.3, §3.4); one boot:
//! - before any domain: virt-freezer exits 0 (no guest agent), the ping probe fails (1);
//! - flags: unknown flags exit 2, a missing mode or name exits 1, an unreachable socket exits 1;
//! - the guest-agent-ping probe passes once the agent answers;
//! - exec probes: the guest command's stdout and exit code become the probe's, a command the
//!   agent cannot run exits 255;
//! - virt-freezer (on its fixed `/run/kubevirt/sockets/launcher-sock`, given to it through a
//!   mount namespace of its own) freezes the guest's file systems and thaws them.
//!
//! `QLAUNCHER_COMPANIONS_DIR=<dir>` runs the programs found there instead of this build's (e.g.
//! the image's static ones from scripts/build-companions).
//!
//! The launcher runs in-process in a private network namespace of the test thread. Needs root and
//! the test guest (`scripts/build-guest`).

use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};
use testkit::guest::{self, GuestImages};
use testkit::handler::{self, Client};
use testkit::in_process::{InProcess, LauncherRoot};

fn vmi(uid: &str) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "probed", "namespace": "default", "uid": uid},
        "spec": {
            "domain": {
                "resources": {"requests": {"memory": "256Mi"}},
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

/// Runs a command off the runtime's threads (the launcher serves on them).
async fn output(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("spawn"))
        .await
        .unwrap()
}

/// The program to run: this build's, or the one in `$QLAUNCHER_COMPANIONS_DIR` when set (e.g.
/// scripts/build-companions' static ones, to check and measure what the image gets).
fn program(built: &str, name: &str) -> PathBuf {
    match std::env::var_os("QLAUNCHER_COMPANIONS_DIR") {
        Some(dir) => Path::new(&dir).join(name),
        None => PathBuf::from(built),
    }
}

fn probe(socket: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(program(env!("CARGO_BIN_EXE_virt-probe"), "virt-probe"));
    cmd.arg("--socket").arg(socket).args(args);
    cmd
}

/// virt-freezer with `sockets` mounted at `/run/kubevirt/sockets` in a mount namespace of its own
/// (a tmpfs over `/run` there), as the compute container's `/var/run/kubevirt/sockets` emptyDir
/// appears through `/var/run -> ../run`.
fn freezer(sockets: &Path, args: &[&str]) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(program(env!("CARGO_BIN_EXE_virt-freezer"), "virt-freezer"));
    cmd.args(args);
    let sockets = sockets.to_path_buf();
    // SAFETY: only syscalls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            use nix::mount::{mount, MsFlags};
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )?;
            mount(
                Some("tmpfs"),
                "/run",
                Some("tmpfs"),
                MsFlags::empty(),
                Some("mode=0755"),
            )?;
            nix::unistd::mkdir(
                "/run/kubevirt",
                nix::sys::stat::Mode::from_bits_truncate(0o755),
            )?;
            nix::unistd::mkdir(
                "/run/kubevirt/sockets",
                nix::sys::stat::Mode::from_bits_truncate(0o755),
            )?;
            mount(
                Some(sockets.as_path()),
                "/run/kubevirt/sockets",
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )?;
            Ok(())
        })
    };
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn freeze_status(client: &mut Client) -> Value {
    let answer = client
        .get_guest_info(cmd::EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    let info: Value = serde_json::from_str(&answer.guest_info_response).unwrap();
    info["fsFreezeStatus"].clone()
}

#[test]
fn virt_probe_and_virt_freezer_get_kubevirts_answers_from_a_real_guest() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
    testkit::in_process::runtime().block_on(scenario());
}

async fn scenario() {
    let images = GuestImages::locate();
    let uid = format!("5f0c1a2e-0000-4000-8026-{:012}", std::process::id());
    let root = LauncherRoot::new(&images.disk_qcow2, &uid);
    let private = root.private.clone();
    let sockets: PathBuf = root.share_dir().join("sockets");
    let launcher = InProcess::start(root.config.clone(), &root.share_dir()).await;
    let mut client = launcher.client.clone();
    let socket = sockets.join("launcher-sock");
    assert!(socket.exists(), "no {}", socket.display());
    let vmi = vmi(&uid);
    let domain = "default_probed";

    // Flags and connection failures.
    let out = output(probe(&socket, &["--bogus"])).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(text(&out.stderr).contains("unknown flag: --bogus"));
    let out = output(probe(
        Path::new("/nonexistent/launcher-sock"),
        &["--guestAgentPing"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        output(freezer(
            &sockets,
            &["--name", "probed", "--namespace", "default"]
        ))
        .await
        .status
        .code(),
        Some(1)
    );
    assert_eq!(
        output(freezer(&sockets, &["--freeze", "--name", "probed"]))
            .await
            .status
            .code(),
        Some(1)
    );
    assert_eq!(
        output(freezer(&sockets, &["--freeze", "-x"]))
            .await
            .status
            .code(),
        Some(2)
    );

    // No domain yet: no guest agent, so the hooks pass; the ping probe fails.
    let out = output(freezer(
        &sockets,
        &["--freeze", "--name", "probed", "--namespace", "default"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text(&out.stderr).contains("No guest agent, exiting"),
        "{out:?}"
    );
    let out = output(probe(
        &socket,
        &[
            "--domainName",
            domain,
            "--timeoutSeconds",
            "1",
            "--guestAgentPing",
        ],
    ))
    .await;
    assert_eq!(out.status.code(), Some(1), "{out:?}");

    let answer = client
        .sync_virtual_machine(handler::vmi_only(&vmi))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.success, "{}", answer.message);
    let serial = private.join(&uid).join("virt-serial0-log");
    guest::wait_log_marker(&serial, "QLG: agent ready", guest::BOOT_TIMEOUT).await;

    // The guest-agent-ping readiness probe passes once the launcher reaches the agent.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = output(probe(
            &socket,
            &[
                "--domainName",
                domain,
                "--timeoutSeconds",
                "5",
                "--guestAgentPing",
            ],
        ))
        .await;
        if out.status.code() == Some(0) {
            assert!(out.stdout.is_empty());
            break;
        }
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(
            Instant::now() < deadline,
            "ping probe never passed: {out:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // Exec probes: stdout (with a newline) and the exit code of the guest command.
    let out = output(probe(
        &socket,
        &[
            "--domainName",
            domain,
            "--timeoutSeconds",
            "20",
            "--command",
            "/bin/sh",
            "--",
            "-c",
            "echo ready; exit 3",
        ],
    ))
    .await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(text(&out.stdout).starts_with("ready\n"), "{out:?}");
    assert!(text(&out.stdout).ends_with('\n'));
    let out = output(probe(
        &socket,
        &[
            "--domainName",
            domain,
            "--timeoutSeconds",
            "20",
            "--command",
            "/bin/true",
        ],
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    // A command the agent cannot start: a gRPC error, exit -1 (255).
    let out = output(probe(
        &socket,
        &[
            "--domainName",
            domain,
            "--timeoutSeconds",
            "20",
            "--command",
            "/no/such/program",
        ],
    ))
    .await;
    assert_eq!(out.status.code(), Some(255), "{out:?}");

    // Velero's hooks: freeze, then thaw.
    let out = output(freezer(
        &sockets,
        &["--freeze", "--name", "probed", "--namespace", "default"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text(&out.stderr).contains("Operation completed successfully"),
        "{out:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while freeze_status(&mut client).await != "frozen" {
        assert!(
            Instant::now() < deadline,
            "not frozen after virt-freezer --freeze"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let out = output(freezer(
        &sockets,
        &["--unfreeze", "--name", "probed", "--namespace", "default"],
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while freeze_status(&mut client).await != "thawed" {
        assert!(
            Instant::now() < deadline,
            "not thawed after virt-freezer --unfreeze"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The probes still work on the thawed guest.
    let out = output(probe(
        &socket,
        &[
            "--domainName",
            domain,
            "--timeoutSeconds",
            "5",
            "--guestAgentPing",
        ],
    ))
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    drop(launcher);
}

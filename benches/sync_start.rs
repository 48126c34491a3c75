//! Start latency of SyncVMI: from `SyncVirtualMachine` received to QEMU running (`cont`
//! acknowledged), split into storage, network, conversion and QEMU start, beside KubeVirt's
//! published figure (1.39 s from the launcher ready to the domain started: 1.20 s to "defined",
//! then 0.19 s to "started"; KubeVirt's "defined" covers storage, network, conversion and the
//! libvirt define, so it compares with qlauncher's storage + network + conversion).
//!
//! Each run: a fresh network namespace (a thread that unshares it, with `eth0` one end of a veth
//! pair), a fresh launcher root, a VMI with the test guest as containerDisk, a cloud-init NoCloud
//! disk and a masquerade NIC, synced through the command server; then QEMU is killed. QEMU runs
//! under TCG. Needs root and the test guest (`scripts/build-guest`).
//!
//! `cargo bench --bench sync_start` (release), or `cargo bench --profile dev --bench sync_start`
//! to reuse the debug build; `QLAUNCHER_BENCH_RUNS` sets the number of runs (default 5).

use qlauncher::sync::guest::info::StartTimings;
use qlauncher::sync::rpc::proto::cmd::v1::cmd_client::CmdClient;
use qlauncher::sync::rpc::server::{CmdServer, CmdSocketPaths};
use qlauncher::sync::rpc::uds;
use qlauncher::sync::{SyncConfig, SyncVmi};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// KubeVirt's published start figures (seconds): ready -> defined, defined -> started.
const KUBEVIRT_DEFINED: f64 = 1.20;
const KUBEVIRT_STARTED: f64 = 0.19;

fn vmi(uid: &str) -> serde_json::Value {
    testkit::launcher::guest_vmi("bench", uid)
}

/// One start in a fresh network namespace; returns SyncVMI's split and the client-side latency.
fn one_run(disk: &Path, n: usize) -> Result<(StartTimings, Duration), String> {
    std::thread::spawn({
        let disk = disk.to_path_buf();
        move || {
            testkit::netns::unshare_pod_eth0("10.244.0.9/24", None)?;
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?
                .block_on(start(&disk, n))
        }
    })
    .join()
    .map_err(|_| "run panicked".to_string())?
}

async fn start(disk: &Path, n: usize) -> Result<(StartTimings, Duration), String> {
    let root = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut config = SyncConfig::under_root(root.path());
    let resolv = root.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 10.96.0.10\n").map_err(|e| e.to_string())?;
    config.resolv_conf = resolv;
    let disks = PathBuf::from(&config.paths.container_disks);
    std::fs::create_dir_all(&disks).map_err(|e| e.to_string())?;
    std::os::unix::fs::symlink(disk, disks.join("disk_0.img")).map_err(|e| e.to_string())?;
    let manager_private = config.paths.private_dir.clone();
    let manager = Arc::new(SyncVmi::new(config, None));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let paths = CmdSocketPaths::in_share_dir(&root.path().join("var/run/kubevirt"));
    let server = CmdServer::start(manager.clone(), paths.clone(), async move {
        let _ = stopped.await;
    })
    .await
    .map_err(|e| e.to_string())?;
    server.mark_ready().map_err(|e| e.to_string())?;
    let channel = uds::connect(&paths.ready, Duration::from_secs(5))
        .await
        .map_err(|e| e.to_string())?;
    let mut client = CmdClient::new(channel);
    let uid = format!("5f0c1a2e-0000-4000-8000-{:06}{:06}", std::process::id(), n);
    // The per-VMI directory (serial console, agent channel) the launcher creates at start.
    std::fs::create_dir_all(PathBuf::from(&manager_private).join(&uid))
        .map_err(|e| e.to_string())?;
    let request = testkit::handler::vmi_only(&vmi(&uid));
    let t0 = Instant::now();
    let answer = client.sync_virtual_machine(request).await;
    let wall = t0.elapsed();
    let timings = manager.start_timings();
    if let Some(pid) = manager.qemu_pid() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        // Let QEMU go before the namespace's thread ends.
        for _ in 0..100 {
            if !Path::new(&format!("/proc/{pid}")).exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let _ = stop.send(());
    let answer = answer.map_err(|e| e.to_string())?.into_inner();
    if !answer.success {
        return Err(answer.message);
    }
    Ok((timings.ok_or("no timings recorded")?, wall))
}

/// A report line: step, (median, min, max) in ms, KubeVirt's figure in s.
type Row<'a> = (&'a str, (f64, f64, f64), Option<f64>);

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let mid = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    (mid, v[0], v[v.len() - 1])
}

fn main() {
    let dir = std::env::var_os("QLAUNCHER_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/qlauncher/guest"));
    let disk = dir.join("disk.qcow2");
    if !disk.is_file() {
        eprintln!(
            "sync_start: {} missing: run scripts/build-guest; skipped",
            disk.display()
        );
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("sync_start: needs root (network namespaces); skipped");
        return;
    }
    let runs: usize = std::env::var("QLAUNCHER_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1);
    let mut all = Vec::new();
    for n in 0..runs {
        match one_run(&disk, n) {
            Ok(r) => all.push(r),
            Err(e) => {
                eprintln!("sync_start: run {n} failed: {e}");
                std::process::exit(1);
            }
        }
    }
    let ms = |f: &dyn Fn(&(StartTimings, Duration)) -> Duration| {
        median(all.iter().map(|r| f(r).as_secs_f64() * 1000.0).collect())
    };
    let rows: [Row; 7] = [
        ("storage", ms(&|r| r.0.storage), None),
        ("network", ms(&|r| r.0.network), None),
        ("conversion", ms(&|r| r.0.convert), None),
        (
            "storage+network+conversion (KubeVirt: ready -> defined)",
            ms(&|r| r.0.storage + r.0.network + r.0.convert),
            Some(KUBEVIRT_DEFINED),
        ),
        (
            "QEMU start to cont acknowledged (KubeVirt: defined -> started)",
            ms(&|r| r.0.qemu),
            Some(KUBEVIRT_STARTED),
        ),
        (
            "total (KubeVirt: ready -> started)",
            ms(&|r| r.0.total),
            Some(KUBEVIRT_DEFINED + KUBEVIRT_STARTED),
        ),
        (
            "client-side SyncVirtualMachine round trip",
            ms(&|r| r.1),
            None,
        ),
    ];
    println!("SyncVMI start latency, {runs} runs, TCG (median [min..max], ms)");
    for (name, (mid, lo, hi), kubevirt) in rows {
        match kubevirt {
            Some(k) => println!(
                "  {name:<66} {mid:8.1} [{lo:.1}..{hi:.1}]   KubeVirt {:.0} ms   ratio {:.2}",
                k * 1000.0,
                k * 1000.0 / mid.max(0.001)
            ),
            None => println!("  {name:<66} {mid:8.1} [{lo:.1}..{hi:.1}]"),
        }
    }
}

//! Live-migration benchmark driver: one migration of a booted test guest between two real
//! qemu-system-x86_64 processes (TCG) started from qlauncher's argv for the same VMI (kernel
//! boot, no NIC, `--mem` MiB), driven by qlauncher's source and target halves
//! (`src/sync/migration`). Prints one JSON line per run with QEMU's own figures from the
//! source's `query-migrate` at completion (`total_ms`, `downtime_ms`, `setup_ms`) and the wall
//! time from the target's start to the guest running there (`wall_ms`).
//!
//! Usage: `migration [--mem MIB] [--mode precopy|multifd] [--runs N]`; `migration --mem MIB
//! --libvirt-xml ROOT` prints the libvirt domain XML qlauncher exports for the same VMI with its
//! files under ROOT instead (what the libvirt side of the benchmark runs). `scripts/bench-migration`
//! builds it (`cargo test --bench migration --no-run`), runs it interleaved with two libvirt
//! daemons doing the same migration, and writes the medians. Needs the test guest
//! (`scripts/build-guest`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use qlauncher::cmdline::{convert, render, FactsFile};
use qlauncher::qmp::QmpClient;
use qlauncher::sync::migration::source::{resolved_machine, run_source, SourcePlan};
use qlauncher::sync::migration::target::{incoming_argv, TargetSession, TargetSockets};
use qlauncher::sync::migration::MigrationOptions;
use qlauncher::vmi::{DefaultsConfig, Vmi};
use testkit::guest::{Console, GuestImages, BOOT_TIMEOUT};
use testkit::migration::running_domain;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn vmi(mem: u64) -> Vmi {
    let v = serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "migbench", "namespace": "default",
                     "uid": "6b6b6b6b-0000-4000-8000-00000000b019"},
        "spec": {"domain": {
            "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0",
                "container": {"image": "local/qlg-kernel", "kernelPath": "/vmlinuz",
                              "initrdPath": "/initrd.img"}}},
            "memory": {"guest": format!("{mem}Mi")},
            "resources": {"requests": {"memory": format!("{mem}Mi")}},
            "devices": {"autoattachPodInterface": false}
        }}
    });
    let mut vmi = Vmi::from_json_or_yaml(&v.to_string()).unwrap();
    vmi.apply_defaults(&DefaultsConfig::for_manifest(&vmi, "migbench"));
    vmi
}

/// The libvirt domain XML qlauncher exports for the VMI (compat/libvirt-xml, adapted to the
/// installed libvirt 9.0), every path under `root`, its files in place.
fn libvirt_xml(vmi: &Vmi, root: &Path, guest: &GuestImages) -> String {
    let ctx = testkit::cmdline::acceptance_context(vmi, &FactsFile::default(), root, "qlmb");
    let plan = convert(vmi, &ctx).unwrap();
    pod(vmi, root, guest);
    let xml =
        qlauncher_libvirt_xml::to_xml(&qlauncher_libvirt_xml::export(vmi, &ctx, &plan).unwrap())
            .unwrap();
    qlauncher_libvirt_xml::libvirt::for_libvirt9(&xml)
}

/// qlauncher's argv for the VMI with every path under `root` (its "pod"), the kernel pair in
/// place; returns (argv, QMP socket, serial socket).
fn pod(vmi: &Vmi, root: &Path, guest: &GuestImages) -> (Vec<String>, String, String) {
    let ctx = testkit::cmdline::acceptance_context(vmi, &FactsFile::default(), root, "qlmb");
    let plan = convert(vmi, &ctx).unwrap();
    testkit::cmdline::create_pod_dirs(root);
    assert!(plan.kernel_boot.is_some(), "the bench VMI boots a kernel");
    testkit::cmdline::place_kernel_and_vnc(&plan, guest);
    let argv = render::argv(&plan);
    let serial = argv
        .windows(2)
        .filter(|w| w[0] == "-chardev")
        .find(|w| w[1].contains("id=charserial0"))
        .and_then(|w| {
            w[1].split(',')
                .find_map(|p| p.strip_prefix("path=").map(str::to_owned))
        })
        .expect("a serial console");
    std::fs::create_dir_all(Path::new(&serial).parent().unwrap()).unwrap();
    (argv, root.join("qmp.sock").display().to_string(), serial)
}

/// Connects to a QEMU's QMP socket once it exists (60 s), panicking with QEMU's log otherwise.
async fn qmp(path: &str, log: &Path) -> QmpClient {
    for _ in 0..600 {
        if let Ok(c) = QmpClient::connect(Path::new(path), Duration::from_secs(60)).await {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no QMP monitor at {path}:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

fn spawn(argv: &[String], log: &Path) -> Qemu {
    let f = std::fs::File::create(log).unwrap();
    Qemu(
        Command::new("qemu-system-x86_64")
            .args(argv)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .expect("qemu-system-x86_64"),
    )
}

async fn one(mem: u64, multifd: bool, guest: &GuestImages) -> serde_json::Value {
    let tmp = tempfile::Builder::new().prefix("qlmb").tempdir().unwrap();
    let vmi = vmi(mem);
    let (s_argv, s_mon, s_serial) = pod(&vmi, &tmp.path().join("src"), guest);
    let (t_argv, t_mon, _) = pod(&vmi, &tmp.path().join("dst"), guest);
    let _source = spawn(&s_argv, &tmp.path().join("src.log"));
    let s_qmp = qmp(&s_mon, &tmp.path().join("src.log")).await;
    let mut console = Console::connect(Path::new(&s_serial), Duration::from_secs(30)).unwrap();
    qlauncher::qmp::lifecycle::resume(&s_qmp).await.unwrap();
    console.wait_for_marker("boot ok", BOOT_TIMEOUT).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;

    let domain = running_domain(
        "6b6b6b6b-0000-4000-8000-00000000b019",
        "bench",
        resolved_machine(&s_qmp).await.unwrap(),
    );
    let t0 = Instant::now();
    let target_argv = incoming_argv(&t_argv, &domain).unwrap();
    let _target = spawn(&target_argv, &tmp.path().join("dst.log"));
    let t_qmp = qmp(&t_mon, &tmp.path().join("dst.log")).await;
    let control = tmp.path().join("control.sock");
    let sockets = TargetSockets {
        stream: tmp.path().join("m-49152-source.sock"),
        nbd: tmp.path().join("m-49153-source.sock"),
        ordered_stream: tmp.path().join("m-qemu-stream.sock"),
    };
    let listener = UnixListener::bind(&control).unwrap();
    let (tc, ts) = (t_qmp.clone(), sockets.clone());
    let target = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        let mut s = TargetSession::accept(conn, "6b6b6b6b-0000-4000-8000-00000000b019").await?;
        s.incoming(&tc, &ts).await?;
        s.finish(&tc).await
    });
    // virt-handler's defaults: unlimited bandwidth, 150 s timeouts; 8 channels with multifd.
    let options = if multifd {
        br#"{"Bandwidth":"0","ProgressTimeout":150,"CompletionTimeoutPerGiB":150,"ParallelMigrationThreads":8}"#.as_slice()
    } else {
        br#"{"Bandwidth":"0","ProgressTimeout":150,"CompletionTimeoutPerGiB":150}"#.as_slice()
    };
    let plan = SourcePlan {
        stream: sockets.stream.clone(),
        nbd: sockets.nbd.clone(),
        options: MigrationOptions::from_json(options).unwrap(),
        data_bytes: mem << 20,
    };
    let (_tx, abort) = watch::channel(false);
    let conn = UnixStream::connect(&control).await.unwrap();
    let end = run_source(conn, &s_qmp, domain, &plan, abort)
        .await
        .expect("migration");
    target.await.unwrap().expect("target");
    let wall = t0.elapsed();
    let info = s_qmp.execute("query-migrate", None).await.unwrap();
    serde_json::json!({
        "tool": "qlauncher",
        "mode": if multifd { "multifd" } else { "precopy" },
        "mem_mib": mem,
        "total_ms": end.total_ms,
        "downtime_ms": end.downtime_ms,
        "setup_ms": info["setup-time"],
        "transferred": info["ram"]["transferred"],
        "wall_ms": wall.as_millis() as u64,
    })
}

fn main() {
    let mut mem = 512;
    let mut multifd = false;
    let mut runs = 1;
    let mut xml_root = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--mem" => mem = args.next().and_then(|v| v.parse().ok()).expect("--mem MIB"),
            "--mode" => multifd = args.next().as_deref() == Some("multifd"),
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).expect("--runs N"),
            "--libvirt-xml" => xml_root = Some(args.next().expect("--libvirt-xml ROOT")),
            // cargo passes --bench when run through `cargo bench`.
            _ => {}
        }
    }
    let guest = match GuestImages::try_locate() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("skipping the migration benchmark: {e}");
            return;
        }
    };
    if let Some(root) = xml_root {
        print!("{}", libvirt_xml(&vmi(mem), Path::new(&root), &guest));
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for _ in 0..runs {
        let r = rt.block_on(one(mem, multifd, &guest));
        println!("{r}");
    }
}

//! Storage benchmark: native overlay and ISO creation against the tools KubeVirt runs
//! (`qemu-img create -f qcow2 -b ... -F ...`, `xorrisofs`, `genisoimage`), each run as a process,
//! printed as ratios in one run. `cargo bench --bench storage` (or `scripts/bench-storage`).
//! Optional argument: iterations (default 40).
//!
//! The native side includes what qlauncher does for real (staging, fsync of file and directory,
//! rename, chown); the tools are timed from spawn to exit, without an fsync.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use qlauncher::storage::{
    create_overlay, write_cloud_init_iso, write_config_volume_iso, ChainPolicy, CloudInitData,
    CloudInitSpec, ConfigVolumeKind, ConfigVolumeSpec, OverlaySpec, VmiIdentity,
};

fn main() {
    let iterations: u32 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(40);
    let dir = std::env::temp_dir().join(format!("qlauncher-bench-storage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let result = std::panic::catch_unwind(|| run(&dir, iterations));
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn tool_available(name: &str) -> bool {
    Command::new(name)
        .arg("--version")
        .output()
        .map(|o| o.status.success() || !o.stderr.is_empty())
        .unwrap_or(false)
}

fn time<F: FnMut(u32)>(iterations: u32, mut f: F) -> Duration {
    f(u32::MAX); // warm-up
    let start = Instant::now();
    for i in 0..iterations {
        f(i);
    }
    start.elapsed() / iterations
}

/// The median of some durations (the upper one of an even count).
fn median(mut runs: Vec<Duration>) -> Duration {
    runs.sort();
    runs.get(runs.len() / 2).copied().unwrap_or_default()
}

fn report(what: &str, native: Duration, tool: &str, other: Duration) {
    println!(
        "{what:<28} native {:>9.3} ms   {tool:<22} {:>9.3} ms   ratio {:>6.1}x",
        native.as_secs_f64() * 1e3,
        other.as_secs_f64() * 1e3,
        other.as_secs_f64() / native.as_secs_f64()
    );
}

fn run(dir: &Path, iterations: u32) {
    println!(
        "storage bench: {iterations} iterations each (overlays: interleaved, median; the rest: mean) in {}",
        dir.display()
    );
    let bases = dir.join("container-disks");
    std::fs::create_dir_all(&bases).unwrap();

    // Overlays over a raw and a qcow2 base.
    let raw = bases.join("disk_0.img");
    std::fs::File::create(&raw)
        .and_then(|f| f.set_len(1 << 30))
        .unwrap();
    let qcow = bases.join("disk_1.img");
    testkit::storage::run(
        "qemu-img",
        &["create", "-q", "-f", "qcow2", qcow.to_str().unwrap(), "1G"],
    );
    for (base, format) in [(&raw, "raw"), (&qcow, "qcow2")] {
        let ephemeral = dir.join(format!("ephemeral-{format}"));
        let tool_dir = dir.join(format!("qemu-img-{format}"));
        std::fs::create_dir_all(&tool_dir).unwrap();
        // Interleaved run by run (native, tool, native, ...) so that load changes hit both;
        // the medians are reported. Iteration u32::MAX is the warm-up of each.
        let (mut native_runs, mut tool_runs) = (Vec::new(), Vec::new());
        for i in std::iter::once(u32::MAX).chain(0..iterations) {
            let start = Instant::now();
            let mut spec = OverlaySpec::at_kubevirt_path(&format!("vol{i}"), base, &ephemeral);
            spec.policy = ChainPolicy {
                allowed_roots: vec![bases.clone()],
                max_depth: 8,
            };
            create_overlay(&spec).unwrap();
            let native = start.elapsed();
            // KubeVirt's launcher makes `disk-data/<volume>` before it runs qemu-img
            // (`ephemeral-disk.go`: `createVolumeDirectory`), so the tool's side pays that mkdir too.
            let out_dir = tool_dir.join(format!("vol{i}"));
            let out: PathBuf = out_dir.join("disk.qcow2");
            let start = Instant::now();
            std::fs::create_dir_all(&out_dir).unwrap();
            testkit::storage::run(
                "qemu-img",
                &[
                    "create",
                    "-q",
                    "-f",
                    "qcow2",
                    "-b",
                    base.to_str().unwrap(),
                    "-F",
                    format,
                    out.to_str().unwrap(),
                ],
            );
            let tool = start.elapsed();
            let _ = std::fs::remove_dir_all(&out_dir);
            if i != u32::MAX {
                native_runs.push(native);
                tool_runs.push(tool);
            }
        }
        let (native, tool) = (median(native_runs), median(tool_runs));
        report(
            &format!("overlay over {format} base"),
            native,
            "qemu-img create -b -F",
            tool,
        );
    }

    // cloud-init NoCloud ISO.
    let user_data = format!("#cloud-config\n{}", "runcmd:\n  - echo hello\n".repeat(40));
    let spec = CloudInitSpec {
        volume: "cloudinitdisk".into(),
        user_data: Some(user_data[..user_data.len().min(2000)].to_string()),
        network_data: Some("version: 2\nethernets:\n  eth0:\n    dhcp4: true\n".into()),
        ..CloudInitSpec::default()
    };
    let vmi = VmiIdentity {
        name: "bench".into(),
        namespace: "default".into(),
        firmware_uuid: Some("5d307ca9-b3ef-428c-8861-06e72d69f223".into()),
        ..VmiIdentity::default()
    };
    let data = CloudInitData::resolve(&spec, &vmi, &dir.join("secret")).unwrap();
    let iso_dir = dir.join("cloud-init-data");
    let native = time(iterations, |_| {
        write_cloud_init_iso(&data, &iso_dir.join("noCloud.iso"), None).unwrap();
    });
    let staging = dir.join("cidata-staging");
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::write(staging.join("user-data"), &data.user_data).unwrap();
    std::fs::write(staging.join("meta-data"), &data.meta_data).unwrap();
    std::fs::write(staging.join("network-config"), &data.network_data).unwrap();
    let out = dir.join("tool.iso");
    for (tool, args) in [
        (
            "xorrisofs",
            vec![
                "-output",
                out.to_str().unwrap(),
                "-volid",
                "cidata",
                "-joliet",
                "-rock",
                "-partition_cyl_align",
                "on",
                staging.to_str().unwrap(),
            ],
        ),
        (
            "genisoimage",
            vec![
                "-quiet",
                "-output",
                out.to_str().unwrap(),
                "-volid",
                "cidata",
                "-joliet",
                "-rock",
                staging.to_str().unwrap(),
            ],
        ),
    ] {
        if !tool_available(tool) {
            println!("{tool} not installed: skipped");
            continue;
        }
        let quiet: Vec<&str> = if tool == "xorrisofs" {
            let mut a = vec!["-quiet"];
            a.extend(&args);
            a
        } else {
            args.clone()
        };
        let t = time(iterations, |_| {
            testkit::storage::run(tool, &quiet);
        });
        report("cloud-init NoCloud ISO", native, tool, t);
    }

    // A ConfigMap ISO with 20 keys.
    let source = dir.join("config-map/app");
    std::fs::create_dir_all(&source).unwrap();
    for k in 0..20 {
        std::fs::write(
            source.join(format!("key{k}")),
            format!("value {k}\n").repeat(50),
        )
        .unwrap();
    }
    let mut cm =
        ConfigVolumeSpec::at_kubevirt_paths("app", ConfigVolumeKind::ConfigMap, None, dir).unwrap();
    cm.owner = None;
    let native = time(iterations, |_| write_config_volume_iso(&cm).unwrap());
    let mut grafts: Vec<String> = (0..20)
        .map(|k| format!("key{k}={}", source.join(format!("key{k}")).display()))
        .collect();
    let mut args: Vec<String> = [
        "-quiet",
        "-output",
        out.to_str().unwrap(),
        "-follow-links",
        "-volid",
        "cfgdata",
        "-joliet",
        "-rock",
        "-graft-points",
        "-partition_cyl_align",
        "on",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.append(&mut grafts);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    if tool_available("xorrisofs") {
        let t = time(iterations, |_| {
            testkit::storage::run("xorrisofs", &args);
        });
        report("ConfigMap ISO (20 keys)", native, "xorrisofs", t);
    }
}

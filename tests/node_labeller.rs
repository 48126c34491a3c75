//! The node labeller (`qlauncher node-labeller`, the image's `node-labeller.sh`) on this machine:
//!
//! - against libvirt: KubeVirt's label rules ([`testkit::labels::node_labels`]) give the same
//!   labels, models and NUMA topology from qlauncher's files as from the files this host's
//!   libvirt 9.0 writes for the same QEMU, with TCG and with KVM, with and without a CR list of
//!   obsolete models;
//! - every row of the failure table of virt-handler's file parsing (a QEMU that does not start or
//!   stops answering, a failing QMP step, no CPU map, no `/dev/kvm`, unreadable sysfs, names that
//!   are not label names, an old cross-arch file) still gives files virt-handler starts with and
//!   labels the API server accepts, with a warning naming what was skipped;
//! - `node-labeller.sh` as the init container runs it (no arguments, the environment, the fixed
//!   directory) in a private mount namespace with a `/dev` of its own.

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use qlauncher::labeller::probe::{self, Accel, QemuProbe};
use qlauncher::labeller::{self, HostPaths, Options};
use qlauncher::qmp::commands::MachineInfo;
use serde_json::json;
use testkit::labels::{libvirt_files, node_labels, NodeLabels};
use testkit::qmp_script::{scripted, step};

const QEMU: &str = "/usr/bin/qemu-system-x86_64";
const LIBVIRT_CPU_MAP: &str = "/usr/share/libvirt/cpu_map";

fn options(out: &Path) -> Options {
    Options {
        out_dir: out.to_path_buf(),
        qemu: QEMU.into(),
        cpu_map: Some(LIBVIRT_CPU_MAP.into()),
        host: HostPaths::default(),
        hypervisor_device: String::new(),
        preferred_virttype: String::new(),
        prepare_device: false,
        virttype: Some("qemu".into()),
        timeout: Duration::from_secs(30),
    }
}

fn run(opts: &Options) -> labeller::Report {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(labeller::run(opts))
        .expect("the labeller writes its files")
}

/// The labels of `dir`, which must be ones virt-handler starts with and the API server takes.
fn accepted(dir: &Path) -> NodeLabels {
    let l = node_labels(dir, None).unwrap_or_else(|f| panic!("virt-handler panics: {}", f.0));
    assert!(l.invalid.is_empty(), "rejected labels: {:?}", l.invalid);
    assert!(!l.topology.is_empty(), "no NUMA cell");
    assert!(!l.host_cpu_model.is_empty());
    assert!(
        l.labels
            .keys()
            .any(|k| k.starts_with("cpu-vendor.node.kubevirt.io/")),
        "{:?}",
        l.labels
    );
    let supported = std::fs::read_to_string(dir.join(labeller::SUPPORTED_FEATURES)).unwrap();
    assert!(!supported.trim().is_empty());
    assert_eq!(
        std::fs::read(dir.join(labeller::CROSS_ARCH)).unwrap(),
        b"",
        "the cross-arch file is written empty"
    );
    l
}

fn has_warning(report: &labeller::Report, needle: &str) {
    assert!(
        report.warnings.iter().any(|w| w.contains(needle)),
        "no warning with {needle:?}: {:?}",
        report.warnings
    );
}

// --- against libvirt ----------------------------------------------------------------------------

fn same_as_libvirt(virttype: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let lv = tmp.path().join("libvirt");
    let ql = tmp.path().join("qlauncher");
    libvirt_files(&lv, tmp.path(), virttype);
    let out = Command::new(env!("CARGO_BIN_EXE_qlauncher"))
        .args([
            "node-labeller",
            "--virttype",
            virttype,
            "--cpu-map",
            LIBVIRT_CPU_MAP,
        ])
        .arg("--out")
        .arg(&ql)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("node-labeller: warning"), "{stderr}");
    let lv1 = node_labels(&lv, None).unwrap_or_else(|f| panic!("libvirt's own files: {}", f.0));
    let ql1 = accepted(&ql);
    assert_eq!(ql1.labels, lv1.labels, "{virttype}: labels");
    assert_eq!(
        ql1.models, lv1.models,
        "{virttype}: models and their usability"
    );
    assert_eq!(ql1.topology, lv1.topology, "{virttype}: NUMA topology");
    assert_eq!(ql1.host_cpu_model, lv1.host_cpu_model);
    // A CR list naming only the host model: every other model is labelled, and the host model is
    // marked obsolete on both sides.
    let cr = [lv1.host_cpu_model.as_str()];
    let lv2 = node_labels(&lv, Some(&cr)).unwrap();
    let ql2 = node_labels(&ql, Some(&cr)).unwrap();
    assert_eq!(
        ql2.labels, lv2.labels,
        "{virttype}: labels with obsoleteCPUModels={cr:?}"
    );
    assert!(ql2
        .labels
        .contains_key("node-labeller.kubevirt.io/obsolete-host-model"));
    let machines: BTreeSet<&String> = ql1
        .labels
        .keys()
        .filter(|k| k.starts_with("machine-type.node.kubevirt.io/"))
        .collect();
    assert!(machines.contains(&"machine-type.node.kubevirt.io/q35".to_string()));
    assert!(machines.len() > 10, "{machines:?}");
}

#[test]
fn tcg_labels_are_libvirts() {
    same_as_libvirt("qemu");
}

#[test]
fn kvm_labels_are_libvirts() {
    if !Path::new("/dev/kvm").exists() {
        eprintln!("SKIP: no /dev/kvm here");
        return;
    }
    same_as_libvirt("kvm");
}

// --- the failure table --------------------------------------------------------------------------

#[test]
fn a_qemu_that_does_not_start_still_gives_files_virt_handler_starts_with() {
    for (qemu, warning) in [
        ("/nonexistent/qemu-system-x86_64", "cannot start QEMU"),
        ("/bin/false", "no QMP monitor"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let mut opts = options(tmp.path());
        opts.qemu = qemu.into();
        let report = run(&opts);
        has_warning(&report, warning);
        let l = accepted(tmp.path());
        // Nothing about QEMU is known: no machine types, CPU models or features; the host-model
        // is the host's own CPU, decoded against the CPU map.
        assert!(
            !l.labels.keys().any(|k| k.starts_with("machine-type.")),
            "{qemu}"
        );
        assert!(l.models.is_empty(), "{qemu}");
        has_warning(&report, "host-model from the host's CPUID");
    }
}

#[test]
fn a_qemu_that_never_answers_is_killed_and_the_files_are_still_written() {
    let tmp = tempfile::tempdir().unwrap();
    let silent = tmp.path().join("silent-qemu");
    std::fs::write(&silent, "#!/bin/sh\nexec sleep 60\n").unwrap();
    std::fs::set_permissions(&silent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = tmp.path().join("out");
    let mut opts = options(&out);
    opts.qemu = silent;
    opts.timeout = Duration::from_secs(1);
    let report = run(&opts);
    has_warning(&report, "no QMP monitor");
    has_warning(&report, "did not quit; killed");
    accepted(&out);
}

#[test]
fn kvm_asked_for_but_qemu_running_tcg_gives_tcg_files() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (probed, warnings) = rt.block_on(async {
        let (client, _peer) = scripted(
            tmp.path(),
            vec![
                step("query-version", json!({"return": {"qemu": {"major": 7, "minor": 2, "micro": 0}, "package": ""}})),
                step("query-kvm", json!({"return": {"enabled": false, "present": true}})),
            ],
        )
        .await;
        let mut w = Vec::new();
        let p = probe::probe_monitor(&client, Accel::Kvm, &mut w).await;
        (p, w)
    });
    assert!(!probed.kvm);
    assert!(
        warnings.iter().any(|w| w.contains("KVM was asked for")),
        "{warnings:?}"
    );
    let out = tmp.path().join("out");
    let report = labeller::write_files(&options(&out), Accel::Kvm, &probed, warnings).unwrap();
    assert_eq!(report.virttype, "qemu");
    let domcaps = std::fs::read_to_string(out.join(labeller::DOMCAPABILITIES)).unwrap();
    assert!(domcaps.contains("<domain>qemu</domain>"), "{domcaps}");
    accepted(&out);
}

#[test]
fn failing_qmp_steps_are_skipped_with_warnings() {
    let tmp = tempfile::tempdir().unwrap();
    let err = json!({"error": {"class": "GenericError", "desc": "scripted failure"}});
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (probed, warnings) = rt.block_on(async {
        let (client, _peer) = scripted(
            tmp.path(),
            vec![
                step("query-version", json!({"return": {"qemu": {"major": 7, "minor": 2, "micro": 0}, "package": ""}})),
                step("query-kvm", err.clone()),
                step("qom-list-types", json!({"return": [{"name": "sev-guest"}]})),
                step("query-machines", err.clone()),
                step("query-cpu-definitions", json!({"return": [
                    {"name": "EPYC", "unavailable-features": ["sse4a"]},
                    {"name": "qemu64", "unavailable-features": []},
                    {"name": "Penryn"},
                    {"name": "host", "unavailable-features": []}
                ]})),
                // TCG (query-kvm failed): no SEV query; the expansion of max fails.
                step("query-cpu-model-expansion", err.clone()),
            ],
        )
        .await;
        let mut w = Vec::new();
        let p = probe::probe_monitor(&client, Accel::Tcg, &mut w).await;
        (p, w)
    });
    for needle in [
        "query-kvm",
        "query-machines",
        "static expansion of CPU model max",
    ] {
        assert!(
            warnings.iter().any(|w| w.contains(needle)),
            "{needle}: {warnings:?}"
        );
    }
    assert!(probed.machines.is_none() && probed.host_cpu.is_none() && probed.sev.is_none());
    let out = tmp.path().join("out");
    let report = labeller::write_files(&options(&out), Accel::Tcg, &probed, warnings).unwrap();
    let l = accepted(&out);
    assert_eq!(
        l.models
            .iter()
            .map(|(m, u)| (m.as_str(), *u))
            .collect::<Vec<_>>(),
        vec![("EPYC", false), ("Penryn", true), ("qemu64", true)],
        "QEMU's models that libvirt's map names, host left out, unknown counting as usable"
    );
    has_warning(&report, "host-model from the host's CPUID");
}

#[test]
fn sev_comes_from_the_probe() {
    let tmp = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let probed = rt.block_on(async {
        let (client, _peer) = scripted(
            tmp.path(),
            vec![
                step("query-version", json!({"return": {"qemu": {"major": 10, "minor": 1, "micro": 0}, "package": ""}})),
                step("query-kvm", json!({"return": {"enabled": true, "present": true}})),
                step("qom-list-types", json!({"return": [{"name": "sev-guest"}, {"name": "max-x86_64-cpu"}]})),
                step("query-machines", json!({"return": [
                    {"name": "pc-q35-10.1", "alias": "q35", "cpu-max": 4096},
                    {"name": "none", "cpu-max": 1}
                ]})),
                step("query-cpu-definitions", json!({"return": [{"name": "EPYC", "unavailable-features": []}]})),
                step("query-sev-capabilities", json!({"return": {"pdh": "", "cert-chain": "",
                    "cpu0-id": "aWQ=", "cbitpos": 51, "reduced-phys-bits": 1}})),
                step("query-cpu-model-expansion", json!({"return": {"model": {"name": "base", "props": {
                    "vendor": "AuthenticAMD", "family": 23, "model": 1, "stepping": 2,
                    "fpu": true, "sse": true, "sse2": true, "lm": true, "x2apic": true,
                    "invtsc": false}}}})),
                step("query-cpu-model-expansion", json!({"return": {"model": {"name": "base", "props": {
                    "vendor": "AuthenticAMD", "family": 23, "model": 1, "stepping": 2,
                    "fpu": true, "sse": true, "sse2": true, "lm": true, "x2apic": true, "invtsc": true}}}})),
            ],
        )
        .await;
        let mut w = Vec::new();
        let p = probe::probe_monitor(&client, Accel::Kvm, &mut w).await;
        assert!(w.is_empty(), "{w:?}");
        p
    });
    assert_eq!(probed.sev.as_ref().map(|s| s.cbitpos), Some(51));
    let out = tmp.path().join("out");
    labeller::write_files(&options(&out), Accel::Kvm, &probed, Vec::new()).unwrap();
    let l = accepted(&out);
    assert_eq!(
        l.labels.get("kubevirt.io/sev").map(String::as_str),
        Some("true")
    );
    // invtsc is on only when migratability is not asked for: it is still a required feature.
    assert!(
        l.labels
            .contains_key("host-model-required-features.node.kubevirt.io/invtsc"),
        "{:?}",
        l.labels
    );
    assert!(l
        .labels
        .contains_key("machine-type.node.kubevirt.io/pc-q35-10.1"));
    assert!(l.labels.contains_key("machine-type.node.kubevirt.io/q35"));
}

/// A real TCG probe of this machine's QEMU.
fn tcg_probe() -> QemuProbe {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut w = Vec::new();
    let p = rt.block_on(probe::probe_qemu(
        Path::new(QEMU),
        Accel::Tcg,
        Duration::from_secs(30),
        &mut w,
    ));
    assert!(w.is_empty(), "{w:?}");
    p
}

#[test]
fn names_that_are_not_label_names_never_reach_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    // A CPU map with a feature and a model whose names are not label names (the feature before
    // libvirt's, so that it takes fpu's bit; the model last, the newest).
    let map = tmp.path().join("cpu_map");
    std::fs::create_dir_all(&map).unwrap();
    for e in std::fs::read_dir(LIBVIRT_CPU_MAP).unwrap().flatten() {
        std::fs::copy(e.path(), map.join(e.file_name())).unwrap();
    }
    std::fs::write(
        map.join("x86_bad.xml"),
        "<cpus><feature name='bad feature'><cpuid eax_in='0x01' edx='0x00000001'/></feature></cpus>",
    )
    .unwrap();
    std::fs::write(
        map.join("x86_badmodel.xml"),
        "<cpus><model name='Bad Model'><decode host='on' guest='on'/><feature name='fpu'/></model></cpus>",
    )
    .unwrap();
    let index = std::fs::read_to_string(map.join("index.xml"))
        .unwrap()
        .replacen(
            "<include filename='x86_features.xml'/>",
            "<include filename='x86_bad.xml'/><include filename='x86_features.xml'/>",
            1,
        )
        .replacen(
            "</arch>",
            "<include filename='x86_badmodel.xml'/></arch>",
            1,
        );
    std::fs::write(map.join("index.xml"), index).unwrap();
    let mut probed = tcg_probe();
    let machines = probed.machines.as_mut().unwrap();
    machines.push(MachineInfo {
        name: "pc q35 odd".into(),
        cpu_max: 1,
        ..Default::default()
    });
    machines.push(MachineInfo {
        name: "pc-odd-1.0".into(),
        alias: Some("odd/alias".into()),
        cpu_max: 1,
        ..Default::default()
    });
    let models = probed.cpu_models.as_mut().unwrap();
    models.push(qlauncher::labeller::x86::QemuModel {
        name: "Bad Model".into(),
        usable: qlauncher::labeller::x86::Usable::Yes,
        blockers: vec![],
        deprecated: false,
    });
    let out = tmp.path().join("out");
    let mut opts = options(&out);
    opts.cpu_map = Some(map);
    let report = labeller::write_files(&opts, Accel::Tcg, &probed, Vec::new()).unwrap();
    let l = accepted(&out);
    for needle in [
        "machine types left out",
        "CPU models left out",
        "supported features left out",
    ] {
        has_warning(&report, needle);
    }
    assert!(l
        .labels
        .contains_key("machine-type.node.kubevirt.io/pc-odd-1.0"));
    assert!(!l
        .labels
        .keys()
        .any(|k| k.contains("odd/alias") || k.contains(' ')));
}

#[test]
fn without_a_cpu_map_the_host_model_is_still_named() {
    let tmp = tempfile::tempdir().unwrap();
    let mut opts = options(tmp.path());
    opts.cpu_map = Some("/nonexistent/cpu_map".into());
    let report = run(&opts);
    has_warning(&report, "CPU map /nonexistent/cpu_map not loaded");
    let l = accepted(tmp.path());
    assert_eq!(l.host_cpu_model, "qemu64");
    assert!(l.labels.keys().any(|k| k.starts_with("machine-type.")));
}

#[test]
fn no_kvm_device_and_unreadable_sysfs() {
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    for d in ["dev", "sys/devices/system/cpu", "proc"] {
        std::fs::create_dir_all(host.join(d)).unwrap();
    }
    // A node directory whose files cannot be read (a directory where a file should be).
    std::fs::create_dir_all(host.join("sys/devices/system/node/node0/cpulist")).unwrap();
    std::fs::write(host.join("sys/devices/system/cpu/online"), "0\n").unwrap();
    std::fs::write(host.join("proc/meminfo"), "MemTotal: 1024 kB\n").unwrap();
    let out = tmp.path().join("out");
    let mut opts = options(&out);
    opts.host = HostPaths {
        dev: host.join("dev"),
        sys: host.join("sys"),
        proc: host.join("proc"),
    };
    opts.virttype = None;
    opts.hypervisor_device = "kvm".into();
    opts.preferred_virttype = "kvm".into();
    opts.prepare_device = true;
    let report = run(&opts);
    // No /dev/kvm and none in /proc/misc: TCG, and no TSC counter.
    assert_eq!(report.virttype, "qemu");
    has_warning(&report, "node0/cpulist");
    let l = accepted(&out);
    assert!(!l.labels.keys().any(|k| k.starts_with("cpu-timer.")));
    assert_eq!(l.topology.len(), 1, "one cell of the online CPUs");
    assert_eq!(l.topology[0].cpus, vec![(0, vec![0])]);
}

#[test]
fn every_run_rewrites_every_file() {
    let tmp = tempfile::tempdir().unwrap();
    for f in [
        labeller::CAPABILITIES,
        labeller::DOMCAPABILITIES,
        labeller::SUPPORTED_FEATURES,
        labeller::CROSS_ARCH,
    ] {
        std::fs::write(tmp.path().join(f), "<domainCapabilities/>").unwrap();
    }
    run(&options(tmp.path()));
    accepted(tmp.path());
    let names: BTreeSet<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 4, "no temporary file left: {names:?}");
    // A directory that cannot be written is the one error.
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(rt.block_on(labeller::run(&options(&file))).is_err());
}

// --- node-labeller.sh as the init container runs it ---------------------------------------------

#[test]
fn node_labeller_sh_as_the_init_container_runs_it() {
    let tmp = tempfile::tempdir().unwrap();
    let link = tmp.path().join("node-labeller.sh");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_qlauncher"), &link).unwrap();
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let host_kvm_mode = std::fs::metadata("/dev/kvm")
        .ok()
        .map(|m| m.permissions().mode());
    // The init container's /dev is its own: a tmpfs with the basic nodes and a kvm node, so the
    // script's chmod o+rw changes this copy, never the host's.
    let script = r#"set -e
mount -t tmpfs -o mode=0755 tmpfs /dev
for n in "null 1 3" "zero 1 5" "random 1 8" "urandom 1 9"; do set -- $n; mknod -m 666 /dev/$1 c $2 $3; done
ln -s /proc/self/fd /dev/fd; ln -s fd/0 /dev/stdin; ln -s fd/1 /dev/stdout; ln -s fd/2 /dev/stderr
if [ "$WITH_KVM" = 1 ]; then mknod -m 600 /dev/kvm c 10 232; fi
mount -t tmpfs tmpfs /var/lib
mkdir /var/lib/kubevirt-node-labeller
mount --bind "$OUT" /var/lib/kubevirt-node-labeller
"$LINK" 2> "$OUT.stderr"
if [ "$WITH_KVM" = 1 ]; then stat -c %a /dev/kvm; fi
"#;
    let with_kvm = Path::new("/dev/kvm").exists();
    let r = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script])
        .env("OUT", &out)
        .env("LINK", &link)
        .env("WITH_KVM", if with_kvm { "1" } else { "0" })
        .env("HYPERVISOR_DEVICE", "kvm")
        .env("PREFERRED_VIRTTYPE", "kvm")
        .output()
        .unwrap();
    let stderr = std::fs::read_to_string(PathBuf::from(format!("{}.stderr", out.display())))
        .unwrap_or_default();
    assert!(
        r.status.success(),
        "{}{stderr}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert!(
        stderr.contains("wrote 4 files into /var/lib/kubevirt-node-labeller"),
        "{stderr}"
    );
    let l = accepted(&out);
    assert!(l.labels.contains_key("machine-type.node.kubevirt.io/q35"));
    if with_kvm {
        assert!(stderr.contains("virttype kvm"), "{stderr}");
        assert_eq!(
            String::from_utf8_lossy(&r.stdout).trim(),
            "606",
            "o+rw on the pod's node"
        );
    }
    assert_eq!(
        std::fs::metadata("/dev/kvm")
            .ok()
            .map(|m| m.permissions().mode()),
        host_kvm_mode,
        "the host's /dev/kvm is untouched"
    );
}

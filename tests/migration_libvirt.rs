//! Beyond KubeVirt: a domain started the way libvirt starts it from the XML qlauncher exports
//! (compat/libvirt-xml) live-migrates into QEMU started from qlauncher's own argv for the same
//! VMI, and the guest keeps running. This is the path an existing KubeVirt cluster would take to
//! move its running VMs to qlauncher without a reboot: the device models libvirt's QEMU and
//! qlauncher's QEMU build must be identical, down to the migration stream.
//!
//! "libvirt's QEMU" is `qemu-system-x86_64` with the argv libvirt 9.0 itself produces for the
//! exported XML (`virsh -c qemu:///embed?root=… domxml-to-native qemu-argv`, libvirt's embedded
//! QEMU driver; no daemon), plus the one file libvirt would have written before starting it (its
//! master key). qlauncher's target is the plan's argv with the source's resolved machine type,
//! the CPU adopted from the source's static expansion (the one device model that differs: see
//! the test) and `-incoming defer`; qlauncher's migration halves drive both QEMUs over QMP. Every other
//! record of the two argvs is identical or differs only where no device state lives (compat's
//! table, printed by the test: monitor and agent socket paths, `-display none`, libvirt's
//! master key and explicit USB port and boot index); the stream loads, the guest's CPU
//! identity and feature words match, its counter continues and its disk is there. Both share
//! the plan's files (same host, shared storage): the target opens the disks inactive until the
//! switchover.
//!
//! The VMI is the test guest by kernel boot with KubeVirt's default devices (serial console,
//! guest-agent channel, memory balloon, VNC + VGA), virtio disks (containerDisk, cloud-init),
//! a SATA disk and CD-ROM, a USB tablet, virtio-rng and an i6300esb watchdog, without a pod
//! network (a tap needs libvirt's fds).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use qlauncher::cmdline::devices::cpu::adopted_cpu_plan;
use qlauncher::cmdline::plan::{CpuFlag, CpuPlan, DomainPlan};
use qlauncher::cmdline::qemu::FormatDriver;
use qlauncher::cmdline::{convert, render, FactsFile};
use qlauncher::qmp::QmpClient;
use qlauncher::sync::migration::outgoing::running_cpu_definition;
use qlauncher::sync::migration::source::{resolved_machine, run_source, SourcePlan};
use qlauncher::sync::migration::target::{incoming_argv, TargetEnd, TargetSession, TargetSockets};
use qlauncher::sync::migration::MigrationOptions;
use qlauncher::vmi::{DefaultsConfig, Vmi};
use qlauncher_libvirt_xml::libvirt::{self, EmbedRoot};
use qlauncher_libvirt_xml::{export, to_xml};
use testkit::cmdline::{
    chardev_dirs_and_blockdevs, create_pod_dirs, missing_images, place_kernel_and_vnc,
};
use testkit::guest::{Console, GuestImages, BOOT_TIMEOUT};
use testkit::migration::running_domain;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

/// Kills and reaps QEMU on drop.
struct Qemu(Child, PathBuf);

impl Qemu {
    fn spawn(argv: &[String], log: PathBuf) -> Qemu {
        let f = std::fs::File::create(&log).unwrap();
        let child = Command::new("qemu-system-x86_64")
            .args(argv)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .expect("qemu-system-x86_64");
        Qemu(child, log)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.1).unwrap_or_default()
    }

    /// Connects to its QMP socket once QEMU made it (panics with QEMU's log if it exits).
    async fn qmp(&mut self, path: &Path) -> QmpClient {
        for _ in 0..600 {
            if let Ok(Some(st)) = self.0.try_wait() {
                panic!(
                    "QEMU exited ({st}) before its monitor came up:\n{}",
                    self.log()
                );
            }
            if path.exists() {
                if let Ok(c) = QmpClient::connect(path, Duration::from_secs(60)).await {
                    return c;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no QMP monitor at {}:\n{}", path.display(), self.log());
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn vmi() -> Vmi {
    let v = serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "moving", "namespace": "default",
                     "uid": "5a5a5a5a-0000-4000-8000-00000000a019"},
        "spec": {
            "domain": {
                "firmware": {
                    "uuid": "5a5a5a5a-1111-4000-8000-00000000a019",
                    "kernelBoot": {
                        "kernelArgs": "console=ttyS0",
                        "container": {"image": "qlauncher/test-guest-kernel",
                                      "kernelPath": "/boot/vmlinuz",
                                      "initrdPath": "/boot/initrd.img"}
                    }
                },
                "memory": {"guest": "256Mi"},
                "devices": {
                    "autoattachPodInterface": false,
                    "disks": [
                        {"name": "rootdisk", "disk": {"bus": "virtio"}},
                        {"name": "cidata", "disk": {"bus": "virtio"}},
                        {"name": "scratch", "disk": {"bus": "sata"}},
                        {"name": "cd", "cdrom": {"bus": "sata"}}
                    ],
                    "inputs": [{"name": "tablet", "type": "tablet", "bus": "usb"}],
                    "rng": {},
                    "watchdog": {"name": "wd", "i6300esb": {"action": "poweroff"}}
                }
            },
            "volumes": [
                {"name": "rootdisk", "containerDisk": {"image": "qlauncher/test-guest:latest"}},
                {"name": "cidata", "cloudInitNoCloud": {"userData": "#cloud-config\n"}},
                {"name": "scratch", "emptyDisk": {"capacity": "16Mi"}},
                {"name": "cd", "containerDisk": {"image": "qlauncher/test-guest:latest"}}
            ]
        }
    });
    let mut vmi = Vmi::from_json_or_yaml(&v.to_string()).unwrap();
    vmi.apply_defaults(&DefaultsConfig::for_manifest(&vmi, "moving"));
    vmi
}

/// Creates every file the plan's argv refers to (as `tests/cmdline_qemu_acceptance.rs` does):
/// the kernel-boot pair from the test guest, each disk's image, socket directories.
fn prepare_files(plan: &DomainPlan, root: &Path, guest: &GuestImages) {
    create_pod_dirs(root);
    place_kernel_and_vnc(plan, guest);
    let blockdevs = chardev_dirs_and_blockdevs(plan);
    for (path, fmt) in missing_images(&blockdevs) {
        let ok = match fmt {
            Some(FormatDriver::Qcow2) => Command::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
                .arg(&guest.disk_raw)
                .arg(path)
                .status()
                .unwrap()
                .success(),
            _ => std::fs::copy(&guest.disk_raw, path).is_ok(),
        };
        assert!(ok, "image {}", path.display());
    }
}

/// The value of `key=` in the first `-chardev` word with `id=<id>`.
fn chardev_path(argv: &[String], id: &str) -> Option<String> {
    argv.windows(2)
        .filter(|w| w[0] == "-chardev")
        .map(|w| &w[1])
        .find(|v| v.split(',').any(|p| p == format!("id={id}")))
        .and_then(|v| {
            v.split(',')
                .find_map(|p| p.strip_prefix("path=").map(str::to_owned))
        })
}

/// libvirt's argv made runnable outside libvirt: the master-key secret file it writes before
/// exec (32 random bytes) and the directories of its sockets (the guest-agent channel's is under
/// libvirt's root).
fn runnable(argv: &[String]) {
    for w in argv
        .windows(2)
        .filter(|w| w[0] == "-chardev")
        .map(|w| &w[1])
    {
        if let Some(p) = w.split(',').find_map(|p| p.strip_prefix("path=")) {
            std::fs::create_dir_all(Path::new(p).parent().unwrap()).unwrap();
        }
    }
    for w in argv {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(w) else {
            continue;
        };
        if v["qom-type"] == "secret" {
            let file = Path::new(v["file"].as_str().unwrap());
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            let mut key = [0u8; 32];
            getrandom(&mut key);
            std::fs::write(file, key).unwrap();
        }
    }
}

fn getrandom(buf: &mut [u8]) {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(buf)
        .unwrap();
}

fn word_after<'a>(argv: &'a [String], flag: &str) -> Option<&'a str> {
    argv.windows(2)
        .find(|w| w[0] == flag)
        .map(|w| w[1].as_str())
}

fn with_word_after(argv: &[String], flag: &str, value: &str) -> Vec<String> {
    let mut out = argv.to_vec();
    for i in 1..out.len() {
        if out[i - 1] == flag {
            out[i] = value.to_owned();
        }
    }
    out
}

/// The CPU libvirt's QEMU runs, from its `-cpu` (`EPYC,x2apic=on,...`: libvirt's host-model,
/// expanded to a named model and features) as a plan: what a qlauncher source would hold.
fn libvirt_cpu(arg: &str) -> CpuPlan {
    let mut words = arg.split(',');
    let model = words.next().unwrap_or_default().to_owned();
    let flags = words
        .map(|w| {
            let (name, value) = w.split_once('=').unwrap_or((w, "on"));
            CpuFlag {
                name: name.to_owned(),
                value: value.to_owned(),
            }
        })
        .collect();
    CpuPlan {
        model,
        flags,
        host_model: true,
        adopted: None,
        libvirt: None,
    }
}

/// What the guest sees of vCPU 0: its CPUID feature words, model id, family, model, stepping.
async fn cpu_of(qmp: &QmpClient) -> serde_json::Value {
    let cpus = qmp.execute("query-cpus-fast", None).await.unwrap();
    let path = cpus[0]["qom-path"].as_str().unwrap().to_owned();
    let mut out = serde_json::Map::new();
    for p in ["feature-words", "model-id", "family", "model", "stepping"] {
        let v = qmp
            .execute(
                "qom-get",
                Some(serde_json::json!({"path": path, "property": p})),
            )
            .await
            .unwrap();
        out.insert(p.to_owned(), v);
    }
    serde_json::Value::Object(out)
}

fn last_count(console: &Console) -> u64 {
    console
        .markers()
        .iter()
        .filter_map(|m| m.strip_prefix("count ")?.trim().parse().ok())
        .max()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_started_by_libvirt_from_our_xml_migrates_into_qlaunchers_qemu() {
    let guest = GuestImages::locate();
    let tmp = tempfile::Builder::new().prefix("qlmigl").tempdir().unwrap();
    let root = tmp.path();
    let vmi = vmi();
    let mut ctx = testkit::cmdline::acceptance_context(&vmi, &FactsFile::default(), root, "qlmigl");
    ctx.qemu = libvirt::installed_qemu().expect("qemu-system-x86_64 --version");
    let plan = convert(&vmi, &ctx).unwrap();
    prepare_files(&plan, root, &guest);
    let ours = render::argv(&plan);

    // libvirt's QEMU for the XML we export.
    let xml = to_xml(&export(&vmi, &ctx, &plan).unwrap()).unwrap();
    let embed = EmbedRoot::temporary(&root.join("embed")).unwrap();
    let theirs = embed
        .domxml_to_native(&libvirt::for_libvirt9(&xml))
        .unwrap_or_else(|e| panic!("virsh domxml-to-native: {e}\n{xml}"));
    runnable(&theirs);
    // The device-by-device comparison of the two argvs (compat's harness), for the log.
    let root_s = embed.dir().display().to_string();
    let report = qlauncher_libvirt_xml::harness::compare(
        &qlauncher_libvirt_xml::argv::records(&ours, None).unwrap(),
        &qlauncher_libvirt_xml::argv::records(&theirs, Some(&root_s)).unwrap(),
    );
    eprintln!("{}", report.table());
    let monitor = chardev_path(&theirs, "charmonitor").expect("libvirt's monitor");
    let serial = chardev_path(&theirs, "charserial0").expect("libvirt's serial console");
    assert_eq!(
        chardev_path(&ours, "charserial0").as_deref(),
        Some(serial.as_str()),
        "the serial console is at the same path in both argvs"
    );
    let mut source = Qemu::spawn(&theirs, root.join("libvirt-qemu.log"));
    let s_qmp = source.qmp(Path::new(&monitor)).await;
    let mut console = Console::connect(Path::new(&serial), Duration::from_secs(30)).unwrap();
    qlauncher::qmp::lifecycle::resume(&s_qmp).await.unwrap();
    console
        .wait_for_marker("boot ok", BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", source.log()));
    console.wait_for_prompt(BOOT_TIMEOUT).unwrap();
    let (rc, out) = console
        .run(
            "(i=0; while :; do i=$((i+1)); echo \"QLG: count $i\"; sleep 1; done) & true",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(rc, 0, "{out}");
    console
        .wait_for_marker("count 2", Duration::from_secs(60))
        .unwrap();
    let before = last_count(&console);
    drop(console);

    // qlauncher's QEMU for the same VMI, incoming.
    let domain = running_domain(
        vmi.metadata.uid.as_deref().unwrap_or_default(),
        "mig-libvirt",
        resolved_machine(&s_qmp).await.unwrap(),
    );
    // The CPU is the one device model that differs (compat's table above): qlauncher renders
    // KubeVirt's default host-model as `-cpu max` under TCG (`-cpu host,migratable=on` with
    // KVM), libvirt as the named model plus features it probed (here EPYC + 28 flags). QEMU does
    // not check the CPU in the migration stream, so the guest would silently see another CPUID
    // after the move (measured here with qlauncher's own `-cpu max`: the same TCG feature words,
    // but family 15 model 107 stepping 1 "QEMU TCG CPU version 2.5+" instead of family 23
    // model 1 stepping 2 "AMD EPYC Processor"). Like libvirt's own target (which takes the
    // expanded CPU from the migration cookie), the target adopts the source's CPU as a
    // qlauncher source sends it: the static expansion libvirt's QEMU answers for the CPU it
    // runs, rendered by the target as `base,<every property>,enforce=on`.
    let source_cpu = cpu_of(&s_qmp).await;
    let running = libvirt_cpu(word_after(&theirs, "-cpu").unwrap());
    let definition = running_cpu_definition(&s_qmp, &running)
        .await
        .unwrap()
        .expect("host-model");
    let mut adopted = plan.clone();
    adopted.cpu = adopted_cpu_plan(&definition).unwrap();
    let adopted_argv = render::argv(&adopted);
    let cpu_arg = word_after(&adopted_argv, "-cpu").unwrap().to_owned();
    assert!(cpu_arg.starts_with("base,"), "{cpu_arg}");
    let ours = with_word_after(&ours, "-cpu", &cpu_arg);
    let target_argv = incoming_argv(&ours, &domain).unwrap();
    let mut target = Qemu::spawn(&target_argv, root.join("qlauncher-qemu.log"));
    let t_qmp = target.qmp(&root.join("qmp.sock")).await;

    let control = root.join("control.sock");
    let sockets = TargetSockets {
        stream: root.join("u-49152-source.sock"),
        nbd: root.join("u-49153-source.sock"),
        ordered_stream: root.join("u-qemu-stream.sock"),
    };
    let listener = UnixListener::bind(&control).unwrap();
    let (t_client, t_sockets, uid) = (t_qmp.clone(), sockets.clone(), domain.vmi_uid.clone());
    let target_half = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        let mut session = TargetSession::accept(conn, &uid).await?;
        session.incoming(&t_client, &t_sockets).await?;
        session.finish(&t_client).await
    });
    let plan = SourcePlan {
        stream: sockets.stream.clone(),
        nbd: sockets.nbd.clone(),
        options: MigrationOptions::from_json(br#"{"ProgressTimeout":150}"#).unwrap(),
        data_bytes: 256 << 20,
    };
    let (_abort_tx, abort) = watch::channel(false);
    let conn = UnixStream::connect(&control).await.unwrap();
    let result = tokio::time::timeout(
        Duration::from_secs(600),
        run_source(conn, &s_qmp, domain, &plan, abort),
    )
    .await
    .expect("the source finished");
    let t_end = target_half.await.unwrap();
    if let Err(e) = &result {
        panic!(
            "migration from libvirt's QEMU failed: {}\ntarget end: {t_end:?}\n\
             libvirt's argv: {theirs:?}\nqlauncher's argv: {target_argv:?}\n\
             qlauncher's QEMU log:\n{}\nlibvirt's QEMU log:\n{}",
            e.failure_reason(),
            target.log(),
            source.log()
        );
    }
    assert_eq!(t_end.unwrap(), TargetEnd::Completed { paused: false });
    let st = qlauncher::qmp::lifecycle::query_status(&t_qmp)
        .await
        .unwrap();
    assert_eq!(st.0, "running");
    assert_eq!(
        cpu_of(&t_qmp).await,
        source_cpu,
        "the guest sees the same CPU"
    );

    // The guest keeps counting on qlauncher's QEMU, from where it was.
    let mut console = Console::connect(Path::new(&serial), Duration::from_secs(30)).unwrap();
    let first = console
        .wait_for_marker("count ", Duration::from_secs(120))
        .unwrap();
    let first: u64 = first["count ".len()..].trim().parse().unwrap();
    assert!(
        first > before,
        "target counted {first}, source was at {before}"
    );
    console
        .wait_for_marker(&format!("count {}", first + 2), Duration::from_secs(120))
        .unwrap();
    console.send(b"\n").unwrap();
    let (rc, out) = console
        .run("cat /sys/block/vda/size", Duration::from_secs(120))
        .unwrap();
    assert_eq!(rc, 0, "the disk is there after the move: {out}");
}

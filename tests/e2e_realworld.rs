//! Real-world VMIs through `qlauncher run` (issue 21), each modelled on what KubeVirt users run:
//!
//! - EFI (OVMF, no secure boot) with a name Kubernetes accepts but a DNS label does not (a dot,
//!   a first part longer than 63): the guest boots through OVMF, `<nvram>/<name>_VARS.fd` is made
//!   from the template, the guest's host name (DHCP option 12, cloud-init `local-hostname`) is the
//!   first part cut to 63 (KubeVirt `dns.SanitizeHostname`), a 39-character serial is accepted
//!   and the guest reads its first 20 bytes (virtio-blk's ID); a second run keeps the VARS file
//!   (the same inode, not reset to the template).
//! - EFI secure boot (the default of `efi: {}`): SMM, the secure code and the secure-boot VARS
//!   template with Microsoft's keys enrolled (Debian's `OVMF_VARS_4M.ms.fd`); the firmware
//!   enforces secure boot, so it refuses the test guest's unsigned syslinux.efi ("Access Denied").
//! - EFI secure boot (`secureBoot: true`, SMM) booting the guest through Debian's signed chain
//!   (`disk-secureboot.qcow2` of `scripts/build-guest`: Microsoft-signed shim, Debian-signed GRUB
//!   and kernel) to its shell; the guest's kernel reports secure boot enabled (dmesg, and the
//!   `SecureBoot` EFI variable's value byte is 1).
//! - An `ephemeral` PVC volume: the guest's writes land in the overlay, the PVC image is unchanged.
//!
//! Needs root, OVMF (`scripts/install-deps`) and the test guest (`scripts/build-guest`).

use testkit::guest;
use testkit::storage::{contains_bytes, sha256};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use guest::GuestImages;
use testkit::run::{short_tempdir, write_scratch_marker, Pod, Run, STEP};

/// The tests of this file run one at a time: once, two of their guests lost their serial console
/// together while the hostile-image test cleaned up its pod (not reproduced; see the round's
/// note), so they no longer overlap.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes `vmi` as `<dir>/vmi.json`.
fn write_vmi(dir: &Path, vmi: &serde_json::Value) -> PathBuf {
    let path = dir.join("vmi.json");
    std::fs::write(&path, vmi.to_string()).unwrap();
    path
}

/// The last `QLG: <prefix>...` marker of the serial log, waiting up to `timeout` for one.
fn wait_logged(run: &mut Run, prefix: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(m) = run
            .logged_markers()
            .into_iter()
            .rev()
            .find(|m| m.starts_with(prefix))
        {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "no {prefix:?} marker within {timeout:?}\n{}",
            run.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The decoded NoCloud meta-data the guest printed.
fn meta_data(run: &mut Run) -> serde_json::Value {
    use base64::Engine as _;
    let m = wait_logged(run, "meta-data ", STEP);
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(m.trim_start_matches("meta-data "))
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// The command line of the QEMU that `run` started (found by its `-uuid` being in our root).
fn qemu_cmdline(root: &Path, timeout: Duration) -> Vec<String> {
    let needle = root.display().to_string();
    let deadline = Instant::now() + timeout;
    loop {
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let words: Vec<String> = raw
                .split(|b| *b == 0)
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            if words
                .first()
                .is_some_and(|w| w.ends_with("qemu-system-x86_64"))
                && words.iter().any(|w| w.contains(&needle))
            {
                return words;
            }
        }
        assert!(Instant::now() < deadline, "no QEMU for {needle}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn nvram_dir(root: &Path) -> PathBuf {
    root.join("var/run/kubevirt-private/libvirt/qemu/nvram")
}

/// A VMI on the test guest's disk (containerDisk `rootdisk`) with cloud-init and a pod network.
fn guest_vmi(
    name: &str,
    firmware: serde_json::Value,
    extra_disk_fields: serde_json::Value,
) -> serde_json::Value {
    let mut root = serde_json::json!({"name": "rootdisk", "disk": {"bus": "virtio"}});
    if let (Some(r), Some(extra)) = (root.as_object_mut(), extra_disk_fields.as_object()) {
        r.extend(extra.clone());
    }
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "terminationGracePeriodSeconds": 30,
            "domain": {
                "firmware": firmware,
                "resources": {"requests": {"memory": "256Mi"}},
                "devices": {
                    "rng": {},
                    "disks": [root, {"name": "cloudinit", "disk": {"bus": "virtio"}}],
                    "interfaces": [{"name": "default", "masquerade": {}}]
                }
            },
            "networks": [{"name": "default", "pod": {}}],
            "volumes": [
                {"name": "rootdisk", "containerDisk": {"image": "qlauncher/test-guest"}},
                {"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config\n"}}
            ]
        }
    })
}

#[test]
fn efi_boot_with_a_dotted_long_name_keeps_its_vars_across_runs() {
    let _serial = one_at_a_time();
    let images = GuestImages::locate();
    let tmp = short_tempdir();
    let first = format!("efi-{}", "n".repeat(70));
    let name = format!("{first}.prod.example");
    let serial = format!("SER{}", "0123456789".repeat(3)) + "ABCDEF";
    assert_eq!(serial.len(), 39);
    let vmi = write_vmi(
        tmp.path(),
        &guest_vmi(
            &name,
            serde_json::json!({"bootloader": {"efi": {"secureBoot": false}}}),
            serde_json::json!({"serial": serial}),
        ),
    );
    let root = tmp.path().join("r");
    let disk = format!("rootdisk={}", images.disk_qcow2.display());
    let pod = Pod::new();
    let mut run = Run::start(&pod, &vmi, &root, &["--container-disk", &disk]);
    let mut console = run.console();
    // UEFI: the disk's EFI syslinux passed `qlg.boot=disk-uefi` (guest/README.md).
    let (rc, out) = console.run("cat /proc/cmdline", STEP).unwrap();
    assert_eq!(rc, 0);
    assert!(out.contains("qlg.boot=disk-uefi"), "{out}");
    let (rc, out) = console
        .run("cat /sys/block/vda/serial; echo", STEP)
        .unwrap();
    assert_eq!((rc, out.trim()), (0, &serial[..20]));
    // KubeVirt's host name: the first part of the name, cut to 63.
    let hostname = &first[..63];
    let lease = console.wait_for_marker("lease eth0 ", STEP).unwrap();
    let (_, fields) = guest::marker_fields(&lease);
    assert_eq!(
        fields.get("hostname").map(String::as_str),
        Some(hostname),
        "{lease}"
    );
    assert_eq!(meta_data(&mut run)["local-hostname"], hostname);

    let vars = nvram_dir(&root).join(format!("{name}_VARS.fd"));
    let cmdline = qemu_cmdline(&root, STEP);
    let joined = cmdline.join(" ");
    assert!(joined.contains("OVMF_CODE"), "{joined}");
    assert!(joined.contains(&vars.display().to_string()), "{joined}");
    assert!(!joined.contains("smm=on"), "{joined}");
    run.stop(&mut console);
    drop(run);

    let template = cmdline
        .iter()
        .find_map(|w| w.contains("OVMF_CODE").then_some(w.clone()))
        .unwrap();
    // KubeVirt v1.9.0 boots EFI without secure boot on the secure-boot code (SMM is QEMU's
    // default), with the plain vars template.
    assert!(
        template.contains("OVMF_CODE") && template.contains(".secboot.fd"),
        "{template}"
    );
    let meta = std::fs::metadata(&vars).unwrap();
    let template_vars = if template.contains("_4M") {
        "/usr/share/OVMF/OVMF_VARS_4M.fd"
    } else {
        "/usr/share/OVMF/OVMF_VARS.fd"
    };
    assert_eq!(meta.len(), std::fs::metadata(template_vars).unwrap().len());
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    let after_first = sha256(&vars);
    // OVMF recorded its boot entries: the file is no longer the template.
    assert_ne!(after_first, sha256(Path::new(template_vars)));

    // Second run, same root: the same VARS file, with what the first boot stored.
    let mut run = Run::start(&pod, &vmi, &root, &["--container-disk", &disk]);
    let mut console = run.console();
    let (rc, out) = console.run("cat /proc/cmdline", STEP).unwrap();
    assert!(rc == 0 && out.contains("qlg.boot=disk-uefi"), "{out}");
    run.stop(&mut console);
    let meta = std::fs::metadata(&vars).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::ino(&meta), inode);
    assert_ne!(sha256(&vars), sha256(Path::new(template_vars)));
}

#[test]
fn efi_secure_boot_runs_smm_with_the_secure_vars_template_and_enforces_it() {
    let _serial = one_at_a_time();
    let images = GuestImages::locate();
    let tmp = short_tempdir();
    let mut vmi = guest_vmi(
        "secure",
        serde_json::json!({"bootloader": {"efi": {}}}),
        serde_json::json!({}),
    );
    vmi["spec"]["terminationGracePeriodSeconds"] = serde_json::json!(1);
    vmi["spec"]["domain"]["features"] = serde_json::json!({"smm": {}});
    let vmi = write_vmi(tmp.path(), &vmi);
    let root = tmp.path().join("r");
    let disk = format!("rootdisk={}", images.disk_qcow2.display());
    let pod = Pod::new();
    let mut run = Run::start(&pod, &vmi, &root, &["--container-disk", &disk]);
    let cmdline = qemu_cmdline(&root, STEP).join(" ");
    assert!(cmdline.contains("smm=on"), "{cmdline}");
    assert!(
        cmdline.contains("driver=cfi.pflash01,property=secure,value=on"),
        "{cmdline}"
    );
    assert!(
        cmdline.contains("OVMF_CODE_4M.secboot.fd") || cmdline.contains("OVMF_CODE.secboot.fd"),
        "{cmdline}"
    );
    let vars = nvram_dir(&root).join("secure_VARS.fd");
    assert_eq!(
        std::fs::metadata(&vars).unwrap().len(),
        std::fs::metadata("/usr/share/OVMF/OVMF_VARS_4M.ms.fd")
            .unwrap()
            .len()
    );
    // The firmware enforces secure boot: the unsigned syslinux.efi is refused.
    let log = run.private_file("virt-serial0-log", STEP);
    let deadline = Instant::now() + STEP;
    loop {
        let text = String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default()).into_owned();
        if text.contains("Access Denied") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no secure-boot refusal on the console:\n{text}\n{}",
            run.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    testkit::process::run(&["kill", "-TERM", &run.pid().to_string()]);
    assert!(run.wait(STEP).is_some(), "qlauncher run did not exit");
}

/// Time the secure-boot guest gets to reach `QLG: boot ok`: OVMF with SMM under TCG, then shim,
/// GRUB and the kernel each verified, is several times slower than the plain EFI boot.
const SECURE_BOOT_TIMEOUT: Duration = Duration::from_secs(900);

/// The EFI global variable `SecureBoot` in the guest's efivarfs.
const SECURE_BOOT_VAR: &str =
    "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c";

#[test]
fn efi_secure_boot_boots_the_signed_shim_grub_and_kernel_and_the_guest_sees_it_enabled() {
    let _serial = one_at_a_time();
    let images = GuestImages::locate();
    let signed = images.dir.join("disk-secureboot.qcow2");
    assert!(
        signed.is_file(),
        "{} is missing: run scripts/build-guest (it builds the secure-boot disk next to the \
         others)",
        signed.display()
    );
    let tmp = short_tempdir();
    let mut vmi = guest_vmi(
        "signed",
        serde_json::json!({"bootloader": {"efi": {"secureBoot": true}}}),
        serde_json::json!({}),
    );
    vmi["spec"]["domain"]["features"] = serde_json::json!({"smm": {}});
    // The Debian kernel resets right after its EFI stub in 256 MiB with SMM's reserved memory
    // (seen under plain QEMU too); 512 MiB boots.
    vmi["spec"]["domain"]["resources"]["requests"]["memory"] = serde_json::json!("512Mi");
    let vmi = write_vmi(tmp.path(), &vmi);
    let root = tmp.path().join("r");
    let disk = format!("rootdisk={}", signed.display());
    let pod = Pod::new();
    let mut run = Run::start(&pod, &vmi, &root, &["--container-disk", &disk]);
    let cmdline = qemu_cmdline(&root, STEP).join(" ");
    assert!(cmdline.contains("smm=on"), "{cmdline}");
    assert!(
        cmdline.contains("driver=cfi.pflash01,property=secure,value=on"),
        "{cmdline}"
    );
    assert!(cmdline.contains(".secboot.fd"), "{cmdline}");
    assert!(
        nvram_dir(&root).join("signed_VARS.fd").is_file(),
        "{}",
        run.diagnostics()
    );
    wait_logged(&mut run, "boot ok", SECURE_BOOT_TIMEOUT);
    let mut console = run.console();
    let (rc, out) = console.run("cat /proc/cmdline", STEP).unwrap();
    assert!(rc == 0 && out.contains("qlg.boot=disk-secureboot"), "{out}");
    // The kernel found the firmware enforcing secure boot (and locked itself down).
    let (rc, out) = console.run("dmesg | grep -i 'secure boot'", STEP).unwrap();
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("Secure boot enabled"), "{out}");
    // The variable: 4 bytes of attributes, then the value (1: enabled). efivarfs is a module of
    // the guest's kernel (signed by Debian, so the locked-down kernel loads it), in the second
    // initramfs archive of the secure-boot disk.
    let (rc, out) = console
        .run(
            &format!(
                "insmod /lib/modules/*/kernel/fs/efivarfs/efivarfs.ko && \
                 mount -t efivarfs efivarfs /sys/firmware/efi/efivars && \
                 od -An -tu1 {SECURE_BOOT_VAR}"
            ),
            STEP,
        )
        .unwrap();
    assert_eq!(rc, 0, "{out}");
    assert_eq!(
        out.split_whitespace().last(),
        Some("1"),
        "SecureBoot variable: {out}"
    );
    run.stop(&mut console);
}

#[test]
fn ephemeral_pvc_writes_land_in_the_overlay_and_the_pvc_is_unchanged() {
    let _serial = one_at_a_time();
    let images = GuestImages::locate();
    let tmp = short_tempdir();
    let root = tmp.path().join("r");
    // The PVC as virt-handler mounts a filesystem-mode claim: <private>/vmi-disks/<vol>/disk.img.
    let pvc = root.join("var/run/kubevirt-private/vmi-disks/rootdisk/disk.img");
    std::fs::create_dir_all(pvc.parent().unwrap()).unwrap();
    std::fs::copy(&images.disk_raw, &pvc).unwrap();
    let pvc_sum = sha256(&pvc);
    let mut vmi = guest_vmi("ephemeral", serde_json::json!({}), serde_json::json!({}));
    vmi["spec"]["volumes"][0] = serde_json::json!({
        "name": "rootdisk", "ephemeral": {"persistentVolumeClaim": {"claimName": "golden"}}
    });
    let vmi = write_vmi(tmp.path(), &vmi);
    let mark = format!("qle-ephemeral-{}", testkit::names::unique());
    let pod = Pod::new();
    let mut run = Run::start(&pod, &vmi, &root, &[]);
    let mut console = run.console();
    write_scratch_marker(&mut console, &mark);
    run.stop(&mut console);
    drop(run);
    let overlay = root.join("var/run/kubevirt-ephemeral-disks/disk-data/rootdisk/disk.qcow2");
    assert!(
        contains_bytes(&std::fs::read(&overlay).unwrap(), mark.as_bytes()),
        "{} lacks the guest's write",
        overlay.display()
    );
    assert_eq!(sha256(&pvc), pvc_sum, "the PVC image changed");
}

/// GHSA-qv98-3369-g364: a containerDisk image recording its own backing file (`/etc/shadow`) is
/// refused before QEMU starts, naming the volume, and no overlay is left behind.
#[test]
fn a_container_disk_with_a_hostile_backing_file_is_refused_before_qemu_starts() {
    let _serial = one_at_a_time();
    let tmp = short_tempdir();
    let image = tmp.path().join("hostile.qcow2");
    testkit::storage::qemu_img_create_unchecked(&image, "16M", "/etc/shadow", "raw");
    let vmi = write_vmi(
        tmp.path(),
        &guest_vmi("hostile", serde_json::json!({}), serde_json::json!({})),
    );
    let root = tmp.path().join("r");
    let disk = format!("rootdisk={}", image.display());
    let pod = Pod::new();
    let mut run = Run::start(&pod, &vmi, &root, &["--container-disk", &disk]);
    let status = run
        .wait(STEP)
        .unwrap_or_else(|| panic!("qlauncher run kept running:\n{}", run.output()));
    assert!(!status.success(), "{}", run.output());
    let out = run.output();
    assert!(
        out.contains("volume rootdisk") && out.contains("/etc/shadow"),
        "{out}"
    );
    assert!(
        !root
            .join("var/run/kubevirt-ephemeral-disks/disk-data/rootdisk")
            .exists(),
        "an overlay was left behind"
    );
    let qemu_log = root.join("var/run/kubevirt-private/qlauncher/qemu.log");
    assert!(
        std::fs::read_to_string(&qemu_log)
            .unwrap_or_default()
            .is_empty(),
        "QEMU was started"
    );
    assert!(pod.pids().is_empty(), "processes left in the pod");
}

/// A guest with ACPI off (`features.acpi.enabled: false`) and a guest agent: once the agent's
/// channel is connected, SIGTERM to the launcher powers it off through the agent's
/// `guest-shutdown` (libvirt's default shutdown mode prefers a connected agent), well within its
/// grace period. (The test guest prints "agent ready" before `qemu-ga` opens its port, so the test
/// waits for the launcher to see the channel open.)
#[test]
fn acpi_off_guest_with_an_agent_powers_off_through_the_agent() {
    let _serial = one_at_a_time();
    let images = GuestImages::locate();
    let tmp = short_tempdir();
    let mut vmi = guest_vmi("noacpi", serde_json::json!({}), serde_json::json!({}));
    vmi["spec"]["terminationGracePeriodSeconds"] = serde_json::json!(120);
    vmi["spec"]["domain"]["features"] = serde_json::json!({"acpi": {"enabled": false}});
    let vmi = write_vmi(tmp.path(), &vmi);
    let root = tmp.path().join("r");
    let disk = format!("rootdisk={}", images.disk_qcow2.display());
    let pod = Pod::new();
    let mut run = Run::start(&pod, &vmi, &root, &["--container-disk", &disk]);
    let mut console = run.console();
    console.wait_for_marker("agent ready", STEP).unwrap();
    let deadline = Instant::now() + STEP;
    while !run
        .output()
        .lines()
        .any(|l| l.contains("guest channel state changed") && l.contains("\"open\":true"))
    {
        assert!(
            Instant::now() < deadline,
            "the agent channel never opened:\n{}",
            run.diagnostics()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let t0 = Instant::now();
    testkit::process::run(&["kill", "-TERM", &run.pid().to_string()]);
    let status = run
        .wait(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("not powered off within 60 s:\n{}", run.diagnostics()));
    assert!(status.success(), "{}", run.output());
    assert!(t0.elapsed() < Duration::from_secs(60));
    assert!(
        run.output()
            .contains("guest-shutdown through the guest agent"),
        "{}",
        run.output()
    );
}

//! `qlauncher run FILE [--root DIR] [--emulation auto|on|off] [--container-disk VOLUME=PATH]...
//! [--kernel-boot-dir DIR]`: one VMI outside Kubernetes.
//!
//! Places every KubeVirt path under `--root`, links the local images the VMI's containerDisk
//! volumes (and kernelBoot container) name where KubeVirt's disk sidecars would put them
//! (`<root>/var/run/kubevirt/container-disks/disk_<i>.img`, `.../kernel-boot/`), and then becomes
//! the monitor (exec: the dedicated `virt-launcher-monitor` binary when it sits next to
//! `qlauncher`, as in the image, else `qlauncher monitor`) with virt-launcher's flags and the VMI
//! in `STANDALONE_VMI`. The launcher the monitor starts is this same binary (`virt-launcher`
//! when that is a link to it, as in the image, else `qlauncher launcher`), so that of the three
//! programs only the small monitor is read in afresh. One process tree (monitor, launcher, QEMU). Ctrl-C or SIGTERM presses the ACPI power button and
//! kills QEMU when the grace period (`spec.terminationGracePeriodSeconds`, default 30 s) ends.
//! The network binding is set up in the current network namespace on its `eth0`.
//!
//! QEMU gets a second QMP monitor at `<root>/var/run/kubevirt-private/qlauncher/operator.sock`
//! for `qlauncher qmp` and `qlauncher hotplug` (the launcher holds the domain's own monitor,
//! `.../qlauncher/monitor.sock`, and QEMU serves one client per monitor).
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use qlauncher::vmi::Vmi;

/// The longest unix socket path the kernel accepts (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;
/// `--emulation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Emulation {
    /// KVM when it runs a probe guest in time (`monitor::kvm_probe`), else TCG.
    Auto,
    /// Always TCG.
    On,
    /// KVM only: fails, with the probe's reason logged, when KVM does not run the probe guest.
    Off,
}

/// Arguments of `qlauncher run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// VMI manifest (YAML or JSON).
    pub file: PathBuf,
    /// Directory under which every KubeVirt path is placed (kept between runs: a second run reuses
    /// the overlays).
    #[arg(long, default_value = "/var/lib/qlauncher/run")]
    pub root: PathBuf,
    /// Hardware virtualization or TCG.
    #[arg(long, value_enum, default_value = "auto")]
    pub emulation: Emulation,
    /// A local base image (qcow2 or raw) for a containerDisk volume: `VOLUME=PATH`. Repeatable.
    #[arg(long = "container-disk", value_name = "VOLUME=PATH")]
    pub container_disks: Vec<String>,
    /// Directory holding the kernelBoot container's kernel and initrd (by their file names).
    #[arg(long, value_name = "DIR")]
    pub kernel_boot_dir: Option<PathBuf>,
}

/// Runs `qlauncher run`: returns only on error (it execs the monitor).
pub fn run(args: RunArgs) -> anyhow::Result<std::process::ExitCode> {
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let mut vmi = Vmi::from_json_or_yaml(&text).context("cannot read the VMI")?;
    let id = stable_identity(&mut vmi)?;
    let root = checked_root(&args.root, &id.uid)?;
    let container_disks = root.join("var/run/kubevirt/container-disks");
    std::fs::create_dir_all(&container_disks)?;
    link_images(&args, &vmi, &container_disks)?;
    let grace = vmi
        .spec
        .termination_grace_period_seconds
        .map(|s| s.max(0))
        .unwrap_or(30);
    let mut flags = monitor_flags(id, &root, grace);
    if args.emulation != Emulation::Off {
        flags.push("--allow-emulation".into());
    }
    let json = serde_json::to_string(&vmi)?;
    exec_monitor(flags, json, &root, args.emulation)
}

/// The VMI's name, namespace and UID, as the launcher's flags carry them.
struct Identity {
    name: String,
    namespace: String,
    uid: String,
}

/// Fills in what a VMI outside Kubernetes lacks, stable from run to run: the namespace
/// (`default`), the UID (v5 of namespace/name, so a second run finds its files again) and the
/// firmware UUID (v5 of the name in KubeVirt's firmware namespace, as KubeVirt gives a VM's
/// VMIs: the guest sees the same machine on every run, and cloud-init the same NoCloud
/// instance-id, so it does not redo its first boot over the reused overlay). The name is
/// required.
fn stable_identity(vmi: &mut Vmi) -> anyhow::Result<Identity> {
    let name = vmi
        .metadata
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .context("metadata.name: missing")?;
    let namespace = vmi
        .metadata
        .namespace
        .get_or_insert_with(|| "default".into())
        .clone();
    let uid = vmi
        .metadata
        .uid
        .get_or_insert_with(|| {
            uuid::Uuid::new_v5(
                &uuid::Uuid::NAMESPACE_URL,
                format!("qlauncher-run:{namespace}/{name}").as_bytes(),
            )
            .to_string()
        })
        .clone();
    let firmware = vmi
        .spec
        .domain
        .firmware
        .get_or_insert_with(Default::default);
    if firmware.uuid.as_deref().unwrap_or("").is_empty() {
        firmware.uuid = Some(
            uuid::Uuid::new_v5(
                &qlauncher::vmi::defaults::FIRMWARE_UUID_NAMESPACE,
                name.as_bytes(),
            )
            .to_string(),
        );
    }
    Ok(Identity {
        name,
        namespace,
        uid,
    })
}

/// `--root`, created and made absolute, refused when it is too long for QEMU's unix sockets
/// under it: the longest is the guest agent channel's, and a socket path must fit in
/// `sun_path` (108 bytes with its NUL), or QEMU fails at start.
fn checked_root(root: &Path, uid: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
    let root = std::fs::canonicalize(root)?;
    let agent_socket = root
        .join("var/run/kubevirt-private")
        .join(uid)
        .join("org.qemu.guest_agent.0");
    let len = agent_socket.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        bail!(
            "--root {}: QEMU's socket {} would be {len} bytes long, over the {MAX_SOCKET_PATH} \
             bytes a unix socket path can have: choose a shorter --root",
            root.display(),
            agent_socket.display()
        );
    }
    Ok(root)
}

/// Links the local images where KubeVirt's disk sidecars would put them in
/// `container_disks`: each containerDisk volume's `--container-disk` image as
/// `disk_<volume index>.img`, and `--kernel-boot-dir` as `kernel-boot`. Every containerDisk
/// volume needs an image, and every image a containerDisk volume.
fn link_images(args: &RunArgs, vmi: &Vmi, container_disks: &Path) -> anyhow::Result<()> {
    let mut mapped: Vec<(String, PathBuf)> = Vec::new();
    for spec in &args.container_disks {
        let (volume, path) = spec
            .split_once('=')
            .with_context(|| format!("--container-disk {spec:?}: expected VOLUME=PATH"))?;
        let path = std::fs::canonicalize(path)
            .with_context(|| format!("--container-disk {volume}: cannot find {path}"))?;
        mapped.push((volume.to_string(), path));
    }
    for (index, vol) in vmi.spec.volumes.iter().flatten().enumerate() {
        if vol.container_disk.is_none() {
            continue;
        }
        let Some((_, path)) = mapped.iter().find(|(v, _)| *v == vol.name) else {
            bail!(
                "volume {} is a containerDisk: give its image with --container-disk {}=PATH",
                vol.name,
                vol.name
            );
        };
        relink(path, &container_disks.join(format!("disk_{index}.img")))?;
    }
    for (volume, _) in &mapped {
        if !vmi
            .spec
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == *volume && v.container_disk.is_some())
        {
            bail!("--container-disk {volume}: the VMI has no containerDisk volume of that name");
        }
    }
    if let Some(dir) = &args.kernel_boot_dir {
        let dir = std::fs::canonicalize(dir)
            .with_context(|| format!("--kernel-boot-dir: cannot find {}", dir.display()))?;
        relink(&dir, &container_disks.join("kernel-boot"))?;
    }
    Ok(())
}

/// `qlauncher monitor`'s argv with virt-launcher's flags: the VMI's identity, every KubeVirt
/// directory under `root`, the grace period in seconds and QEMU's start timeout.
fn monitor_flags(id: Identity, root: &Path, grace: i64) -> Vec<String> {
    let p = |p: &str| root.join(p).display().to_string();
    vec![
        "monitor".into(),
        "--name".into(),
        id.name,
        "--namespace".into(),
        id.namespace,
        "--uid".into(),
        id.uid,
        "--kubevirt-share-dir".into(),
        p("var/run/kubevirt"),
        "--ephemeral-disk-dir".into(),
        p("var/run/kubevirt-ephemeral-disks"),
        "--container-disk-dir".into(),
        p("var/run/kubevirt/container-disks"),
        "--hotplug-disk-dir".into(),
        p("var/run/kubevirt/hotplug-disks"),
        "--private-dir".into(),
        p("var/run/kubevirt-private"),
        "--grace-period-seconds".into(),
        grace.to_string(),
        "--qemu-timeout".into(),
        "120s".into(),
    ]
}

/// Becomes the monitor with `flags`, the VMI's `json` in `STANDALONE_VMI`, the root, the
/// operator's QMP socket and the emulation mode in the launcher's environment. As in the pod's
/// image: the dedicated PID 1 binary when it sits next to this one, else this binary's `monitor`
/// subcommand. Either starts this binary as the launcher: the dedicated monitor through its
/// `virt-launcher` sibling when that is a link to this binary (the image), else through
/// [`qlauncher_monitor::LAUNCHER_ENV`]. Returns only on error.
fn exec_monitor(
    mut flags: Vec<String>,
    json: String,
    root: &Path,
    emulation: Emulation,
) -> anyhow::Result<std::process::ExitCode> {
    let exe = std::env::current_exe().context("cannot find the qlauncher binary")?;
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    let monitor = dir.join("virt-launcher-monitor");
    let mut command = if monitor.is_file() {
        flags.remove(0);
        let mut command = std::process::Command::new(monitor);
        let sibling = std::fs::canonicalize(dir.join("virt-launcher")).ok();
        if sibling.as_deref() != Some(exe.as_path()) {
            command.env(qlauncher_monitor::LAUNCHER_ENV, &exe);
        }
        command
    } else {
        std::process::Command::new(exe)
    };
    command
        .args(flags)
        .env("STANDALONE_VMI", json)
        .env(qlauncher::sync::launcher::ROOT_ENV, root)
        .env(
            qlauncher::sync::launcher::OPERATOR_QMP_ENV,
            root.join("var/run/kubevirt-private/qlauncher/operator.sock"),
        )
        .env(
            qlauncher::sync::launcher::EMULATION_ENV,
            match emulation {
                Emulation::On => "on",
                Emulation::Off => "off",
                Emulation::Auto => "auto",
            },
        );
    let err = command.exec();
    Err(err).context("cannot exec the monitor")
}

/// Makes `link` a symlink to `target`, replacing an older link.
fn relink(target: &Path, link: &Path) -> anyhow::Result<()> {
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(link).with_context(|| format!("cannot replace {}", link.display()))?;
    }
    std::os::unix::fs::symlink(target, link)
        .with_context(|| format!("cannot link {} to {}", link.display(), target.display()))
}

//! The launcher's settings for SyncVMI: KubeVirt's paths, the QEMU binary and version, KVM, the
//! agent poller's intervals, and the timeouts every step of the orchestrator shares.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cmdline::context::{PathRoots, QemuVersion};

/// Everything a `SyncVmi` needs from the launcher: where KubeVirt's paths are, which QEMU to run,
/// whether KVM is used.
#[derive(Debug, Clone)]
pub struct SyncConfig {
    /// The converter's path roots (every KubeVirt path the VMI's devices use).
    pub paths: PathRoots,
    /// The QEMU binary: an absolute path ([`find_in_path`] once), so that starting QEMU does not
    /// search `PATH` (one failed `execve` per directory before it).
    pub qemu: PathBuf,
    /// QEMU's version (chooses renderer details); replaced by [`SyncConfig::qemu_probe`]'s answer
    /// when there is one.
    pub qemu_version: QemuVersion,
    /// QEMU's version for the converter and for `GetQemuVersion` before a domain exists: the
    /// image's version record when it matches the binary ([`crate::sync::qemu_version::QemuProbe::with_record`], no
    /// process), else `qemu --version`, run once in the background.
    pub qemu_probe: Option<crate::sync::qemu_version::QemuProbe>,
    /// Use KVM.
    pub kvm: bool,
    /// `--allow-emulation`: TCG when KVM is not used.
    pub allow_emulation: bool,
    /// The pod's resolv.conf (`/etc/resolv.conf`), read for the DHCP server's DNS options.
    pub resolv_conf: PathBuf,
    /// Where QEMU binds its QMP socket.
    pub qmp_socket: PathBuf,
    /// A second QMP monitor socket for an operator's tools (`qlauncher qmp`, `qlauncher
    /// hotplug`), or None. QEMU serves one client per monitor and the launcher holds
    /// [`SyncConfig::qmp_socket`] for the domain's lifetime, so those tools need their own.
    /// `qlauncher run` sets it; a pod's launcher does not (KubeVirt's QEMU has only libvirt's).
    pub operator_qmp_socket: Option<PathBuf>,
    /// QEMU's stdout and stderr (appended).
    pub qemu_log: PathBuf,
    /// The uid QEMU's files and tap belong to (107 non-root, 0 root).
    pub runtime_uid: u32,
    /// virt-launcher's `--ovmf-path`: where KubeVirt's file names of the EFI firmware are looked
    /// up first, before Debian's `/usr/share/OVMF` pairs ([`crate::storage::detect_efi`]); also
    /// where the SEV firmware (`OVMF_CODE.cc.fd`) is, for `GetLaunchMeasurement`.
    pub ovmf_dir: PathBuf,
    /// The vhost-vsock device the launcher opens for a VMI with `status.VSOCKCID` and hands to
    /// QEMU as `vhostfd` (libvirt's way, so an unprivileged QEMU needs no access to it).
    pub vhost_vsock: PathBuf,
    /// `--vm-stats-collector`: `GetVMStats` answers (else it is a gRPC error, as KubeVirt's).
    pub vm_stats_collector: bool,
    /// The speed limit of each push backup job in bytes per second (`blockdev-backup`
    /// `speed`), or None for none (libvirt and KubeVirt set none): an operator's bound on the
    /// I/O a backup takes from the guest.
    pub backup_speed: Option<u64>,
    /// Where a pull backup's NBD server listens: KubeVirt's
    /// `/var/run/kubevirt/sockets/backup-nbd-sock` (`virtwrap/storage/backup.go`,
    /// `pullBackupSocketDir`/`pullBackupSocketName`), the socket `Export`'s tunnel reads.
    pub backup_nbd_socket: PathBuf,
    /// Unplug vCPUs under TCG even on a QEMU that aborts at the next memory-topology change
    /// after it ([`crate::sync::reconcile::resources::tcg_unplug_crashes`]); off by default (the
    /// unplug is refused). For tests of the unplug itself, where nothing is plugged afterwards.
    pub allow_unsafe_tcg_vcpu_unplug: bool,
    /// The guest agent poller's intervals (`--qemu-agent-*-interval`,
    /// `--qemu-fsfreeze-status-interval`; KubeVirt's defaults).
    pub agent_poll: PollIntervals,
    /// The downward-API network-info file (`/etc/podinfo/network-info`), SR-IOV PCI addresses.
    pub network_info: PathBuf,
    /// sysfs (`/sys`), where host PCI devices are looked up.
    pub sysfs: PathBuf,
    /// `<share dir>/migrationproxy` (`/var/run/kubevirt/migrationproxy` in a pod): the migration
    /// proxy's unix sockets, owned by the runtime user ([`crate::sync::migration`]).
    pub migration_proxy_dir: PathBuf,
    /// Where a migration target listens for the source launcher: the path virt-handler's target
    /// proxy dials for role 0 (`/var/run/libvirt/virtqemud-sock` in a pod).
    pub migration_control_socket: PathBuf,
    /// `--image-volume`: the image volumes the containerDisks and the kernel boot image are
    /// linked from before storage is prepared ([`crate::storage::image_volume`]); `None` without
    /// the ImageVolume feature (virt-handler bind-mounts `disk_<i>.img` then).
    pub image_volume: Option<crate::storage::image_volume::ImageVolumeDirs>,
    /// The hook sidecars collected at start-up (`--hook-sidecars`, [`crate::hooks::collect`]);
    /// empty without them.
    pub hooks: crate::hooks::Sidecars,
    /// Where the VEP-190 plugin sidecars' sockets are: KubeVirt's `/var/run/kubevirt-plugin`
    /// ([`crate::hooks::plugins::PLUGIN_DIR`]) under the root, as the hook sidecars' directory is.
    pub plugin_dir: PathBuf,
}

/// How long a guest may take to release an unplugged device (`DEVICE_DELETED`).
pub const HOTPLUG_TIMEOUT: Duration = Duration::from_secs(30);

/// How long QEMU may take to answer on QMP after it was started.
pub const QMP_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the graceful shutdown waits for a connected agent to sync and take `guest-shutdown`
/// before it presses the ACPI button instead (a guest whose agent channel is not connected is
/// not waited for).
pub const AGENT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);
/// How long it listens for the agent refusing `guest-shutdown` (it says nothing when it obeys).
pub const AGENT_SHUTDOWN_ANSWER: Duration = Duration::from_secs(1);

/// The socket virt-handler's target proxy dials for role 0 in the target pod: where libvirt's
/// `virtqemud` listens in KubeVirt's launcher. qlauncher's migration target listens here
/// ([`crate::sync::migration::protocol`]; `migration-target.go`, `handleTargetMigrationProxy`).
pub const TARGET_CONTROL_SOCKET: &str = "/var/run/libvirt/virtqemud-sock";

/// KubeVirt's pull backup NBD socket in the launcher pod.
pub const BACKUP_NBD_SOCKET: &str = "/var/run/kubevirt/sockets/backup-nbd-sock";

/// The guest agent poller's intervals (virt-launcher's flags and their defaults;
/// [`crate::sync::cmdapi::guest_info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollIntervals {
    /// `guest-info` (`--qemu-agent-version-interval`, 300 s).
    pub version: Duration,
    /// `guest-get-fsinfo` (`--qemu-agent-file-interval`, 300 s).
    pub filesystems: Duration,
    /// `guest-fsfreeze-status` (`--qemu-fsfreeze-status-interval`, 5 s).
    pub fsfreeze: Duration,
    /// OS info, host name, time zone (`--qemu-agent-sys-interval`, 120 s).
    pub sys: Duration,
    /// `guest-get-users` (`--qemu-agent-user-interval`, 10 s).
    pub users: Duration,
}

impl Default for PollIntervals {
    fn default() -> Self {
        PollIntervals {
            version: Duration::from_secs(300),
            filesystems: Duration::from_secs(300),
            fsfreeze: Duration::from_secs(5),
            sys: Duration::from_secs(120),
            users: Duration::from_secs(10),
        }
    }
}

impl SyncConfig {
    /// KubeVirt's paths under `root` (`/` in a pod): `<root>/var/run/kubevirt-private`, ...;
    /// QMP socket `<private>/qlauncher/monitor.sock`, QEMU log `<private>/qlauncher/qemu.log`.
    pub fn under_root(root: &Path) -> SyncConfig {
        let r = |p: &str| root.join(p.trim_start_matches('/')).display().to_string();
        let d = PathRoots::default();
        let paths = PathRoots {
            private_dir: r(&d.private_dir),
            ephemeral_disks: r(&d.ephemeral_disks),
            container_disks: r(&d.container_disks),
            hotplug_disks: r(&d.hotplug_disks),
            empty_disks: r(&d.empty_disks),
            cloud_init: r(&d.cloud_init),
            dev: r(&d.dev),
            nvram: r(&d.nvram),
            virtiofs: r(&d.virtiofs),
        };
        let private = PathBuf::from(&paths.private_dir).join("qlauncher");
        SyncConfig {
            paths,
            qemu: find_in_path("qemu-system-x86_64"),
            qemu_version: QemuVersion { major: 7, minor: 2 },
            qemu_probe: None,
            kvm: false,
            allow_emulation: true,
            resolv_conf: "/etc/resolv.conf".into(),
            qmp_socket: private.join("monitor.sock"),
            operator_qmp_socket: None,
            qemu_log: private.join("qemu.log"),
            runtime_uid: if nix::unistd::geteuid().is_root() {
                0
            } else {
                107
            },
            ovmf_dir: "/usr/share/OVMF".into(),
            vhost_vsock: "/dev/vhost-vsock".into(),
            vm_stats_collector: false,
            allow_unsafe_tcg_vcpu_unplug: false,
            backup_speed: None,
            backup_nbd_socket: root.join(BACKUP_NBD_SOCKET.trim_start_matches('/')),
            agent_poll: Default::default(),
            network_info: root.join("etc/podinfo/network-info"),
            sysfs: root.join("sys"),
            migration_proxy_dir: root.join("var/run/kubevirt/migrationproxy"),
            migration_control_socket: root.join(TARGET_CONTROL_SOCKET.trim_start_matches('/')),
            image_volume: None,
            hooks: Default::default(),
            plugin_dir: root.join(crate::hooks::plugins::PLUGIN_DIR.trim_start_matches('/')),
        }
    }
}

/// The first executable `dir/name` over the directories of `PATH` (default
/// `/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`), found with `stat` and no exec;
/// `name` itself when none is (the exec then fails with QEMU's name in the error).
pub fn find_in_path(name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .unwrap_or_else(|| PathBuf::from(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_root() {
        let c = SyncConfig::under_root(Path::new("/tmp/r"));
        assert_eq!(
            c.paths.container_disks,
            "/tmp/r/var/run/kubevirt/container-disks"
        );
        assert_eq!(c.paths.empty_disks, "/tmp/r/var/run/libvirt/empty-disks");
        assert_eq!(
            c.qmp_socket,
            PathBuf::from("/tmp/r/var/run/kubevirt-private/qlauncher/monitor.sock")
        );
    }
}

#[cfg(test)]
mod find_in_path_tests {
    use super::*;

    #[test]
    fn finds_an_absolute_program_and_keeps_unknown_names() {
        let sh = find_in_path("sh");
        assert!(sh.is_absolute() && sh.ends_with("sh"), "{}", sh.display());
        assert_eq!(
            find_in_path("no-such-program-qlauncher"),
            PathBuf::from("no-such-program-qlauncher")
        );
    }
}

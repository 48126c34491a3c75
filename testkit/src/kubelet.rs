//! The kubelet's and the container runtime's side of a KubeVirt pod, for running the launcher as
//! KubeVirt runs it by default: a non-root VMI (`status.runtimeUser: 107`, virt-api's default
//! unless the `Root` feature gate is on).
//!
//! - [`empty_dir`], [`compute_empty_dirs`]: the compute container's emptyDirs as the kubelet makes
//!   them for a pod with `fsGroup: 107` (`SetVolumeOwnership`): owned by root, group 107, mode
//!   2777 (0777 and setgid). The launcher (uid 107, no `CAP_FOWNER`) can create files and
//!   directories in them but cannot change their mode or owner.
//! - [`compute_user_argv`], [`compute_user_env`]: the compute container's identity and
//!   environment (`rendercontainer.go securityContext`, `xdgEnvironmentVariables`): uid and gid
//!   107, supplementary groups \[107\] (the fsGroup), bounding set `{NET_BIND_SERVICE}`, no
//!   inheritable or ambient capability, `no_new_privs`; with it nothing is effective or permitted.
//! - [`device_node`]: a device plugin's per-pod device node, mode 0666 (the tun plugin gives the
//!   pod a read-write `/dev/net/tun`; this host's is 0600), bind-mounted over the host's node in
//!   the launcher's own mount namespace ([`bind_over_argv`]).
//!
//! Only numeric ids are used: no user or group 107 is made on the host (a host group 107 would
//! hide ownership bugs).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The pod's `fsGroup` and the compute container's uid and gid for a non-root VMI: KubeVirt's
/// `qemu` user, 107 (`pkg/util/util.go NonRootUID`).
pub const QEMU_ID: u32 = 107;

/// The compute container's emptyDir mount points, relative to the pod's root, parents first
/// (`rendervolumes.go Mounts`: `private`, `public`, `sockets`, `libvirt-runtime`,
/// `ephemeral-disks`, `container-disks`, `hotplug-disks`).
pub const COMPUTE_EMPTY_DIRS: &[&str] = &[
    "var/run/kubevirt-private",
    "var/run/kubevirt",
    "var/run/kubevirt/sockets",
    "var/run/libvirt",
    "var/run/kubevirt-ephemeral-disks",
    "var/run/kubevirt/container-disks",
    "var/run/kubevirt/hotplug-disks",
];

/// Makes `path` (and missing parents) as the kubelet makes an emptyDir for `fsGroup: 107`:
/// `root:107`, mode 2777. Parents made here are root's, mode 0755. Panics on failure.
pub fn empty_dir(path: &Path) {
    if let Some(parent) = path.parent() {
        if !parent.exists() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
            std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    std::fs::create_dir_all(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::os::unix::fs::chown(path, Some(0), Some(QEMU_ID)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o2777)).unwrap();
}

/// Makes every [`COMPUTE_EMPTY_DIRS`] under `root` with [`empty_dir`]; returns their paths.
/// `root` itself must be searchable by 107 (mode 0755).
pub fn compute_empty_dirs(root: &Path) -> Vec<PathBuf> {
    COMPUTE_EMPTY_DIRS
        .iter()
        .map(|d| {
            let path = root.join(d);
            empty_dir(&path);
            path
        })
        .collect()
}

/// The words that run a command as the compute container of a non-root VMI (put them before
/// the program): `setpriv` (util-linux) with uid and gid [`QEMU_ID`], groups [`QEMU_ID`], the
/// bounding set reduced to `NET_BIND_SERVICE`, no inheritable or ambient capability,
/// `no_new_privs`. Run it as root, last before the program (after `ip netns exec` and mounts).
pub fn compute_user_argv() -> Vec<String> {
    let id = QEMU_ID.to_string();
    vec![
        "setpriv".into(),
        format!("--reuid={id}"),
        format!("--regid={id}"),
        format!("--groups={id}"),
        "--bounding-set=-all,+net_bind_service".into(),
        "--inh-caps=-all".into(),
        "--ambient-caps=-all".into(),
        "--no-new-privs".into(),
        "--".into(),
    ]
}

/// The words that run a command as KubeVirt's virt-launcher runs in a non-root compute container:
/// [`compute_user_argv`] plus `NET_BIND_SERVICE` inheritable and ambient, which
/// virt-launcher-monitor (file capability `cap_net_bind_service`) hands its virt-launcher
/// (`AmbientCaps`, `cmd/virt-launcher-monitor`, v1.9.0) so that it can serve DHCP on port 67.
/// Nothing else is permitted; `no_new_privs` stays set.
pub fn launcher_user_argv() -> Vec<String> {
    compute_user_argv()
        .into_iter()
        .map(|w| match w.as_str() {
            "--inh-caps=-all" => "--inh-caps=-all,+net_bind_service".to_owned(),
            "--ambient-caps=-all" => "--ambient-caps=-all,+net_bind_service".to_owned(),
            _ => w,
        })
        .collect()
}

/// The environment the template gives a non-root compute container
/// (`rendercontainer.go xdgEnvironmentVariables`), at the pod's paths: `XDG_CACHE_HOME` and
/// `XDG_CONFIG_HOME` the private directory, `XDG_RUNTIME_DIR` `<root>/var/run`, and `HOME=/` (as
/// containerd sets it for a uid without a passwd entry).
pub fn compute_user_env(root: &Path) -> Vec<(String, String)> {
    let private = root.join("var/run/kubevirt-private").display().to_string();
    vec![
        ("XDG_CACHE_HOME".into(), private.clone()),
        ("XDG_CONFIG_HOME".into(), private),
        (
            "XDG_RUNTIME_DIR".into(),
            root.join("var/run").display().to_string(),
        ),
        ("HOME".into(), "/".into()),
    ]
}

/// Makes `node` a character device node of the same device as `like` (e.g. `/dev/net/tun`),
/// mode 0666: what a device plugin gives the pod. Kept if it exists. Panics on failure.
pub fn device_node(node: &Path, like: &Path) {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if node.exists() {
        return;
    }
    let meta = std::fs::metadata(like).unwrap_or_else(|e| panic!("{}: {e}", like.display()));
    assert!(meta.file_type().is_char_device(), "{}", like.display());
    let path = std::ffi::CString::new(node.display().to_string()).unwrap();
    // SAFETY: a valid C path; creates a character device node of `like`'s device number.
    let r = unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o666, meta.rdev()) };
    assert_eq!(r, 0, "mknod {}", node.display());
    std::fs::set_permissions(node, std::fs::Permissions::from_mode(0o666)).unwrap();
}

/// The words that run a command in a private mount namespace in which each `(node, target)`'s
/// node is bind-mounted over `target` (a [`device_node`] over `/dev/net/tun`): `unshare` and
/// `sh -c 'mount --bind ... && exec "$@"'`. Put them before the program (and before
/// [`compute_user_argv`]: mounting needs root).
pub fn bind_over_argv(binds: &[(&Path, &Path)]) -> Vec<String> {
    let mut script = String::new();
    let mut args = Vec::new();
    for (i, (node, target)) in binds.iter().enumerate() {
        script.push_str(&format!(
            "mount --bind \"${a}\" \"${b}\" && ",
            a = 2 * i + 1,
            b = 2 * i + 2
        ));
        args.push(node.display().to_string());
        args.push(target.display().to_string());
    }
    script.push_str(&format!("shift {} && exec \"$@\"", 2 * binds.len()));
    let mut argv: Vec<String> = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.push(script);
    argv.push("sh".into());
    argv.extend(args);
    argv
}

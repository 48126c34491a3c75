//! QEMU's privileges: the runtime user it runs as, its umask, the descriptors it inherits, and
//! the ownership of the directory it creates its QMP socket in.
//!
//! KubeVirt runs QEMU as the `qemu` user, uid and gid 107 (`status.runtimeUser`, the default unless
//! the `Root` feature gate is on; with `--run-as-nonroot` the whole launcher is that user). libvirt
//! starts QEMU with `virCommandSetUID/GID` (no supplementary groups) and umask `0002`
//! (`qemuProcessLaunch`), so the sockets QEMU binds (QMP, serial console, VNC) are not
//! world-writable, and gives the domain's directories to that user. qlauncher does the same when the
//! launcher is root and the runtime uid is not: [`confine_qemu`] on QEMU's command,
//! [`prepare_socket_dir`] on the QMP socket's directory. The files QEMU opens (overlays, empty
//! disks, cloud-init ISOs, the tap) are given to the runtime uid where they are made (`storage`,
//! `net`).
//!
//! QEMU inherits only its standard streams and the descriptors the launcher places for it after
//! [`confine_qemu`] (the QMP listener as fd 3, vsock's `vhostfd` as fd 20; `start.rs`
//! `spawn_qemu`): everything else the launcher holds, also what it inherited itself without
//! close-on-exec (a parent's jobserver pipe, a leaked socket), is marked close-on-exec before QEMU
//! starts, as libvirt's `virCommand` closes every descriptor it was not asked to pass.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

/// The umask QEMU runs with (libvirt's): files and sockets it creates are not world-writable.
pub const QEMU_UMASK: libc::mode_t = 0o002;

/// The mode of the directory holding QEMU's QMP socket (libvirt's domain directories are `0750`).
pub const SOCKET_DIR_MODE: u32 = 0o750;

/// True when QEMU must switch to `runtime_uid`: the launcher is root and the runtime user is not.
pub fn drops_privileges(runtime_uid: u32) -> bool {
    runtime_uid != 0 && nix::unistd::geteuid().is_root()
}

/// Confines QEMU's `command`: umask [`QEMU_UMASK`]; every descriptor above stderr close-on-exec
/// (`close_range(3, ~0, CLOSE_RANGE_CLOEXEC)`, a loop on kernels without it); and, when
/// [`drops_privileges`], uid and gid `runtime_uid` (gid = uid, as KubeVirt's 107:107) with no
/// supplementary groups (std's `CommandExt::uid` clears them when the parent is root). std switches
/// the user before running `pre_exec` closures, and closures run in registration order: call this
/// before registering one that places descriptors QEMU must inherit (a tap fd), and before the
/// detaching double fork ([`crate::monitor::qemu::spawn_detached`]), so QEMU never runs as root.
pub fn confine_qemu(command: &mut Command, runtime_uid: u32) {
    if drops_privileges(runtime_uid) {
        command.uid(runtime_uid).gid(runtime_uid);
    }
    // SAFETY: umask, close_range and fcntl are async-signal-safe and touch only the child's own
    // state.
    unsafe {
        command.pre_exec(|| {
            libc::umask(QEMU_UMASK);
            let r = libc::syscall(
                libc::SYS_close_range,
                3 as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if r != 0 {
                for fd in 3..4096 {
                    let flags = libc::fcntl(fd, libc::F_GETFD);
                    if flags >= 0 {
                        libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
                    }
                }
            }
            Ok(())
        });
    }
}

/// Makes `dir` (where QEMU binds its QMP socket) mode [`SOCKET_DIR_MODE`], owned by the runtime
/// user when [`drops_privileges`], so QEMU can create the socket and nobody else can reach it.
/// Errors: the `chmod`/`chown` error.
pub fn prepare_socket_dir(dir: &Path, runtime_uid: u32) -> std::io::Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(SOCKET_DIR_MODE))?;
    if drops_privileges(runtime_uid) {
        std::os::unix::fs::chown(dir, Some(runtime_uid), Some(runtime_uid))?;
    }
    Ok(())
}

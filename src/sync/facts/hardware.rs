//! Host hardware facts: VFIO devices the device plugins assigned, virtiofsd sockets, and the
//! pre-opened vhost-vsock device QEMU inherits.

use std::collections::BTreeMap;
use std::path::Path;

use crate::cmdline::ConverterContext;
use crate::sync::error::SyncError;
use crate::vmi::Vmi;

/// Host hardware facts: VFIO devices from the device plugins' `PCI_RESOURCE_*` variables, and
/// the virtiofsd sockets that exist. SEV and TDX are not probed (yet), so such VMIs are refused.
pub(crate) fn add_hardware_facts(vmi: &Vmi, ctx: &mut ConverterContext) {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    ctx.host_devices = crate::cmdline::context::host_devices_from_env(vmi, &env);
    for fs in vmi
        .spec
        .domain
        .devices
        .filesystems
        .as_deref()
        .unwrap_or_default()
    {
        if Path::new(&ctx.paths.virtiofs)
            .join(format!("{}.sock", fs.name))
            .exists()
        {
            ctx.virtiofs_ready.insert(fs.name.clone());
        }
    }
}

/// The fd number QEMU gets the pre-opened vhost-vsock device at (`vhostfd=` of
/// `vhost-vsock-pci`).
pub const VSOCK_FD: i32 = 20;

/// Opens the vhost-vsock device (`vhost` `/dev/vhost-vsock`, read-write, close-on-exec) when
/// `vmi` has a vsock CID (`status.VSOCKCID`), as libvirt does for `<vsock>` before it starts QEMU,
/// so that QEMU, which may run unprivileged, only inherits the fd.
///
/// # Errors
/// [`SyncError::PrepareQemu`] naming the device when it cannot be opened (a node without the
/// `vhost_vsock` module, or no permission); QEMU is not started.
pub fn open_vhost_vsock(
    vmi: &Vmi,
    device: &std::path::Path,
) -> Result<Option<std::os::fd::OwnedFd>, SyncError> {
    if vmi.status.as_ref().and_then(|s| s.vsock_cid).is_none() {
        return Ok(None);
    }
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(device)
        .map_err(|source| SyncError::PrepareQemu {
            what: format!(
                "open {} for status.VSOCKCID (spec.domain.devices.autoattachVSOCK; the node needs \
                 the vhost_vsock module)",
                device.display()
            ),
            source,
        })?;
    Ok(Some(file.into()))
}

/// Makes `fd` appear as `target` in the spawned process (`dup2` before exec; a `dup2` onto
/// itself does not clear close-on-exec, so that case clears the flag explicitly).
pub fn inherit_fd(command: &mut std::process::Command, fd: &std::os::fd::OwnedFd, target: i32) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let raw = fd.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and calls only dup2 and fcntl, which are
    // async-signal-safe; `raw` stays open in the parent until the spawn returned.
    unsafe {
        command.pre_exec(move || {
            if raw == target {
                let flags = libc::fcntl(raw, libc::F_GETFD);
                if flags < 0 || libc::fcntl(raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(raw, target) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

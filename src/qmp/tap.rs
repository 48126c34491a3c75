//! Opening a tap device by name, as libvirt does for `<interface type='ethernet'>` with a
//! pre-created tap (`managed='no'`): open `/dev/net/tun` and `TUNSETIFF` with
//! `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR` (libvirt `virNetDevTapCreate`). If no tap of that name
//! exists, the kernel creates a non-persistent one that disappears when the fd is closed.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};

use super::QmpError;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens tap `name` (at most 15 bytes) for QEMU's `netdev_add tap fd=`; `vnet_hdr` matches
/// QEMU's `vnet_hdr` default for virtio-net. Errors: [`QmpError::OpenTap`].
pub fn open_tap(name: &str, vnet_hdr: bool) -> Result<OwnedFd, QmpError> {
    let err = |source| QmpError::OpenTap {
        name: name.to_string(),
        source,
    };
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(['/', '\0', ' ']) {
        return Err(err(std::io::Error::from(std::io::ErrorKind::InvalidInput)));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(err)?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
        _pad: [0; 22],
    };
    if vnet_hdr {
        req.flags |= libc::IFF_VNET_HDR as libc::c_short;
    }
    for (d, s) in req.name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which IfReq matches in size (40 bytes).
    let r = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReq) };
    if r < 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    Ok(OwnedFd::from(file))
}

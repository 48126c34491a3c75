//! Opening a tap device by name, as libvirt does for `<interface type='ethernet'>` with a
//! pre-created tap (`managed='no'`): open `/dev/net/tun` and `TUNSETIFF` with
//! `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR` (libvirt `virNetDevTapCreate`). If no tap of that name
//! exists, the kernel creates a non-persistent one that disappears when the fd is closed.

use std::os::fd::OwnedFd;

use super::QmpError;
use crate::sys::tun::{self, IFF_NO_PI, IFF_TAP, IFF_VNET_HDR};

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
    let mut flags = IFF_TAP | IFF_NO_PI;
    if vnet_hdr {
        flags |= IFF_VNET_HDR;
    }
    let file = tun::open(name, flags).map_err(err)?;
    Ok(OwnedFd::from(file))
}

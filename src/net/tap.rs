//! Persistent tap creation with the tun ioctls (rtnetlink cannot create tun/tap links: the
//! kernel answers EOPNOTSUPP).
//!
//! As KubeVirt's `virt-chroot create-tap` (`cmd/virt-chroot/tap-device-maker.go`) with
//! vishvananda/netlink's flags: `IFF_TAP|IFF_TUN_EXCL|IFF_ONE_QUEUE` for one queue,
//! `IFF_TAP|IFF_MULTI_QUEUE|IFF_NO_PI` for several; owner and group set, persistent. QEMU later
//! re-opens it by name with its own flags (it must use `IFF_MULTI_QUEUE` exactly when the tap
//! was made multi-queue).

use crate::net::NetError;
use crate::sys::tun::{self, IFF_MULTI_QUEUE, IFF_NO_PI, IFF_ONE_QUEUE, IFF_TAP, IFF_TUN_EXCL};
use std::io;
use std::os::fd::AsFd;

/// The TUNSETIFF flags KubeVirt uses.
pub fn flags(multiqueue: bool) -> libc::c_short {
    if multiqueue {
        IFF_TAP | IFF_MULTI_QUEUE | IFF_NO_PI
    } else {
        IFF_TAP | IFF_TUN_EXCL | IFF_ONE_QUEUE
    }
}

/// Creates the persistent tap `name` owned by `owner:group` in the calling thread's network
/// namespace. Errors: [`NetError::CreateTap`] with the failing open or ioctl.
pub fn create(name: &str, owner: u32, group: u32, multiqueue: bool) -> Result<(), NetError> {
    let err = |source: io::Error| NetError::CreateTap {
        name: name.into(),
        source,
    };
    let f = tun::open(name, flags(multiqueue)).map_err(err)?;
    tun::persist(f.as_fd(), owner, group).map_err(err)?;
    Ok(())
}

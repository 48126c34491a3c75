//! Persistent tap creation with the tun ioctls (rtnetlink cannot create tun/tap links: the
//! kernel answers EOPNOTSUPP).
//!
//! As KubeVirt's `virt-chroot create-tap` (`cmd/virt-chroot/tap-device-maker.go`) with
//! vishvananda/netlink's flags: `IFF_TAP|IFF_TUN_EXCL|IFF_ONE_QUEUE` for one queue,
//! `IFF_TAP|IFF_MULTI_QUEUE|IFF_NO_PI` for several; owner and group set, persistent. QEMU later
//! re-opens it by name with its own flags (it must use `IFF_MULTI_QUEUE` exactly when the tap
//! was made multi-queue).

use crate::net::NetError;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;

const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_ONE_QUEUE: libc::c_short = 0x2000;
const IFF_TUN_EXCL: libc::c_short = -0x8000; // 0x8000 as a c_short
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

mod ioctl {
    #![allow(missing_docs)]
    use super::IfReq;
    nix::ioctl_write_ptr_bad!(tunsetiff, nix::request_code_write!(b'T', 202, 4), IfReq);
    nix::ioctl_write_int_bad!(tunsetpersist, nix::request_code_write!(b'T', 203, 4));
    nix::ioctl_write_int_bad!(tunsetowner, nix::request_code_write!(b'T', 204, 4));
    nix::ioctl_write_int_bad!(tunsetgroup, nix::request_code_write!(b'T', 206, 4));
}
use ioctl::{tunsetgroup, tunsetiff, tunsetowner, tunsetpersist};

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
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(err(io::Error::from(io::ErrorKind::InvalidInput)));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(err)?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: flags(multiqueue),
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    let fd = f.as_raw_fd();
    let io = |e: nix::Error| err(io::Error::from(e));
    // SAFETY: fd is an open /dev/net/tun; the ifreq outlives the call.
    unsafe {
        tunsetiff(fd, &req).map_err(io)?;
        tunsetowner(fd, owner as libc::c_int).map_err(io)?;
        tunsetgroup(fd, group as libc::c_int).map_err(io)?;
        tunsetpersist(fd, 1).map_err(io)?;
    }
    Ok(())
}

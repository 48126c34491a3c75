//! The tun ioctls (`linux/if_tun.h`): opening `/dev/net/tun` on a named tap with `TUNSETIFF`, and
//! the owner, group and persistence of a tap.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `IFF_TAP`: an Ethernet (tap) device.
pub const IFF_TAP: libc::c_short = 0x0002;
/// `IFF_NO_PI`: no packet information header.
pub const IFF_NO_PI: libc::c_short = 0x1000;
/// `IFF_ONE_QUEUE` (ignored by modern kernels; KubeVirt still sets it).
pub const IFF_ONE_QUEUE: libc::c_short = 0x2000;
/// `IFF_VNET_HDR`: a virtio-net header on each packet.
pub const IFF_VNET_HDR: libc::c_short = 0x4000;
/// `IFF_TUN_EXCL` (0x8000 as a `c_short`): fail if the device exists.
pub const IFF_TUN_EXCL: libc::c_short = -0x8000;
/// `IFF_MULTI_QUEUE`: one fd per queue.
pub const IFF_MULTI_QUEUE: libc::c_short = 0x0100;

/// `struct ifreq` as `TUNSETIFF` reads it (40 bytes).
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

/// Opens `/dev/net/tun` and attaches it to the tap `name` with `flags` (`TUNSETIFF`; the kernel
/// creates the device when none of that name exists). Errors: `InvalidInput` when `name` is empty
/// or longer than 15 bytes; the open or ioctl error.
pub fn open(name: &str, flags: libc::c_short) -> io::Result<File> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: the fd is an open /dev/net/tun; the ifreq outlives the call.
    unsafe { ioctl::tunsetiff(file.as_raw_fd(), &req) }.map_err(io::Error::from)?;
    Ok(file)
}

/// `TUNSETOWNER`, `TUNSETGROUP` and `TUNSETPERSIST(1)` on an fd from [`open`]: the tap outlives
/// the fd and `owner:group` may open it.
pub fn persist(fd: BorrowedFd<'_>, owner: u32, group: u32) -> io::Result<()> {
    let fd = fd.as_raw_fd();
    // SAFETY: fd is an open /dev/net/tun attached to a tap; the calls take integers.
    unsafe {
        ioctl::tunsetowner(fd, owner as libc::c_int)?;
        ioctl::tunsetgroup(fd, group as libc::c_int)?;
        ioctl::tunsetpersist(fd, 1)?;
    }
    Ok(())
}

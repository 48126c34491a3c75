//! The calling thread's capability sets through raw `capget`/`capset` (version 3 headers, 64
//! capability bits in two 32-bit words; `capget(2)`, linux/capability.h). Two raw syscalls and no
//! allocation, so the functions are async-signal-safe and may run between `fork` and `exec`, where
//! virt-launcher-monitor raises `CAP_NET_BIND_SERVICE` as ambient for the launcher (as KubeVirt's
//! `cmd/virt-launcher-monitor` does) and the launcher clears the inheritable set before it execs QEMU.

/// `CAP_NET_BIND_SERVICE` (linux/capability.h).
pub const CAP_NET_BIND_SERVICE: u32 = 10;

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct Header {
    version: u32,
    pid: libc::c_int,
}

/// One 32-bit word of each set, as the kernel's `__user_cap_data_struct` lays it out.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The effective, permitted and inheritable sets of the calling thread, read by [`CapSets::get`].
pub struct CapSets {
    data: [Data; 2],
}

impl CapSets {
    /// Reads the calling thread's sets; `None` when `capget` fails.
    pub fn get() -> Option<CapSets> {
        let mut header = Header {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let mut data = [Data::default(); 2];
        // SAFETY: a valid version 3 header and two data structs, as the kernel's ABI for 64
        // capability bits takes them.
        let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
        (rc == 0).then_some(CapSets { data })
    }

    /// Writes the sets back; `false` when `capset` refuses them (the sets stay as they were).
    pub fn set(&self) -> bool {
        let mut header = Header {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        // SAFETY: as in `get`; the kernel only reads the data structs.
        unsafe { libc::syscall(libc::SYS_capset, &mut header, self.data.as_ptr()) == 0 }
    }

    /// Whether capability number `cap` (0..64) is in the permitted set.
    pub fn permitted(&self, cap: u32) -> bool {
        let (word, bit) = Self::locate(cap);
        self.data[word].permitted & bit != 0
    }

    /// Whether the inheritable set is empty.
    pub fn inheritable_empty(&self) -> bool {
        self.data.iter().all(|d| d.inheritable == 0)
    }

    /// Empties the inheritable set (in memory; [`CapSets::set`] writes it).
    pub fn clear_inheritable(&mut self) {
        for d in &mut self.data {
            d.inheritable = 0;
        }
    }

    /// Adds capability number `cap` (0..64) to the inheritable set (in memory).
    pub fn add_inheritable(&mut self, cap: u32) {
        let (word, bit) = Self::locate(cap);
        self.data[word].inheritable |= bit;
    }

    fn locate(cap: u32) -> (usize, u32) {
        (((cap / 32) & 1) as usize, 1u32 << (cap % 32))
    }
}

/// Raises capability number `cap` in the ambient set (`prctl(PR_CAP_AMBIENT_RAISE)`); it must be
/// permitted and inheritable already. `false` when the kernel refuses.
pub fn raise_ambient(cap: u32) -> bool {
    // SAFETY: prctl with integer arguments only.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_RAISE as libc::c_ulong,
            cap as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        ) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_sets_and_writes_them_back_unchanged() {
        let sets = CapSets::get().expect("capget");
        assert!(sets.set(), "capset of the unchanged sets");
    }

    #[test]
    fn bits_above_31_land_in_the_second_word() {
        assert_eq!(CapSets::locate(10), (0, 1 << 10));
        assert_eq!(CapSets::locate(40), (1, 1 << 8));
    }
}

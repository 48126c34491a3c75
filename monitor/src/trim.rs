//! Giving resident memory back to the kernel while the pod idles: the monitor's and the launcher's
//! resident sets are mostly clean file-backed pages (their own text and read-only data, and
//! libc's, ld.so's, libgcc_s's) that only the start path or one RPC touched, mapped in 64 KiB
//! blocks by the kernel's fault-around, plus freed heap.
//!
//! [`trim_resident`] returns free heap to the kernel (`malloc_trim(0)`, glibc) and drops the
//! process's pages of every private, non-writable, file-backed mapping that holds no anonymous
//! (copied-on-write) page: `madvise(MADV_PAGEOUT)` (Linux 5.4) first, which also reclaims the
//! pages from the page cache (and so from the pod's memory cgroup charge) when no other process
//! maps them, then `madvise(MADV_DONTNEED)`, which unmaps the shared ones (libc) from this
//! process only. Such a mapping is never written, so dropping it loses nothing: the pages the
//! process still runs fault back in from the file. A read-only mapping with a few anonymous
//! pages (the RELRO segment's relocated GOT) has only its other pages dropped, run by run from
//! `/proc/self/pagemap`; writable mappings and the kernel's `[vdso]` and `[vvar]` are left
//! alone; the main thread's dead stack below the caller's frame goes too.
//!
//! The first trim also turns the kernel's fault-around off for those mappings (a write-protect
//! userfaultfd registration), so what faults back is one page per fault, not a 64 KiB block:
//! measured on the idle launcher, its resident text went from 2.0 MiB to 0.43 MiB.
//! Best effort: every failure is ignored.
//!
//! Where that registration is refused (a kernel before 6.7, such as Debian 12's 6.1, or a seccomp
//! profile without userfaultfd), the mappings are advised `MADV_RANDOM` instead: fault-around
//! still maps the cached pages around a fault, but the fault itself no longer reads ahead, and
//! the trim's `MADV_PAGEOUT` has taken the launcher's own text out of the page cache, so what
//! faults back stays close to what runs.
//!
//! `QLAUNCHER_TRIM` (for measuring) is `0` (no trim) or a comma-separated list of: `fault-around`
//! (no userfaultfd registration, as on a kernel without `UFFD_FEATURE_WP_ASYNC`), `readahead`
//! (no `MADV_RANDOM` fallback: with `fault-around`, the trim as it was on 6.1 kernels),
//! `random` (`MADV_RANDOM` always) and `evict` (also drop the executable's page cache).

/// What a trim did: bytes of mappings advised and resident kilobytes they held before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// The summed length of the advised mappings, in bytes.
    pub advised_bytes: usize,
    /// Their resident size before the trim, in KiB (smaps' `Rss`).
    pub resident_kib: u64,
}

/// Whether `QLAUNCHER_TRIM=0` turned trimming off.
pub fn disabled() -> bool {
    std::env::var_os("QLAUNCHER_TRIM").is_some_and(|v| v == "0")
}

/// Trims as described in the module documentation.
pub fn trim_resident() -> Trimmed {
    let mut done = Trimmed::default();
    if disabled() {
        return done;
    }
    // SAFETY: malloc_trim only releases free heap memory.
    unsafe {
        libc::malloc_trim(0);
    }
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return done;
    };
    let mode = std::env::var("QLAUNCHER_TRIM").unwrap_or_default();
    let flag = |f: &str| mode.split(',').any(|m| m == f);
    let partly = partly_anonymous(&smaps);
    let candidates = droppable(&smaps);
    let fault_around_off =
        !flag("fault-around") && without_fault_around(&[&candidates[..], &partly[..]].concat());
    let random = flag("random") || flag("evict") || (!fault_around_off && !flag("readahead"));
    for m in partly {
        done.resident_kib += drop_file_pages(m);
    }
    for m in candidates {
        // SAFETY: the range is a whole private, non-writable file mapping of this process with no
        // anonymous page: dropping its pages only makes them fault in again from the file.
        unsafe {
            if random {
                libc::madvise(m.start as *mut libc::c_void, m.len, libc::MADV_RANDOM);
            }
            libc::madvise(m.start as *mut libc::c_void, m.len, libc::MADV_PAGEOUT);
            libc::madvise(m.start as *mut libc::c_void, m.len, libc::MADV_DONTNEED);
        }
        done.advised_bytes += m.len;
        done.resident_kib += m.rss_kib;
    }
    trim_main_stack(&smaps);
    if flag("evict") {
        evict_executable();
    }
    done
}

/// Turns the kernel's fault-around off for `mappings`, once per process: a fault on a file
/// mapping otherwise maps up to 64 KiB of cached pages around it (`fault_around_bytes`), so the
/// few hundred scattered text pages an idle launcher runs would keep megabytes resident again
/// after every trim. A mapping registered with a userfaultfd in write-protect mode gets no
/// fault-around (the kernel's `uffd_disable_fault_around`); with `UFFD_FEATURE_WP_ASYNC` (Linux
/// 6.7) any memory type may be registered and the kernel resolves write-protect faults itself,
/// and since nothing is ever write-protected (no `UFFDIO_WRITEPROTECT`) no fault is delivered:
/// the registration only makes each fault map its own page. The userfaultfd stays open for the
/// process's life (closing it would unregister). Best effort: on an older kernel, without the
/// permission (`vm.unprivileged_userfaultfd`, seccomp) or on any error nothing changes.
/// `QLAUNCHER_TRIM=fault-around` skips it (for measuring). Returns whether fault-around is off
/// (the registration of the first call took; later calls return that answer).
fn without_fault_around(mappings: &[Mapping]) -> bool {
    use std::sync::atomic::{AtomicU8, Ordering};
    const UNTRIED: u8 = 0;
    const OFF: u8 = 1;
    const REFUSED: u8 = 2;
    static STATE: AtomicU8 = AtomicU8::new(UNTRIED);
    match STATE.load(Ordering::Relaxed) {
        UNTRIED => {}
        state => return state == OFF,
    }
    let off = register_write_protect(mappings);
    STATE.store(if off { OFF } else { REFUSED }, Ordering::Relaxed);
    off
}

/// The userfaultfd registration of [`without_fault_around`]; whether any mapping registered.
fn register_write_protect(mappings: &[Mapping]) -> bool {
    #[repr(C)]
    struct UffdioApi {
        api: u64,
        features: u64,
        ioctls: u64,
    }
    #[repr(C)]
    struct UffdioRegister {
        start: u64,
        len: u64,
        mode: u64,
        ioctls: u64,
    }
    const UFFD_API: u64 = 0xaa;
    const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
    const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
    // _IOWR(0xaa, 0x3f, struct uffdio_api) and _IOWR(0xaa, 0x00, struct uffdio_register).
    const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
    const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
    // SAFETY: userfaultfd(2) with flags only; the fd is owned here.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd < 0 {
        return false;
    }
    let fd = fd as libc::c_int;
    let mut api = UffdioApi {
        api: UFFD_API,
        features: UFFD_FEATURE_WP_ASYNC,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API with a valid, initialised struct uffdio_api.
    if unsafe { libc::ioctl(fd, UFFDIO_API, &mut api) } != 0
        || api.features & UFFD_FEATURE_WP_ASYNC == 0
    {
        // SAFETY: our own fd.
        unsafe { libc::close(fd) };
        return false;
    }
    let mut registered = false;
    for m in mappings {
        let mut reg = UffdioRegister {
            start: m.start as u64,
            len: m.len as u64,
            mode: UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER of a whole mapping of ours with a valid struct.
        registered |= unsafe { libc::ioctl(fd, UFFDIO_REGISTER, &mut reg) } == 0;
    }
    if !registered {
        // SAFETY: our own fd.
        unsafe { libc::close(fd) };
    }
    registered
}

/// Experiment (`QLAUNCHER_TRIM=evict`): drops the executable's page cache too
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`, which skips pages still mapped), so that with
/// `MADV_RANDOM` only the pages the process touches again are read and mapped.
fn evict_executable() {
    let Ok(file) = std::fs::File::open("/proc/self/exe") else {
        return;
    };
    use std::os::fd::AsRawFd;
    // SAFETY: advice on an open fd of ours.
    unsafe {
        libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
    }
}

/// Drops the pages of a read-only private file mapping that holds some anonymous pages (a
/// RELRO segment with its few relocated GOT pages) page by page: `/proc/self/pagemap` tells
/// which pages are anonymous (present without bit 61, or swapped), and only the runs of the
/// others are advised `MADV_DONTNEED`. Returns the KiB advised.
fn drop_file_pages(m: Mapping) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    const PAGE: usize = 4096;
    let pages = m.len / PAGE;
    if pages == 0 || pages > 4096 {
        return 0;
    }
    let Ok(mut f) = std::fs::File::open("/proc/self/pagemap") else {
        return 0;
    };
    let mut raw = vec![0u8; pages * 8];
    if f.seek(SeekFrom::Start((m.start / PAGE * 8) as u64))
        .is_err()
        || f.read_exact(&mut raw).is_err()
    {
        return 0;
    }
    let keep = |i: usize| {
        let e = u64::from_ne_bytes(raw[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
        let (present, swapped, file) = (e >> 63 & 1 == 1, e >> 62 & 1 == 1, e >> 61 & 1 == 1);
        swapped || (present && !file)
    };
    let mut advised = 0;
    let mut i = 0;
    while i < pages {
        if keep(i) {
            i += 1;
            continue;
        }
        let run = i;
        while i < pages && !keep(i) {
            i += 1;
        }
        // SAFETY: pages [run, i) of a non-writable private file mapping hold no anonymous page
        // (and cannot gain one: the mapping is not writable), so dropping them loses nothing.
        unsafe {
            libc::madvise(
                (m.start + run * PAGE) as *mut libc::c_void,
                (i - run) * PAGE,
                libc::MADV_DONTNEED,
            );
        }
        advised += ((i - run) * PAGE / 1024) as u64;
    }
    advised
}

/// The private, non-writable file mappings that hold anonymous pages and are resident.
fn partly_anonymous(smaps: &str) -> Vec<Mapping> {
    mappings(smaps)
        .into_iter()
        .filter(|(m, eligible, anon)| *eligible && *anon > 0 && m.rss_kib > *anon)
        .map(|(m, _, _)| m)
        .collect()
}

/// Drops the main thread's stack pages below the caller's frame (start-up's deep calls left them
/// resident; they are dead by the ABI and fault back in as zero pages), keeping an 8 KiB margin
/// below the current stack pointer. Only on the main thread, whose stack is smaps' `[stack]`.
fn trim_main_stack(smaps: &str) {
    // SAFETY: getpid and gettid have no preconditions.
    if unsafe { libc::getpid() != libc::gettid() } {
        return;
    }
    let here = 0u8;
    let sp = std::ptr::addr_of!(here) as usize;
    let Some((start, len)) = smaps
        .lines()
        .filter(|l| l.ends_with("[stack]"))
        .find_map(|l| header(l).map(|(m, _)| (m.start, m.len)))
    else {
        return;
    };
    const MARGIN: usize = 8 * 1024;
    let end = sp.saturating_sub(MARGIN) & !0xfff;
    if end > start && sp < start + len {
        // SAFETY: [start, end) is the main thread's stack below this frame minus the margin:
        // nothing lives there (no caller's frame, no signal frame while this one runs).
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

/// One mapping [`trim_resident`] may drop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mapping {
    start: usize,
    len: usize,
    rss_kib: u64,
}

/// The mappings of an smaps text (`/proc/PID/smaps`) that are private, not writable, backed by a
/// file (a path), resident and without anonymous pages.
fn droppable(smaps: &str) -> Vec<Mapping> {
    mappings(smaps)
        .into_iter()
        .filter(|(m, eligible, anon)| *eligible && *anon == 0 && m.rss_kib > 0)
        .map(|(m, _, _)| m)
        .collect()
}

/// Every mapping of an smaps text with whether its header makes it eligible (private, not
/// writable, a file's) and its anonymous (and swapped) KiB.
fn mappings(smaps: &str) -> Vec<(Mapping, bool, u64)> {
    let mut out = Vec::new();
    let mut cur: Option<(Mapping, bool, u64)> = None;
    for line in smaps.lines() {
        if let Some((m, eligible)) = header(line) {
            out.extend(cur.take());
            cur = Some((m, eligible, 0));
            continue;
        }
        let Some((m, _, anon)) = cur.as_mut() else {
            continue;
        };
        let mut kv = line.split_whitespace();
        let (Some(key), Some(value)) = (kv.next(), kv.next()) else {
            continue;
        };
        let Ok(kib) = value.parse::<u64>() else {
            continue;
        };
        match key {
            "Rss:" => m.rss_kib = kib,
            "Anonymous:" | "Swap:" => *anon += kib,
            _ => {}
        }
    }
    out.extend(cur);
    out
}

/// A mapping header line of smaps (`start-end perms offset dev inode path`): the mapping and
/// whether its header makes it eligible; `None` for the other lines.
fn header(line: &str) -> Option<(Mapping, bool)> {
    let mut parts = line.split_whitespace();
    let range = parts.next()?;
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = parts.next()?.as_bytes();
    if perms.len() != 4 {
        return None;
    }
    let (_offset, _dev, inode) = (parts.next()?, parts.next()?, parts.next()?);
    let path = parts.next().unwrap_or("");
    let eligible = perms[0] == b'r'
        && perms[1] == b'-'
        && perms[3] == b'p'
        && inode != "0"
        && path.starts_with('/')
        && !line.ends_with(" (deleted)");
    Some((
        Mapping {
            start,
            len: end.saturating_sub(start),
            rss_kib: 0,
        },
        eligible,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
55d0a0000000-55d0a0200000 r--p 00000000 fe:01 123 /usr/bin/virt-launcher
Size:               2048 kB
Rss:                1092 kB
Anonymous:             0 kB
55d0a0200000-55d0a0700000 r-xp 00200000 fe:01 123 /usr/bin/virt-launcher
Size:               5120 kB
Rss:                2548 kB
Anonymous:             0 kB
55d0a0700000-55d0a0760000 r--p 00700000 fe:01 123 /usr/bin/virt-launcher
Size:                384 kB
Rss:                 360 kB
Anonymous:           360 kB
55d0a0760000-55d0a0765000 rw-p 00760000 fe:01 123 /usr/bin/virt-launcher
Size:                 20 kB
Rss:                  20 kB
Anonymous:            20 kB
55d0a1000000-55d0a1100000 rw-p 00000000 00:00 0 [heap]
Size:               1024 kB
Rss:                 532 kB
Anonymous:           532 kB
7f0000000000-7f0000150000 r-xp 00028000 fe:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
Size:               1368 kB
Rss:                1216 kB
Anonymous:             0 kB
7f0000200000-7f0000201000 r--p 00000000 fe:01 789 /tmp/gone (deleted)
Size:                  4 kB
Rss:                   4 kB
Anonymous:             0 kB
7f0000300000-7f0000301000 r-xp 00000000 fe:01 790 /usr/lib/idle.so
Size:                  4 kB
Rss:                   0 kB
Anonymous:             0 kB
7ffc00000000-7ffc00002000 r-xp 00000000 00:00 0 [vdso]
Size:                  8 kB
Rss:                   4 kB
Anonymous:             0 kB
";

    #[test]
    fn drops_clean_read_only_file_mappings_only() {
        let got = droppable(SMAPS);
        assert_eq!(
            got,
            vec![
                Mapping {
                    start: 0x55d0a0000000,
                    len: 0x200000,
                    rss_kib: 1092
                },
                Mapping {
                    start: 0x55d0a0200000,
                    len: 0x500000,
                    rss_kib: 2548
                },
                Mapping {
                    start: 0x7f0000000000,
                    len: 0x150000,
                    rss_kib: 1216
                },
            ]
        );
    }

    #[test]
    fn trimming_this_process_keeps_it_running() {
        let before = std::fs::read_to_string("/proc/self/smaps").unwrap();
        assert!(!droppable(&before).is_empty());
        trim_resident();
        // The text faults back in: formatting and allocating still work.
        assert_eq!(format!("{}", 41 + 1), "42");
        let after = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let uffd_wp = after
            .lines()
            .filter(|l| l.starts_with("VmFlags:") && l.split_whitespace().any(|f| f == "uw"))
            .count();
        eprintln!("mappings without fault-around (uffd-wp): {uffd_wp}");
    }
}

//! Giving back start-up memory once the domain runs: the launcher's resident set is mostly
//! file-backed pages of its own binary's text that only the start path touched, plus freed heap.
//!
//! [`trim_after_start`] returns the freed heap to the kernel (`malloc_trim(0)`, glibc) and asks
//! the kernel to drop the binary's text pages from this process (`madvise(MADV_PAGEOUT)`, Linux
//! 5.4, which also reclaims them from the page cache when nobody else maps them; else
//! `MADV_DONTNEED`). Only `r-xp` mappings of the executable are touched: text is never written
//! (no text relocations), so dropping it loses nothing and the pages the launcher still runs
//! fault back in. Relocated read-only data and anything writable are left alone.
//! `QLAUNCHER_TRIM=0` turns it off (for measuring).

/// Trims as described in the module documentation; returns the bytes of text advised. Best
/// effort: every failure is ignored.
pub fn trim_after_start() -> usize {
    if std::env::var_os("QLAUNCHER_TRIM").is_some_and(|v| v == "0") {
        return 0;
    }
    // SAFETY: malloc_trim only releases free heap memory.
    unsafe {
        libc::malloc_trim(0);
    }
    let Ok(exe) = std::fs::read_link("/proc/self/exe") else {
        return 0;
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return 0;
    };
    let exe = exe.to_string_lossy();
    let mut advised = 0;
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let (Some(range), Some(perms)) = (parts.next(), parts.next()) else {
            continue;
        };
        if perms != "r-xp" || parts.nth(3) != Some(&*exe) {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        let len = end.saturating_sub(start);
        // SAFETY: the range is a whole private, non-writable text mapping of this executable;
        // dropping its pages only makes them fault in again from the file.
        let r = unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_PAGEOUT) };
        if r != 0 {
            // SAFETY: as above.
            unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) };
        }
        advised += len;
    }
    advised
}

//! Giving back start-up memory once the domain runs, and again while the launcher idles: the
//! launcher's resident set is mostly clean file-backed pages (its own text and read-only data,
//! libc's) that only the start path or one RPC touched, plus freed heap.
//!
//! The work is [`qlauncher_monitor::trim::trim_resident`] (shared with the monitor, PID 1):
//! `malloc_trim(0)`, then `MADV_PAGEOUT` and `MADV_DONTNEED` of every private, non-writable,
//! file-backed mapping without anonymous pages, with fault-around off for them (or read-ahead
//! off, `MADV_RANDOM`, where the kernel refuses that).
//! [`trim_after_start`] runs it once the domain's
//! QEMU is watched, [`periodic`] every [`TRIM_INTERVAL`] while it runs (a read of smaps and one madvise per mapping, plus
//! the refaults of the code that runs next). [`limit_arenas`] keeps glibc to one malloc arena.
//! `QLAUNCHER_TRIM=0` turns trimming off (for measuring).

use std::time::Duration;

/// How often a launcher with a running domain gives its resident pages back.
pub const TRIM_INTERVAL: Duration = Duration::from_secs(10);

/// Trims once; returns the bytes of mappings advised. Best effort: every failure is ignored.
pub fn trim_after_start() -> usize {
    qlauncher_monitor::trim::trim_resident().advised_bytes
}

/// Trims every [`TRIM_INTERVAL`], forever (race it against the domain's supervision).
pub async fn periodic() {
    if qlauncher_monitor::trim::disabled() {
        return std::future::pending().await;
    }
    loop {
        tokio::time::sleep(TRIM_INTERVAL).await;
        let t = std::time::Instant::now();
        let done = qlauncher_monitor::trim::trim_resident();
        tracing::trace!(
            resident_kib = done.resident_kib,
            micros = t.elapsed().as_micros() as u64,
            "resident pages trimmed"
        );
    }
}

/// One malloc arena (`mallopt(M_ARENA_MAX, 1)`, glibc): the launcher runs a current-thread
/// runtime, and each short-lived blocking thread would otherwise get an arena of its own whose
/// freed pages stay resident. Call before any thread starts.
pub fn limit_arenas() {
    // SAFETY: mallopt only changes the allocator's tuning.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

//! Names unique among the tests of every test binary running now: they carry the test process id
//! and a counter shared by the whole kit.

use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The next value of the kit's counter (0, 1, 2, ... in this process).
pub fn next() -> u32 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// `<pid>-<counter>`: unique among the tests of every test binary running now.
pub fn unique() -> String {
    format!("{}-{}", std::process::id(), next())
}

/// `<prefix><pid mod 100000>x<counter>`: at most 15 bytes when `prefix` has at most 4 (fits a
/// network interface name such as a tap).
pub fn short(prefix: &str) -> String {
    format!("{prefix}{}x{}", std::process::id() % 100_000, next())
}

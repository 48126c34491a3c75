//! Log lines on stderr in the shape of KubeVirt's `kubevirt.io/client-go/log` (one JSON object per
//! line, keys in order: `component`, `level`, `msg`, `reason` when there is an error, `timestamp`
//! in UTC with microseconds), so `kubectl logs` and Velero's hook output read as for KubeVirt's
//! programs. Verbosity follows KubeVirt: `V(n)` lines are written only when `n` is at most the
//! level (default 2; `VIRT_LAUNCHER_LOG_VERBOSITY` or `-v` set it); errors and infos always are.

use std::io::Write;
use std::sync::atomic::{AtomicI32, Ordering};

static VERBOSITY: AtomicI32 = AtomicI32::new(2);

/// KubeVirt's default verbosity.
pub const DEFAULT_VERBOSITY: i32 = 2;

/// Sets the level `V(n)` lines are compared with.
pub fn set_verbosity(level: i32) {
    VERBOSITY.store(level, Ordering::Relaxed);
}

/// The current verbosity level.
pub fn verbosity() -> i32 {
    VERBOSITY.load(Ordering::Relaxed)
}

/// Writes one `info` line.
pub fn info(component: &str, msg: &str) {
    line(component, "info", msg, None);
}

/// Writes one `info` line if `level <= verbosity()` (KubeVirt's `Log.V(level).Info`).
pub fn v(level: i32, component: &str, msg: &str) {
    if level <= verbosity() {
        line(component, "info", msg, None);
    }
}

/// Writes one `warning` line.
pub fn warning(component: &str, msg: &str) {
    line(component, "warning", msg, None);
}

/// Writes one `error` line, with the error text as `reason` when given.
pub fn error(component: &str, msg: &str, reason: Option<&str>) {
    line(component, "error", msg, reason);
}

/// Writes one line at `level` (`info`, `warning`, `error`, `critical`).
pub fn line(component: &str, level: &str, msg: &str, reason: Option<&str>) {
    let mut out = String::with_capacity(128);
    out.push_str("{\"component\":");
    quote(&mut out, component);
    out.push_str(",\"level\":");
    quote(&mut out, level);
    out.push_str(",\"msg\":");
    quote(&mut out, msg);
    if let Some(reason) = reason {
        out.push_str(",\"reason\":");
        quote(&mut out, reason);
    }
    out.push_str(",\"timestamp\":");
    quote(&mut out, &timestamp_now());
    out.push_str("}\n");
    let _ = std::io::stderr().lock().write_all(out.as_bytes());
}

/// Appends `s` as a JSON string.
fn quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Now as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC).
pub fn timestamp_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    timestamp(now.as_secs() as i64, now.subsec_micros())
}

/// Unix seconds and microseconds as `YYYY-MM-DDTHH:MM:SS.ffffffZ` (UTC).
pub fn timestamp(secs: i64, micros: u32) -> String {
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let t = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{micros:06}Z",
        t / 3600,
        t / 60 % 60,
        t % 60
    )
}

/// The proleptic Gregorian date of a day count from 1970-01-01 (H. Hinnant's algorithm).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_utc_rfc3339_with_microseconds() {
        assert_eq!(timestamp(0, 0), "1970-01-01T00:00:00.000000Z");
        assert_eq!(timestamp(1_796_187_314, 42), "2026-12-02T04:55:14.000042Z");
        assert_eq!(timestamp(951_782_400, 0), "2000-02-29T00:00:00.000000Z");
    }

    #[test]
    fn strings_are_json_escaped() {
        let mut s = String::new();
        quote(&mut s, "a\"b\\c\nd\u{1}");
        assert_eq!(s, "\"a\\\"b\\\\c\\nd\\u0001\"");
    }
}

//! The monitor's JSON log, without a logging framework: one JSON object per line on standard
//! error, in the shape KubeVirt's components write (`pkg/log/log.go` of v1.9.0) and the launcher's
//! `qlauncher::log` formatter writes: sorted keys `component`, `level` (`debug`, `info`,
//! `warning`, `error`), `msg`, `pos` (`file.rs:line`), `timestamp` (RFC 3339 UTC with
//! microseconds), the VMI's `name`, `namespace`, `uid` when known, and the record's own fields.
//!
//! ```text
//! {"component":"virt-launcher-monitor","level":"info","msg":"virt-launcher started","pid":17,"pos":"pid1.rs:190","timestamp":"2026-12-01T10:41:07.123456Z"}
//! ```
//!
//! [`init`] sets the component, the VMI and the level once; the [`crate::info`], [`crate::warn`],
//! [`crate::error`] and [`crate::debug`] macros write records. Before `init` nothing is written.
use std::io::Write;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Record levels, least severe first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `debug`.
    Debug,
    /// `info`.
    Info,
    /// `warning`.
    Warning,
    /// `error`.
    Error,
}

impl Level {
    /// KubeVirt's name of the level.
    pub fn name(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }

    /// KubeVirt's `-v` verbosity to a level: up to 2 is `info`, 3 and more `debug` (as
    /// `qlauncher::log::level_for_verbosity`).
    pub fn for_verbosity(verbosity: u32) -> Level {
        if verbosity >= 3 {
            Level::Debug
        } else {
            Level::Info
        }
    }

    /// A `QLAUNCHER_LOG` directive's level (`trace`/`debug`, `info`, `warn`, `error`; the first
    /// comma-separated part without a target); `None` when it names none of them.
    pub fn from_directive(directive: &str) -> Option<Level> {
        match directive
            .split(',')
            .next()?
            .trim()
            .to_ascii_lowercase()
            .as_str()
        {
            "trace" | "debug" => Some(Level::Debug),
            "info" => Some(Level::Info),
            "warn" | "warning" => Some(Level::Warning),
            "error" => Some(Level::Error),
            _ => None,
        }
    }
}

/// A field value: an integer or a string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// A JSON number.
    Int(i64),
    /// A JSON string.
    Str(String),
}

macro_rules! int_value {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::Int(v as i64)
            }
        }
    )*};
}
int_value!(i32, u32, i64, u64, usize);

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_string())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Str(v)
    }
}

/// The VMI identity and component every record carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Logger {
    /// The `component` field.
    pub component: String,
    /// `metadata.name`, from `--name`.
    pub name: Option<String>,
    /// `metadata.namespace`, from `--namespace`.
    pub namespace: Option<String>,
    /// `metadata.uid`, from `--uid`.
    pub uid: Option<String>,
    /// The least severe level written.
    pub level: Option<Level>,
}

static LOGGER: OnceLock<Logger> = OnceLock::new();

/// Sets the process's logger; `QLAUNCHER_LOG` (a level) overrides the logger's level. A second
/// call does nothing.
pub fn init(mut logger: Logger) {
    if let Some(level) = std::env::var("QLAUNCHER_LOG")
        .ok()
        .and_then(|d| Level::from_directive(&d))
    {
        logger.level = Some(level);
    }
    let _ = LOGGER.set(logger);
}

impl Logger {
    /// One record as a JSON line without the newline; keys sorted, fixed keys win over fields.
    pub fn format(
        &self,
        level: Level,
        time: SystemTime,
        msg: &str,
        pos: &str,
        fields: &[(&str, Value)],
    ) -> String {
        let mut keys: Vec<(&str, Value)> = Vec::with_capacity(fields.len() + 8);
        let fixed = [
            ("component", Some(self.component.as_str())),
            ("level", Some(level.name())),
            ("msg", Some(msg)),
            ("name", self.name.as_deref()),
            ("namespace", self.namespace.as_deref()),
            ("pos", Some(pos)),
            ("uid", self.uid.as_deref()),
        ];
        let timestamp = rfc3339_micros(time);
        for (k, v) in fixed {
            if let Some(v) = v {
                keys.push((k, Value::Str(v.to_string())));
            }
        }
        keys.push(("timestamp", Value::Str(timestamp)));
        for (k, v) in fields {
            if !keys.iter().any(|(f, _)| f == k) {
                keys.push((k, v.clone()));
            }
        }
        keys.sort_by(|a, b| a.0.cmp(b.0));
        let mut out = String::with_capacity(256);
        out.push('{');
        for (i, (k, v)) in keys.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_string(&mut out, k);
            out.push(':');
            match v {
                Value::Int(n) => out.push_str(&n.to_string()),
                Value::Str(s) => push_json_string(&mut out, s),
            }
        }
        out.push('}');
        out
    }
}

/// Writes one record when the logger is set and the level is enabled. `pos` is `file!()`; only
/// its file name is kept.
pub fn emit(level: Level, file: &str, line: u32, msg: &str, fields: &[(&str, Value)]) {
    let Some(logger) = LOGGER.get() else {
        return;
    };
    if level < logger.level.unwrap_or(Level::Info) {
        return;
    }
    let base = file.rsplit('/').next().unwrap_or(file);
    let pos = format!("{base}:{line}");
    let mut text = logger.format(level, SystemTime::now(), msg, &pos, fields);
    text.push('\n');
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Appends `s` as a JSON string literal.
fn push_json_string(out: &mut String, s: &str) {
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

/// Formats a time as RFC 3339 in UTC with microseconds: `2026-11-30T00:41:07.123456Z`.
/// Times before 1970 print as the epoch.
pub fn rfc3339_micros(time: SystemTime) -> String {
    let d = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Writes a record: `log!(Level::Info, "msg", key = value, ...)`.
#[macro_export]
macro_rules! log {
    ($level:expr, $msg:expr $(, $k:ident = $v:expr)* $(,)?) => {
        $crate::log::emit(
            $level,
            file!(),
            line!(),
            &$msg,
            &[$((stringify!($k), $crate::log::Value::from($v))),*],
        )
    };
}

/// An `info` record: `info!("msg", key = value, ...)`.
#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { $crate::log!($crate::log::Level::Info, $($t)*) };
}

/// A `warning` record.
#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { $crate::log!($crate::log::Level::Warning, $($t)*) };
}

/// An `error` record.
#[macro_export]
macro_rules! error {
    ($($t:tt)*) => { $crate::log!($crate::log::Level::Error, $($t)*) };
}

/// A `debug` record.
#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => { $crate::log!($crate::log::Level::Debug, $($t)*) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn record_is_one_sorted_json_line_with_the_vmi() {
        let logger = Logger {
            component: "virt-launcher-monitor".into(),
            name: Some("testvmi".into()),
            namespace: Some("default".into()),
            uid: Some("1234".into()),
            level: None,
        };
        let line = logger.format(
            Level::Warning,
            UNIX_EPOCH + Duration::from_micros(1_796_000_467_123_456),
            "dirty \"virt-launcher\"\n shutdown",
            "pid1.rs:10",
            &[("code", Value::Int(3)), ("msg", "no".into())],
        );
        assert_eq!(
            line,
            r#"{"code":3,"component":"virt-launcher-monitor","level":"warning","msg":"dirty \"virt-launcher\"\n shutdown","name":"testvmi","namespace":"default","pos":"pid1.rs:10","timestamp":"2026-11-30T01:01:07.123456Z","uid":"1234"}"#
        );
    }

    #[test]
    fn levels_and_directives() {
        assert_eq!(Level::for_verbosity(2), Level::Info);
        assert_eq!(Level::for_verbosity(4), Level::Debug);
        assert_eq!(
            Level::from_directive("warn,qlauncher=debug"),
            Some(Level::Warning)
        );
        assert_eq!(Level::from_directive("qlauncher=debug"), None);
    }

    #[test]
    fn leap_day_dates() {
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339_micros(t), "2000-02-29T00:00:00.000000Z");
    }
}

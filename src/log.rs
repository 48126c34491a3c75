//! JSON logs in the shape KubeVirt's components write them.
//!
//! Every record is one JSON object on one line of standard error, as `pkg/log/log.go` of KubeVirt
//! v1.9.0 prints them: `component` (`virt-launcher`, `virt-launcher-monitor`), `level` (`debug`,
//! `info`, `warning`, `error`), `msg`, `pos` (`file.rs:line`), `timestamp` (RFC 3339 in UTC with
//! microseconds, e.g. `2026-11-30T00:41:07.123456Z`), the VMI's `name`, `namespace` and `uid` when
//! they are known, and any further structured field of the `tracing` event. Example:
//!
//! ```text
//! {"component":"virt-launcher-monitor","level":"info","msg":"virt-launcher exited","name":"testvmi","namespace":"default","pos":"pid1.rs:140","status":0,"timestamp":"2026-11-30T00:41:07.123456Z","uid":"1234"}
//! ```
//!
//! [`init`] installs the formatter as the global `tracing` subscriber; [`Logger::format`] is the
//! pure formatting step, used by the tests.
use std::fmt;
use std::time::SystemTime;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The VMI a process works for, added to every record (KubeVirt's `log.Log.Object(vmi)`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmiRef {
    /// `metadata.name`, from `--name`.
    pub name: Option<String>,
    /// `metadata.namespace`, from `--namespace`.
    pub namespace: Option<String>,
    /// `metadata.uid`, from `--uid`.
    pub uid: Option<String>,
}

/// One log record before formatting: what [`Logger::format`] turns into a line.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// `tracing` level; `WARN` prints as KubeVirt's `warning`, `TRACE` as `debug`.
    pub level: Level,
    /// Time of the event.
    pub time: SystemTime,
    /// The message.
    pub msg: String,
    /// `file:line` of the call site, file name only.
    pub pos: Option<String>,
    /// Further structured fields, in the order they were given.
    pub fields: Vec<(String, Value)>,
}

/// The formatter: a component name and the VMI it logs for.
#[derive(Debug, Clone)]
pub struct Logger {
    /// The `component` field (`virt-launcher`, `virt-launcher-monitor`).
    pub component: String,
    /// The VMI identity added to every record.
    pub vmi: VmiRef,
}

impl Logger {
    /// Formats one record as a single JSON line without the trailing newline. Keys are sorted, as
    /// Go's JSON encoder sorts map keys; structured fields never replace the fixed keys.
    pub fn format(&self, record: &Record) -> String {
        let mut map = Map::new();
        for (k, v) in &record.fields {
            map.insert(k.clone(), v.clone());
        }
        map.insert("component".into(), self.component.clone().into());
        map.insert("level".into(), level_name(record.level).into());
        map.insert("msg".into(), record.msg.clone().into());
        map.insert("timestamp".into(), rfc3339_micros(record.time).into());
        if let Some(pos) = &record.pos {
            map.insert("pos".into(), pos.clone().into());
        }
        for (key, value) in [
            ("name", &self.vmi.name),
            ("namespace", &self.vmi.namespace),
            ("uid", &self.vmi.uid),
        ] {
            if let Some(v) = value {
                map.insert(key.into(), v.clone().into());
            }
        }
        // serde_json's Map is a BTreeMap (no preserve_order feature): keys come out sorted.
        Value::Object(map).to_string()
    }
}

/// KubeVirt's level names (`pkg/log/log.go`: debug, info, warning, error).
pub fn level_name(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG | Level::TRACE => "debug",
    }
}

/// Formats a time as RFC 3339 in UTC with microseconds (`2026-11-30T00:41:07.123456Z`): the
/// monitor crate's formatter, shared so that both components print the same timestamps.
pub use qlauncher_monitor::log::rfc3339_micros;

/// Collects an event's fields: `message` becomes `msg`, the rest structured values.
#[derive(Default)]
struct FieldCollector {
    msg: String,
    fields: Vec<(String, Value)>,
}

impl FieldCollector {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.msg = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
        } else {
            self.fields.push((field.name().to_string(), value));
        }
    }
}

impl Visit for FieldCollector {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        // The whole chain, one cause after the other, as KubeVirt's `reason` field shows it.
        self.put(field, Value::String(crate::sys::error::error_chain(value)));
    }
}

impl<S, N> FormatEvent<S, N> for Logger
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = FieldCollector::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let pos = meta.file().map(|f| {
            let file = f.rsplit('/').next().unwrap_or(f);
            format!("{file}:{}", meta.line().unwrap_or(0))
        });
        let record = Record {
            level: *meta.level(),
            time: SystemTime::now(),
            msg: fields.msg,
            pos,
            fields: fields.fields,
        };
        writeln!(writer, "{}", self.format(&record))
    }
}

/// Maps KubeVirt's `-v` verbosity (and `VIRT_LAUNCHER_LOG_VERBOSITY`) to a level: up to 2 is
/// `info`, 3 and more is `debug` (KubeVirt logs its verbose `V(3)`..`V(4)` lines at debug depth).
pub fn level_for_verbosity(verbosity: u32) -> Level {
    if verbosity >= 3 {
        Level::DEBUG
    } else {
        Level::INFO
    }
}

/// Installs the JSON formatter as the global subscriber writing to standard error. When
/// `QLAUNCHER_LOG` is set it is used as an `EnvFilter` directive (e.g. `debug`), otherwise
/// `verbosity` picks the level as [`level_for_verbosity`] says. A second call does nothing.
pub fn init(component: &str, vmi: VmiRef, verbosity: u32) {
    let logger = Logger {
        component: component.to_string(),
        vmi,
    };
    let filter = match std::env::var("QLAUNCHER_LOG") {
        Ok(directive) => tracing_subscriber::EnvFilter::new(directive),
        Err(_) => tracing_subscriber::EnvFilter::new(
            level_for_verbosity(verbosity).to_string().to_lowercase(),
        ),
    };
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .event_format(logger)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn record_is_one_sorted_json_line_with_the_vmi() {
        let logger = Logger {
            component: "virt-launcher".into(),
            vmi: VmiRef {
                name: Some("testvmi".into()),
                namespace: Some("default".into()),
                uid: Some("1234".into()),
            },
        };
        let record = Record {
            level: Level::WARN,
            time: UNIX_EPOCH + Duration::from_micros(1_796_000_467_123_456),
            msg: "grace period expired, killing QEMU".into(),
            pos: Some("grace.rs:10".into()),
            fields: vec![("pid".into(), 42.into()), ("msg".into(), "no".into())],
        };
        assert_eq!(
            logger.format(&record),
            r#"{"component":"virt-launcher","level":"warning","msg":"grace period expired, killing QEMU","name":"testvmi","namespace":"default","pid":42,"pos":"grace.rs:10","timestamp":"2026-11-30T01:01:07.123456Z","uid":"1234"}"#
        );
    }

    #[test]
    fn unknown_vmi_fields_are_left_out() {
        let logger = Logger {
            component: "virt-launcher-monitor".into(),
            vmi: VmiRef::default(),
        };
        let record = Record {
            level: Level::TRACE,
            time: UNIX_EPOCH,
            msg: "m".into(),
            pos: None,
            fields: vec![],
        };
        assert_eq!(
            logger.format(&record),
            r#"{"component":"virt-launcher-monitor","level":"debug","msg":"m","timestamp":"1970-01-01T00:00:00.000000Z"}"#
        );
    }

    #[test]
    fn leap_day_dates() {
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339_micros(t), "2000-02-29T00:00:00.000000Z");
    }
}

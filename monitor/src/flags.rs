//! Go-style flag scanning for the `virt-launcher-monitor` and `virt-launcher` command lines.
//!
//! virt-controller renders the compute container's command (`pkg/virt-controller/services/template.go`)
//! with Go `pflag` syntax, and the flag set grows between KubeVirt releases. Both processes therefore
//! take a table of known flags and accept everything else: `--flag value`, `--flag=value`, `-flag`,
//! boolean `--flag` or `--flag=true`. An unknown flag consumes the next argument as its value when that
//! argument does not start with `-`. Ignored flags are returned so the caller can log them.
use std::collections::BTreeMap;
use std::time::Duration;

/// A flag value that does not parse. Names the flag (without dashes) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagError {
    /// Flag name without dashes.
    pub flag: String,
    /// What is wrong with the value.
    pub reason: String,
}

impl std::fmt::Display for FlagError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "flag --{}: {}", self.flag, self.reason)
    }
}

impl std::error::Error for FlagError {}

/// Whether a known flag takes a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    /// `--flag` alone means `true`; `--flag=false` is accepted.
    Bool,
    /// `--flag value` or `--flag=value`.
    Value,
}

/// The result of [`scan`]: known flags by name (last occurrence wins) and the ignored arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScannedFlags {
    /// Known flag name (without dashes) to its value; booleans hold `"true"` or what followed `=`.
    pub values: BTreeMap<String, String>,
    /// Unknown flags and positional arguments, each as written (a flag with its value joined by `=`).
    pub ignored: Vec<String>,
}

impl ScannedFlags {
    /// The value of `name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// A boolean flag: absent is `false`; `true`, `1`, `t`, `TRUE` and `True` are true (Go's
    /// `strconv.ParseBool`). Errors name the flag.
    pub fn bool(&self, name: &str) -> Result<bool, FlagError> {
        match self.get(name) {
            None => Ok(false),
            Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
            Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
            Some(other) => Err(FlagError {
                flag: name.to_string(),
                reason: format!("{other:?} is not a boolean"),
            }),
        }
    }

    /// A string flag with a default.
    pub fn string(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or(default).to_string()
    }

    /// An integer flag with a default. Errors name the flag.
    pub fn int<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T, FlagError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| FlagError {
                flag: name.to_string(),
                reason: format!("{v:?} is not an integer"),
            }),
        }
    }

    /// A Go duration flag (`240s`, `3m`, `1h30m`, `1.5s`) with a default. Errors name the flag.
    pub fn duration(&self, name: &str, default: Duration) -> Result<Duration, FlagError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => parse_go_duration(v).ok_or_else(|| FlagError {
                flag: name.to_string(),
                reason: format!("{v:?} is not a duration"),
            }),
        }
    }
}

/// Scans `args` (without the program name) against `known`.
pub fn scan(args: &[String], known: &[(&str, FlagKind)]) -> ScannedFlags {
    let mut out = ScannedFlags::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some(body) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            out.ignored.push(arg.clone());
            continue;
        };
        if body.is_empty() {
            out.ignored.push(arg.clone());
            continue;
        }
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (body, None),
        };
        let kind = known.iter().find(|(n, _)| *n == name).map(|(_, k)| *k);
        let takes_next = |i: usize| args.get(i).filter(|next| !next.starts_with('-')).cloned();
        match (kind, inline) {
            (Some(_), Some(v)) => {
                out.values.insert(name.to_string(), v);
            }
            (Some(FlagKind::Bool), None) => {
                out.values.insert(name.to_string(), "true".to_string());
            }
            (Some(FlagKind::Value), None) => {
                // pflag takes the next argument whatever it looks like (`-v -1` is not used).
                let v = args.get(i).cloned().unwrap_or_default();
                i += 1;
                out.values.insert(name.to_string(), v);
            }
            (None, Some(_)) => out.ignored.push(arg.clone()),
            (None, None) => match takes_next(i) {
                Some(v) => {
                    i += 1;
                    out.ignored.push(format!("{arg}={v}"));
                }
                None => out.ignored.push(arg.clone()),
            },
        }
    }
    out
}

/// Parses a Go `time.ParseDuration` string: a sequence of decimal numbers each with a unit
/// `ns`, `us`, `µs`, `ms`, `s`, `m`, `h`, e.g. `240s`, `1h30m`, `1.5s`; `0` alone is zero. Negative
/// durations are refused (`None`), as is anything else Go would refuse.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest.is_empty() {
        return None;
    }
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let number: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total_nanos += number * scale;
    }
    if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
        return None;
    }
    Some(Duration::from_nanos(total_nanos.round() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    const KNOWN: &[(&str, FlagKind)] = &[
        ("name", FlagKind::Value),
        ("allow-emulation", FlagKind::Bool),
        ("v", FlagKind::Value),
    ];

    #[test]
    fn known_unknown_and_bool_flags() {
        let scanned = scan(
            &args(&[
                "--name",
                "vmi",
                "--allow-emulation",
                "--new-flag",
                "x",
                "--other=1",
                "--lonely",
                "-v",
                "4",
                "stray",
            ]),
            KNOWN,
        );
        let expected = ScannedFlags {
            values: [("name", "vmi"), ("allow-emulation", "true"), ("v", "4")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ignored: args(&["--new-flag=x", "--other=1", "--lonely", "stray"]),
        };
        assert_eq!(scanned, expected);
    }

    #[test]
    fn inline_values_and_single_dash() {
        let scanned = scan(&args(&["-name=a", "--allow-emulation=false"]), KNOWN);
        assert_eq!(scanned.get("name"), Some("a"));
        assert!(!scanned.bool("allow-emulation").unwrap());
    }

    #[test]
    fn bad_values_name_the_flag() {
        let scanned = scan(&args(&["--v", "x", "--allow-emulation=yes"]), KNOWN);
        assert_eq!(
            scanned.int::<u32>("v", 2).unwrap_err().to_string(),
            "flag --v: \"x\" is not an integer"
        );
        assert_eq!(
            scanned.bool("allow-emulation").unwrap_err().to_string(),
            "flag --allow-emulation: \"yes\" is not a boolean"
        );
    }

    #[test]
    fn go_durations() {
        let cases: &[(&str, Option<Duration>)] = &[
            ("240s", Some(Duration::from_secs(240))),
            ("3m", Some(Duration::from_secs(180))),
            ("1h30m", Some(Duration::from_secs(5400))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("300ms", Some(Duration::from_millis(300))),
            ("0", Some(Duration::ZERO)),
            ("10", None),
            ("-5s", None),
            ("", None),
            ("5x", None),
        ];
        for (input, expected) in cases {
            assert_eq!(parse_go_duration(input), *expected, "{input}");
        }
    }
}

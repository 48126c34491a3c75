//! Command-line flags the way KubeVirt's Go programs read them: spf13/pflag's `CommandLine`
//! with `ExitOnError` (virt-tail, virt-probe, virt-freezer; `cmd/virt-*/`, v1.9.0).
//!
//! The subset those programs use: long flags `--name value` and `--name=value`; booleans
//! `--name` (true) and `--name=false` (a separate word is never a boolean's value); one-letter
//! flags (Go's `-v`, added through `AddGoFlag`) as `-v 3`, `-v=3` or `-v3`; `--` ends the flags;
//! other words (and a lone `-`) are positional wherever they stand (pflag intersperses).
//! `-h`/`--help` prints the usage and exits 0 (pflag's `ErrHelp`). Any other problem (an unknown
//! flag, a missing value, a value that does not parse) prints pflag's message and the usage and
//! exits 2, unless unknown flags are tolerated (virt-tail's `ParseErrorsWhitelist{UnknownFlags}`):
//! then an unknown flag is dropped with its value (`--x=v`, or the next word when it does not
//! start with `-`).

use std::collections::HashMap;
use std::io::Write;

/// What a flag holds (pflag's `String`, `Int32`, `Bool`, and Go's `-v` level).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Any word, `""` by default.
    String,
    /// A 32-bit signed integer, Go's `strconv.ParseInt(s, 0, 32)` syntax.
    Int32,
    /// `true`/`false` in Go's `strconv.ParseBool` spellings; `--name` alone is true.
    Bool,
}

/// One flag of a program: its name (the long form, or a one-letter name that is also its
/// shorthand, as pflag makes Go's `v`), kind, default (as text) and usage line.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    /// `domainName`, `timeoutSeconds`, `v`, ...
    pub name: &'static str,
    /// How the value parses.
    pub kind: Kind,
    /// The default shown in the usage (`""` for none).
    pub default: &'static str,
    /// The usage text.
    pub usage: &'static str,
}

/// The parsed command line: each given flag's last value (text, already checked against its
/// kind) and the positional arguments in order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Parsed {
    values: HashMap<&'static str, String>,
    /// The positional arguments (pflag's `Args()`).
    pub args: Vec<String>,
}

impl Parsed {
    /// The value of a string flag, `""` when not given.
    pub fn string(&self, name: &str) -> String {
        self.values.get(name).cloned().unwrap_or_default()
    }

    /// The value of an Int32 flag, `default` when not given.
    pub fn int32(&self, name: &str, default: i32) -> i32 {
        self.values
            .get(name)
            .and_then(|v| parse_int32(v))
            .unwrap_or(default)
    }

    /// The value of a Bool flag, false when not given.
    pub fn bool(&self, name: &str) -> bool {
        self.values
            .get(name)
            .and_then(|v| parse_bool(v))
            .unwrap_or(false)
    }

    /// Whether the flag was given at all.
    pub fn given(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }
}

/// Why parsing stopped: help asked for (exit 0) or an error message (exit 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// `-h` or `--help`.
    Help,
    /// pflag's message, e.g. `unknown flag: --x`.
    Error(String),
}

/// Parses `args` (without the program name) against `flags`.
///
/// Errors: [`Stop::Help`] for `-h`/`--help`; [`Stop::Error`] with pflag's wording for an unknown
/// flag (unless `tolerate_unknown`), a flag without its value, or a value of the wrong kind.
pub fn parse(flags: &[Flag], args: &[String], tolerate_unknown: bool) -> Result<Parsed, Stop> {
    let mut parsed = Parsed::default();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            parsed.args.extend(args[i..].iter().cloned());
            break;
        }
        if !arg.starts_with('-') || arg == "-" {
            parsed.args.push(arg.clone());
            continue;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            if name.is_empty() || name.starts_with('-') || name.starts_with('=') {
                return Err(Stop::Error(format!("bad flag syntax: {arg}")));
            }
            let Some(flag) = flags.iter().find(|f| f.name == name) else {
                if name == "help" {
                    return Err(Stop::Help);
                }
                if tolerate_unknown {
                    if inline.is_none() && i < args.len() && !args[i].starts_with('-') {
                        i += 1;
                    }
                    continue;
                }
                return Err(Stop::Error(format!("unknown flag: --{name}")));
            };
            let value = match (inline, flag.kind) {
                (Some(v), _) => v,
                (None, Kind::Bool) => "true".to_string(),
                (None, _) if i < args.len() => {
                    i += 1;
                    args[i - 1].clone()
                }
                (None, _) => return Err(Stop::Error(format!("flag needs an argument: {arg}"))),
            };
            set(&mut parsed, flag, value, &format!("--{name}"))?;
            continue;
        }
        // Shorthands: `-abc`, each letter a flag; a non-boolean takes the rest of the word, or
        // the next word.
        let letters = &arg[1..];
        let mut pos = 0;
        while pos < letters.len() {
            let c = &letters[pos..pos + letters[pos..].chars().next().map_or(1, char::len_utf8)];
            pos += c.len();
            let flag = flags.iter().find(|f| f.name == c);
            let Some(flag) = flag else {
                if c == "h" {
                    return Err(Stop::Help);
                }
                if tolerate_unknown {
                    let rest = &letters[pos..];
                    if rest.is_empty() && i < args.len() && !args[i].starts_with('-') {
                        i += 1;
                    }
                    break;
                }
                return Err(Stop::Error(format!(
                    "unknown shorthand flag: '{c}' in -{letters}"
                )));
            };
            let rest = &letters[pos..];
            let value = if let Some(v) = rest.strip_prefix('=') {
                pos = letters.len();
                v.to_string()
            } else if flag.kind == Kind::Bool {
                "true".to_string()
            } else if !rest.is_empty() {
                pos = letters.len();
                rest.to_string()
            } else if i < args.len() {
                i += 1;
                args[i - 1].clone()
            } else {
                return Err(Stop::Error(format!(
                    "flag needs an argument: '{c}' in -{letters}"
                )));
            };
            set(&mut parsed, flag, value, &format!("-{c}"))?;
        }
    }
    Ok(parsed)
}

fn set(parsed: &mut Parsed, flag: &Flag, value: String, spelled: &str) -> Result<(), Stop> {
    let ok = match flag.kind {
        Kind::String => true,
        Kind::Int32 => parse_int32(&value).is_some(),
        Kind::Bool => parse_bool(&value).is_some(),
    };
    if !ok {
        let why = match flag.kind {
            Kind::Bool => "strconv.ParseBool: parsing",
            _ => "strconv.ParseInt: parsing",
        };
        return Err(Stop::Error(format!(
            "invalid argument \"{value}\" for \"{spelled}\" flag: {why} \"{value}\": invalid syntax"
        )));
    }
    parsed.values.insert(flag.name, value);
    Ok(())
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `strconv.ParseInt(s, 0, 32)`: an optional sign, then decimal, `0x`/`0o`/`0b` or a
/// leading-`0` octal number, with `_` allowed between digits after a prefix; None when it does not
/// parse or does not fit in 32 bits.
pub fn parse_int32(s: &str) -> Option<i32> {
    let (negative, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d.to_string(), true)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d.to_string(), true)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d.to_string(), true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_string(), true)
    } else {
        (10, lower.clone(), false)
    };
    if digits.is_empty() || (!prefixed && digits.contains('_')) {
        return None;
    }
    if digits.starts_with('_') || digits.ends_with('_') || digits.contains("__") {
        return None;
    }
    let digits: String = digits.chars().filter(|c| *c != '_').collect();
    if digits.starts_with(['+', '-']) {
        return None;
    }
    let magnitude = i64::from_str_radix(&digits, radix).ok()?;
    let value = if negative { -magnitude } else { magnitude };
    i32::try_from(value).ok()
}

/// pflag's usage text: `Usage of <program>:` and one line per flag.
pub fn usage(program: &str, flags: &[Flag]) -> String {
    let mut out = format!("Usage of {program}:\n");
    for f in flags {
        let spelled = if f.name.len() == 1 {
            format!("  -{}, --{}", f.name, f.name)
        } else {
            format!("      --{}", f.name)
        };
        let kind = match f.kind {
            Kind::String => " string",
            Kind::Int32 => " int32",
            Kind::Bool => "",
        };
        let default = match (f.kind, f.default) {
            (_, "") | (Kind::Bool, "false") => String::new(),
            (Kind::String, d) => format!(" (default \"{d}\")"),
            (_, d) => format!(" (default {d})"),
        };
        out.push_str(&format!("{spelled}{kind}   {}{default}\n", f.usage));
    }
    out
}

/// Parses the process's own arguments, or ends the process as pflag's `ExitOnError` does: the
/// usage on stderr and exit 0 for help; the message and the usage on stderr and exit 2 otherwise.
pub fn parse_or_exit(program: &str, flags: &[Flag], tolerate_unknown: bool) -> Parsed {
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    match parse(flags, &args, tolerate_unknown) {
        Ok(parsed) => parsed,
        Err(stop) => {
            let mut err = std::io::stderr().lock();
            let code = match stop {
                Stop::Help => 0,
                Stop::Error(message) => {
                    let _ = writeln!(err, "{message}");
                    2
                }
            };
            let _ = write!(err, "{}", usage(program, flags));
            std::process::exit(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: [Flag; 4] = [
        Flag {
            name: "domainName",
            kind: Kind::String,
            default: "",
            usage: "d",
        },
        Flag {
            name: "timeoutSeconds",
            kind: Kind::Int32,
            default: "1",
            usage: "t",
        },
        Flag {
            name: "guestAgentPing",
            kind: Kind::Bool,
            default: "false",
            usage: "g",
        },
        Flag {
            name: "v",
            kind: Kind::Int32,
            default: "2",
            usage: "v",
        },
    ];

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn long_short_bool_and_positional_forms() {
        let p = parse(
            &FLAGS,
            &words("a --domainName ns_vm --timeoutSeconds=3 --guestAgentPing b -v 4 -- --x -y"),
            false,
        )
        .unwrap();
        assert_eq!(p.string("domainName"), "ns_vm");
        assert_eq!(p.int32("timeoutSeconds", 1), 3);
        assert!(p.bool("guestAgentPing"));
        assert_eq!(p.int32("v", 2), 4);
        assert_eq!(p.args, words("a b --x -y"));
        let p = parse(&FLAGS, &words("-v5 --guestAgentPing=false"), false).unwrap();
        assert_eq!(p.int32("v", 2), 5);
        assert!(!p.bool("guestAgentPing"));
        assert_eq!(
            parse(&FLAGS, &words("-v=6"), false).unwrap().int32("v", 2),
            6
        );
        // A boolean never takes the next word.
        let p = parse(&FLAGS, &words("--guestAgentPing false"), false).unwrap();
        assert!(p.bool("guestAgentPing"));
        assert_eq!(p.args, words("false"));
    }

    #[test]
    fn errors_and_help() {
        assert_eq!(
            parse(&FLAGS, &words("--nope"), false),
            Err(Stop::Error("unknown flag: --nope".into()))
        );
        assert_eq!(
            parse(&FLAGS, &words("-x"), false),
            Err(Stop::Error("unknown shorthand flag: 'x' in -x".into()))
        );
        assert_eq!(
            parse(&FLAGS, &words("--domainName"), false),
            Err(Stop::Error("flag needs an argument: --domainName".into()))
        );
        assert!(matches!(
            parse(&FLAGS, &words("--timeoutSeconds abc"), false),
            Err(Stop::Error(m)) if m.starts_with("invalid argument \"abc\" for \"--timeoutSeconds\"")
        ));
        assert_eq!(parse(&FLAGS, &words("--help"), false), Err(Stop::Help));
        assert_eq!(parse(&FLAGS, &words("-h"), true), Err(Stop::Help));
    }

    #[test]
    fn tolerated_unknown_flags_drop_their_value() {
        let p = parse(
            &FLAGS,
            &words("--nope value --x=1 -q w --domainName d z"),
            true,
        )
        .unwrap();
        assert_eq!(p.string("domainName"), "d");
        assert_eq!(p.args, words("z"));
    }

    #[test]
    fn go_integer_syntax() {
        assert_eq!(parse_int32("10"), Some(10));
        assert_eq!(parse_int32("-0x10"), Some(-16));
        assert_eq!(parse_int32("010"), Some(8));
        assert_eq!(parse_int32("0b1_0"), Some(2));
        assert_eq!(parse_int32("1_0"), None);
        assert_eq!(parse_int32("2147483648"), None);
        assert_eq!(parse_int32(""), None);
        assert_eq!(parse_int32("--1"), None);
    }
}

//! Tier 2, clock: what an answer may change in `<clock>`: the offset (`@offset`, `@adjustment`,
//! `@basis`, `@timezone`) and the `<timer name present tickpolicy track>` of the timers KubeVirt's
//! converter writes (rtc, pit, kvmclock, hpet, hypervclock), as typed [`ClockEdit`]s on the
//! plan's [`ClockPlan`](qlauncher_core::cmdline::plan::ClockPlan), from which the `-rtc` options, `TZ`, the PIT global, HPET and the
//! `kvmclock`/`hv-time` CPU flags are derived again (`qlauncher_core::cmdline::devices::clock::lower_clock`),
//! as libvirt renders them (`qemu_command.c` `qemuBuildClockArgStr`, `qemuBuildClockCommandLine`,
//! `qemuBuildCpuCommandLine`; checks of `qemu_validate.c` `qemuValidateDomainDefClockTimers`).
//! Other timers (`tsc`, `platform`) and attributes stay in the tree for the general diff to
//! refuse.

use super::*;
use qlauncher_core::cmdline::devices::clock::{
    is_time_zone_name, lower_clock, MAX_CLOCK_ADJUSTMENT,
};
use qlauncher_core::cmdline::plan::{ClockOffset, TickPolicy, TimerName, TimerPlan, TimerTrack};

/// One change of `<clock>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClockEdit {
    /// `<clock offset adjustment timezone>`.
    Offset(ClockOffset),
    /// `<timer name=..>`: the timer as the answer has it, or `None` when it removed it.
    Timer {
        /// Which timer.
        name: TimerName,
        /// Its attributes.
        timer: Option<TimerPlan>,
    },
}

impl std::fmt::Display for ClockEdit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClockEdit::Offset(ClockOffset::Utc { adjustment: None }) => {
                write!(f, "clock offset utc")
            }
            ClockEdit::Offset(ClockOffset::Utc {
                adjustment: Some(a),
            }) => write!(f, "clock offset utc adjustment={a}"),
            ClockEdit::Offset(ClockOffset::Localtime) => write!(f, "clock offset localtime"),
            ClockEdit::Offset(ClockOffset::Timezone(tz)) => {
                write!(f, "clock offset timezone {tz:?}")
            }
            ClockEdit::Timer { name, timer: None } => {
                write!(f, "clock timer {} removed", name.name())
            }
            ClockEdit::Timer {
                name,
                timer: Some(t),
            } => write!(
                f,
                "clock timer {} present={} tickpolicy={} track={}",
                name.name(),
                t.present.map_or("-", |p| if p { "yes" } else { "no" }),
                t.tick_policy.map_or("-", TickPolicy::name),
                t.track.map_or("-", TimerTrack::name)
            ),
        }
    }
}

/// The attributes of `<clock>` this module reads.
const CLOCK_ATTRS: [&str; 4] = ["offset", "adjustment", "basis", "timezone"];

/// The attributes of a `<timer>` this module reads (besides `name`).
const TIMER_ATTRS: [&str; 3] = ["present", "tickpolicy", "track"];

/// The tier-2 view of `<clock>`: its offset attributes in one form (libvirt's `variable` clock
/// with basis `utc` is `utc` with the adjustment; `reset` and `0` are no adjustment; no
/// `<clock>` is `utc`), and the attributes of each timer of [`TimerName`] by name.
#[derive(Debug, Default, PartialEq)]
pub(in crate::hooks) struct ClockView {
    offset: BTreeMap<&'static str, String>,
    timers: BTreeMap<TimerName, BTreeMap<&'static str, String>>,
}

impl ClockView {
    /// Whether the `hypervclock` timer is present (`present="yes"`).
    pub(in crate::hooks) fn hypervclock(&self) -> bool {
        self.timers
            .get(&TimerName::Hypervclock)
            .is_some_and(|t| t.get("present").map(String::as_str) == Some("yes"))
    }
}

/// Takes the offset attributes and the [`TimerName`] timers (with only [`TIMER_ATTRS`]) out of
/// `<clock>`.
pub(in crate::hooks) fn take_clock(d: &mut Node) -> ClockView {
    let mut v = ClockView::default();
    // No `<clock>` is a UTC one: both trees get one, so what is left in them is compared.
    if !d.children.iter().any(|c| c.name == "clock") {
        d.children.push(Node {
            name: "clock".into(),
            ..Node::default()
        });
    }
    let Some(clock) = d.children.iter_mut().find(|c| c.name == "clock") else {
        return v;
    };
    for k in CLOCK_ATTRS {
        if let Some(x) = clock.attrs.remove(k) {
            v.offset.insert(k, x);
        }
    }
    v.offset.entry("offset").or_insert_with(|| "utc".into());
    let basis_utc = v.offset.get("basis").is_none_or(|b| b == "utc");
    if v.offset["offset"] == "variable" && basis_utc {
        v.offset.insert("offset", "utc".into());
        v.offset.remove("basis");
    }
    if v.offset
        .get("adjustment")
        .is_some_and(|a| a == "reset" || a == "0")
    {
        v.offset.remove("adjustment");
    }
    clock.children.retain(|t| {
        let known = t.name == "timer"
            && t.children.is_empty()
            && t.text.is_empty()
            && t.attrs
                .keys()
                .all(|k| k == "name" || TIMER_ATTRS.contains(&k.as_str()));
        let Some(name) = t
            .attrs
            .get("name")
            .and_then(|n| TimerName::from_name(n))
            .filter(|n| known && !v.timers.contains_key(n))
        else {
            return true;
        };
        let attrs = TIMER_ATTRS
            .iter()
            .filter_map(|k| t.attrs.get(*k).map(|x| (*k, x.clone())))
            .collect();
        v.timers.insert(name, attrs);
        false
    });
    v
}

/// A refusal of `domain/clock<what>` (`@adjustment`, `/timer[hpet]@present`).
fn refuse(what: &str, sent: Option<&String>, answered: Option<&String>, why: &str) -> Refusal {
    Refusal {
        path: format!("domain/clock{what}"),
        sent: sent.cloned().unwrap_or_else(|| "-".into()),
        answered: answered.cloned().unwrap_or_else(|| "-".into()),
        reason: why.into(),
    }
}

/// The edits between the `sent` and `answered` clocks: the offset, then each changed timer in
/// [`TimerName`] order.
pub(in crate::hooks) fn diff_clock(
    sent: &ClockView,
    answered: &ClockView,
) -> Result<Vec<HookEdit>, Refusal> {
    let mut edits = Vec::new();
    if sent.offset != answered.offset {
        edits.push(HookEdit::Clock(ClockEdit::Offset(offset(sent, answered)?)));
    }
    edits.extend(keyed_diff(
        &sent.timers,
        &answered.timers,
        Keys::Either,
        |name, a, b| {
            let timer = match b {
                None => None,
                Some(b) => Some(timer(*name, a, b)?),
            };
            Ok(vec![HookEdit::Clock(ClockEdit::Timer {
                name: *name,
                timer,
            })])
        },
    )?);
    Ok(edits)
}

/// The answer's offset, or the refusal of what QEMU (or KubeVirt's domain) cannot take.
fn offset(sent: &ClockView, answered: &ClockView) -> Result<ClockOffset, Refusal> {
    let get = |v: &ClockView, k: &str| v.offset.get(k).cloned();
    let bad = |k: &str, why: &str| {
        refuse(
            &format!("@{k}"),
            get(sent, k).as_ref(),
            get(answered, k).as_ref(),
            why,
        )
    };
    let kind = get(answered, "offset").unwrap_or_default();
    let adjustment = match get(answered, "adjustment") {
        None => None,
        Some(a) => Some(
            a.parse::<i64>()
                .ok()
                .filter(|a| a.abs() <= MAX_CLOCK_ADJUSTMENT)
                .ok_or_else(|| {
                    bad(
                        "adjustment",
                        "not reset or a number of seconds within 100 years",
                    )
                })?,
        ),
    };
    if kind != "variable" && get(answered, "basis").is_some() {
        return Err(bad("basis", "a basis goes with offset variable only"));
    }
    if kind != "timezone" && get(answered, "timezone").is_some() {
        return Err(bad(
            "timezone",
            "a time zone goes with offset timezone only",
        ));
    }
    Ok(match kind.as_str() {
        "utc" => ClockOffset::Utc { adjustment },
        "localtime" | "variable" if adjustment.is_some() || kind == "variable" => {
            return Err(bad(
                if kind == "variable" {
                    "basis"
                } else {
                    "adjustment"
                },
                "a shift from local time depends on the host's time zone (libvirt adds the \
                 host's UTC offset): use offset utc with the adjustment",
            ))
        }
        "localtime" => ClockOffset::Localtime,
        "timezone" => {
            if adjustment.is_some() {
                return Err(bad("adjustment", "a timezone clock takes no adjustment"));
            }
            let tz = get(answered, "timezone").unwrap_or_default();
            if !is_time_zone_name(&tz) {
                return Err(bad(
                    "timezone",
                    "not a time zone name (letters, digits, /_+-, relative)",
                ));
            }
            ClockOffset::Timezone(tz)
        }
        "absolute" => {
            return Err(bad(
                "offset",
                "KubeVirt's domain (api.Clock) has no start time: use offset utc with an \
                 adjustment",
            ))
        }
        _ => {
            return Err(bad(
                "offset",
                "not a clock offset (utc, localtime, timezone, variable)",
            ))
        }
    })
}

/// The answer's timer `name` (attributes `b`; `a` as sent), checked as libvirt and QEMU check it.
fn timer(
    name: TimerName,
    a: Option<&BTreeMap<&'static str, String>>,
    b: &BTreeMap<&'static str, String>,
) -> Result<TimerPlan, Refusal> {
    let bad = |k: &str, why: &str| {
        refuse(
            &format!("/timer[{}]@{k}", name.name()),
            a.and_then(|a| a.get(k)),
            b.get(k),
            why,
        )
    };
    let present = match b.get("present").map(String::as_str) {
        None => None,
        Some("yes") => Some(true),
        Some("no") => Some(false),
        Some(_) => return Err(bad("present", "not yes or no")),
    };
    let tick_policy = match b.get("tickpolicy") {
        None => None,
        Some(p) => Some(TickPolicy::from_name(p).ok_or_else(|| {
            bad(
                "tickpolicy",
                "not a tick policy (delay, catchup, merge, discard)",
            )
        })?),
    };
    let track = match b.get("track") {
        None => None,
        Some(t) => Some(
            TimerTrack::from_name(t)
                .ok_or_else(|| bad("track", "not a track (boot, guest, wall, realtime)"))?,
        ),
    };
    if track.is_some() && name != TimerName::Rtc {
        return Err(bad("track", "only the rtc timer has a track"));
    }
    let ticks = matches!(name, TimerName::Rtc | TimerName::Pit | TimerName::Hpet);
    if tick_policy.is_some() && !ticks {
        return Err(bad("tickpolicy", "this timer has no tick policy"));
    }
    match name {
        TimerName::Rtc => {
            if present == Some(false) {
                return Err(bad(
                    "present",
                    "q35 always has its RTC: QEMU cannot remove it",
                ));
            }
            if track == Some(TimerTrack::Boot) {
                return Err(bad("track", "unsupported rtc timer track 'boot' (libvirt)"));
            }
            if matches!(tick_policy, Some(TickPolicy::Merge | TickPolicy::Discard)) {
                return Err(bad(
                    "tickpolicy",
                    "QEMU's RTC delays or catches up (driftfix=slew) only (libvirt: \
                     unsupported rtc timer tickpolicy)",
                ));
            }
        }
        TimerName::Pit => {
            if present == Some(false) {
                return Err(bad(
                    "present",
                    "libvirt has no way to remove q35's PIT from QEMU",
                ));
            }
            if matches!(tick_policy, Some(TickPolicy::Catchup | TickPolicy::Merge)) {
                return Err(bad(
                    "tickpolicy",
                    "QEMU's kvm-pit lost_tick_policy takes delay or discard only",
                ));
            }
        }
        TimerName::Kvmclock | TimerName::Hpet | TimerName::Hypervclock => {}
    }
    Ok(TimerPlan {
        name,
        present,
        tick_policy,
        track,
    })
}

/// Applies `edit` to the plan's clock (which KubeVirt's domain then lists) and derives its QEMU
/// options again.
pub(in crate::hooks) fn apply_clock(plan: &mut DomainPlan, edit: &ClockEdit) {
    let c = &mut plan.clock;
    c.listed = true;
    match edit {
        ClockEdit::Offset(o) => c.offset = o.clone(),
        ClockEdit::Timer { name, timer } => {
            match (c.timers.iter_mut().find(|t| t.name == *name), timer) {
                (Some(t), Some(n)) => *t = n.clone(),
                (None, Some(n)) => c.timers.push(n.clone()),
                (_, None) => c.timers.retain(|t| t.name != *name),
            }
        }
    }
    lower_clock(plan);
}

#[cfg(test)]
mod tests {
    use super::super::super::*;
    use qlauncher_core::cmdline::plan::{Accel, ClockOffset, TickPolicy, TimerName, TimerPlan};

    const SENT: &str =
        "<domain type=\"kvm\"><name>ns_vm</name><clock offset=\"utc\" adjustment=\"reset\">\
        <timer name=\"rtc\" tickpolicy=\"catchup\" present=\"yes\"></timer>\
        <timer name=\"hpet\" present=\"no\"></timer></clock></domain>";

    /// A plan converted from SENT's clock (as the converter makes it), at a fixed time.
    fn plan() -> DomainPlan {
        let mut plan = DomainPlan {
            accel: Accel::Kvm,
            ..Default::default()
        };
        plan.clock.now_unix = 1796083200;
        apply(
            &diff_answer("<domain type=\"kvm\"><name>ns_vm</name></domain>", SENT).unwrap(),
            &mut plan,
        );
        plan
    }

    #[test]
    fn offset_and_timer_changes_are_typed_edits() {
        let answer = SENT
            .replace("adjustment=\"reset\"", "adjustment=\"3600\"")
            .replace(
            "<timer name=\"hpet\" present=\"no\"></timer>",
            "<timer name=\"hpet\" present=\"yes\"/><timer name=\"pit\" tickpolicy=\"discard\"/>\
                 <timer name=\"kvmclock\" present=\"no\"/>",
        );
        assert_eq!(
            hook_diff(SENT, &answer).unwrap(),
            "clock offset utc adjustment=3600\n\
             clock timer pit present=- tickpolicy=discard track=-\n\
             clock timer kvmclock present=no tickpolicy=- track=-\n\
             clock timer hpet present=yes tickpolicy=- track=-\n"
        );
        let mut p = plan();
        assert_eq!(
            (p.rtc.base.as_str(), p.rtc.driftfix, p.machine.hpet),
            ("utc", Some("slew"), Some(false))
        );
        apply(&diff_answer(SENT, &answer).unwrap(), &mut p);
        assert_eq!(
            (p.rtc.base.as_str(), p.rtc.driftfix, p.machine.hpet),
            ("2026-12-01T01:00:00", Some("slew"), Some(true))
        );
        assert_eq!(
            p.globals
                .iter()
                .map(|g| g.value.as_str())
                .collect::<Vec<_>>(),
            ["discard"]
        );
        assert_eq!(
            p.cpu
                .flags
                .iter()
                .map(|f| format!("{}={}", f.name, f.value))
                .collect::<Vec<_>>(),
            ["kvmclock=off"]
        );
        assert_eq!(
            p.clock.timer(TimerName::Pit),
            Some(&TimerPlan {
                name: TimerName::Pit,
                present: None,
                tick_policy: Some(TickPolicy::Discard),
                track: None
            })
        );
        // A timezone clock: base=localtime, TZ for QEMU; removing a timer drops its option.
        let tz = SENT
            .replace(
                "offset=\"utc\" adjustment=\"reset\"",
                "offset=\"timezone\" timezone=\"Europe/Berlin\"",
            )
            .replace("<timer name=\"hpet\" present=\"no\"></timer>", "");
        let edits = diff_answer(SENT, &tz).unwrap();
        assert_eq!(
            edits[0],
            HookEdit::Clock(ClockEdit::Offset(ClockOffset::Timezone(
                "Europe/Berlin".into()
            )))
        );
        let mut p = plan();
        apply(&edits, &mut p);
        assert_eq!(
            (p.rtc.base.as_str(), p.env.clone(), p.machine.hpet),
            (
                "localtime",
                vec![("TZ".to_string(), "Europe/Berlin".to_string())],
                None
            )
        );
    }

    #[test]
    fn the_same_clock_written_otherwise_is_no_change() {
        let variable = SENT.replace(
            "offset=\"utc\" adjustment=\"reset\"",
            "offset=\"variable\" basis=\"utc\" adjustment=\"0\"",
        );
        assert_eq!(diff_answer(SENT, &variable).unwrap(), vec![]);
        let utc = SENT.replace(" adjustment=\"reset\"", "");
        assert_eq!(diff_answer(SENT, &utc).unwrap(), vec![]);
        let shifted = SENT.replace("adjustment=\"reset\"", "adjustment=\"-60\"");
        let same = SENT.replace(
            "offset=\"utc\" adjustment=\"reset\"",
            "offset=\"variable\" adjustment=\"-60\"",
        );
        assert_eq!(diff_answer(&shifted, &same).unwrap(), vec![]);
        // No <clock> is a UTC one.
        let none = "<domain type=\"kvm\"><name>ns_vm</name></domain>";
        let empty =
            "<domain type=\"kvm\"><name>ns_vm</name><clock offset=\"utc\"></clock></domain>";
        assert_eq!(diff_answer(none, empty).unwrap(), vec![]);
    }

    #[test]
    fn clocks_qemu_cannot_run_are_refused_with_the_path() {
        let timer = |t: &str| {
            SENT.replace(
                "<timer name=\"hpet\" present=\"no\"></timer>",
                &format!("<timer name=\"hpet\" present=\"no\"></timer>{t}"),
            )
        };
        let rtc = |attrs: &str| {
            SENT.replace(
                "<timer name=\"rtc\" tickpolicy=\"catchup\" present=\"yes\">",
                &format!("<timer name=\"rtc\" {attrs}>"),
            )
        };
        let offset = |attrs: &str| SENT.replace("offset=\"utc\" adjustment=\"reset\"", attrs);
        let cases = [
            (rtc("track=\"boot\""), "domain/clock/timer[rtc]@track"),
            (
                rtc("tickpolicy=\"merge\""),
                "domain/clock/timer[rtc]@tickpolicy",
            ),
            (rtc("present=\"no\""), "domain/clock/timer[rtc]@present"),
            (rtc("present=\"maybe\""), "domain/clock/timer[rtc]@present"),
            (
                timer("<timer name=\"pit\" tickpolicy=\"catchup\"/>"),
                "domain/clock/timer[pit]@tickpolicy",
            ),
            (
                timer("<timer name=\"pit\" present=\"no\"/>"),
                "domain/clock/timer[pit]@present",
            ),
            (
                timer("<timer name=\"kvmclock\" tickpolicy=\"delay\"/>"),
                "domain/clock/timer[kvmclock]@tickpolicy",
            ),
            (
                timer("<timer name=\"hpet\" track=\"wall\"/>"),
                "domain/clock/timer",
            ),
            (
                timer("<timer name=\"tsc\" frequency=\"1000000000\"/>"),
                "domain/clock/timer",
            ),
            (offset("offset=\"absolute\" start=\"0\""), "domain/clock"),
            (
                offset("offset=\"localtime\" adjustment=\"60\""),
                "domain/clock@adjustment",
            ),
            (
                offset("offset=\"variable\" basis=\"localtime\" adjustment=\"60\""),
                "domain/clock@basis",
            ),
            (
                offset("offset=\"timezone\" timezone=\"../../etc/passwd\""),
                "domain/clock@timezone",
            ),
            (
                offset("offset=\"utc\" adjustment=\"soon\""),
                "domain/clock@adjustment",
            ),
            (
                offset("offset=\"utc\" adjustment=\"9999999999\""),
                "domain/clock@adjustment",
            ),
        ];
        for (answer, path) in cases {
            let r = diff_answer(SENT, &answer).unwrap_err();
            assert!(r.path.starts_with(path), "{path}: {r}\n{answer}");
        }
    }
}

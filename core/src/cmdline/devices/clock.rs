//! Clock (`converter/compute/clock.go`, libvirt's `-rtc` rendering): the VMI's clock becomes the
//! plan's [`ClockPlan`] (libvirt's `<clock>`: offset and timers), and [`lower_clock`] derives the
//! QEMU options from it, as libvirt's `qemuBuildClockArgStr`, `qemuBuildClockCommandLine` and
//! `qemuBuildCpuCommandLine` do: `-rtc base=utc` by default; `utc.offsetSeconds` becomes a start
//! date computed from `ctx.now_unix` (libvirt's `adjustment`); `timezone` becomes
//! `base=localtime` with `TZ` in QEMU's environment. Timers: rtc `tickPolicy: catchup` ->
//! `driftfix=slew`, `track: guest` -> `clock=vm`; pit tickPolicy ->
//! `-global kvm-pit.lost_tick_policy` (KVM only); hpet `present: false` -> HPET off; the `kvm`
//! timer the `kvmclock` CPU flag, the `hyperv` one `hv-time`. A hook's clock edits change the
//! [`ClockPlan`] and call [`lower_clock`] again.
//!
//! Reads: `ctx.now_unix`, `ctx.kvm`, `ctx.allow_emulation`.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::plan::{
    Accel, ClockOffset, ClockPlan, CpuFlag, DomainPlan, GlobalProp, RtcPlan, TickPolicy, TimerName,
    TimerPlan, TimerTrack,
};
use super::accel;
use crate::vmi::Vmi;

/// Sets `clock`, then (through [`lower_clock`]) `rtc`, `env` (TZ), HPET, the PIT global and the
/// timer CPU flags. Runs after the CPU configurator (it adds to the `-cpu` flags).
pub struct ClockConfigurator;

/// `YYYY-MM-DDTHH:MM:SS` (UTC) for a Unix time (Howard Hinnant's civil-from-days).
pub fn format_utc(t: i64) -> String {
    let days = t.div_euclid(86400);
    let secs = t.rem_euclid(86400);
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    )
}

/// The largest clock shift taken (seconds): 100 years either way.
pub const MAX_CLOCK_ADJUSTMENT: i64 = 100 * 365 * 86400;

/// Whether `tz` is a time zone name qlauncher passes as QEMU's `TZ`: 1 to 64 letters, digits and
/// `/_+-`, relative, without `..` (no path outside the zoneinfo tree, no option separator).
pub fn is_time_zone_name(tz: &str) -> bool {
    !tz.is_empty()
        && tz.len() <= 64
        && !tz.starts_with('/')
        && !tz.contains("..")
        && tz
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_+-".contains(&b))
}

/// Derives the QEMU options of `plan.clock` (idempotent: a hook's edit calls it again):
/// `rtc` (base from the offset, `clock=` from the rtc timer's track, `driftfix=slew` for its
/// `catchup`), `TZ` for a timezone clock, `-global kvm-pit.lost_tick_policy` for a pit
/// `delay`/`discard` under KVM, `machine.hpet` from the hpet timer's `present`, and the
/// `kvmclock`/`hv-time` CPU flags (libvirt: `kvmclock=on|off` when `present` is written,
/// `hv-time=on` when present). Values QEMU has no form for (rtc track `boot`, rtc `merge` or
/// `discard`, pit `catchup` or `merge`) add nothing: the converter and the hook diff refuse them
/// first.
pub fn lower_clock(plan: &mut DomainPlan) {
    let c = &plan.clock;
    let mut rtc = RtcPlan {
        base: "utc".into(),
        ..Default::default()
    };
    match &c.offset {
        ClockOffset::Utc {
            adjustment: Some(a),
        } if *a != 0 => rtc.base = format_utc(c.now_unix.saturating_add(*a)),
        ClockOffset::Utc { .. } => {}
        ClockOffset::Localtime | ClockOffset::Timezone(_) => rtc.base = "localtime".into(),
    }
    if let Some(t) = c.timer(TimerName::Rtc) {
        rtc.clock = match t.track {
            Some(TimerTrack::Guest) => Some("vm"),
            Some(TimerTrack::Wall) => Some("host"),
            Some(TimerTrack::Realtime) => Some("rt"),
            Some(TimerTrack::Boot) | None => None,
        };
        if t.tick_policy == Some(TickPolicy::Catchup) {
            rtc.driftfix = Some("slew");
        }
    }
    plan.env.retain(|(k, _)| k != "TZ");
    if let ClockOffset::Timezone(tz) = &c.offset {
        plan.env.push(("TZ".into(), tz.clone()));
    }
    plan.globals
        .retain(|g| !(g.driver == "kvm-pit" && g.property == "lost_tick_policy"));
    let pit = c.timer(TimerName::Pit).and_then(|t| t.tick_policy);
    if let (Some(p @ (TickPolicy::Delay | TickPolicy::Discard)), Accel::Kvm) = (pit, plan.accel) {
        plan.globals.push(GlobalProp {
            driver: "kvm-pit",
            property: "lost_tick_policy",
            value: p.name().into(),
        });
    }
    plan.machine.hpet = c.timer(TimerName::Hpet).and_then(|t| t.present);
    let on_off = |b: bool| if b { "on" } else { "off" };
    let kvmclock = c
        .timer(TimerName::Kvmclock)
        .and_then(|t| t.present)
        .map(on_off);
    let hv_time = c
        .timer(TimerName::Hypervclock)
        .and_then(|t| t.present)
        .map(on_off);
    set_cpu_flag(plan, "kvmclock", kvmclock);
    set_cpu_flag(plan, "hv-time", hv_time);
    plan.rtc = rtc;
}

/// Sets the `-cpu` flag `name` to `value` in place (or last, when new), or removes it.
fn set_cpu_flag(plan: &mut DomainPlan, name: &str, value: Option<&str>) {
    let flags = &mut plan.cpu.flags;
    match (flags.iter_mut().find(|f| f.name == name), value) {
        (Some(f), Some(v)) => f.value = v.into(),
        (None, Some(v)) => flags.push(CpuFlag {
            name: name.into(),
            value: v.into(),
        }),
        (_, None) => flags.retain(|f| f.name != name),
    }
}

impl super::super::convert::Configurator for ClockConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let base = FieldPath::new("spec.domain.clock");
        plan.accel = accel(ctx)?;
        let mut clock = ClockPlan {
            now_unix: ctx.now_unix,
            ..Default::default()
        };
        if let Some(c) = vmi.spec.domain.clock.as_ref() {
            clock.listed = true;
            if c.utc.is_some() && c.timezone.is_some() {
                return Err(ConvertError::invalid(
                    base,
                    "utc and timezone are mutually exclusive",
                ));
            }
            if let Some(u) = &c.utc {
                if let Some(off) = u.offset_seconds {
                    if off.abs() > MAX_CLOCK_ADJUSTMENT {
                        return Err(ConvertError::invalid(
                            base.key("utc").key("offsetSeconds"),
                            "offset beyond 100 years",
                        ));
                    }
                }
                clock.offset = ClockOffset::Utc {
                    adjustment: u.offset_seconds,
                };
            }
            if let Some(tz) = &c.timezone {
                if !is_time_zone_name(tz) {
                    return Err(ConvertError::invalid(
                        base.key("timezone"),
                        format!("{tz:?} is not a time zone name"),
                    ));
                }
                clock.offset = ClockOffset::Timezone(tz.clone());
            }
            if let Some(t) = &c.timer {
                clock.timers = timers(t, &base.key("timer"))?;
            }
        }
        plan.clock = clock;
        lower_clock(plan);
        Ok(())
    }
}

/// The VMI's timers as libvirt's, in KubeVirt's order (rtc, pit, kvmclock, hpet, hypervclock),
/// `present` written for each (KubeVirt's `boolToYesNo`, default yes); tick policies and tracks
/// QEMU cannot run are refused with their field.
fn timers(t: &crate::vmi::domain::Timer, tp: &FieldPath) -> Result<Vec<TimerPlan>, ConvertError> {
    let present = |e: Option<bool>| Some(e != Some(false));
    let policy = |v: &Option<String>,
                  ok: &[TickPolicy],
                  timer: &str|
     -> Result<Option<TickPolicy>, ConvertError> {
        let Some(v) = v.as_deref() else {
            return Ok(None);
        };
        match TickPolicy::from_name(v).filter(|p| ok.contains(p)) {
            Some(p) => Ok(Some(p)),
            None => Err(ConvertError::unsupported(
                tp.key(timer).key("tickPolicy"),
                format!("{timer} tick policy {v:?}"),
            )),
        }
    };
    let mut out = Vec::new();
    if let Some(r) = &t.rtc {
        let track = match r.track.as_deref() {
            None => None,
            Some("guest") => Some(TimerTrack::Guest),
            Some("wall") => Some(TimerTrack::Wall),
            Some(o) => {
                return Err(ConvertError::unsupported(
                    tp.key("rtc").key("track"),
                    format!("rtc track {o:?}"),
                ))
            }
        };
        out.push(TimerPlan {
            name: TimerName::Rtc,
            present: present(r.enabled),
            tick_policy: policy(
                &r.tick_policy,
                &[TickPolicy::Delay, TickPolicy::Catchup],
                "rtc",
            )?,
            track,
        });
    }
    if let Some(p) = &t.pit {
        out.push(TimerPlan {
            name: TimerName::Pit,
            present: present(p.enabled),
            tick_policy: policy(
                &p.tick_policy,
                &[TickPolicy::Delay, TickPolicy::Discard],
                "pit",
            )?,
            track: None,
        });
    }
    if let Some(k) = &t.kvm {
        out.push(TimerPlan {
            name: TimerName::Kvmclock,
            present: present(k.enabled),
            tick_policy: None,
            track: None,
        });
    }
    if let Some(h) = &t.hpet {
        out.push(TimerPlan {
            name: TimerName::Hpet,
            present: present(h.enabled),
            tick_policy: policy(&h.tick_policy, &TickPolicy::ALL, "hpet")?,
            track: None,
        });
    }
    if let Some(h) = &t.hyperv {
        out.push(TimerPlan {
            name: TimerName::Hypervclock,
            present: present(h.enabled),
            tick_policy: None,
            track: None,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::{configure, error_path};
    use serde_json::json;

    #[test]
    fn clock_table() {
        let at = ConverterContext {
            now_unix: 1796083200,
            ..Default::default()
        };
        let tcg = ConverterContext {
            kvm: false,
            allow_emulation: true,
            ..Default::default()
        };
        let pit = GlobalProp {
            driver: "kvm-pit",
            property: "lost_tick_policy",
            value: "discard".into(),
        };
        // (clock fragment, context) -> (rtc base, rtc clock, driftfix, TZ, globals, hpet)
        let cases = [
            (
                json!(null),
                at.clone(),
                ("utc", None, None, None, vec![], None),
            ),
            (
                json!({"utc": {}}),
                at.clone(),
                ("utc", None, None, None, vec![], None),
            ),
            (
                json!({"utc": {"offsetSeconds": 3661}}),
                at.clone(),
                ("2026-12-01T01:01:01", None, None, None, vec![], None),
            ),
            (
                json!({"timezone": "Europe/Berlin"}),
                at.clone(),
                ("localtime", None, None, Some("Europe/Berlin"), vec![], None),
            ),
            (
                json!({"utc": {}, "timer": {"rtc": {"tickPolicy": "catchup", "track": "guest"}, "pit": {"tickPolicy": "discard"}, "hpet": {"present": false}}}),
                at.clone(),
                (
                    "utc",
                    Some("vm"),
                    Some("slew"),
                    None,
                    vec![pit.clone()],
                    Some(false),
                ),
            ),
            (
                json!({"utc": {}, "timer": {"rtc": {"track": "wall"}, "pit": {"tickPolicy": "discard"}}}),
                tcg,
                ("utc", Some("host"), None, None, vec![], None),
            ),
        ];
        for (clock, ctx, (base, rtc_clock, driftfix, tz, globals, hpet)) in cases {
            let plan = configure(&ClockConfigurator, json!({ "clock": clock }), &ctx).unwrap();
            assert_eq!(
                (plan.rtc.base.as_str(), plan.rtc.clock, plan.rtc.driftfix),
                (base, rtc_clock, driftfix),
                "{clock}"
            );
            let env: Vec<(String, String)> = tz
                .map(|t| ("TZ".to_string(), t.to_string()))
                .into_iter()
                .collect();
            assert_eq!(plan.env, env, "{clock}");
            assert_eq!(plan.globals, globals, "{clock}");
            assert_eq!(plan.machine.hpet, hpet, "{clock}");
        }
    }

    #[test]
    fn bad_clocks_name_the_field() {
        let cases = [
            (json!({"utc": {}, "timezone": "UTC"}), "spec.domain.clock"),
            (
                json!({"utc": {"offsetSeconds": 4000000000_i64}}),
                "spec.domain.clock.utc.offsetSeconds",
            ),
            (
                json!({"timezone": "../../etc/passwd"}),
                "spec.domain.clock.timezone",
            ),
            (json!({"timezone": "A,B"}), "spec.domain.clock.timezone"),
            (
                json!({"utc": {}, "timer": {"rtc": {"tickPolicy": "merge"}}}),
                "spec.domain.clock.timer.rtc.tickPolicy",
            ),
            (
                json!({"utc": {}, "timer": {"pit": {"tickPolicy": "catchup"}}}),
                "spec.domain.clock.timer.pit.tickPolicy",
            ),
        ];
        for (clock, path) in cases {
            assert_eq!(
                error_path(configure(
                    &ClockConfigurator,
                    json!({ "clock": clock }),
                    &ConverterContext::default()
                )),
                path,
                "{clock}"
            );
        }
    }

    #[test]
    fn lowering_a_changed_clock_replaces_what_the_old_one_set() {
        let ctx = ConverterContext {
            now_unix: 1796083200,
            ..Default::default()
        };
        let mut plan = configure(
            &ClockConfigurator,
            json!({"clock": {"timezone": "Europe/Berlin", "timer": {"pit": {"tickPolicy": "discard"}, "kvm": {}, "hpet": {"present": false}}}}),
            &ctx,
        )
        .unwrap();
        let once = plan.clone();
        lower_clock(&mut plan);
        assert_eq!(plan, once, "lowering twice changes nothing");
        plan.clock.offset = ClockOffset::Utc {
            adjustment: Some(-60),
        };
        plan.clock.timers = vec![TimerPlan {
            name: TimerName::Rtc,
            present: Some(true),
            tick_policy: Some(TickPolicy::Catchup),
            track: Some(TimerTrack::Realtime),
        }];
        lower_clock(&mut plan);
        assert_eq!(
            (
                plan.rtc.base.as_str(),
                plan.rtc.clock,
                plan.rtc.driftfix,
                plan.machine.hpet
            ),
            ("2026-11-30T23:59:00", Some("rt"), Some("slew"), None)
        );
        assert_eq!(plan.env, vec![]);
        assert_eq!(plan.globals, vec![]);
        assert_eq!(plan.cpu.flags, vec![]);
    }

    #[test]
    fn utc_dates_are_civil() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00");
        assert_eq!(format_utc(951782400), "2000-02-29T00:00:00");
        assert_eq!(format_utc(1796083200 + 3661), "2026-12-01T01:01:01");
        assert_eq!(format_utc(-1), "1969-12-31T23:59:59");
    }
}

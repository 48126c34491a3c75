//! Clock (`converter/compute/clock.go`, libvirt's `-rtc` rendering): `-rtc base=utc` by default;
//! `utc.offsetSeconds` becomes a start date computed from `ctx.now_unix` (libvirt's
//! `adjustment`); `timezone` becomes `base=localtime` with `TZ` in QEMU's environment. Timers:
//! rtc `tickPolicy: catchup` -> `driftfix=slew`, `track: guest` -> `clock=vm`; pit tickPolicy ->
//! `-global kvm-pit.lost_tick_policy` (KVM only); hpet `present: false` -> HPET off.
//! `kvm`/`hyperv` timers are CPU flags (see `cpu.rs`).
//!
//! Reads: `ctx.now_unix`, `ctx.kvm`, `ctx.allow_emulation`.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::plan::{Accel, DomainPlan, GlobalProp, RtcPlan};
use super::accel;
use crate::vmi::Vmi;

/// Sets `rtc`, `env` (TZ), HPET and PIT globals.
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

impl super::super::convert::Configurator for ClockConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let base = FieldPath::new("spec.domain.clock");
        let mut rtc = RtcPlan {
            base: "utc".into(),
            ..Default::default()
        };
        let Some(clock) = vmi.spec.domain.clock.as_ref() else {
            plan.rtc = rtc;
            return Ok(());
        };
        if clock.utc.is_some() && clock.timezone.is_some() {
            return Err(ConvertError::invalid(
                base,
                "utc and timezone are mutually exclusive",
            ));
        }
        if let Some(off) = clock.utc.as_ref().and_then(|u| u.offset_seconds) {
            if off.abs() > 100 * 365 * 86400 {
                return Err(ConvertError::invalid(
                    base.key("utc").key("offsetSeconds"),
                    "offset beyond 100 years",
                ));
            }
            if off != 0 {
                rtc.base = format_utc(ctx.now_unix + off);
            }
        }
        if let Some(tz) = &clock.timezone {
            let p = base.key("timezone");
            if tz.is_empty()
                || tz.len() > 64
                || tz.starts_with('/')
                || tz.contains("..")
                || !tz
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"/_+-".contains(&b))
            {
                return Err(ConvertError::invalid(
                    p,
                    format!("{tz:?} is not a time zone name"),
                ));
            }
            rtc.base = "localtime".into();
            plan.env.push(("TZ".into(), tz.clone()));
        }
        if let Some(t) = &clock.timer {
            let tp = base.key("timer");
            if let Some(r) = &t.rtc {
                match r.tick_policy.as_deref() {
                    None | Some("delay") => {}
                    Some("catchup") => rtc.driftfix = Some("slew"),
                    Some(o) => {
                        return Err(ConvertError::unsupported(
                            tp.key("rtc").key("tickPolicy"),
                            format!("rtc tick policy {o:?}"),
                        ))
                    }
                }
                match r.track.as_deref() {
                    None => {}
                    Some("guest") => rtc.clock = Some("vm"),
                    Some("wall") => rtc.clock = Some("host"),
                    Some(o) => {
                        return Err(ConvertError::unsupported(
                            tp.key("rtc").key("track"),
                            format!("rtc track {o:?}"),
                        ))
                    }
                }
            }
            if let Some(p) = &t.pit {
                let policy = match p.tick_policy.as_deref() {
                    None => None,
                    Some(v @ ("delay" | "discard")) => Some(v),
                    Some(o) => {
                        return Err(ConvertError::unsupported(
                            tp.key("pit").key("tickPolicy"),
                            format!("pit tick policy {o:?}"),
                        ))
                    }
                };
                if let (Some(v), Accel::Kvm) = (policy, accel(ctx)?) {
                    plan.globals.push(GlobalProp {
                        driver: "kvm-pit",
                        property: "lost_tick_policy",
                        value: v.into(),
                    });
                }
            }
            if let Some(h) = &t.hpet {
                plan.machine.hpet = Some(h.enabled.unwrap_or(true));
            }
        }
        plan.rtc = rtc;
        Ok(())
    }
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
    fn utc_dates_are_civil() {
        assert_eq!(format_utc(0), "1970-01-01T00:00:00");
        assert_eq!(format_utc(951782400), "2000-02-29T00:00:00");
        assert_eq!(format_utc(1796083200 + 3661), "2026-12-01T01:01:01");
        assert_eq!(format_utc(-1), "1969-12-31T23:59:59");
    }
}

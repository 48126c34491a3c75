//! Sound (`converter/compute/sound.go`): `ich9` (default) -> `ich9-intel-hda` plus an
//! `hda-duplex` codec, `ac97` -> `AC97`; id `ua-<name>`; both on the `audio1` none backend.
//!
//! Reads: nothing from the context.

use super::super::context::ConverterContext;
use super::super::error::{ConvertError, FieldPath};
use super::super::names::{alias, check_name};
use super::super::plan::{Backend, DeviceClass, DomainPlan, Placement};
use super::super::qemu::{Device, DeviceSound};
use super::planned;
use crate::vmi::Vmi;

/// Adds the sound card.
pub struct SoundConfigurator;

impl super::super::convert::Configurator for SoundConfigurator {
    fn configure(
        &self,
        vmi: &Vmi,
        _ctx: &ConverterContext,
        plan: &mut DomainPlan,
    ) -> Result<(), ConvertError> {
        let Some(s) = vmi.spec.domain.devices.sound.as_ref() else {
            return Ok(());
        };
        let p = FieldPath::new("spec.domain.devices.sound");
        check_name(&p.key("name"), &s.name)?;
        let id = alias(&s.name);
        plan.audiodev = true;
        match s.model.as_deref().unwrap_or("ich9") {
            "" | "ich9" => {
                plan.devices.push(planned(
                    DeviceClass::Sound,
                    Some(&s.name),
                    Backend::None,
                    Device::Sound(DeviceSound {
                        driver: "ich9-intel-hda",
                        id: id.clone(),
                        audiodev: None,
                        bus: None,
                        cad: None,
                    }),
                    Placement::RootComplexAny,
                ));
                plan.devices.push(planned(
                    DeviceClass::Sound,
                    Some(&s.name),
                    Backend::None,
                    Device::Sound(DeviceSound {
                        driver: "hda-duplex",
                        id: format!("{id}-codec0"),
                        audiodev: Some("audio1".into()),
                        bus: Some(format!("{id}.0")),
                        cad: Some(0),
                    }),
                    Placement::NonPci,
                ));
            }
            "ac97" => plan.devices.push(planned(
                DeviceClass::Sound,
                Some(&s.name),
                Backend::None,
                Device::Sound(DeviceSound {
                    driver: "AC97",
                    id,
                    audiodev: Some("audio1".into()),
                    bus: None,
                    cad: None,
                }),
                Placement::RootComplexAny,
            )),
            o => {
                return Err(ConvertError::unsupported(
                    p.key("model"),
                    format!("sound model {o:?}"),
                ))
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmdline::testutil::{configure, drivers, error_path};
    use serde_json::json;

    #[test]
    fn sound_table() {
        let s = |v: &str| v.to_string();
        let cases = [
            (json!(null), vec![], false),
            (
                json!({"name": "snd"}),
                vec![
                    ("ich9-intel-hda", s("ua-snd")),
                    ("hda-duplex", s("ua-snd-codec0")),
                ],
                true,
            ),
            (
                json!({"name": "snd", "model": "ac97"}),
                vec![("AC97", s("ua-snd"))],
                true,
            ),
        ];
        for (sound, want, audiodev) in cases {
            let plan = configure(
                &SoundConfigurator,
                json!({"devices": {"sound": sound}}),
                &ConverterContext::default(),
            )
            .unwrap();
            assert_eq!(drivers(&plan), want, "{sound}");
            assert_eq!(plan.audiodev, audiodev, "{sound}");
        }
        let r = configure(
            &SoundConfigurator,
            json!({"devices": {"sound": {"name": "snd", "model": "sb16"}}}),
            &ConverterContext::default(),
        );
        assert_eq!(error_path(r), "spec.domain.devices.sound.model");
    }
}

//! VMI JSON/YAML -> defaults -> validation -> conversion -> argv.
#![no_main]
#[path = "../../tests/harden_support/targets.rs"]
mod targets;
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    targets::vmi_pipeline(data);
});

//! A hook sidecar's OnDefineDomain answer through the parse, the diff, the plan edits and the argv.
#![no_main]
// Each target uses a part of the shared bodies.
#[allow(dead_code)]
#[path = "../../testkit/src/fuzz.rs"]
mod targets;
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    targets::hook_answer(data);
});

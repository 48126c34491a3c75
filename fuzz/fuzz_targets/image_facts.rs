//! The image fact reader: format magic, qcow2 header, backing chain.
#![no_main]
// Each target uses a part of the shared bodies.
#[allow(dead_code)]
#[path = "../../testkit/src/fuzz.rs"]
mod targets;
use std::sync::OnceLock;
static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let dir = DIR.get_or_init(|| {
        // In memory when /dev/shm exists: one file write per input.
        let d = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .expect("tempdir");
        std::fs::write(d.path().join("base.raw"), [0u8; 512]).expect("base");
        d
    });
    targets::image_facts(dir.path(), data);
});

//! One cmd v1 gRPC request (protobuf) through the decoding and what the server does with its
//! untrusted fields before it acts (VMI JSON, migration and SEV options).
//!
//! `QLAUNCHER_FUZZ_SEEDS=<dir>` writes the seeds into `<dir>` and exits, with every VMI
//! manifest under `QLAUNCHER_FUZZ_VMIS` (e.g. `tests/fixtures/cmdline`) as a sync request too.
#![no_main]
// Each target uses a part of the shared bodies.
#[allow(dead_code)]
#[path = "../../testkit/src/fuzz.rs"]
mod targets;
libfuzzer_sys::fuzz_target!(
    init: {
        if let Some(dir) = std::env::var_os("QLAUNCHER_FUZZ_SEEDS") {
            let vmis = std::env::var_os("QLAUNCHER_FUZZ_VMIS")
                .map(|d| targets::vmi_jsons(d.as_ref()))
                .unwrap_or_default();
            targets::write_seeds(dir.as_ref(), &targets::cmd_seeds(&vmis)).expect("seeds");
            std::process::exit(0);
        }
    },
    |data: &[u8]| {
        targets::cmd_request(data);
    }
);

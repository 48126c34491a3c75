//! libvirt's remote protocol from a migration source: one frame through the decoders, and the
//! whole stream into the server with a refusing target.
//!
//! `QLAUNCHER_FUZZ_SEEDS=<dir>` writes the seeds into `<dir>` and exits.
#![no_main]
// Each target uses a part of the shared bodies.
#[allow(dead_code)]
#[path = "../../testkit/src/fuzz.rs"]
mod targets;
use std::sync::OnceLock;
static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
libfuzzer_sys::fuzz_target!(
    init: {
        if let Some(dir) = std::env::var_os("QLAUNCHER_FUZZ_SEEDS") {
            targets::write_seeds(dir.as_ref(), &targets::libvirt_rpc_seeds()).expect("seeds");
            std::process::exit(0);
        }
    },
    |data: &[u8]| {
        let rt = RT.get_or_init(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime")
        });
        targets::libvirt_rpc(rt, data);
    }
);

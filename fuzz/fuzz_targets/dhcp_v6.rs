//! One datagram through the DHCPv6 server.
#![no_main]
// Each target uses a part of the shared bodies.
#[allow(dead_code)]
#[path = "../../testkit/src/fuzz.rs"]
mod targets;
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    targets::dhcp_v6(&targets::v6_config(), data);
});

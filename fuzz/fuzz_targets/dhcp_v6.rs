//! One datagram through the DHCPv6 server.
#![no_main]
#[path = "../../tests/harden_support/targets.rs"]
mod targets;
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    targets::dhcp_v6(&targets::v6_config(), data);
});

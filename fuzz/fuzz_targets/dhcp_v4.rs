//! One datagram through the DHCPv4 server (parser and reply builder).
#![no_main]
// Each target uses a part of the shared bodies.
#[allow(dead_code)]
#[path = "../../testkit/src/fuzz.rs"]
mod targets;
use std::sync::OnceLock;
static SERVER: OnceLock<qlauncher::net::dhcp::v4::DhcpV4Server> = OnceLock::new();
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let server = SERVER.get_or_init(|| {
        qlauncher::net::dhcp::v4::DhcpV4Server::new(targets::v4_config()).expect("server")
    });
    targets::dhcp_v4(server, data);
});

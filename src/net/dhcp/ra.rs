//! Optional IPv6 router advertisements on the bridge, so the guest gets an IPv6 default route.
//!
//! Beyond KubeVirt, which sends none (kubevirt/kubevirt issue 19193; its example sets the route
//! with cloud-init). Off by default (`NetConfig::ipv6_router_advertisement`). The RA (RFC 4861
//! §4.2) sets the Managed and Other flags (addresses and DNS come from DHCPv6), carries no
//! prefix (the /120 cannot be autoconfigured), a source link-layer address and the MTU.

use crate::net::NetError;
use socket2::{Domain, Protocol, Socket, Type};
use std::future::Future;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::Duration;

/// All-nodes multicast.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// The router advertisement configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaConfig {
    /// The interface (the bridge).
    pub iface: String,
    /// The bridge MAC (source link-layer address option).
    pub source_mac: [u8; 6],
    /// The MTU option value.
    pub mtu: u32,
    /// Router lifetime in seconds (how long the default route lives).
    pub router_lifetime_secs: u16,
    /// Seconds between unsolicited advertisements.
    pub interval_secs: u32,
}

/// The ICMPv6 router advertisement message (checksum left 0: the kernel fills it for raw
/// ICMPv6 sockets).
pub fn advertisement(cfg: &RaConfig) -> Vec<u8> {
    let mut p = vec![134, 0, 0, 0, 64, 0xc0];
    p.extend_from_slice(&cfg.router_lifetime_secs.to_be_bytes());
    p.extend_from_slice(&[0; 8]); // reachable time, retrans timer: unspecified
    p.extend_from_slice(&[1, 1]); // source link-layer address, 8 bytes
    p.extend_from_slice(&cfg.source_mac);
    p.extend_from_slice(&[5, 1, 0, 0]); // MTU, 8 bytes
    p.extend_from_slice(&cfg.mtu.to_be_bytes());
    p
}

/// Opens the raw ICMPv6 socket on `iface` with hop limit 255 (required by RFC 4861).
pub fn bind(iface: &str) -> Result<(Socket, u32), NetError> {
    let err = |step: &'static str| {
        let iface = iface.to_string();
        move |source| NetError::DhcpSocket {
            iface,
            step,
            source,
        }
    };
    let index = nix::net::if_::if_nametoindex(iface)
        .map_err(|e| err("if_nametoindex")(std::io::Error::from(e)))?;
    let s = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6)).map_err(err("socket"))?;
    s.bind_device(Some(iface.as_bytes()))
        .map_err(err("SO_BINDTODEVICE"))?;
    s.set_multicast_hops_v6(255)
        .map_err(err("IPV6_MULTICAST_HOPS"))?;
    s.set_multicast_if_v6(index)
        .map_err(err("IPV6_MULTICAST_IF"))?;
    Ok((s, index))
}

/// Sends an advertisement now and every `interval_secs` until `shutdown` completes.
/// Send failures (e.g. no link-local address yet) are ignored and retried at the next tick.
pub async fn serve(
    socket: Socket,
    index: u32,
    cfg: RaConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), NetError> {
    let msg = advertisement(&cfg);
    let to = SocketAddrV6::new(ALL_NODES, 0, 0, index);
    let mut tick = tokio::time::interval(Duration::from_secs(u64::from(cfg.interval_secs.max(1))));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            _ = tick.tick() => {
                let _ = socket.send_to(&msg, &to.into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertisement_layout() {
        let cfg = RaConfig {
            iface: "k6t-eth0".into(),
            source_mac: [2, 0, 0, 0, 0, 0],
            mtu: 1450,
            router_lifetime_secs: 1800,
            interval_secs: 200,
        };
        assert_eq!(
            advertisement(&cfg),
            vec![
                134, 0, 0, 0, 64, 0xc0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 0, 0, 0, 0, 0,
                5, 1, 0, 0, 0, 0, 0x05, 0xaa
            ]
        );
    }
}

//! The DHCPv6 server for the masquerade binding when the pod has IPv6.
//!
//! As KubeVirt `pkg/network/dhcp/serverv6`: one IA_NA address (fd10:0:2::2) with infinite
//! lifetimes, server DUID-LL from the bridge MAC, DNS servers (23) from the pod's IPv6
//! nameservers; Solicit → Advertise (Reply when the client asks for rapid commit), Request,
//! Renew, Rebind, Confirm, Information-Request, Release, Decline → Reply. Replies go back to the
//! client's link-local address and port.

use super::{DhcpStats, Outcome};
use crate::net::NetError;
use dhcproto::v6::{DhcpOption, IAAddr, Message, MessageType, OptionCode, IANA};
use dhcproto::{Decodable, Encodable};
use std::future::Future;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::sync::Arc;

/// All_DHCP_Relay_Agents_and_Servers (RFC 8415).
pub const ALL_DHCP_SERVERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 1, 2);
/// "Infinite" lifetime.
pub const INFINITE: u32 = u32::MAX;

/// The DHCPv6 server configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpV6Config {
    /// The interface the server listens on (the bridge).
    pub iface: String,
    /// The MAC the server DUID-LL is made of (the bridge MAC).
    pub server_mac: [u8; 6],
    /// The one address handed out.
    pub address: Ipv6Addr,
    /// DNS servers (option 23); not sent when empty.
    pub dns: Vec<Ipv6Addr>,
}

/// The server DUID: DUID-LL (type 3), hardware type 1 (Ethernet), then the MAC.
pub fn server_duid(mac: [u8; 6]) -> Vec<u8> {
    let mut d = vec![0, 3, 0, 1];
    d.extend_from_slice(&mac);
    d
}

/// Decides the answer to one datagram from `from`. Pure, never panics.
pub fn respond(cfg: &DhcpV6Config, packet: &[u8], from: SocketAddrV6) -> Outcome<SocketAddrV6> {
    // dhcproto asserts on some inputs; a panic is caught and counted as malformed.
    let req = match std::panic::catch_unwind(|| Message::from_bytes(packet)) {
        Ok(Ok(m)) => m,
        Ok(Err(e)) => return Outcome::Malformed(e.to_string()),
        Err(_) => return Outcome::Malformed("the decoder panicked".into()),
    };
    let Some(DhcpOption::ClientId(client_id)) = req.opts().get(OptionCode::ClientId) else {
        return Outcome::Malformed("no client identifier".into());
    };
    let duid = server_duid(cfg.server_mac);
    if let Some(DhcpOption::ServerId(id)) = req.opts().get(OptionCode::ServerId) {
        if *id != duid {
            return Outcome::Ignored("message for another server");
        }
    }
    let rapid = req.opts().get(OptionCode::RapidCommit).is_some();
    let kind = match req.msg_type() {
        MessageType::Solicit if rapid => MessageType::Reply,
        MessageType::Solicit => MessageType::Advertise,
        MessageType::Request
        | MessageType::Renew
        | MessageType::Rebind
        | MessageType::Confirm
        | MessageType::InformationRequest
        | MessageType::Release
        | MessageType::Decline => MessageType::Reply,
        _ => return Outcome::Ignored("message type not served"),
    };
    let mut r = Message::new_with_id(kind, req.xid());
    r.opts_mut().insert(DhcpOption::ServerId(duid));
    r.opts_mut().insert(DhcpOption::ClientId(client_id.clone()));
    if rapid && req.msg_type() == MessageType::Solicit {
        r.opts_mut().insert(DhcpOption::RapidCommit);
    }
    if req.msg_type() != MessageType::InformationRequest {
        let iaid = match req.opts().get(OptionCode::IANA) {
            Some(DhcpOption::IANA(ia)) => ia.id,
            _ => 0,
        };
        let mut ia_opts = dhcproto::v6::DhcpOptions::new();
        ia_opts.insert(DhcpOption::IAAddr(IAAddr {
            addr: cfg.address,
            preferred_life: INFINITE,
            valid_life: INFINITE,
            opts: dhcproto::v6::DhcpOptions::new(),
        }));
        r.opts_mut().insert(DhcpOption::IANA(IANA {
            id: iaid,
            t1: INFINITE,
            t2: INFINITE,
            opts: ia_opts,
        }));
    }
    if !cfg.dns.is_empty() {
        r.opts_mut()
            .insert(DhcpOption::DomainNameServers(cfg.dns.clone()));
    }
    match r.to_vec() {
        Ok(bytes) => Outcome::Reply {
            bytes,
            to: from,
            nak: false,
        },
        Err(e) => Outcome::Malformed(format!("encode reply: {e}")),
    }
}

/// Binds the DHCPv6 server socket: UDP [::]:547, IPv6 only, `SO_BINDTODEVICE` to `iface`,
/// joined to ff02::1:2 on it, non-blocking. Call it in the pod network namespace.
pub fn bind(iface: &str) -> Result<std::net::UdpSocket, NetError> {
    use socket2::{Domain, Protocol, Socket, Type};
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
    let s = Socket::new(Domain::IPV6, Type::DGRAM, Some(Protocol::UDP)).map_err(err("socket"))?;
    s.set_only_v6(true).map_err(err("IPV6_V6ONLY"))?;
    s.set_reuse_address(true).map_err(err("SO_REUSEADDR"))?;
    s.bind_device(Some(iface.as_bytes()))
        .map_err(err("SO_BINDTODEVICE"))?;
    let addr = SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 547, 0, 0));
    s.bind(&addr.into()).map_err(err("bind [::]:547"))?;
    s.join_multicast_v6(&ALL_DHCP_SERVERS, index)
        .map_err(err("join ff02::1:2"))?;
    s.set_nonblocking(true).map_err(err("O_NONBLOCK"))?;
    Ok(s.into())
}

/// Serves DHCPv6 on `socket` (from [`bind`]) until `shutdown` completes.
pub async fn serve(
    socket: std::net::UdpSocket,
    cfg: Arc<DhcpV6Config>,
    stats: Arc<DhcpStats>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), NetError> {
    let socket =
        tokio::net::UdpSocket::from_std(socket).map_err(|source| NetError::DhcpSocket {
            iface: cfg.iface.clone(),
            step: "register with tokio",
            source,
        })?;
    tokio::pin!(shutdown);
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, from) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            r = socket.recv_from(&mut buf) => match r {
                Ok((n, SocketAddr::V6(from))) => (n, from),
                _ => continue,
            },
        };
        let outcome = respond(&cfg, &buf[..n], from);
        outcome.count(&stats);
        if let Outcome::Reply { bytes, to, .. } = &outcome {
            if socket.send_to(bytes, *to).await.is_err() {
                DhcpStats::bump(&stats.send_errors);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> DhcpV6Config {
        DhcpV6Config {
            iface: "k6t-eth0".into(),
            server_mac: [2, 0, 0, 0, 0, 0],
            address: "fd10:0:2::2".parse().unwrap(),
            dns: vec!["fd00:10:96::a".parse().unwrap()],
        }
    }

    fn from() -> SocketAddrV6 {
        SocketAddrV6::new("fe80::1".parse().unwrap(), 546, 0, 3)
    }

    fn solicit(rapid: bool) -> Vec<u8> {
        let mut m = Message::new_with_id(MessageType::Solicit, [1, 2, 3]);
        m.opts_mut()
            .insert(DhcpOption::ClientId(vec![0, 3, 0, 1, 1, 2, 3, 4, 5, 6]));
        m.opts_mut().insert(DhcpOption::IANA(IANA {
            id: 77,
            t1: 0,
            t2: 0,
            opts: Default::default(),
        }));
        if rapid {
            m.opts_mut().insert(DhcpOption::RapidCommit);
        }
        m.to_vec().unwrap()
    }

    #[test]
    fn solicit_gets_advertise_with_address_and_dns() {
        let Outcome::Reply { bytes, to, .. } = respond(&cfg(), &solicit(false), from()) else {
            panic!()
        };
        assert_eq!(to, from());
        let m = Message::from_bytes(&bytes).unwrap();
        assert_eq!(m.msg_type(), MessageType::Advertise);
        assert_eq!(m.xid(), [1, 2, 3]);
        let Some(DhcpOption::IANA(ia)) = m.opts().get(OptionCode::IANA) else {
            panic!()
        };
        assert_eq!(ia.id, 77);
        let Some(DhcpOption::IAAddr(a)) = ia.opts.get(OptionCode::IAAddr) else {
            panic!()
        };
        assert_eq!(
            (a.addr, a.valid_life),
            ("fd10:0:2::2".parse().unwrap(), INFINITE)
        );
        assert_eq!(
            m.opts().get(OptionCode::DomainNameServers),
            Some(&DhcpOption::DomainNameServers(cfg().dns))
        );
        assert_eq!(
            m.opts().get(OptionCode::ServerId),
            Some(&DhcpOption::ServerId(vec![0, 3, 0, 1, 2, 0, 0, 0, 0, 0]))
        );
    }

    #[test]
    fn rapid_commit_solicit_gets_reply() {
        let Outcome::Reply { bytes, .. } = respond(&cfg(), &solicit(true), from()) else {
            panic!()
        };
        assert_eq!(
            Message::from_bytes(&bytes).unwrap().msg_type(),
            MessageType::Reply
        );
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let _ = respond(&cfg(), &bytes, from());
        }
    }
}

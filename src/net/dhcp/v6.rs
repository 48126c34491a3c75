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
use dhcproto::{Decodable, Encodable, Name};
use std::future::Future;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV6};
use std::str::FromStr;
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
    /// The domain search list (option 24, RFC 3646), the same as DHCPv4's option 119 (beyond
    /// KubeVirt, which sends none); not sent when empty. Entries that are not DNS names are
    /// left out ([`super::dns_name_problem`]).
    pub search: Vec<String>,
}

/// The server DUID: DUID-LL (type 3), hardware type 1 (Ethernet), then the MAC.
pub fn server_duid(mac: [u8; 6]) -> Vec<u8> {
    let mut d = vec![0, 3, 0, 1];
    d.extend_from_slice(&mac);
    d
}

/// The most options nested inside one another (IA_NA > IA Address > Status Code is 3).
const MAX_NESTING: usize = 4;

/// What [`precheck`] counted, so the decoded message can be checked against it: dhcproto stops
/// at the first option it cannot decode and returns the ones before it, silently.
#[derive(Debug, Default)]
struct Counted {
    /// Top-level options.
    top: usize,
    /// Options inside each IA_NA.
    in_iana: Vec<usize>,
}

/// Checks a client message's option layout before dhcproto 0.15 decodes it (RFC 8415 §21).
///
/// The decoder subtracts a fixed field length from the option length without checking it
/// (`src/v6/options.rs`: Status Code shorter than 2 bytes, Vendor Class and Vendor-specific
/// Information shorter than 4), which panics with debug assertions and silently drops the
/// option without them; and it ignores an option that runs past the end of the message or of
/// its IA. Here every option must fit its container exactly and have its fixed length.
fn precheck(packet: &[u8]) -> Result<Counted, String> {
    if packet.len() < 4 {
        return Err(format!(
            "{} bytes is shorter than a DHCPv6 header",
            packet.len()
        ));
    }
    let mut counted = Counted::default();
    counted.top = check_options(&packet[4..], 0, &mut counted.in_iana)?;
    Ok(counted)
}

/// Walks the options in `buf` (one container: the message, an IA or an IA Address) and returns
/// how many there are; the counts of IA_NA contents are pushed to `in_iana`.
fn check_options(buf: &[u8], depth: usize, in_iana: &mut Vec<usize>) -> Result<usize, String> {
    if depth > MAX_NESTING {
        return Err("options nested too deep".into());
    }
    let mut i = 0;
    let mut n = 0;
    while i < buf.len() {
        let Some(head) = buf.get(i..i + 4) else {
            return Err(format!("option header truncated at offset {i}"));
        };
        let code = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let Some(body) = buf.get(i + 4..i + 4 + len) else {
            return Err(format!(
                "option {code} length {len} runs past the end ({} bytes left)",
                buf.len() - i - 4
            ));
        };
        let bad = |what: &str| Err(format!("option {code} length {len}: {what}"));
        match code {
            // Client and Server Identifier: a DUID, 2-byte type and 1 to 128 bytes (§11).
            1 | 2 if !(3..=130).contains(&len) => return bad("a DUID is 3 to 130 bytes"),
            // IA_NA and IA_PD: IAID, T1, T2, then options.
            3 | 25 => {
                if len < 12 {
                    return bad("an IA_NA or IA_PD is at least 12 bytes");
                }
                let slot = in_iana.len();
                if code == 3 {
                    in_iana.push(0);
                }
                let inner = check_options(&body[12..], depth + 1, in_iana)?;
                if code == 3 {
                    in_iana[slot] = inner;
                }
            }
            // IA_TA: IAID, then options.
            4 => {
                if len < 4 {
                    return bad("an IA_TA is at least 4 bytes");
                }
                check_options(&body[4..], depth + 1, in_iana)?;
            }
            // IA Address: address, preferred and valid lifetimes, then options.
            5 => {
                if len < 24 {
                    return bad("an IA Address is at least 24 bytes");
                }
                check_options(&body[24..], depth + 1, in_iana)?;
            }
            // IA Prefix: lifetimes, prefix length, prefix, then options.
            26 => {
                if len < 25 {
                    return bad("an IA Prefix is at least 25 bytes");
                }
                check_options(&body[25..], depth + 1, in_iana)?;
            }
            6 | 61 if len % 2 != 0 => return bad("a list of 2-byte codes"),
            7 | 19 if len != 1 => return bad("1 byte"),
            8 if len != 2 => return bad("2 bytes"),
            9 => return bad("a Relay Message option in a client message"),
            11 if len < 11 => return bad("an Authentication option is at least 11 bytes"),
            12 if len != 16 => return bad("an IPv6 address"),
            13 => {
                if len < 2 {
                    return bad("a Status Code is at least 2 bytes");
                }
                if std::str::from_utf8(&body[2..]).is_err() {
                    return bad("the status message is not UTF-8");
                }
            }
            14 | 20 if len != 0 => return bad("no data"),
            16 if len < 4 => return bad("a Vendor Class is at least 4 bytes"),
            17 => {
                if len < 4 {
                    return bad("Vendor-specific Information is at least 4 bytes");
                }
                check_options(&body[4..], depth + 1, &mut Vec::new())?;
            }
            23 if len % 16 != 0 => return bad("a list of IPv6 addresses"),
            56 => check_ntp(body).map_err(|e| format!("option 56: {e}"))?,
            _ => {}
        }
        n += 1;
        i += 4 + len;
    }
    Ok(n)
}

/// NTP Server suboptions (RFC 5908): addresses (1, 2) of 16 bytes, or an FQDN (3).
fn check_ntp(body: &[u8]) -> Result<(), String> {
    let mut i = 0;
    while i < body.len() {
        let Some(head) = body.get(i..i + 4) else {
            return Err("suboption header truncated".into());
        };
        let code = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        if body.len() < i + 4 + len {
            return Err(format!("suboption {code} runs past the end"));
        }
        match code {
            1 | 2 if len == 16 => {}
            3 if len > 0 => {}
            _ => return Err(format!("suboption {code} of {len} bytes")),
        }
        i += 4 + len;
    }
    Ok(())
}

/// Decodes a client message: [`precheck`], dhcproto, then a check that dhcproto kept every
/// option (it drops what it cannot decode without an error).
pub fn decode_client_message(packet: &[u8]) -> Result<Message, String> {
    let counted = precheck(packet)?;
    let m = Message::from_bytes(packet).map_err(|e| e.to_string())?;
    // dhcproto sorts the options by code (not stably), so several IA_NAs are compared as a set.
    let mut decoded_iana: Vec<usize> = m
        .opts()
        .iter()
        .filter_map(|o| match o {
            DhcpOption::IANA(ia) => Some(ia.opts.iter().count()),
            _ => None,
        })
        .collect();
    let mut counted_iana = counted.in_iana;
    decoded_iana.sort_unstable();
    counted_iana.sort_unstable();
    if m.opts().iter().count() != counted.top || decoded_iana != counted_iana {
        return Err("an option did not decode".into());
    }
    Ok(m)
}

/// Decides the answer to one datagram from `from`. Pure, never panics.
///
/// Malformed: an option layout [`decode_client_message`] rejects, or a message without the
/// options RFC 8415 §16 requires (a Client Identifier except in Information-request; a Server
/// Identifier in Request, Renew, Release and Decline; none in Solicit, Rebind and Confirm; no
/// IA in Information-request). Relay messages are not served (KubeVirt serves the directly
/// attached guest only).
pub fn respond(cfg: &DhcpV6Config, packet: &[u8], from: SocketAddrV6) -> Outcome<SocketAddrV6> {
    if matches!(packet.first(), Some(12 | 13)) {
        return Outcome::Ignored("relay message");
    }
    let req = match decode_client_message(packet) {
        Ok(m) => m,
        Err(e) => return Outcome::Malformed(e),
    };
    if let Err(e) = required_options(&req) {
        return Outcome::Malformed(e);
    }
    let client_id = match req.opts().get(OptionCode::ClientId) {
        Some(DhcpOption::ClientId(id)) => Some(id.clone()),
        _ => None,
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
    if let Some(id) = client_id {
        r.opts_mut().insert(DhcpOption::ClientId(id));
    }
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
    let search: Vec<Name> = cfg
        .search
        .iter()
        .filter(|d| super::dns_name_problem(d).is_none())
        .filter_map(|d| Name::from_str(&format!("{d}.")).ok())
        .collect();
    if !search.is_empty() {
        r.opts_mut().insert(DhcpOption::DomainSearchList(search));
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

/// RFC 8415 §16: which identifiers a message must or must not carry.
fn required_options(req: &Message) -> Result<(), String> {
    let has = |c| req.opts().get(c).is_some();
    let kind = req.msg_type();
    let (client, server): (bool, Option<bool>) = match kind {
        MessageType::Solicit | MessageType::Rebind | MessageType::Confirm => (true, Some(false)),
        MessageType::Request | MessageType::Renew | MessageType::Release | MessageType::Decline => {
            (true, Some(true))
        }
        MessageType::InformationRequest => (false, None),
        _ => return Ok(()),
    };
    if client && !has(OptionCode::ClientId) {
        return Err(format!("{kind:?} without a Client Identifier"));
    }
    match server {
        Some(true) if !has(OptionCode::ServerId) => {
            return Err(format!("{kind:?} without a Server Identifier"))
        }
        Some(false) if has(OptionCode::ServerId) => {
            return Err(format!("{kind:?} with a Server Identifier"))
        }
        _ => {}
    }
    if kind == MessageType::InformationRequest
        && [OptionCode::IANA, OptionCode::IATA, OptionCode::IAPD]
            .into_iter()
            .any(has)
    {
        return Err("Information-request with an IA".into());
    }
    Ok(())
}

/// Binds the DHCPv6 server socket: UDP `[::]:547`, IPv6 only, `SO_BINDTODEVICE` to `iface`,
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
        match &outcome {
            Outcome::Reply { bytes, to, .. } if socket.send_to(bytes, *to).await.is_err() => {
                DhcpStats::bump(&stats.send_errors);
            }
            Outcome::Malformed(reason) => {
                tracing::debug!(reason = %reason, from = %from, "dropped malformed DHCPv6 message");
            }
            _ => {}
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
            search: vec![
                "default.svc.cluster.local".into(),
                "bad_name.example".into(),
            ],
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

    /// A message of `kind` with xid 1,2,3 and these raw options.
    fn raw(kind: u8, opts: &[&[u8]]) -> Vec<u8> {
        let mut m = vec![kind, 1, 2, 3];
        for o in opts {
            m.extend_from_slice(o);
        }
        m
    }

    const CLIENT_ID: &[u8] = &[0, 1, 0, 10, 0, 3, 0, 1, 1, 2, 3, 4, 5, 6];
    const SERVER_ID: &[u8] = &[0, 2, 0, 10, 0, 3, 0, 1, 2, 0, 0, 0, 0, 0];
    const IA_NA: &[u8] = &[0, 3, 0, 12, 0, 0, 0, 77, 0, 0, 0, 0, 0, 0, 0, 0];

    #[test]
    fn malformed_options_are_dropped_before_dhcproto_sees_them() {
        let cases: Vec<(&str, Vec<u8>)> = vec![
            // The three places dhcproto 0.15 subtracts below zero.
            (
                "status code of 0 bytes",
                raw(1, &[CLIENT_ID, &[0, 13, 0, 0]]),
            ),
            (
                "status code of 1 byte",
                raw(1, &[CLIENT_ID, &[0, 13, 0, 1, 0]]),
            ),
            (
                "vendor class of 3 bytes",
                raw(1, &[CLIENT_ID, &[0, 16, 0, 3, 0, 0, 1]]),
            ),
            (
                "vendor opts of 2 bytes",
                raw(1, &[CLIENT_ID, &[0, 17, 0, 2, 0, 0]]),
            ),
            (
                "option past the end",
                raw(1, &[CLIENT_ID, &[0, 6, 0, 40, 0, 23]]),
            ),
            ("truncated option header", raw(1, &[CLIENT_ID, &[0, 6, 0]])),
            (
                "IA_NA of 8 bytes",
                raw(1, &[CLIENT_ID, &[0, 3, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0]]),
            ),
            (
                "IA_NA whose address runs past it",
                raw(
                    3,
                    &[
                        CLIENT_ID,
                        SERVER_ID,
                        &[0, 3, 0, 16, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 24],
                    ],
                ),
            ),
            ("empty client id", raw(11, &[&[0, 1, 0, 0]])),
            (
                "rapid commit with data",
                raw(1, &[CLIENT_ID, &[0, 14, 0, 1, 0]]),
            ),
            (
                "status message not UTF-8",
                raw(1, &[CLIENT_ID, &[0, 13, 0, 3, 0, 0, 0xff]]),
            ),
            // RFC 8415 §16.
            ("solicit without client id", raw(1, &[IA_NA])),
            (
                "solicit with server id",
                raw(1, &[CLIENT_ID, SERVER_ID, IA_NA]),
            ),
            ("request without server id", raw(3, &[CLIENT_ID, IA_NA])),
            (
                "information-request with IA_NA",
                raw(11, &[CLIENT_ID, IA_NA]),
            ),
            ("header only", vec![1, 0, 0]),
        ];
        for (what, bytes) in cases {
            match respond(&cfg(), &bytes, from()) {
                Outcome::Malformed(_) => {}
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn well_formed_request_and_information_request_are_answered() {
        let Outcome::Reply { bytes, .. } = respond(
            &cfg(),
            &raw(3, &[CLIENT_ID, SERVER_ID, IA_NA, &[0, 8, 0, 2, 0, 0]]),
            from(),
        ) else {
            panic!("request not answered")
        };
        let m = Message::from_bytes(&bytes).unwrap();
        assert_eq!(m.msg_type(), MessageType::Reply);
        assert!(m.opts().get(OptionCode::IANA).is_some());
        // Information-request without a client id: a Reply without IA_NA and without client id.
        let Outcome::Reply { bytes, .. } =
            respond(&cfg(), &raw(11, &[&[0, 6, 0, 4, 0, 23, 0, 24]]), from())
        else {
            panic!("information-request not answered")
        };
        let m = Message::from_bytes(&bytes).unwrap();
        assert!(m.opts().get(OptionCode::IANA).is_none());
        assert!(m.opts().get(OptionCode::ClientId).is_none());
        let Some(DhcpOption::DomainSearchList(names)) = m.opts().get(OptionCode::DomainSearchList)
        else {
            panic!("no option 24")
        };
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        assert_eq!(names, ["default.svc.cluster.local."]);
        // Two IA_NAs, one with an IA Address inside, in either order.
        let ia_addr: &[u8] = &[
            0, 3, 0, 40, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5, 0, 24, 0xfd, 0x10, 0, 0, 0, 2,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0,
        ];
        for opts in [[CLIENT_ID, IA_NA, ia_addr], [CLIENT_ID, ia_addr, IA_NA]] {
            assert!(matches!(
                respond(&cfg(), &raw(1, &opts), from()),
                Outcome::Reply { .. }
            ));
        }
        // Relay messages are not served.
        assert!(matches!(
            respond(&cfg(), &[12, 0, 0, 0], from()),
            Outcome::Ignored(_)
        ));
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let _ = respond(&cfg(), &bytes, from());
        }
    }
}

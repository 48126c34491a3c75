//! The DHCPv4 server: DISCOVER→OFFER, REQUEST→ACK/NAK, INFORM→ACK, RELEASE, DECLINE.
//!
//! Options follow KubeVirt `pkg/network/dhcp/server/server.go`: subnet mask (1), router (3),
//! DNS (6), hostname (12), domain name (15), interface MTU (26), domain search (119), classless
//! static routes (121), lease time (51), server identifier (54), and the VMI's dhcpOptions (66,
//! 67, 42, private 224–254). Unlike krolaw/dhcp4, a client's parameter request list (55) is
//! honoured: when present, only the listed options are sent (53, 54 and 51 always are), and the
//! reply is kept within the client's maximum message size (57). Replies are broadcast to
//! 255.255.255.255:68 (the client has no address yet), INFORM replies go to ciaddr:68.

use super::{DhcpStats, Outcome};
use crate::net::config::DhcpExtraOptions;
use crate::net::NetError;
use dhcproto::v4::{
    self, DhcpOption, Flags, HType, Message, MessageType, Opcode, OptionCode, UnknownOption,
};
use dhcproto::{Decodable, Encodable, Name};
use ipnet::Ipv4Net;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::str::FromStr;
use std::sync::Arc;

/// The server configuration for one guest NIC (built by [`crate::net::plan()`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpV4Config {
    /// The interface the server listens on (the bridge).
    pub iface: String,
    /// The server identifier (54): the bridge address.
    pub server_ip: Ipv4Addr,
    /// The one address handed out.
    pub client_ip: Ipv4Addr,
    /// Its prefix length (subnet mask option 1).
    pub prefix_len: u8,
    /// The router (3).
    pub router: Option<Ipv4Addr>,
    /// DNS servers (6).
    pub dns: Vec<Ipv4Addr>,
    /// The search list (119).
    pub search: Vec<String>,
    /// The domain name (15).
    pub domain_name: Option<String>,
    /// The hostname (12); not sent when empty.
    pub hostname: String,
    /// The interface MTU (26).
    pub mtu: u16,
    /// Classless static routes (121); not sent when empty.
    pub routes: Vec<(Ipv4Net, Ipv4Addr)>,
    /// The lease time (51) in seconds.
    pub lease_seconds: u32,
    /// Answer only this client MAC (bridge binding); any MAC when `None` (masquerade).
    pub client_mac: Option<[u8; 6]>,
    /// The VMI's dhcpOptions.
    pub extra: DhcpExtraOptions,
}

/// A server ready to answer: the configuration with its options pre-built and validated.
#[derive(Debug, Clone)]
pub struct DhcpV4Server {
    cfg: DhcpV4Config,
    /// Optional options in the order they are dropped last-first when a reply is too big.
    optional: Vec<DhcpOption>,
}

fn prefix_mask(len: u8) -> Ipv4Addr {
    Ipv4Net::new(Ipv4Addr::UNSPECIFIED, len.min(32))
        .map(|n| n.netmask())
        .unwrap_or(Ipv4Addr::BROADCAST)
}

fn opt_err(option: &str, reason: impl Into<String>) -> NetError {
    NetError::DhcpOption {
        option: option.into(),
        reason: reason.into(),
    }
}

impl DhcpV4Server {
    /// Validates the configuration and pre-builds the options.
    ///
    /// The search list goes through [`super::search_list`]: entries that are not DNS names or do
    /// not fit 255 bytes are dropped, with one warning each kind (after [`crate::net::plan()`],
    /// which makes the list the same way, nothing is left to drop).
    ///
    /// Errors: [`NetError::DhcpOption`] for a private option outside 224..=254 or longer than
    /// 255 bytes (VMI input, checked by [`crate::net::plan()`] already).
    pub fn new(cfg: DhcpV4Config) -> Result<DhcpV4Server, NetError> {
        let mut optional = vec![DhcpOption::SubnetMask(prefix_mask(cfg.prefix_len))];
        if let Some(r) = cfg.router {
            optional.push(DhcpOption::Router(vec![r]));
        }
        if !cfg.dns.is_empty() {
            optional.push(DhcpOption::DomainNameServer(cfg.dns.clone()));
        }
        if !cfg.hostname.is_empty() {
            optional.push(DhcpOption::Hostname(cfg.hostname.clone()));
        }
        if let Some(d) = &cfg.domain_name {
            optional.push(DhcpOption::DomainName(d.clone()));
        }
        optional.push(DhcpOption::InterfaceMtu(cfg.mtu));
        let search = super::search_list(&cfg.search);
        for note in search.notes() {
            tracing::warn!(iface = %cfg.iface, "DHCPv4: {note}");
        }
        let names: Vec<Name> = search
            .names
            .iter()
            .filter_map(|d| Name::from_str(&format!("{d}.")).ok())
            .collect();
        if !names.is_empty() {
            optional.push(DhcpOption::DomainSearch(names));
        }
        if !cfg.routes.is_empty() {
            optional.push(DhcpOption::ClasslessStaticRoute(cfg.routes.clone()));
        }
        if let Some(t) = &cfg.extra.tftp_server_name {
            optional.push(DhcpOption::TFTPServerName(t.as_bytes().to_vec()));
        }
        if let Some(b) = &cfg.extra.boot_file_name {
            optional.push(DhcpOption::BootfileName(b.as_bytes().to_vec()));
        }
        if !cfg.extra.ntp_servers.is_empty() {
            optional.push(DhcpOption::NtpServers(cfg.extra.ntp_servers.clone()));
        }
        for (code, value) in &cfg.extra.private_options {
            if !(224..=254).contains(code) {
                return Err(opt_err(
                    &code.to_string(),
                    "outside the private range 224..=254",
                ));
            }
            if value.len() > 255 {
                return Err(opt_err(&code.to_string(), "value longer than 255 bytes"));
            }
            optional.push(DhcpOption::Unknown(UnknownOption::new(
                OptionCode::from(*code),
                value.as_bytes().to_vec(),
            )));
        }
        Ok(DhcpV4Server { cfg, optional })
    }

    /// The configuration.
    pub fn config(&self) -> &DhcpV4Config {
        &self.cfg
    }

    /// Decides the answer to one datagram. Pure: no I/O, never panics on any input.
    pub fn respond(&self, packet: &[u8]) -> Outcome<SocketAddrV4> {
        let req = match decode_request(packet) {
            Ok(m) => m,
            Err(e) => return Outcome::Malformed(e),
        };
        if req.opcode() != Opcode::BootRequest {
            return Outcome::Ignored("not a BOOTREQUEST");
        }
        if req.htype() != HType::Eth || req.chaddr().len() < 6 {
            return Outcome::Malformed("not an Ethernet client hardware address".into());
        }
        if let Some(mac) = self.cfg.client_mac {
            if req.chaddr()[..6] != mac {
                return Outcome::Ignored("client MAC is not the guest's");
            }
        }
        let Some(kind) = req.opts().msg_type() else {
            return Outcome::Malformed("no message type option".into());
        };
        let broadcast = SocketAddrV4::new(Ipv4Addr::BROADCAST, 68);
        match kind {
            MessageType::Discover => self.reply(&req, MessageType::Offer, broadcast),
            MessageType::Request => {
                if let Some(DhcpOption::ServerIdentifier(id)) =
                    req.opts().get(OptionCode::ServerIdentifier)
                {
                    if *id != self.cfg.server_ip {
                        return Outcome::Ignored("REQUEST for another server");
                    }
                }
                let wanted = match req.opts().get(OptionCode::RequestedIpAddress) {
                    Some(DhcpOption::RequestedIpAddress(a)) => *a,
                    _ => req.ciaddr(),
                };
                if wanted == self.cfg.client_ip {
                    self.reply(&req, MessageType::Ack, broadcast)
                } else {
                    self.nak(&req, broadcast)
                }
            }
            MessageType::Inform => {
                let to = if req.ciaddr().is_unspecified() {
                    broadcast
                } else {
                    SocketAddrV4::new(req.ciaddr(), 68)
                };
                self.reply(&req, MessageType::Ack, to)
            }
            MessageType::Release => Outcome::Released,
            MessageType::Decline => Outcome::Ignored("DECLINE"),
            _ => Outcome::Ignored("message type not served"),
        }
    }

    fn base(&self, req: &Message, kind: MessageType) -> Message {
        let mut r = Message::default();
        r.set_opcode(Opcode::BootReply)
            .set_htype(HType::Eth)
            .set_xid(req.xid())
            .set_flags(req.flags())
            .set_giaddr(req.giaddr())
            .set_chaddr(&req.chaddr()[..6]);
        r.opts_mut().insert(DhcpOption::MessageType(kind));
        r.opts_mut()
            .insert(DhcpOption::ServerIdentifier(self.cfg.server_ip));
        r
    }

    fn nak(&self, req: &Message, to: SocketAddrV4) -> Outcome<SocketAddrV4> {
        let mut r = self.base(req, MessageType::Nak);
        r.set_flags(Flags::default().set_broadcast());
        match r.to_vec() {
            Ok(bytes) => Outcome::Reply {
                bytes,
                to,
                nak: true,
            },
            Err(e) => Outcome::Malformed(format!("encode NAK: {e}")),
        }
    }

    fn reply(&self, req: &Message, kind: MessageType, to: SocketAddrV4) -> Outcome<SocketAddrV4> {
        let inform = req.opts().msg_type() == Some(MessageType::Inform);
        let mut r = self.base(req, kind);
        if inform {
            r.set_ciaddr(req.ciaddr());
        } else {
            r.set_yiaddr(self.cfg.client_ip);
            r.set_siaddr(self.cfg.server_ip);
            r.opts_mut()
                .insert(DhcpOption::AddressLeaseTime(self.cfg.lease_seconds));
        }
        let requested: Option<Vec<OptionCode>> =
            match req.opts().get(OptionCode::ParameterRequestList) {
                Some(DhcpOption::ParameterRequestList(l)) => Some(l.clone()),
                _ => None,
            };
        let mut chosen: Vec<&DhcpOption> = self
            .optional
            .iter()
            .filter(|o| {
                requested
                    .as_ref()
                    .is_none_or(|l| l.contains(&OptionCode::from(*o)))
            })
            .collect();
        // The reply must fit the client's maximum DHCP message size (57; at least 576 bytes of
        // IP datagram), minus the IP and UDP headers.
        let max_ip = match req.opts().get(OptionCode::MaxMessageSize) {
            Some(DhcpOption::MaxMessageSize(n)) => usize::from(*n).max(576),
            _ => 576,
        };
        loop {
            let mut m = r.clone();
            for o in &chosen {
                m.opts_mut().insert((*o).clone());
            }
            match m.to_vec() {
                Ok(bytes) if bytes.len() + 28 <= max_ip || chosen.is_empty() => {
                    return Outcome::Reply {
                        bytes,
                        to,
                        nak: false,
                    }
                }
                Ok(_) => {
                    chosen.pop();
                }
                Err(e) => return Outcome::Malformed(format!("encode reply: {e}")),
            }
        }
    }
}

/// Checks what dhcproto 0.15 does not before it decodes a client packet, because it panics
/// on these instead of returning an error: `hlen` over 16 (slicing `chaddr`), a classless route
/// (121) with a prefix over 32 (`unwrap`), wrong lengths of options 80, 81, 94 and 152–155
/// (`debug_assert`), and an empty option 151 (`len - 1`). dhcproto joins the pieces of an option
/// that appears more than once (RFC 3396), so the fixed lengths are checked on the joined length
/// too (two 4-byte options 152 are one of 8 bytes: found by libFuzzer, `dhcp_v4`). Found by the
/// property test below.
fn precheck(packet: &[u8]) -> Result<(), String> {
    if packet.len() < 240 {
        return Err(format!(
            "{} bytes is shorter than a BOOTP header",
            packet.len()
        ));
    }
    if packet[2] > 16 {
        return Err(format!("hlen {} is over 16", packet[2]));
    }
    if packet[236..240] != [99, 130, 83, 99] {
        return Err("no DHCP magic cookie".into());
    }
    let mut joined = [0usize; 256];
    let mut i = 240;
    while i < packet.len() {
        let code = packet[i];
        match code {
            0 => {
                i += 1;
                continue;
            }
            255 => break,
            _ => {}
        }
        let Some(&len) = packet.get(i + 1) else {
            return Err(format!("option {code} has no length"));
        };
        let len = usize::from(len);
        let Some(body) = packet.get(i + 2..i + 2 + len) else {
            return Err(format!("option {code} runs past the packet"));
        };
        let ok = match code {
            80 => len == 0,
            81 => len >= 3,
            94 => len == 3,
            151 => len >= 1,
            152..=155 => len == 4,
            121 => {
                let mut j = 0;
                let mut good = true;
                while j < body.len() {
                    let prefix = body[j];
                    if prefix > 32 {
                        good = false;
                        break;
                    }
                    j += 1 + usize::from(prefix).div_ceil(8) + 4;
                }
                good
            }
            _ => true,
        };
        if !ok {
            return Err(format!("option {code} has an invalid length or value"));
        }
        joined[usize::from(code)] += len;
        i += 2 + len;
    }
    for (code, len) in joined.iter().enumerate() {
        let fixed = match code {
            80 => Some(0),
            94 => Some(3),
            152..=155 => Some(4),
            _ => None,
        };
        if fixed.is_some_and(|f| *len != 0 && *len != f) {
            return Err(format!(
                "option {code} has an invalid length once its parts are joined"
            ));
        }
    }
    Ok(())
}

/// Decodes a client packet without letting the decoder panic: [`precheck`] first, and any
/// remaining panic inside dhcproto is caught and reported as malformed.
fn decode_request(packet: &[u8]) -> Result<Message, String> {
    precheck(packet)?;
    match std::panic::catch_unwind(|| Message::from_bytes(packet)) {
        Ok(Ok(m)) => Ok(m),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the decoder panicked".into()),
    }
}

/// Binds the DHCPv4 server socket: UDP 0.0.0.0:67 with `SO_REUSEADDR`, `SO_BROADCAST` and
/// `SO_BINDTODEVICE` to `iface`, non-blocking. Call it in the pod network namespace (the socket
/// stays in the namespace it was made in). Binding port 67 needs `CAP_NET_BIND_SERVICE`.
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
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(err("socket"))?;
    s.set_reuse_address(true).map_err(err("SO_REUSEADDR"))?;
    s.set_broadcast(true).map_err(err("SO_BROADCAST"))?;
    s.bind_device(Some(iface.as_bytes()))
        .map_err(err("SO_BINDTODEVICE"))?;
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 67));
    s.bind(&addr.into()).map_err(err("bind :67"))?;
    s.set_nonblocking(true).map_err(err("O_NONBLOCK"))?;
    Ok(s.into())
}

/// Serves DHCPv4 on `socket` (from [`bind`]) until `shutdown` completes.
///
/// Errors: only registering the socket with tokio ([`NetError::DhcpSocket`]); receive and send
/// errors are counted and the loop goes on.
pub async fn serve(
    socket: std::net::UdpSocket,
    server: Arc<DhcpV4Server>,
    stats: Arc<DhcpStats>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), NetError> {
    let iface = server.cfg.iface.clone();
    let socket =
        tokio::net::UdpSocket::from_std(socket).map_err(|source| NetError::DhcpSocket {
            iface,
            step: "register with tokio",
            source,
        })?;
    tokio::pin!(shutdown);
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, _from) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            r = socket.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(_) => { DhcpStats::bump(&stats.send_errors); continue; }
            },
        };
        let outcome = server.respond(&buf[..n]);
        outcome.count(&stats);
        match &outcome {
            Outcome::Reply { bytes, to, .. } if socket.send_to(bytes, *to).await.is_err() => {
                DhcpStats::bump(&stats.send_errors);
            }
            Outcome::Malformed(reason) => {
                tracing::debug!(reason = %reason, "dropped malformed DHCPv4 packet");
            }
            _ => {}
        }
    }
}

/// Builds a client message (used by tests and the benchmark): `kind` from `mac` with `xid`,
/// requesting `requested` (option 50) when given and listing `prl` (option 55) when non-empty.
pub fn client_message(
    kind: MessageType,
    mac: [u8; 6],
    xid: u32,
    requested: Option<Ipv4Addr>,
    server: Option<Ipv4Addr>,
    prl: &[u8],
) -> Vec<u8> {
    let mut m = Message::default();
    m.set_opcode(Opcode::BootRequest)
        .set_htype(HType::Eth)
        .set_xid(xid)
        .set_flags(Flags::default().set_broadcast())
        .set_chaddr(&mac);
    m.opts_mut().insert(DhcpOption::MessageType(kind));
    if let Some(a) = requested {
        m.opts_mut().insert(DhcpOption::RequestedIpAddress(a));
    }
    if let Some(s) = server {
        m.opts_mut().insert(DhcpOption::ServerIdentifier(s));
    }
    if !prl.is_empty() {
        m.opts_mut().insert(DhcpOption::ParameterRequestList(
            prl.iter().map(|c| OptionCode::from(*c)).collect(),
        ));
    }
    m.to_vec().unwrap_or_default()
}

/// Decodes a server reply (for tests and the benchmark).
pub fn decode(bytes: &[u8]) -> Option<v4::Message> {
    Message::from_bytes(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: [u8; 6] = [0x0a, 0x58, 0x0a, 0xf4, 0, 5];

    fn cfg() -> DhcpV4Config {
        DhcpV4Config {
            iface: "k6t-eth0".into(),
            server_ip: Ipv4Addr::new(10, 0, 2, 1),
            client_ip: Ipv4Addr::new(10, 0, 2, 2),
            prefix_len: 24,
            router: Some(Ipv4Addr::new(10, 0, 2, 1)),
            dns: vec![Ipv4Addr::new(10, 96, 0, 10)],
            search: vec!["default.svc.cluster.local".into(), "cluster.local".into()],
            domain_name: Some("default.svc.cluster.local".into()),
            hostname: "testvmi".into(),
            mtu: 1450,
            routes: vec![("10.96.0.0/12".parse().unwrap(), Ipv4Addr::new(10, 0, 2, 1))],
            lease_seconds: 86313600,
            client_mac: None,
            extra: DhcpExtraOptions {
                tftp_server_name: Some("tftp.example".into()),
                boot_file_name: Some("pxelinux.0".into()),
                ntp_servers: vec![Ipv4Addr::new(10, 0, 0, 123)],
                private_options: vec![(240, "private".into())],
            },
        }
    }

    fn reply(server: &DhcpV4Server, pkt: &[u8]) -> (Message, SocketAddrV4) {
        match server.respond(pkt) {
            Outcome::Reply { bytes, to, .. } => (decode(&bytes).unwrap(), to),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn codes(m: &Message) -> Vec<u8> {
        m.opts().iter().map(|(c, _)| u8::from(*c)).collect()
    }

    #[test]
    fn discover_without_prl_gets_every_option() {
        let s = DhcpV4Server::new(cfg()).unwrap();
        let (m, to) = reply(
            &s,
            &client_message(MessageType::Discover, MAC, 7, None, None, &[]),
        );
        assert_eq!(to, SocketAddrV4::new(Ipv4Addr::BROADCAST, 68));
        assert_eq!(m.opts().msg_type(), Some(MessageType::Offer));
        assert_eq!(m.yiaddr(), Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(m.xid(), 7);
        assert_eq!(
            codes(&m),
            vec![1, 3, 6, 12, 15, 26, 42, 51, 53, 54, 66, 67, 119, 121, 240]
        );
    }

    #[test]
    fn prl_limits_the_options() {
        let s = DhcpV4Server::new(cfg()).unwrap();
        let pkt = client_message(MessageType::Discover, MAC, 1, None, None, &[1, 3, 6, 119]);
        let (m, _) = reply(&s, &pkt);
        assert_eq!(codes(&m), vec![1, 3, 6, 51, 53, 54, 119]);
    }

    #[test]
    fn request_for_the_lease_is_acked_and_other_addresses_naked() {
        let s = DhcpV4Server::new(cfg()).unwrap();
        let ok = client_message(
            MessageType::Request,
            MAC,
            2,
            Some(Ipv4Addr::new(10, 0, 2, 2)),
            Some(Ipv4Addr::new(10, 0, 2, 1)),
            &[],
        );
        assert_eq!(reply(&s, &ok).0.opts().msg_type(), Some(MessageType::Ack));
        let bad = client_message(
            MessageType::Request,
            MAC,
            3,
            Some(Ipv4Addr::new(10, 0, 2, 9)),
            None,
            &[],
        );
        match s.respond(&bad) {
            Outcome::Reply {
                bytes, nak: true, ..
            } => {
                assert_eq!(
                    decode(&bytes).unwrap().opts().msg_type(),
                    Some(MessageType::Nak)
                )
            }
            other => panic!("{other:?}"),
        }
        let other_server = client_message(
            MessageType::Request,
            MAC,
            4,
            Some(Ipv4Addr::new(10, 0, 2, 2)),
            Some(Ipv4Addr::new(10, 0, 2, 99)),
            &[],
        );
        assert!(matches!(s.respond(&other_server), Outcome::Ignored(_)));
    }

    #[test]
    fn release_inform_and_mac_filter() {
        let mut c = cfg();
        c.client_mac = Some(MAC);
        let s = DhcpV4Server::new(c).unwrap();
        assert_eq!(
            s.respond(&client_message(
                MessageType::Release,
                MAC,
                5,
                None,
                None,
                &[]
            )),
            Outcome::Released
        );
        let other = [2, 0, 0, 0, 0, 9];
        assert!(matches!(
            s.respond(&client_message(
                MessageType::Discover,
                other,
                6,
                None,
                None,
                &[]
            )),
            Outcome::Ignored(_)
        ));
        let (m, _) = reply(
            &s,
            &client_message(MessageType::Inform, MAC, 8, None, None, &[]),
        );
        assert_eq!(m.opts().msg_type(), Some(MessageType::Ack));
        assert!(m.opts().get(OptionCode::AddressLeaseTime).is_none());
        assert_eq!(m.yiaddr(), Ipv4Addr::UNSPECIFIED);
    }

    #[test]
    fn reply_fits_the_client_maximum_message_size() {
        let mut c = cfg();
        c.extra.private_options = (224..=230).map(|code| (code, "x".repeat(200))).collect();
        let s = DhcpV4Server::new(c).unwrap();
        let Outcome::Reply { bytes, .. } = s.respond(&client_message(
            MessageType::Discover,
            MAC,
            1,
            None,
            None,
            &[],
        )) else {
            panic!()
        };
        assert!(bytes.len() + 28 <= 576, "{} bytes", bytes.len());
        let m = decode(&bytes).unwrap();
        assert_eq!(m.opts().msg_type(), Some(MessageType::Offer));
        assert!(m.opts().get(OptionCode::SubnetMask).is_some());
    }

    #[test]
    fn invalid_and_overlong_search_domains_are_dropped() {
        let mut c = cfg();
        c.search = vec!["a..b".into(), "ok.example".into()];
        c.search
            .extend((0..20).map(|i| format!("d{i}.{}.example", "x".repeat(30))));
        let s = DhcpV4Server::new(c).unwrap();
        let (m, _) = reply(
            &s,
            &client_message(MessageType::Discover, MAC, 1, None, None, &[119]),
        );
        let Some(DhcpOption::DomainSearch(names)) = m.opts().get(OptionCode::DomainSearch) else {
            panic!("no option 119")
        };
        assert_eq!(names[0].to_string(), "ok.example.");
        let bytes: usize = names.iter().map(|n| n.to_string().len() + 1).sum();
        assert!(bytes <= 255, "{bytes}");
    }

    #[test]
    fn malformed_packets_are_reported() {
        let s = DhcpV4Server::new(cfg()).unwrap();
        assert!(matches!(s.respond(&[]), Outcome::Malformed(_)));
        assert!(matches!(s.respond(&[1, 2, 3]), Outcome::Malformed(_)));
    }

    /// Regression (libFuzzer, `dhcp_v4`): dhcproto joins repeated options (RFC 3396), so two
    /// well-formed 4-byte options 152 became one of 8 bytes and hit its `debug_assert!(len == 4)`;
    /// an empty option 151 made it compute `len - 1`. Both are refused before dhcproto decodes.
    #[test]
    fn repeated_fixed_length_options_are_refused_before_the_decoder() {
        let s = DhcpV4Server::new(cfg()).unwrap();
        let discover = client_message(MessageType::Discover, MAC, 9, None, None, &[1, 3]);
        let end = discover.iter().rposition(|b| *b == 255).unwrap();
        for extra in [
            &[152u8, 4, 0, 0, 0, 1, 152, 4, 0, 0, 0, 2][..],
            &[94, 3, 1, 2, 3, 94, 3, 1, 2, 3][..],
            &[151, 0][..],
        ] {
            let mut pkt = discover[..end].to_vec();
            pkt.extend_from_slice(extra);
            pkt.push(255);
            match s.respond(&pkt) {
                Outcome::Malformed(why) => assert!(why.contains("option"), "{extra:?}: {why}"),
                other => panic!("{extra:?}: {other:?}"),
            }
        }
        // One of each is still served.
        let mut pkt = discover[..end].to_vec();
        pkt.extend_from_slice(&[152, 4, 0, 0, 0, 1]);
        pkt.push(255);
        assert!(matches!(s.respond(&pkt), Outcome::Reply { .. }));
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..700)) {
            let s = DhcpV4Server::new(cfg()).unwrap();
            let stats = DhcpStats::default();
            s.respond(&bytes).count(&stats);
            proptest::prop_assert_eq!(stats.snapshot().received, 1);
        }

        #[test]
        fn mutated_discovers_never_panic(flips in proptest::collection::vec((0usize..400, proptest::num::u8::ANY), 1..20)) {
            let s = DhcpV4Server::new(cfg()).unwrap();
            let mut pkt = client_message(MessageType::Discover, MAC, 9, None, None, &[1, 3, 6, 12, 15, 26, 119, 121]);
            for (i, b) in flips {
                let n = pkt.len();
                pkt[i % n] = b;
            }
            let _ = s.respond(&pkt);
        }
    }
}

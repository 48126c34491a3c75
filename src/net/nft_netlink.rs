//! Commits [`NatTable`]s to the kernel through libnftnl and libmnl (crate `nftnl`), with no `nft`
//! binary, and reads back which `nat` tables exist.
//!
//! Each table carries a marker in its userdata (`qlauncher/<fingerprint>`, a TLV type that `nft`
//! ignores, so `nft list ruleset` is unchanged). Setup skips a table whose marker matches the
//! plan, replaces a table with an older qlauncher marker, and refuses to touch an unmarked one;
//! teardown deletes only marked tables.

use crate::net::nft::{Action, Family, Hook, Match, NatTable, NAT_TABLE};
use crate::net::NetError;
use nftnl::expr::{
    Cmp, CmpOp, Counter, Expression, Immediate, Lookup, Masquerade, Meta, Nat, NatType,
    NetworkHeaderField, Payload, Register, TcpHeaderField, ToSlice, TransportHeaderField, Verdict,
};
use nftnl::set::{Set, SetKey};
use nftnl::{Batch, Chain, MsgType, NlMsg, ProtoFamily, Rule, Table};
use nftnl_sys as sys;
use std::borrow::Cow;
use std::ffi::{c_void, CStr, CString};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::raw::c_char;
use std::ptr::NonNull;

const MARKER_PREFIX: &[u8] = b"qlauncher/";
/// The userdata TLV type of the marker; nft only knows type 0 (comment) for tables.
const MARKER_TLV: u8 = 0x71;

fn proto_family(f: Family) -> ProtoFamily {
    match f {
        Family::Ip => ProtoFamily::Ipv4,
        Family::Ip6 => ProtoFamily::Ipv6,
    }
}

fn nft_err(step: impl Into<String>, source: io::Error) -> NetError {
    NetError::Nftables {
        step: step.into(),
        source,
    }
}

/// The marker stored with a table: a stable FNV-1a hash of its rendered rules.
pub(crate) fn marker(table: &NatTable) -> Vec<u8> {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in table.to_string().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    let mut m = MARKER_PREFIX.to_vec();
    m.extend_from_slice(format!("{h:016x}").as_bytes());
    m
}

/// What exists in the kernel for one family's `nat` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TableState {
    /// No `nat` table.
    Absent,
    /// A `nat` table with this qlauncher marker.
    Ours(Vec<u8>),
    /// A `nat` table without a qlauncher marker.
    Foreign,
}

/// Bytes compared or loaded as-is.
struct Bytes(Vec<u8>);

impl ToSlice for Bytes {
    fn to_slice(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.0)
    }
}

/// An interface name as `meta iifname` loads it: NUL-padded to IFNAMSIZ (16), like `nft` does.
fn ifname(name: &str) -> Bytes {
    let mut b = name.as_bytes().to_vec();
    b.resize(16, 0);
    Bytes(b)
}

/// `meta l4proto` into register 1 (not wrapped by the `nftnl` crate).
struct L4Proto;

impl Expression for L4Proto {
    fn to_expr(&self, _rule: &Rule) -> NonNull<sys::nftnl_expr> {
        // SAFETY: plain libnftnl allocation and attribute setters on the new expression.
        unsafe {
            let expr = sys::nftnl_expr_alloc(c"meta".as_ptr());
            let expr = NonNull::new(expr).unwrap_or_else(|| std::process::abort());
            sys::nftnl_expr_set_u32(
                expr.as_ptr(),
                sys::NFTNL_EXPR_META_KEY as u16,
                libc::NFT_META_L4PROTO as u32,
            );
            sys::nftnl_expr_set_u32(
                expr.as_ptr(),
                sys::NFTNL_EXPR_META_DREG as u16,
                libc::NFT_REG_1 as u32,
            );
            expr
        }
    }
}

/// A port as a set key of type `inet_service` (13), big-endian.
struct PortKey(u16);

impl SetKey for PortKey {
    const TYPE: u32 = 13;
    const LEN: u32 = 2;
    fn data(&self) -> Box<[u8]> {
        Box::new(self.0.to_be_bytes())
    }
}

/// A table message with the qlauncher marker in its userdata.
struct MarkedTable {
    ptr: NonNull<sys::nftnl_table>,
    family: ProtoFamily,
}

impl MarkedTable {
    fn new(family: ProtoFamily, marker: &[u8]) -> MarkedTable {
        // SAFETY: libnftnl copies the name and the userdata buffer.
        unsafe {
            let t = sys::nftnl_table_alloc();
            let t = NonNull::new(t).unwrap_or_else(|| std::process::abort());
            sys::nftnl_table_set_u32(t.as_ptr(), sys::NFTNL_TABLE_FAMILY as u16, family as u32);
            let name = CString::new(NAT_TABLE).unwrap_or_default();
            sys::nftnl_table_set_str(t.as_ptr(), sys::NFTNL_TABLE_NAME as u16, name.as_ptr());
            sys::nftnl_table_set_u32(t.as_ptr(), sys::NFTNL_TABLE_FLAGS as u16, 0);
            let mut udata = vec![MARKER_TLV, marker.len().min(255) as u8];
            udata.extend_from_slice(&marker[..marker.len().min(255)]);
            sys::nftnl_table_set_data(
                t.as_ptr(),
                sys::NFTNL_TABLE_USERDATA as u16,
                udata.as_ptr() as *const c_void,
                udata.len() as u32,
            );
            MarkedTable { ptr: t, family }
        }
    }
}

impl Drop for MarkedTable {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once.
        unsafe { sys::nftnl_table_free(self.ptr.as_ptr()) }
    }
}

// SAFETY: a table message is far below the maximum netlink message size.
unsafe impl NlMsg for MarkedTable {
    unsafe fn write(&self, buf: *mut c_void, seq: u32, msg_type: MsgType) {
        let (ty, flags) = match msg_type {
            MsgType::Add => (libc::NFT_MSG_NEWTABLE, libc::NLM_F_ACK | libc::NLM_F_CREATE),
            MsgType::Del => (libc::NFT_MSG_DELTABLE, libc::NLM_F_ACK),
        };
        // SAFETY: the caller passes a buffer of nft_nlmsg_maxsize() bytes.
        unsafe {
            let hdr = sys::nftnl_nlmsg_build_hdr(
                buf.cast::<c_char>(),
                ty as u16,
                self.family as u16,
                flags as u16,
                seq,
            );
            sys::nftnl_table_nlmsg_build_payload(hdr, self.ptr.as_ptr());
        }
    }
}

/// A receive buffer aligned for `nlmsghdr`, as libmnl requires.
struct AlignedBuf(Vec<u64>);

impl AlignedBuf {
    fn new() -> AlignedBuf {
        AlignedBuf(vec![
            0u64;
            (nftnl::nft_nlmsg_maxsize() as usize).div_ceil(8)
        ])
    }
    fn bytes(&mut self) -> &mut [u8] {
        let len = self.0.len() * 8;
        // SAFETY: a u64 buffer viewed as bytes, same allocation and length in bytes.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast::<u8>(), len) }
    }
}

fn send_batch(batch: Batch, step: &str) -> Result<(), NetError> {
    let batch = batch.finalize();
    let socket = mnl::Socket::new(mnl::Bus::Netfilter).map_err(|e| nft_err(step, e))?;
    let portid = socket.portid();
    socket.send_all(&batch).map_err(|e| nft_err(step, e))?;
    let mut buf = AlignedBuf::new();
    let mut seqs = batch.sequence_numbers();
    while !seqs.is_empty() {
        for msg in socket.recv(buf.bytes()).map_err(|e| nft_err(step, e))? {
            let msg = msg.map_err(|e| nft_err(step, e))?;
            let Some(seq) = seqs.next() else { break };
            mnl::cb_run(msg, seq, portid).map_err(|e| nft_err(step, e))?;
        }
    }
    Ok(())
}

fn table_cb(header: &libc::nlmsghdr, out: &mut Vec<Option<Vec<u8>>>) -> libc::c_int {
    // SAFETY: libnftnl parses the message libmnl handed us into a table we own and free.
    unsafe {
        let t = sys::nftnl_table_alloc();
        if t.is_null() {
            return -1;
        }
        if sys::nftnl_table_nlmsg_parse(header as *const libc::nlmsghdr as *const _, t) < 0 {
            sys::nftnl_table_free(t);
            return -1;
        }
        let name = CStr::from_ptr(sys::nftnl_table_get_str(t, sys::NFTNL_TABLE_NAME as u16));
        if name.to_bytes() == NAT_TABLE.as_bytes() {
            let mut len: u32 = 0;
            let p = sys::nftnl_table_get_data(t, sys::NFTNL_TABLE_USERDATA as u16, &mut len);
            let udata = if p.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(p as *const u8, len as usize).to_vec()
            };
            out.push(Some(udata));
        }
        sys::nftnl_table_free(t);
    }
    1
}

fn marker_of(udata: &[u8]) -> Option<Vec<u8>> {
    let mut rest = udata;
    while rest.len() >= 2 {
        let (ty, len) = (rest[0], rest[1] as usize);
        let value = rest.get(2..2 + len)?;
        if ty == MARKER_TLV && value.starts_with(MARKER_PREFIX) {
            return Some(value.to_vec());
        }
        rest = &rest[2 + len..];
    }
    None
}

/// Reads whether `table <family> nat` exists and whose it is.
pub(crate) fn table_state(family: Family) -> Result<TableState, NetError> {
    let step = format!("list tables {}", family.keyword());
    let mut found: Vec<Option<Vec<u8>>> = Vec::new();
    dump(
        family,
        libc::NFT_MSG_GETTABLE as u16,
        &step,
        table_cb,
        &mut found,
    )?;
    Ok(match found.into_iter().next() {
        None => TableState::Absent,
        Some(udata) => match marker_of(&udata.unwrap_or_default()) {
            Some(m) => TableState::Ours(m),
            None => TableState::Foreign,
        },
    })
}

/// Sends one nftables dump request `msg` (`NFT_MSG_GETTABLE`, `GETCHAIN`, `GETRULE`) for
/// `family` and runs `cb` on every message of the answer, collecting into `out`; errors name
/// `step`.
pub(crate) fn dump<T>(
    family: Family,
    msg: u16,
    step: &str,
    cb: fn(&libc::nlmsghdr, &mut T) -> libc::c_int,
    out: &mut T,
) -> Result<(), NetError> {
    let socket = mnl::Socket::new(mnl::Bus::Netfilter).map_err(|e| nft_err(step, e))?;
    let portid = socket.portid();
    let seq = 1;
    let mut req = AlignedBuf::new();
    let len = {
        let b = req.bytes();
        // SAFETY: the buffer has nft_nlmsg_maxsize() bytes.
        let hdr = unsafe {
            sys::nftnl_nlmsg_build_hdr(
                b.as_mut_ptr().cast::<c_char>(),
                msg,
                proto_family(family) as u16,
                (libc::NLM_F_DUMP | libc::NLM_F_ACK) as u16,
                seq,
            )
        };
        // SAFETY: hdr points into the buffer; nlmsg_len is set by build_hdr.
        unsafe { (*hdr).nlmsg_len as usize }
    };
    socket
        .send(&req.bytes()[..len])
        .map_err(|e| nft_err(step, e))?;
    let mut buf = AlignedBuf::new();
    loop {
        let n = socket.recv_raw(buf.bytes()).map_err(|e| nft_err(step, e))?;
        if n == 0 {
            break;
        }
        match mnl::cb_run2(&buf.bytes()[..n], seq, portid, cb, out).map_err(|e| nft_err(step, e))? {
            mnl::CbResult::Stop => break,
            mnl::CbResult::Ok => {}
        }
    }
    Ok(())
}

fn ip_bytes(a: &IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(v) => v.octets().to_vec(),
        IpAddr::V6(v) => v.octets().to_vec(),
    }
}

fn addr_payload(family: Family, src: bool) -> Payload {
    use nftnl::expr::{Ipv4HeaderField as V4, Ipv6HeaderField as V6};
    Payload::Network(match (family, src) {
        (Family::Ip, true) => NetworkHeaderField::Ipv4(V4::Saddr),
        (Family::Ip, false) => NetworkHeaderField::Ipv4(V4::Daddr),
        (Family::Ip6, true) => NetworkHeaderField::Ipv6(V6::Saddr),
        (Family::Ip6, false) => NetworkHeaderField::Ipv6(V6::Daddr),
    })
}

/// Adds one table (chains, anonymous sets, rules) to `batch`.
pub(crate) fn add_table(batch: &mut Batch, t: &NatTable) {
    let pf = proto_family(t.family);
    let table = Table::new(c"nat", pf);
    batch.add(&MarkedTable::new(pf, &marker(t)), MsgType::Add);
    let mut set_id: u32 = 0;
    let chains: Vec<Chain<'_>> = t
        .chains
        .iter()
        .map(|c| {
            let name = CString::new(c.name.as_str()).unwrap_or_default();
            let mut chain = Chain::new(&name, &table);
            if let Some((hook, prio)) = c.hook {
                let h = match hook {
                    Hook::Prerouting => nftnl::Hook::PreRouting,
                    Hook::Input => nftnl::Hook::In,
                    Hook::Output => nftnl::Hook::Out,
                    Hook::Postrouting => nftnl::Hook::PostRouting,
                };
                chain.set_hook(h, prio);
                chain.set_type(nftnl::ChainType::Nat);
            }
            batch.add(&chain, MsgType::Add);
            chain
        })
        .collect();
    for (c, chain) in t.chains.iter().zip(&chains) {
        for r in &c.rules {
            let mut rule = Rule::new(chain);
            for m in &r.matches {
                match m {
                    Match::IifName(n) => {
                        rule.add_expr(&Meta::IifName);
                        rule.add_expr(&Cmp::new(CmpOp::Eq, ifname(n)));
                    }
                    Match::OifName(n) => {
                        rule.add_expr(&Meta::OifName);
                        rule.add_expr(&Cmp::new(CmpOp::Eq, ifname(n)));
                    }
                    Match::Dport(proto, ports) => {
                        rule.add_expr(&L4Proto);
                        rule.add_expr(&Cmp::new(CmpOp::Eq, Bytes(vec![proto.number()])));
                        // The destination port is bytes 2..4 of TCP, UDP and SCTP headers alike.
                        rule.add_expr(&Payload::Transport(TransportHeaderField::Tcp(
                            TcpHeaderField::Dport,
                        )));
                        if let [one] = ports.as_slice() {
                            rule.add_expr(&Cmp::new(CmpOp::Eq, Bytes(one.to_be_bytes().to_vec())));
                        } else {
                            let name = CString::new(format!("__set{set_id}")).unwrap_or_default();
                            let mut set: Set<'_, PortKey> = Set::new(&name, set_id, &table, pf);
                            set_id += 1;
                            for p in ports {
                                set.add(&PortKey(*p));
                            }
                            batch.add(&set, MsgType::Add);
                            batch.add_iter(set.elems_iter(), MsgType::Add);
                            rule.add_expr(&Lookup::new(&set));
                        }
                    }
                    Match::Saddr(addrs) | Match::Daddr(addrs) => {
                        rule.add_expr(&addr_payload(t.family, matches!(m, Match::Saddr(_))));
                        if let [one] = addrs.as_slice() {
                            rule.add_expr(&Cmp::new(CmpOp::Eq, Bytes(ip_bytes(one))));
                        } else {
                            let name = CString::new(format!("__set{set_id}")).unwrap_or_default();
                            let id = set_id;
                            set_id += 1;
                            let lookup = match t.family {
                                Family::Ip => {
                                    let mut set: Set<'_, Ipv4Addr> =
                                        Set::new(&name, id, &table, pf);
                                    for a in addrs {
                                        if let IpAddr::V4(v) = a {
                                            set.add(v);
                                        }
                                    }
                                    batch.add(&set, MsgType::Add);
                                    batch.add_iter(set.elems_iter(), MsgType::Add);
                                    Lookup::new(&set)
                                }
                                Family::Ip6 => {
                                    let mut set: Set<'_, Ipv6Addr> =
                                        Set::new(&name, id, &table, pf);
                                    for a in addrs {
                                        if let IpAddr::V6(v) = a {
                                            set.add(v);
                                        }
                                    }
                                    batch.add(&set, MsgType::Add);
                                    batch.add_iter(set.elems_iter(), MsgType::Add);
                                    Lookup::new(&set)
                                }
                            };
                            rule.add_expr(&lookup);
                        }
                    }
                }
            }
            rule.add_expr(&Counter);
            match &r.action {
                Action::Masquerade => rule.add_expr(&Masquerade),
                Action::Jump(target) => rule.add_expr(&Verdict::Jump {
                    chain: CString::new(target.as_str()).unwrap_or_default(),
                }),
                Action::Return => rule.add_expr(&Verdict::Return),
                Action::Dnat(a) | Action::Snat(a) => {
                    match a {
                        IpAddr::V4(v) => rule.add_expr(&Immediate::new(v.octets(), Register::Reg1)),
                        IpAddr::V6(v) => rule.add_expr(&Immediate::new(v.octets(), Register::Reg1)),
                    }
                    rule.add_expr(&Nat {
                        nat_type: if matches!(r.action, Action::Dnat(_)) {
                            NatType::DNat
                        } else {
                            NatType::SNat
                        },
                        family: pf,
                        ip_register: Register::Reg1,
                        port_register: None,
                    });
                }
            }
            batch.add(&rule, MsgType::Add);
        }
    }
}

/// Makes the kernel hold exactly `tables` (per family), atomically in one batch.
///
/// Returns the families whose table changed (empty when everything was already in place).
pub(crate) fn commit(tables: &[NatTable]) -> Result<Vec<Family>, NetError> {
    let mut batch = Batch::new();
    let mut changed = Vec::new();
    for t in tables {
        match table_state(t.family)? {
            TableState::Ours(m) if m == marker(t) => continue,
            TableState::Ours(_) => {
                batch.add(&Table::new(c"nat", proto_family(t.family)), MsgType::Del);
            }
            TableState::Foreign => {
                return Err(NetError::ForeignNatTable {
                    family: t.family.keyword(),
                })
            }
            TableState::Absent => {}
        }
        add_table(&mut batch, t);
        changed.push(t.family);
    }
    if !changed.is_empty() {
        send_batch(batch, "commit nat tables")?;
    }
    Ok(changed)
}

/// Deletes the qlauncher-marked `nat` table of each family; returns the families deleted.
pub(crate) fn delete_ours(families: &[Family]) -> Result<Vec<Family>, NetError> {
    let mut batch = Batch::new();
    let mut deleted = Vec::new();
    for f in families {
        if let TableState::Ours(_) = table_state(*f)? {
            batch.add(&Table::new(c"nat", proto_family(*f)), MsgType::Del);
            deleted.push(*f);
        }
    }
    if !deleted.is_empty() {
        send_batch(batch, "delete nat tables")?;
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_is_found_among_tlvs() {
        let mut udata = vec![0, 3, b'a', b'b', 0, MARKER_TLV, 4];
        udata.extend_from_slice(b"qlauncher/x");
        udata[6] = 11;
        assert_eq!(marker_of(&udata), Some(b"qlauncher/x".to_vec()));
        assert_eq!(marker_of(&[0, 200, 1]), None);
        assert_eq!(marker_of(&[]), None);
    }
}

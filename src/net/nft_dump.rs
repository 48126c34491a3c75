//! A `nat` table's chains and rules in a form that compares: what the kernel has (a netlink dump)
//! against what the plan would commit (the very messages [`nft_netlink::add_table`] puts in its
//! batch). Both sides go through libnftnl's own parsers and printers, so a rule `nft` compiled
//! (virt-handler's) and the same rule qlauncher builds print the same, expression by expression.
//!
//! Per chain: its hook and priority (base chains) and its rules in order, each rule the sequence
//! of its expressions as `nftnl_expr_snprintf` prints them (`meta load iifname => reg 1`,
//! `cmp eq reg 1 0x...`). Left out because they name no behaviour: counters' values, the numbers
//! of anonymous sets (`__set0`), a lookup's flags when 0, and the redundant maximum of a
//! single-address NAT that recent `nft` writes ([`single_address_nat`]). The elements of anonymous sets are not compared (the
//! lookup's register is).

use crate::net::nft::{Family, NatTable, RuleText, NAT_TABLE};
use crate::net::nft_netlink;
use crate::net::NetError;
use nftnl::Batch;
use nftnl_sys as sys;
use std::collections::BTreeMap;
use std::ffi::{c_void, CStr};
use std::os::raw::c_char;

/// One chain: base-chain hook number and priority, and its rules' texts in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ChainDump {
    /// `(hook number, priority)` of a base chain (`NF_INET_PRE_ROUTING` = 0 ...).
    pub(crate) hook: Option<(u32, i32)>,
    /// Each rule's expressions, `[ name body ]`.
    pub(crate) rules: Vec<Vec<String>>,
}

/// The chains of one `nat` table, by name.
pub(crate) type TableDump = BTreeMap<String, ChainDump>;

const NFNL_SUBSYS_NFTABLES: u16 = 10;

/// The table `t` as the messages committing it carry it.
pub(crate) fn planned(t: &NatTable) -> TableDump {
    let mut batch = Batch::new();
    nft_netlink::add_table(&mut batch, t);
    let batch = batch.finalize();
    let mut out = TableDump::new();
    for page in &batch {
        let mut at = 0;
        while at + 16 <= page.len() {
            let len =
                u32::from_ne_bytes([page[at], page[at + 1], page[at + 2], page[at + 3]]) as usize;
            let ty = u16::from_ne_bytes([page[at + 4], page[at + 5]]);
            if len < 16 || at + len > page.len() {
                break;
            }
            let header = page[at..].as_ptr().cast::<libc::nlmsghdr>();
            if ty >> 8 == NFNL_SUBSYS_NFTABLES {
                // SAFETY: `header` points at a whole netlink message inside the batch page, which
                // libnftnl built aligned (NLMSG_ALIGN) and which outlives the callbacks.
                unsafe {
                    match u32::from(ty & 0xff) {
                        t if t == libc::NFT_MSG_NEWCHAIN as u32 => {
                            chain_cb(&*header, &mut out);
                        }
                        t if t == libc::NFT_MSG_NEWRULE as u32 => {
                            rule_cb(&*header, &mut out);
                        }
                        _ => {}
                    }
                }
            }
            at += len.div_ceil(4) * 4;
        }
    }
    out
}

/// The kernel's `nat` table of `family` (empty when there is none).
///
/// # Errors
/// [`NetError::Nftables`] when the dump fails (EPERM without `NET_ADMIN`).
pub(crate) fn kernel(family: Family) -> Result<TableDump, NetError> {
    let mut out = TableDump::new();
    let step = format!("list table {} nat", family.keyword());
    nft_netlink::dump(
        family,
        libc::NFT_MSG_GETCHAIN as u16,
        &step,
        chain_cb,
        &mut out,
    )?;
    nft_netlink::dump(
        family,
        libc::NFT_MSG_GETRULE as u16,
        &step,
        rule_cb,
        &mut out,
    )?;
    Ok(out)
}

/// Each way `have` (the kernel's table) differs from `want` (KubeVirt's, as planned), in words;
/// `plan` names the planned rules in `nft` syntax.
pub(crate) fn differences(plan: &NatTable, want: &TableDump, have: &TableDump) -> Vec<String> {
    let family = plan.family.keyword();
    let mut out = Vec::new();
    for (name, chain) in want {
        let Some(got) = have.get(name) else {
            out.push(format!("table {family} nat has no chain {name}"));
            continue;
        };
        if got.hook != chain.hook {
            out.push(format!(
                "chain {family} nat {name} has hook and priority {:?}, KubeVirt's {:?}",
                got.hook, chain.hook
            ));
        }
        let planned = plan.chains.iter().find(|c| &c.name == name);
        for (i, rule) in chain.rules.iter().enumerate() {
            if got.rules.get(i) != Some(rule) {
                let text = planned
                    .and_then(|c| c.rules.get(i))
                    .map(|r| RuleText(plan.family, r).to_string())
                    .unwrap_or_default();
                let got = got.rules.get(i).cloned().unwrap_or_default();
                let at = rule.iter().zip(&got).take_while(|(a, b)| a == b).count();
                out.push(format!(
                    "chain {family} nat {name} rule {} is not KubeVirt's `{text}` (expression {}: \
                     `{}`, KubeVirt's `{}`)",
                    i + 1,
                    at + 1,
                    got.get(at).map(String::as_str).unwrap_or("none"),
                    rule.get(at).map(String::as_str).unwrap_or("none"),
                ));
                break;
            }
        }
        if got.rules.len() > chain.rules.len() {
            out.push(format!(
                "chain {family} nat {name} has {} rules, KubeVirt's {}",
                got.rules.len(),
                chain.rules.len()
            ));
        }
    }
    for name in have.keys().filter(|n| !want.contains_key(*n)) {
        out.push(format!(
            "table {family} nat has a chain {name} KubeVirt does not make"
        ));
    }
    out
}

/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: per the contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

fn chain_cb(header: &libc::nlmsghdr, out: &mut TableDump) -> libc::c_int {
    // SAFETY: libnftnl parses the message into a chain we own and free.
    unsafe {
        let c = sys::nftnl_chain_alloc();
        if c.is_null() {
            return -1;
        }
        if sys::nftnl_chain_nlmsg_parse(header as *const libc::nlmsghdr as *const _, c) >= 0
            && text(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_TABLE as u16)) == NAT_TABLE
        {
            let name = text(sys::nftnl_chain_get_str(c, sys::NFTNL_CHAIN_NAME as u16));
            let hook = sys::nftnl_chain_is_set(c, sys::NFTNL_CHAIN_HOOKNUM as u16).then(|| {
                (
                    sys::nftnl_chain_get_u32(c, sys::NFTNL_CHAIN_HOOKNUM as u16),
                    sys::nftnl_chain_get_s32(c, sys::NFTNL_CHAIN_PRIO as u16),
                )
            });
            out.entry(name).or_default().hook = hook;
        }
        sys::nftnl_chain_free(c);
    }
    1
}

fn rule_cb(header: &libc::nlmsghdr, out: &mut TableDump) -> libc::c_int {
    // SAFETY: libnftnl parses the message into a rule we own and free; the expression callback
    // gets expressions of that rule only while it lives.
    unsafe {
        let r = sys::nftnl_rule_alloc();
        if r.is_null() {
            return -1;
        }
        if sys::nftnl_rule_nlmsg_parse(header as *const libc::nlmsghdr as *const _, r) >= 0
            && text(sys::nftnl_rule_get_str(r, sys::NFTNL_RULE_TABLE as u16)) == NAT_TABLE
        {
            let chain = text(sys::nftnl_rule_get_str(r, sys::NFTNL_RULE_CHAIN as u16));
            let mut exprs: Vec<String> = Vec::new();
            sys::nftnl_expr_foreach(
                r,
                Some(expr_cb),
                (&mut exprs as *mut Vec<String>).cast::<c_void>(),
            );
            out.entry(chain).or_default().rules.push(exprs);
        }
        sys::nftnl_rule_free(r);
    }
    1
}

unsafe extern "C" fn expr_cb(e: *mut sys::nftnl_expr, data: *mut c_void) -> libc::c_int {
    // SAFETY: `data` is the `Vec<String>` rule_cb passed; `e` an expression of its live rule.
    unsafe {
        let exprs = &mut *data.cast::<Vec<String>>();
        let name = text(sys::nftnl_expr_get_str(e, sys::NFTNL_EXPR_NAME as u16));
        if name == "counter" {
            exprs.push("[ counter ]".into());
            return 0;
        }
        let mut buf = [0u8; 512];
        let n = sys::nftnl_expr_snprintf(
            buf.as_mut_ptr().cast::<c_char>(),
            buf.len(),
            e,
            sys::NFTNL_OUTPUT_DEFAULT,
            0,
        );
        let n = usize::try_from(n).unwrap_or(0).min(buf.len() - 1);
        let body = String::from_utf8_lossy(&buf[..n]).trim().to_owned();
        let body = anonymous_set_unnumbered(&body);
        let body = match name.as_str() {
            "nat" => single_address_nat(&body),
            // Lookup flags 0 (not inverted) written out or left out mean the same.
            "lookup" => {
                let mut words: Vec<&str> = body.split_whitespace().collect();
                if words.last() == Some(&"0x0") {
                    words.pop();
                }
                words.join(" ")
            }
            _ => body,
        };
        exprs.push(format!("[ {name} {body} ]"));
    }
    0
}

/// `reg 1 set __set3` -> `reg 1 set __set`: anonymous sets' numbers depend on creation order.
fn anonymous_set_unnumbered(body: &str) -> String {
    body.split(' ')
        .map(|w| match w.strip_prefix("__set") {
            Some(n) if n.chars().all(|c| c.is_ascii_digit()) => "__set",
            _ => w,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `dnat ip addr_min reg 1 addr_max reg 1 flags 0x1` -> `dnat ip addr_min reg 1`: how recent `nft`
/// writes `dnat to ADDR` (the range's maximum the same register, NF_NAT_RANGE_MAP_IPS) and how
/// older `nft` and qlauncher write it (the kernel's `nft_nat_init` takes the minimum for the
/// maximum and sets MAP_IPS itself) mean the same translation.
fn single_address_nat(body: &str) -> String {
    let words: Vec<&str> = body.split(' ').collect();
    let mut out: Vec<&str> = Vec::new();
    let mut min_reg = None;
    let mut i = 0;
    while i < words.len() {
        match words[i] {
            "addr_min" if i + 2 < words.len() && words[i + 1] == "reg" => {
                min_reg = Some(words[i + 2]);
                out.extend_from_slice(&words[i..i + 3]);
                i += 3;
            }
            "addr_max"
                if i + 2 < words.len()
                    && words[i + 1] == "reg"
                    && min_reg == Some(words[i + 2]) =>
            {
                i += 3;
            }
            "flags" if min_reg.is_some() && words.get(i + 1) == Some(&"0x1") => i += 2,
            w => {
                out.push(w);
                i += 1;
            }
        }
    }
    out.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_numbers_are_dropped() {
        assert_eq!(
            anonymous_set_unnumbered("reg 1 set __set12 "),
            "reg 1 set __set "
        );
        assert_eq!(
            anonymous_set_unnumbered("reg 1 set ports"),
            "reg 1 set ports"
        );
    }
}

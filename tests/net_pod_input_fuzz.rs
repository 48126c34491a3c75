//! The `pod_dns` fuzz target (`fuzz/fuzz_targets/pod_dns.rs`) as a bounded proptest: resolv.conf
//! text and pod routes, from real pod files mutated with the tokens that broke KubeVirt and
//! qlauncher (overlong search lists, IP addresses and `_` in search entries, several addresses
//! on a nameserver line, on-link and host routes), through `parse_resolv_conf`, `plan` and the
//! DHCPv4/DHCPv6 option builders. Body in `testkit/src/fuzz.rs`; every input that
//! ever failed it lives in `fuzz/regressions/pod_dns/` and is replayed first.

use testkit::fuzz;

use proptest::prelude::*;
use std::path::PathBuf;

fn cases(default: u32) -> u32 {
    std::env::var("HARDEN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The seeds, also committed as `fuzz/corpus/pod_dns/seed-*` for libFuzzer.
fn seeds() -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/pod_dns");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fuzz/corpus/pod_dns")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("seed-"))
        })
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read(p).expect("seed"))
        .collect()
}

const TOKENS: &[&str] = &[
    "search ",
    "nameserver ",
    "\n",
    " ",
    ".",
    "..",
    "-",
    "_",
    "10.0.0.1",
    "fd00::1",
    "fe80::1%eth0",
    "default.svc.cluster.local",
    "mysub.default.svc.cluster.local",
    "#",
    ";",
    "\u{0}",
    "\u{ff}",
    "a23456789012345678901234567890123456789012345678901234567890123",
];

#[test]
fn pod_dns_seeds_and_regressions() {
    let seeds = seeds();
    assert!(seeds.len() >= 4, "{} seeds", seeds.len());
    for s in &seeds {
        fuzz::pod_dns(s);
    }
    let reg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions/pod_dns");
    for e in std::fs::read_dir(reg).into_iter().flatten().flatten() {
        fuzz::pod_dns(&std::fs::read(e.path()).expect("regression"));
    }
}

/// One edit of a seed: a token inserted, bytes flipped, a range deleted, or a route appended.
#[derive(Debug, Clone)]
enum Edit {
    Token(usize, &'static str),
    Repeat(usize, &'static str, usize),
    Flip(usize, u8),
    Delete(usize, usize),
    Route([u8; 9]),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<usize>(), prop::sample::select(TOKENS)).prop_map(|(i, t)| Edit::Token(i, t)),
        2 => (any::<usize>(), prop::sample::select(TOKENS), 1usize..40).prop_map(|(i, t, n)| Edit::Repeat(i, t, n)),
        2 => (any::<usize>(), 1u8..=255).prop_map(|(i, x)| Edit::Flip(i, x)),
        1 => (any::<usize>(), 1usize..32).prop_map(|(i, n)| Edit::Delete(i, n)),
        2 => any::<[u8; 9]>().prop_map(Edit::Route),
    ]
}

fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for e in edits {
        // Text edits land before the NUL that starts the routes, route edits after it.
        let text_end = v.iter().position(|b| *b == 0).unwrap_or(v.len()).max(1);
        match e {
            Edit::Token(i, t) => {
                let i = 1 + i % text_end;
                let i = i.min(v.len());
                v.splice(i..i, t.bytes());
            }
            Edit::Repeat(i, t, n) => {
                let i = (1 + i % text_end).min(v.len());
                v.splice(i..i, t.repeat(*n).into_bytes());
            }
            Edit::Flip(i, x) => {
                if !v.is_empty() {
                    let i = i % v.len();
                    v[i] ^= x;
                }
            }
            Edit::Delete(i, n) => {
                let i = 1 + i % text_end;
                let end = (i + n).min(text_end).min(v.len());
                if i < end {
                    v.drain(i..end);
                }
            }
            Edit::Route(r) => {
                if !v.contains(&0) {
                    v.push(0);
                }
                v.extend_from_slice(r);
            }
        }
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(1500), failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn pod_dns_mutated(seed in any::<prop::sample::Index>(), e in prop::collection::vec(edit(), 1..8)) {
        let seeds = seeds();
        fuzz::pod_dns(&apply(&seeds[seed.index(seeds.len())], &e));
    }

    #[test]
    fn pod_dns_random(data in prop::collection::vec(any::<u8>(), 0..800)) {
        fuzz::pod_dns(&data);
    }
}

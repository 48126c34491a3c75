//! The fuzz targets of `fuzz/` run as bounded proptests, so CI exercises the same code paths
//! without libFuzzer: structured mutations (byte flips, inserts, deletes, truncation, splices of
//! interesting tokens) of seed inputs that reach deep into each parser (the libFuzzer corpus in
//! `fuzz/corpus/` is not read here: it grows with every fuzzing run). Every input that ever
//! crashed a target lives in `fuzz/regressions/<target>/` and is replayed first.
//!
//! Targets (bodies in `testkit/src/fuzz.rs`): `vmi_pipeline` (VMI JSON/YAML ->
//! defaults -> validation -> conversion -> argv), `dhcp_v4`, `dhcp_v6`, `qmp_reader`,
//! `image_facts` (format magic, qcow2 header, backing chain), `migration_protocol` (the
//! migration control frames as the target and as the source, and the target's checks of the
//! source's definition), `cmd_request` (the cmd v1 protobuf requests and what the server does
//! with their VMI JSON and options before it acts), `hook_answer` (a hook sidecar's domain XML
//! through the namespace-aware parse, the diff, the plan edits and the argv), `libvirt_rpc`
//! (libvirt's remote protocol from a migration source: XDR frames, argument decoders, the server
//! loop).

use testkit::fuzz;

use std::path::{Path, PathBuf};

use dhcproto::v4::MessageType;
use proptest::prelude::*;
use qlauncher::net::dhcp::v4::{client_message, DhcpV4Server};

/// Cases per target; `HARDEN_FUZZ_CASES` overrides (the reliability script raises it).
fn cases(default: u32) -> u32 {
    std::env::var("HARDEN_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file directly under `dir`, sorted (empty when the directory does not exist).
fn files(dir: &Path) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    paths.retain(|p| p.is_file());
    paths.sort();
    paths.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

/// One edit of a seed.
#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
}

fn apply(seed: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for e in edits {
        let len = v.len().max(1);
        match e {
            Edit::Flip(i, x) => {
                if !v.is_empty() {
                    let i = i % v.len();
                    v[i] ^= x;
                }
            }
            Edit::Insert(i, bytes) => {
                let i = i % (v.len() + 1);
                v.splice(i..i, bytes.iter().copied());
            }
            Edit::Delete(i, n) => {
                let i = i % len;
                let end = (i + n).min(v.len());
                if i < end {
                    v.drain(i..end);
                }
            }
            Edit::Truncate(n) => v.truncate(n % len),
        }
    }
    v
}

fn edits(tokens: &'static [&'static [u8]]) -> impl Strategy<Value = Vec<Edit>> {
    let edit = prop_oneof![
        4 => (any::<usize>(), 1u8..=255).prop_map(|(i, x)| Edit::Flip(i, x)),
        3 => (any::<usize>(), prop::sample::select(tokens)).prop_map(|(i, t)| Edit::Insert(i, t.to_vec())),
        2 => (any::<usize>(), prop::collection::vec(any::<u8>(), 1..8)).prop_map(|(i, b)| Edit::Insert(i, b)),
        2 => (any::<usize>(), 1usize..64).prop_map(|(i, n)| Edit::Delete(i, n)),
        1 => any::<usize>().prop_map(Edit::Truncate),
    ];
    prop::collection::vec(edit, 1..6)
}

const VMI_TOKENS: &[&[u8]] = &[
    b",",
    b"\"",
    b"\n",
    b"{}",
    b"[]",
    b"null",
    b"-1",
    b"1e400",
    b"18446744073709551616",
    b"\"../../x\"",
    b"\",,id=x\"",
    b"\"\\u0000\"",
    b": ",
    b"- ",
    b"&a ",
    b"*a",
    b"!!binary ",
    b"\"999999999Ti\"",
    b"\"0\"",
    b"\"virtio\"",
    b"\"sata\"",
    b"\"scsi\"",
    b"\"usb\"",
];

fn vmi_seeds() -> Vec<Vec<u8>> {
    static SEEDS: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    SEEDS.get_or_init(load_vmi_seeds).clone()
}

fn load_vmi_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = Vec::new();
    seeds.extend(
        files(&repo().join("tests/fixtures/cmdline"))
            .into_iter()
            .filter(|s| !s.starts_with(b"{\"facts")),
    );
    seeds
}

#[test]
fn vmi_pipeline_regressions() {
    for input in files(&repo().join("fuzz/regressions/vmi_pipeline")) {
        fuzz::vmi_pipeline(&input);
    }
}

#[test]
fn vmi_pipeline_seeds_convert() {
    // The seeds are good VMIs: most of them must get all the way to an argv, so the mutations
    // below start from inputs that reach the converter.
    let seeds = vmi_seeds();
    let rendered = seeds.iter().filter(|s| fuzz::vmi_pipeline(s) == 3).count();
    assert!(
        seeds.len() >= 20 && rendered * 2 > seeds.len(),
        "{rendered} of {} seeds rendered",
        seeds.len()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(1500), failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn vmi_pipeline_mutated(seed in any::<prop::sample::Index>(), e in edits(VMI_TOKENS)) {
        let seeds = vmi_seeds();
        let input = apply(&seeds[seed.index(seeds.len())], &e);
        fuzz::vmi_pipeline(&input);
    }
}

const DHCP_TOKENS: &[&[u8]] = &[
    &[0],
    &[255],
    &[53, 1, 1],
    &[53, 1, 3],
    &[53, 1, 7],
    &[53, 1, 8],
    &[55, 0],
    &[50, 4, 10, 0, 2, 2],
    &[54, 4, 10, 0, 2, 1],
    &[61, 0],
    &[12, 255],
    &[81, 3, 0, 0, 0],
    &[99, 130, 83, 99],
    &[1, 1, 6, 0],
];

#[allow(clippy::vec_init_then_push)]
fn v4_seeds() -> Vec<Vec<u8>> {
    let mac = [2, 0, 0, 0, 0, 9];
    let mut seeds = Vec::new();
    for kind in [
        MessageType::Discover,
        MessageType::Request,
        MessageType::Inform,
        MessageType::Release,
        MessageType::Decline,
    ] {
        seeds.push(client_message(
            kind,
            mac,
            7,
            Some([10, 0, 2, 2].into()),
            Some([10, 0, 2, 1].into()),
            &[1, 3, 6, 15, 26, 119, 121],
        ));
    }
    seeds
}

#[test]
fn dhcp_v4_regressions() {
    let server = DhcpV4Server::new(fuzz::v4_config()).expect("server");
    for input in files(&repo().join("fuzz/regressions/dhcp_v4")) {
        fuzz::dhcp_v4(&server, &input);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(3000), failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn dhcp_v4_mutated(seed in any::<prop::sample::Index>(), e in edits(DHCP_TOKENS)) {
        let server = DhcpV4Server::new(fuzz::v4_config()).expect("server");
        let seeds = v4_seeds();
        fuzz::dhcp_v4(&server, &apply(&seeds[seed.index(seeds.len())], &e));
    }

    #[test]
    fn dhcp_v4_random(data in prop::collection::vec(any::<u8>(), 0..600)) {
        let server = DhcpV4Server::new(fuzz::v4_config()).expect("server");
        fuzz::dhcp_v4(&server, &data);
    }
}

const V6_TOKENS: &[&[u8]] = &[
    &[1],
    &[3],
    &[5],
    &[8],
    &[11],
    &[0, 1, 0, 10, 0, 3, 0, 1, 2, 0, 0, 0, 0, 9],
    &[0, 3, 0, 12, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
    &[0, 6, 0, 2, 0, 23],
    &[0, 8, 0, 2, 0, 0],
    &[0, 14, 0, 0],
    &[255, 255],
    &[0, 3, 255, 255],
];

#[allow(clippy::vec_init_then_push)]
fn v6_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    // SOLICIT: type 1, xid, client id (DUID-LL), IA_NA(iaid 1), ORO(dns), elapsed time.
    seeds.push(vec![
        1, 0, 0, 7, 0, 1, 0, 10, 0, 3, 0, 1, 2, 0, 0, 0, 0, 9, 0, 3, 0, 12, 0, 0, 0, 1, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 6, 0, 2, 0, 23, 0, 8, 0, 2, 0, 0,
    ]);
    seeds
}

#[test]
fn dhcp_v6_regressions() {
    let cfg = fuzz::v6_config();
    for input in files(&repo().join("fuzz/regressions/dhcp_v6")) {
        fuzz::dhcp_v6(&cfg, &input);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(3000), failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn dhcp_v6_mutated(seed in any::<prop::sample::Index>(), e in edits(V6_TOKENS)) {
        let seeds = v6_seeds();
        fuzz::dhcp_v6(&fuzz::v6_config(), &apply(&seeds[seed.index(seeds.len())], &e));
    }
}

const QMP_TOKENS: &[&[u8]] = &[
    b"\n",
    b"{",
    b"}",
    b"[",
    b"\"",
    b"\\u0000",
    b"{\"return\": {}, \"id\": 1}\n",
    b"{\"return\": {}, \"id\": \"1\"}\n",
    b"{\"error\": {\"class\": \"GenericError\", \"desc\": \"x\"}, \"id\": 2}\n",
    b"{\"event\": \"STOP\", \"timestamp\": {\"seconds\": 1, \"microseconds\": 2}}\n",
    b"{\"QMP\": 1}\n",
    b"{\"id\": 18446744073709551616}\n",
    b"\xff\xfe",
    b"{\"return\": [1,2,3], \"id\": 2}\n",
];

#[allow(clippy::vec_init_then_push)]
fn qmp_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    seeds.push(b"{\"return\": {}, \"id\": 1}\n{\"event\": \"RESUME\", \"timestamp\": {\"seconds\": 1, \"microseconds\": 0}}\n{\"return\": {\"status\": \"running\", \"running\": true}, \"id\": 2}\n".to_vec());
    seeds.push(b"{\"return\": {}, \"id\": 1}\n".to_vec());
    seeds
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn qmp_reader_regressions() {
    let rt = runtime();
    for input in files(&repo().join("fuzz/regressions/qmp_reader")) {
        fuzz::qmp_reader(&rt, &input);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(400), failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn qmp_reader_mutated(seed in any::<prop::sample::Index>(), e in edits(QMP_TOKENS)) {
        let seeds = qmp_seeds();
        fuzz::qmp_reader(&runtime(), &apply(&seeds[seed.index(seeds.len())], &e));
    }
}

/// A qcow2 v3 header (104 bytes + header extensions end + backing file name) for a 1 GiB image
/// whose backing file is `base.raw` (raw), padded to one cluster.
fn qcow2_seed(backing: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 65536];
    h[0..4].copy_from_slice(b"QFI\xfb");
    h[4..8].copy_from_slice(&3u32.to_be_bytes());
    h[8..16].copy_from_slice(&512u64.to_be_bytes()); // backing_file_offset
    h[16..20].copy_from_slice(&(backing.len() as u32).to_be_bytes());
    h[20..24].copy_from_slice(&16u32.to_be_bytes()); // cluster_bits
    h[24..32].copy_from_slice(&(1u64 << 30).to_be_bytes());
    h[36..40].copy_from_slice(&1u32.to_be_bytes()); // l1_size
    h[40..48].copy_from_slice(&(3u64 << 16).to_be_bytes()); // l1_table_offset
    h[48..56].copy_from_slice(&(1u64 << 16).to_be_bytes()); // refcount_table_offset
    h[56..60].copy_from_slice(&1u32.to_be_bytes());
    h[96..100].copy_from_slice(&4u32.to_be_bytes()); // refcount_order
    h[100..104].copy_from_slice(&104u32.to_be_bytes()); // header_length
                                                        // Backing format extension, then the end marker.
    h[104..108].copy_from_slice(&0xe2792acau32.to_be_bytes());
    h[108..112].copy_from_slice(&3u32.to_be_bytes());
    h[112..115].copy_from_slice(b"raw");
    h[512..512 + backing.len()].copy_from_slice(backing);
    h
}

const IMAGE_TOKENS: &[&[u8]] = &[
    b"QFI\xfb",
    &[0xff; 8],
    &[0; 8],
    &[0x7f, 0xff, 0xff, 0xff],
    b"CD001",
    b"../",
    b"/etc/passwd",
    b"base.raw",
    b"image",
    &[0xe2, 0x79, 0x2a, 0xca],
    &[0x68, 0x53, 0x7d, 0xe2],
];

#[allow(clippy::vec_init_then_push)]
fn image_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    seeds.push(qcow2_seed(b"base.raw"));
    seeds.push(qcow2_seed(b"image"));
    let mut iso = vec![0u8; 0x8800];
    iso[0x8001..0x8006].copy_from_slice(b"CD001");
    seeds.push(iso);
    seeds
}

#[test]
fn image_facts_regressions() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("base.raw"), [0u8; 512]).expect("base");
    for input in files(&repo().join("fuzz/regressions/image_facts")) {
        fuzz::image_facts(dir.path(), &input);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(1500), failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn image_facts_mutated(seed in any::<prop::sample::Index>(), e in edits(IMAGE_TOKENS)) {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("base.raw"), [0u8; 512]).expect("base");
        let seeds = image_seeds();
        // Edits land in the first 1 KiB, where the header and backing name are.
        let seed = &seeds[seed.index(seeds.len())];
        let (head, tail) = seed.split_at(seed.len().min(1024));
        let mut input = apply(head, &e);
        input.extend_from_slice(tail);
        fuzz::image_facts(dir.path(), &input);
    }
}

/// Regression (libFuzzer, `dhcp_v6`): a status-code option (13) of length 0 made dhcproto
/// panic while decoding; `v6::respond` now rejects it before dhcproto sees it, as malformed.
#[test]
fn dhcp_v6_empty_status_code_option_is_malformed() {
    let input = [
        0x60, 0x00, 0x7a, 0x00, 0x00, 0x0d, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    let from = std::net::SocketAddrV6::new(std::net::Ipv6Addr::LOCALHOST, 546, 0, 0);
    let out = qlauncher::net::dhcp::v6::respond(&fuzz::v6_config(), &input, from);
    assert!(
        matches!(out, qlauncher::net::dhcp::Outcome::Malformed(_)),
        "{out:?}"
    );
}

const MIGRATION_TOKENS: &[&[u8]] = &[
    b"\"type\":\"Prepare\"",
    b"\"type\":\"Hello\"",
    b"{}",
    b"[]",
    b"null",
    b",",
    b"\"",
    b"\\u0000",
    b"\"pci.0,addr=0x1\"",
    b"\"a,b\"",
    b"\"enforce\"",
    b"18446744073709551616",
    &[0, 0, 0, 0],
    &[0xff, 0xff, 0xff, 0xff],
    &[0, 0x40, 0, 1],
];

#[test]
fn migration_protocol_regressions() {
    let rt = runtime();
    for input in files(&repo().join("fuzz/regressions/migration_protocol")) {
        fuzz::migration_protocol(&rt, &input);
    }
}

#[test]
fn migration_protocol_seeds_are_the_local_definition() {
    // The first seed carries the local domain's own definition, which the target accepts: the
    // mutations below start from a definition that gets through every check.
    use qlauncher::sync::migration::protocol::Message;
    let seed = &fuzz::migration_seeds()[0];
    let rt = runtime();
    let prepare = rt.block_on(async {
        let mut r = &seed[1..];
        let _hello = qlauncher::sync::migration::protocol::read_message(&mut r).await;
        qlauncher::sync::migration::protocol::read_message(&mut r).await
    });
    let Ok(Message::Prepare(domain)) = prepare else {
        panic!("seed 0 has no Prepare: {prepare:?}");
    };
    let local = fuzz::local_domain();
    qlauncher::sync::migration::target::incoming_argv(&local.argv, &domain)
        .expect("the seed's argv is the local one");
    assert!(
        !domain.hotplugged.is_empty(),
        "the seed has hot-plugged devices"
    );
    for sent in &domain.hotplugged {
        let placed = match sent.kind {
            qlauncher::sync::migration::protocol::HotplugKind::Disk => {
                qlauncher::sync::migration::hotplug::place_like_source(&local.qmp.disks, sent)
                    .map(drop)
            }
            qlauncher::sync::migration::protocol::HotplugKind::Nic => {
                qlauncher::sync::migration::hotplug::place_nic_like_source(&local.qmp.nics, sent)
                    .map(drop)
            }
        };
        placed.expect("the seed's device is placed");
    }
    fuzz::migration_protocol(&rt, seed);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(1000), failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn migration_protocol_mutated(seed in any::<prop::sample::Index>(), e in edits(MIGRATION_TOKENS)) {
        let seeds = fuzz::migration_seeds();
        fuzz::migration_protocol(&runtime(), &apply(&seeds[seed.index(seeds.len())], &e));
    }
}

const CMD_TOKENS: &[&[u8]] = &[
    &[0x0a],
    &[0x12],
    &[0x0a, 0x00],
    &[0xff, 0xff, 0xff, 0xff, 0x0f],
    b"{}",
    b"null",
    b",",
    b"\"",
    b"\"migrationState\":{}",
    b"\"targetState\":{\"domainName\":\"a,b\",\"domainNamespace\":\"../x\"}",
    b"\"virtualMachineInstanceUID\":\"\\\"\"",
    b"\"Bandwidth\":\"1e400\"",
    b"\"ParallelMigrationThreads\":4294967296",
    b"\"Unix\"",
];

#[test]
fn cmd_request_regressions() {
    for input in files(&repo().join("fuzz/regressions/cmd_request")) {
        fuzz::cmd_request(&input);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(600), failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn cmd_request_mutated(seed in any::<prop::sample::Index>(), e in edits(CMD_TOKENS)) {
        let seeds = fuzz::cmd_seeds(&[]);
        fuzz::cmd_request(&apply(&seeds[seed.index(seeds.len())], &e));
    }
}

const HOOK_TOKENS: &[&[u8]] = &[
    b"<qemu:commandline><qemu:arg value=\"-device\"/></qemu:commandline>",
    b"<qemu:env name=\"A\" value=\"b\"/>",
    b"xmlns:qemu=\"http://libvirt.org/schemas/domain/qemu/1.0\"",
    b"xmlns:x=\"urn:x\"",
    b"<x:y/>",
    b"<!DOCTYPE d [<!ENTITY a \"aa\">]>",
    b"&a;",
    b"&#x0;",
    b"&#65;",
    b"<![CDATA[<]]>",
    b"<entry name=\"serial\">s</entry>",
    b"<entry name=\"uuid\">u</entry>",
    b"<oemStrings><entry>o</entry></oemStrings>",
    b"<smbios mode=\"host\"/>",
    b"<timer name=\"rtc\" tickpolicy=\"catchup\" track=\"guest\"/>",
    b"<timer name=\"pit\" tickpolicy=\"discard\"/>",
    b" adjustment=\"-3600\"",
    b"<vendor_id state=\"on\" value=\"a=b\"/>",
    b"</sysinfo>",
    b"/>",
    b"\"",
];

#[test]
fn hook_answer_regressions() {
    for input in files(&repo().join("fuzz/regressions/hook_answer")) {
        fuzz::hook_answer(&input);
    }
}

#[test]
fn hook_answer_seeds_are_edits_and_a_refusal() {
    let sent = fuzz::local_hook_input();
    let seeds = fuzz::hook_seeds();
    let diff = |s: &[u8]| qlauncher::hooks::diff_answer(sent, std::str::from_utf8(s).unwrap());
    assert_eq!(diff(&seeds[0]).unwrap(), vec![]);
    assert_eq!(diff(&seeds[1]).unwrap().len(), 1);
    assert_eq!(diff(&seeds[2]).unwrap().len(), 2);
    assert_eq!(diff(&seeds[3]).unwrap_err().path, "domain/name#text");
    assert_eq!(diff(&seeds[4]).unwrap().len(), 3);
    for s in &seeds {
        fuzz::hook_answer(s);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(600), failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn hook_answer_mutated(seed in any::<prop::sample::Index>(), e in edits(HOOK_TOKENS)) {
        let seeds = fuzz::hook_seeds();
        fuzz::hook_answer(&apply(&seeds[seed.index(seeds.len())], &e));
    }
}

const LIBVIRT_TOKENS: &[&[u8]] = &[
    b"\x00\x00\x00\x00",
    b"\xff\xff\xff\xff",
    b"\x7f\xff\xff\xff",
    b"\x00\x40\x00\x00",
    b"\x20\x00\x80\x86",
    b"\x6b\x65\x65\x70",
    b"\x00\x00\x01\x2f",
    b"\x00\x00\x01\x32",
    b"\x00\x00\x00\x07",
];

#[test]
fn libvirt_rpc_regressions() {
    let rt = runtime();
    for input in files(&repo().join("fuzz/regressions/libvirt_rpc")) {
        fuzz::libvirt_rpc(&rt, &input);
    }
}

/// The seeds decode: the Prepare frame's destination XML and cookie are read back, and the
/// stream runs through the server to its CONNECT_CLOSE.
#[test]
fn libvirt_rpc_seeds_are_a_sources_calls() {
    use qlauncher::libvirt_rpc::{packet, remote};
    let seeds = fuzz::libvirt_rpc_seeds();
    let prepare = packet::decode_frame(&seeds[1]).expect("a frame");
    assert_eq!(prepare.header.procedure, 303);
    let args = remote::Prepare3ParamsArgs::decode(&prepare.body).expect("Prepare's arguments");
    assert!(remote::param_string(&args.params, "destination_xml")
        .is_some_and(|x| x.contains("default_vmi")));
    assert!(!args.cookie.is_empty());
    let rt = runtime();
    let stream = tokio::io::join(std::io::Cursor::new(seeds[0].clone()), tokio::io::sink());
    struct Refuse;
    impl qlauncher::libvirt_rpc::server::MigrationTarget for Refuse {
        async fn prepare(
            &mut self,
            _: remote::Prepare3ParamsArgs,
        ) -> Result<remote::Prepare3ParamsRet, remote::RemoteError> {
            Err(remote::RemoteError::qemu(
                remote::ErrorCode::ConfigUnsupported,
                "no",
            ))
        }
        async fn finish(
            &mut self,
            a: remote::Finish3ParamsArgs,
        ) -> Result<remote::Finish3ParamsRet, remote::RemoteError> {
            assert!(a.cancelled);
            Err(remote::RemoteError::qemu(
                remote::ErrorCode::OperationFailed,
                "no",
            ))
        }
    }
    let served = rt
        .block_on(qlauncher::libvirt_rpc::server::serve(stream, &mut Refuse))
        .expect("the stream is libvirt's");
    assert_eq!(served.len(), 6, "{served:?}");
    for s in &seeds {
        fuzz::libvirt_rpc(&rt, s);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(600), failure_persistence: None, ..ProptestConfig::default() })]
    #[test]
    fn libvirt_rpc_mutated(seed in any::<prop::sample::Index>(), e in edits(LIBVIRT_TOKENS)) {
        let seeds = fuzz::libvirt_rpc_seeds();
        fuzz::libvirt_rpc(&runtime(), &apply(&seeds[seed.index(seeds.len())], &e));
    }
}

/// The committed libFuzzer seeds of the targets whose seeds are built from typed messages
/// (`fuzz/corpus/{migration_protocol,cmd_request,hook_answer,libvirt_rpc}/seed-*`) are what the builders make now, so a
/// protocol change cannot leave the fuzzers starting from frames that no longer decode.
/// `QLAUNCHER_WRITE_SEEDS=1` rewrites them.
#[test]
fn committed_seeds_are_current() {
    for (target, seeds) in [
        ("migration_protocol", fuzz::migration_seeds()),
        ("cmd_request", fuzz::cmd_seeds(&[])),
        ("hook_answer", fuzz::hook_seeds()),
        ("libvirt_rpc", fuzz::libvirt_rpc_seeds()),
    ] {
        let dir = repo().join("fuzz/corpus").join(target);
        let seed_files = || -> Vec<PathBuf> {
            let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_default();
            v.retain(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("seed-"))
            });
            v.sort();
            v
        };
        if std::env::var_os("QLAUNCHER_WRITE_SEEDS").is_some() {
            for p in seed_files() {
                std::fs::remove_file(p).expect("remove a seed");
            }
            fuzz::write_seeds(&dir, &seeds).expect("write the seeds");
        }
        let committed: Vec<Vec<u8>> = seed_files()
            .iter()
            .map(|p| std::fs::read(p).expect("read a seed"))
            .collect();
        assert!(
            committed == seeds,
            "fuzz/corpus/{target}: the seeds differ from the builders' (rerun with \
             QLAUNCHER_WRITE_SEEDS=1)"
        );
    }
}

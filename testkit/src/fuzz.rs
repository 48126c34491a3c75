//! The fuzz target bodies, shared by `fuzz/fuzz_targets/*.rs` (cargo-fuzz, libFuzzer; they include
//! this file as a module, the fuzz crate being outside the workspace) and `tests/harden_fuzz.rs`
//! (proptest, bounded, in CI). Each takes arbitrary bytes and must return without panicking,
//! hanging or allocating without bound; anything it checks beyond "no panic" is an invariant of
//! the code under test, asserted here. Uses only qlauncher, std, tokio, serde_json and prost
//! (each a dependency of both crates), so that it compiles in either crate.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};
use std::path::Path;
use std::time::Duration;

use qlauncher::cmdline::context::{IfaceFacts, TapSource};
use qlauncher::cmdline::{convert, render, ConverterContext};
use qlauncher::net::dhcp::v4::{DhcpV4Config, DhcpV4Server};
use qlauncher::net::dhcp::v6::{self, DhcpV6Config};
use qlauncher::net::dhcp::Outcome;
use qlauncher::net::DhcpExtraOptions;
use qlauncher::storage::{probe_image, ChainPolicy};
use qlauncher::vmi::{DefaultsConfig, Vmi};

/// A converter context with a tap fd for every interface of `vmi` (what the sync path hands in).
pub fn context_for(vmi: &Vmi) -> ConverterContext {
    let mut ctx = ConverterContext::default();
    for i in vmi
        .spec
        .domain
        .devices
        .interfaces
        .as_deref()
        .unwrap_or_default()
    {
        ctx.interfaces.insert(
            i.name.clone(),
            IfaceFacts {
                mac: None,
                mtu: Some(1500),
                tap: TapSource::Fds {
                    fds: vec![3],
                    vhostfds: vec![],
                },
            },
        );
    }
    ctx
}

/// VMI JSON/YAML -> defaults -> validation -> conversion -> argv and QMP plan.
/// Returns how far the input got: 0 parse error, 1 invalid, 2 conversion error, 3 rendered.
pub fn vmi_pipeline(data: &[u8]) -> u8 {
    let Ok(text) = std::str::from_utf8(data) else {
        return 0;
    };
    let Ok(mut vmi) = Vmi::from_json_or_yaml(text) else {
        return 0;
    };
    let cfg = DefaultsConfig::for_vmi(&vmi);
    vmi.apply_defaults(&cfg);
    if vmi.validate().is_err() {
        return 1;
    }
    let ctx = context_for(&vmi);
    let Ok(plan) = convert(&vmi, &ctx) else {
        return 2;
    };
    let argv = render::argv(&plan);
    for w in &argv {
        assert!(!w.contains('\0'), "NUL in argv word {w:?}");
    }
    let _ = render::qmp_plan(&plan);
    3
}

/// The DHCPv4 server configuration used for fuzzing (masquerade: any MAC).
pub fn v4_config() -> DhcpV4Config {
    DhcpV4Config {
        iface: "k6t-eth0".into(),
        server_ip: Ipv4Addr::new(10, 0, 2, 1),
        client_ip: Ipv4Addr::new(10, 0, 2, 2),
        prefix_len: 24,
        router: Some(Ipv4Addr::new(10, 0, 2, 1)),
        dns: vec![Ipv4Addr::new(10, 96, 0, 10)],
        search: vec!["default.svc.cluster.local".into()],
        domain_name: Some("default.svc.cluster.local".into()),
        hostname: "testvmi".into(),
        mtu: 1450,
        routes: vec![],
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

/// One datagram through the DHCPv4 server: any reply it builds must decode again.
pub fn dhcp_v4(server: &DhcpV4Server, data: &[u8]) {
    if let Outcome::Reply { bytes, .. } = server.respond(data) {
        assert!(
            qlauncher::net::dhcp::v4::decode(&bytes).is_some(),
            "reply does not decode"
        );
    }
}

/// The DHCPv6 server configuration used for fuzzing.
pub fn v6_config() -> DhcpV6Config {
    DhcpV6Config {
        iface: "k6t-eth0".into(),
        server_mac: [2, 0, 0, 0, 0, 1],
        address: "fd10:0:2::2"
            .parse::<Ipv6Addr>()
            .unwrap_or(Ipv6Addr::LOCALHOST),
        dns: vec![Ipv6Addr::LOCALHOST],
        search: vec!["default.svc.cluster.local".into()],
    }
}

/// One datagram through the DHCPv6 server.
pub fn dhcp_v6(cfg: &DhcpV6Config, data: &[u8]) {
    let from = SocketAddrV6::new("fe80::1".parse().unwrap_or(Ipv6Addr::LOCALHOST), 546, 0, 2);
    let _ = v6::respond(cfg, data, from);
}

/// The QMP reader: a peer sends a greeting, then `data`, then closes its writing side (it keeps
/// reading until the client closes). The client must either fail cleanly or finish a command with
/// an answer or an error, within the timeout. Both ends run as tasks of `rt` (no thread per
/// input), and the peer is awaited, so the client's reader task runs to the end of the stream
/// within the call.
pub fn qmp_reader(rt: &tokio::runtime::Runtime, data: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let data = data.to_vec();
    rt.block_on(async move {
        let (ours, theirs) = tokio::net::UnixStream::pair().expect("socketpair");
        let peer = tokio::spawn(async move {
            let mut theirs = theirs;
            let _ = theirs.write_all(b"{\"QMP\": {\"version\": {\"qemu\": {\"micro\": 0, \"minor\": 2, \"major\": 7}}, \"capabilities\": []}}\n").await;
            let _ = theirs.write_all(&data).await;
            let _ = theirs.shutdown().await;
            // Keep reading so the client's writes never block, until it closes.
            let mut sink = [0u8; 4096];
            while let Ok(Ok(n)) =
                tokio::time::timeout(Duration::from_secs(5), theirs.read(&mut sink)).await
            {
                if n == 0 {
                    break;
                }
            }
        });
        let res = tokio::time::timeout(
            Duration::from_secs(5),
            qlauncher::qmp::QmpClient::from_stream(ours, Duration::from_millis(500)),
        )
        .await
        .expect("from_stream returns within its own timeout");
        if let Ok(client) = res {
            let r = tokio::time::timeout(
                Duration::from_secs(5),
                client.execute_timeout("query-status", None, Duration::from_millis(200)),
            )
            .await;
            assert!(r.is_ok(), "execute did not return within its timeout");
        }
        let _ = peer.await;
    });
}

/// The image fact reader (format magic, qcow2 header, backing chain) over a file holding
/// `data`, in `dir`. Must return facts or an error, never panic.
pub fn image_facts(dir: &Path, data: &[u8]) {
    let path = dir.join("image");
    if std::fs::write(&path, data).is_err() {
        return;
    }
    let policy = ChainPolicy {
        allowed_roots: vec![dir.to_path_buf()],
        ..ChainPolicy::default()
    };
    let _ = probe_image("fuzz", &path, &policy);
}

/// Pod input (resolv.conf text, then pod routes) through the resolv.conf parser, planning and
/// the DHCP option builders, for both bindings; `data`: byte 0 picks the binding and whether
/// `spec.subdomain` is set, then resolv.conf text up to the first NUL, then 9-byte routes
/// (destination, prefix length, router; router 0.0.0.0 is on-link). Nothing in it may make
/// planning or the servers fail, and the guest's DISCOVER and SOLICIT get replies that decode,
/// fit 576 bytes and carry options 119 and 121 of at most 255 bytes.
pub fn pod_dns(data: &[u8]) {
    use qlauncher::net::discover::{PodFacts, PodIface, RouteV4};
    use qlauncher::net::{parse_resolv_conf, plan, Binding, NetConfig};
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let (text, routes) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let resolv = parse_resolv_conf(&String::from_utf8_lossy(text));
    let mut iface = PodIface {
        name: "eth0".into(),
        index: 2,
        mac: [0x0a, 0x58, 0x0a, 0xf4, 0, 5],
        mtu: 1450,
        ipv4: vec!["10.244.0.5/24".parse().expect("net")],
        ipv6: vec!["fd00:10:244::5/64".parse().expect("net")],
        ..Default::default()
    };
    for r in routes.chunks_exact(9) {
        let dst = Ipv4Addr::new(r[0], r[1], r[2], r[3]);
        let Ok(destination) = ipnet::Ipv4Net::new(dst, r[4] % 33) else {
            continue;
        };
        let gw = Ipv4Addr::new(r[5], r[6], r[7], r[8]);
        let gateway = (!gw.is_unspecified()).then_some(gw);
        if destination.prefix_len() == 0 {
            iface.gateway_v4 = gateway;
        }
        iface.routes_v4.push(RouteV4 {
            destination,
            gateway,
            protocol: 4,
        });
    }
    let facts = PodFacts { iface, resolv };
    let cfg = NetConfig {
        binding: if mode & 1 == 0 {
            Binding::Masquerade
        } else {
            Binding::Bridge
        },
        subdomain: (mode & 2 != 0).then(|| "mysub".to_string()),
        hostname: "fuzz".into(),
        ..Default::default()
    };
    let p = plan(&cfg, &facts).expect("pod input never fails planning");
    let v4 = p.dhcp_v4.clone().expect("DHCPv4 planned");
    let server = DhcpV4Server::new(v4.clone()).expect("pod input never fails the DHCPv4 server");
    let mac = v4.client_mac.unwrap_or([2, 0, 0, 0, 0, 9]);
    for prl in [&[][..], &[1, 3, 6, 15, 119, 121][..]] {
        let discover = qlauncher::net::dhcp::v4::client_message(
            dhcproto::v4::MessageType::Discover,
            mac,
            1,
            None,
            None,
            prl,
        );
        let Outcome::Reply { bytes, .. } = server.respond(&discover) else {
            panic!("no reply to DISCOVER");
        };
        assert!(bytes.len() + 28 <= 576, "reply of {} bytes", bytes.len());
        let m = qlauncher::net::dhcp::v4::decode(&bytes).expect("reply decodes");
        for code in [119u8, 121] {
            let mut i = 240;
            let mut total = 0usize;
            while i + 1 < bytes.len() && bytes[i] != 255 {
                if bytes[i] == 0 {
                    i += 1;
                    continue;
                }
                if bytes[i] == code {
                    total += usize::from(bytes[i + 1]);
                }
                i += 2 + usize::from(bytes[i + 1]);
            }
            assert!(total <= 255, "option {code} of {total} bytes");
        }
        let _ = m;
    }
    if let Some(v6cfg) = &p.dhcp_v6 {
        let mut solicit = vec![1, 0, 0, 7, 0, 1, 0, 10, 0, 3, 0, 1, 2, 0, 0, 0, 0, 9];
        solicit.extend_from_slice(&[0, 3, 0, 12, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
        let from = SocketAddrV6::new(Ipv6Addr::LOCALHOST, 546, 0, 2);
        match v6::respond(v6cfg, &solicit, from) {
            Outcome::Reply { bytes, .. } => {
                v6::decode_client_message(&bytes).expect("Advertise decodes");
            }
            other => panic!("no Advertise: {other:?}"),
        }
    }
}

/// The VMI the migration and cmd targets convert as "this launcher's" domain: hot-pluggable
/// disks on SCSI and virtio, a pod and a secondary interface, a host-model CPU.
pub const LOCAL_VMI: &str = r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
"metadata":{"name":"fuzz","namespace":"ns1","uid":"7e3c9a10-0000-4000-8000-0000000000f2"},
"spec":{"domain":{"cpu":{"model":"host-model"},"firmware":{"uuid":"11111111-2222-4333-8444-5555555555f2"},
"devices":{"disks":[{"name":"root","disk":{"bus":"virtio"}},{"name":"hp-scsi","disk":{"bus":"scsi"}},
{"name":"hp-virtio","disk":{"bus":"virtio"}}],
"interfaces":[{"name":"default","masquerade":{},"macAddress":"02:00:00:00:00:01"},
{"name":"blue","bridge":{},"macAddress":"02:00:00:00:00:02"}]},"memory":{"guest":"256Mi"}},
"networks":[{"name":"default","pod":{}},{"name":"blue","multus":{"networkName":"net-a"}}],
"volumes":[{"name":"root","containerDisk":{"image":"example/cirros"}},
{"name":"hp-scsi","persistentVolumeClaim":{"claimName":"pvc-a","hotpluggable":true}},
{"name":"hp-virtio","dataVolume":{"name":"dv-b","hotpluggable":true}}]},
"status":{"migrationTransport":"Unix","volumeStatus":[{"name":"root","target":"vda"},
{"name":"hp-scsi","target":"sda","phase":"Ready","hotplugVolume":{"attachPodName":"hp-pod"}},
{"name":"hp-virtio","target":"vdb","phase":"Ready","hotplugVolume":{"attachPodName":"hp-pod"}}]}}"#;

/// This launcher's side of a migration, from [`LOCAL_VMI`]: the VMI as the converter sees it,
/// its plan, argv and QMP device plan (built once).
pub struct LocalDomain {
    /// The VMI after defaults.
    pub vmi: Vmi,
    /// Its plan.
    pub plan: qlauncher::cmdline::DomainPlan,
    /// Its argv.
    pub argv: Vec<String>,
    /// Its hot-pluggable disks and NICs.
    pub qmp: qlauncher::cmdline::render::QmpPlan,
}

/// [`LocalDomain`] of [`LOCAL_VMI`].
pub fn local_domain() -> &'static LocalDomain {
    static LOCAL: std::sync::OnceLock<LocalDomain> = std::sync::OnceLock::new();
    LOCAL.get_or_init(|| {
        let mut vmi = Vmi::from_json_or_yaml(LOCAL_VMI).expect("local VMI parses");
        let cfg = DefaultsConfig::for_vmi(&vmi);
        vmi.apply_defaults(&cfg);
        vmi.validate().expect("local VMI is valid");
        let plan = convert(&vmi, &context_for(&vmi)).expect("local VMI converts");
        let argv = render::argv(&plan);
        let qmp = render::qmp_plan(&plan);
        LocalDomain {
            vmi,
            plan,
            argv,
            qmp,
        }
    })
}

/// A control channel whose peer sends `data` and then closes; what this side writes is dropped.
fn control_channel(data: &[u8]) -> tokio::io::Join<&[u8], tokio::io::Sink> {
    tokio::io::join(data, tokio::io::sink())
}

/// What a target does with the source's definition before QEMU starts: the argv check against
/// its own, the adopted CPU, the hot-plugged devices placed as the source runs them, the views
/// it converts again without them. None of it may panic; an adopted CPU renders as one `-cpu`
/// word of exactly its properties (no value can add an option), and a placed device keeps the
/// source's bus and address.
pub fn migration_definition(domain: &qlauncher::sync::migration::protocol::RunningDomain) {
    use qlauncher::sync::migration::{hotplug, protocol::HotplugKind, target};
    let local = local_domain();
    // The source's hooked domain goes through the hook answer's checks.
    if let Some(hooked) = &domain.hooked {
        if let Err(refusal) = hooked.edits() {
            assert!(refusal.path.starts_with("domain"), "{refusal}");
        }
    }
    if let Ok(argv) = target::incoming_argv(&local.argv, domain) {
        assert_eq!(argv.len(), local.argv.len() + 2, "incoming argv {argv:?}");
        assert_eq!(argv[argv.len() - 2..], ["-incoming", "defer"]);
    }
    if let Some(def) = &domain.cpu {
        if let Ok(cpu) = qlauncher::cmdline::devices::cpu::adopted_cpu_plan(def) {
            let mut plan = local.plan.clone();
            let flags = cpu.flags.len();
            plan.cpu = cpu;
            let argv = render::argv(&plan);
            let i = argv
                .iter()
                .position(|w| w == "-cpu")
                .expect("the adopted plan has -cpu");
            let word = &argv[i + 1];
            assert_eq!(
                word.split(',').count(),
                flags + 1,
                "-cpu {word:?} is not the model and {flags} properties"
            );
            assert!(
                !word.contains('\0') && !word.contains('\n'),
                "-cpu {word:?}"
            );
        }
    }
    for sent in &domain.hotplugged {
        match sent.kind {
            HotplugKind::Disk => {
                if let Ok(placed) = hotplug::place_like_source(&local.qmp.disks, sent) {
                    assert_eq!(placed.device.addr, sent.addr);
                }
            }
            HotplugKind::Nic => {
                if let Ok(placed) = hotplug::place_nic_like_source(&local.qmp.nics, sent) {
                    assert_eq!(placed.device.bus, sent.bus);
                    assert_eq!(placed.device.addr, sent.addr);
                }
            }
        }
    }
    if !domain.hotplugged.is_empty() {
        for view in hotplug::boot_views(&local.vmi, &domain.hotplugged) {
            let _ = convert(&view, &context_for(&view));
        }
    }
}

/// The migration control protocol (`sync::migration::protocol`) from the peer's bytes `data`:
/// byte 0 picks the role. As the target: the hello, the source's `Prepare` for this VMI (its
/// definition through [`migration_definition`]), then every further frame; as the source: the
/// target's hello, `Ready`/`Failed` and `Done`, then every further frame. Each read either
/// decodes a message or fails; it never panics, never allocates for a frame over the limit,
/// and always ends (the channel closes after `data`).
pub fn migration_protocol(rt: &tokio::runtime::Runtime, data: &[u8]) {
    use qlauncher::sync::migration::protocol::{self, Message};
    use qlauncher::sync::migration::target::TargetSession;
    let Some((&role, data)) = data.split_first() else {
        return;
    };
    rt.block_on(async move {
        let mut channel = control_channel(data);
        if role & 1 == 0 {
            if let Ok(session) = TargetSession::accept(&mut channel, &local_uid()).await {
                migration_definition(&session.domain);
            }
        } else {
            let _ = protocol::hello_as_source(&mut channel).await;
        }
        while let Ok(message) = protocol::read_message(&mut channel).await {
            if let Message::Prepare(domain) = &message {
                migration_definition(domain);
            }
            let _ = message.kind();
        }
    });
}

/// The UID of [`LOCAL_VMI`].
pub fn local_uid() -> String {
    local_domain().vmi.metadata.uid.clone().unwrap_or_default()
}

/// What the `SyncVirtualMachine` family does with a request's `vmiJson` before it acts
/// (`rpc::service` decodes it, `sync::admit` defaults and validates it (`Vmi::admit`) and keys
/// the running spec on it, the start converts it): never a panic, and a VMI that validates either converts
/// or fails with a conversion error.
fn cmd_sync_vmi(vmi_json: &[u8]) {
    let Ok(mut vmi) = serde_json::from_slice::<Vmi>(vmi_json) else {
        return;
    };
    if vmi.admit().is_err() {
        return;
    }
    let volume_status = vmi.status.as_ref().map(|s| &s.volume_status);
    let key = qlauncher::sync::facts::secondary::status_key(&vmi);
    serde_json::to_value((&vmi.spec, volume_status, key)).expect("a valid VMI's spec encodes");
    if let Ok(plan) = convert(&vmi, &context_for(&vmi)) {
        for w in render::argv(&plan) {
            assert!(!w.contains('\0'), "NUL in argv word {w:?}");
        }
        let _ = render::qmp_plan(&plan);
    }
}

/// What the migration RPCs do with a request's `vmiJson` and options before they act
/// (`migration::launcher::decode`, the transport check, the migration state's UIDs and target
/// identity, `MigrationOptions` and what the source derives from them, and the definition
/// rewritten for the target VMI named there): never a panic; the rewritten definition keeps
/// its shape (the UID and names can change values, never add or drop a field or an argv word).
fn cmd_migration(vmi_json: &[u8], options: Option<&[u8]>) {
    use qlauncher::sync::migration::{launcher, protocol, source, MigrationOptions};
    if let Some(options) = options {
        if let Ok(o) = MigrationOptions::from_json(options) {
            let _ = o.max_bandwidth();
            let _ = o.mirror_speed();
            let _ = o.completion_deadline(u64::MAX);
            let _ = o.progress_deadline();
            let _ = source::capabilities(&o);
        }
    }
    let Ok((vmi, state)) = launcher::decode(vmi_json) else {
        return;
    };
    let _ = launcher::require_unix_transport(&vmi);
    let Some(state) = state else {
        return;
    };
    let own_uid = vmi.metadata.uid.clone().unwrap_or_default();
    let _ = state.uid();
    let _ = state.proxy_key(&own_uid);
    let local = local_domain();
    let domain = protocol::RunningDomain {
        vmi_uid: local_uid(),
        migration_uid: state.uid().unwrap_or_default(),
        machine: "pc-q35-7.2".into(),
        argv: local.argv.clone(),
        hotplugged: Vec::new(),
        copied_disks: Vec::new(),
        capabilities: vec!["multifd".into()],
        multifd_channels: Some(8),
        paused: false,
        cpu: None,
        hooked: None,
    };
    let words = domain.argv.len();
    let mut sent = domain;
    if let Some(target_uid) = state.target_vmi_uid() {
        sent = sent
            .for_target_vmi(&local_uid(), target_uid)
            .expect("a UID rewrite always round-trips");
        assert_eq!(
            sent.argv.len(),
            words,
            "the UID rewrite changed the argv's length"
        );
        assert_eq!(sent.vmi_uid, target_uid);
    }
    if let Some(target) = state.target_domain() {
        let own = protocol::DomainIdentity {
            namespace: "ns1".into(),
            name: "fuzz".into(),
        };
        if let Ok(renamed) = sent.clone().for_target_domain(&own, &target) {
            assert_eq!(
                renamed.argv.len(),
                words,
                "the rename changed the argv's length"
            );
        }
    }
}

/// One cmd v1 request as the command server receives it: byte 0 picks the request message
/// (`VMIRequest`, `MigrationRequest`, `ExecRequest`, `GuestPingRequest`, `MemoryDumpRequest`,
/// `InjectLaunchSecretRequest`, `VMStatsRequest`, `BackupRequest`, `RedefineCheckpointRequest`),
/// the rest is its protobuf encoding (tonic hands the message body to prost). Each decoded
/// request's untrusted fields go where the server sends them before it acts: the VMI JSON
/// through the sync or migration preludes, the migration and SEV options through their decoders.
pub fn cmd_request(data: &[u8]) {
    use prost::Message as _;
    use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
    let Some((&rpc, body)) = data.split_first() else {
        return;
    };
    let json = |vmi: Option<cmd::Vmi>| vmi.map(|v| v.vmi_json).unwrap_or_default();
    match (rpc & 0x7f) % 9 {
        0 => {
            if let Ok(r) = cmd::VmiRequest::decode(body) {
                let vmi = json(r.vmi);
                if rpc & 0x80 == 0 {
                    cmd_sync_vmi(&vmi);
                } else {
                    cmd_migration(&vmi, None);
                }
            }
        }
        1 => {
            if let Ok(r) = cmd::MigrationRequest::decode(body) {
                cmd_migration(&json(r.vmi), Some(&r.options));
            }
        }
        2 => {
            let _ = cmd::ExecRequest::decode(body);
        }
        3 => {
            let _ = cmd::GuestPingRequest::decode(body);
        }
        4 => {
            if let Ok(r) = cmd::MemoryDumpRequest::decode(body) {
                let _ = serde_json::from_slice::<Vmi>(&json(r.vmi));
                let _ = std::path::Path::new(&r.dump_path).file_name();
            }
        }
        5 => {
            if let Ok(r) = cmd::InjectLaunchSecretRequest::decode(body) {
                let _ = serde_json::from_slice::<Vmi>(&json(r.vmi));
                let _ = qlauncher::sync::cmdapi::sev::secret_options(&r.options);
            }
        }
        6 => {
            let _ = cmd::VmStatsRequest::decode(body);
        }
        7 => {
            let _ = cmd::BackupRequest::decode(body);
        }
        _ => {
            let _ = cmd::RedefineCheckpointRequest::decode(body);
        }
    }
}

/// `messages` as the peer sends them (one frame each), after the role byte of
/// [`migration_protocol`].
pub fn migration_frames(
    role: u8,
    messages: &[qlauncher::sync::migration::protocol::Message],
) -> Vec<u8> {
    let mut out = vec![role];
    for m in messages {
        let body = serde_json::to_vec(m).expect("a message encodes");
        out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
        out.extend_from_slice(&body);
    }
    out
}

/// Seeds of [`migration_protocol`] that get past the hello and the VMI check into every part of
/// [`migration_definition`]: the local domain's own definition with its hot-pluggable disks and
/// NICs as the source describes them and a host-model CPU expansion, and the source's view of a
/// target that is ready, done, failed or refuses.
pub fn migration_seeds() -> Vec<Vec<u8>> {
    use qlauncher::cmdline::plan::{CpuModel, CpuProp};
    use qlauncher::sync::migration::hotplug;
    use qlauncher::sync::migration::protocol::{
        CopiedDisk, Hello, Message, Outcome, Ready, RunningDomain,
    };
    let local = local_domain();
    let mut hotplugged: Vec<_> = local.qmp.disks.iter().map(hotplug::describe_disk).collect();
    hotplugged.extend(local.qmp.nics.iter().map(hotplug::describe_nic));
    let full = RunningDomain {
        vmi_uid: local_uid(),
        migration_uid: "mig-1".into(),
        machine: "pc-q35-7.2".into(),
        argv: local.argv.clone(),
        hotplugged,
        copied_disks: vec![CopiedDisk {
            node: "libvirt-1-format".into(),
            export: "drive-ua-root".into(),
            size: 1 << 30,
        }],
        capabilities: vec!["multifd".into(), "postcopy-ram".into()],
        multifd_channels: Some(8),
        paused: false,
        hooked: None,
        cpu: Some(CpuModel {
            name: "base".into(),
            props: [
                ("family".to_owned(), CpuProp::Int(6)),
                ("vendor".to_owned(), CpuProp::Text("GenuineIntel".into())),
                ("sse4.2".to_owned(), CpuProp::Bool(true)),
                ("vmx".to_owned(), CpuProp::Bool(false)),
            ]
            .into_iter()
            .collect(),
        }),
    };
    let plain = RunningDomain {
        hotplugged: Vec::new(),
        cpu: None,
        copied_disks: Vec::new(),
        ..full.clone()
    };
    let hello = Message::Hello(Hello::ours());
    let done = Message::Outcome(Outcome {
        completed: true,
        reason: None,
    });
    vec![
        migration_frames(
            0,
            &[
                hello.clone(),
                Message::Prepare(Box::new(full)),
                done.clone(),
                Message::Abort,
            ],
        ),
        migration_frames(
            0,
            &[
                hello.clone(),
                Message::Prepare(Box::new(plain)),
                Message::Outcome(Outcome {
                    completed: false,
                    reason: Some("x".into()),
                }),
            ],
        ),
        migration_frames(
            1,
            &[
                hello.clone(),
                Message::Ready(Ready {
                    nbd_exports: vec!["drive-ua-root".into()],
                }),
                Message::Done,
            ],
        ),
        migration_frames(
            1,
            &[
                Message::Refused {
                    reason: "no".into(),
                },
                Message::Failed {
                    reason: "no".into(),
                },
            ],
        ),
    ]
}

/// Seeds of [`cmd_request`]: every request message with the fields the server reads, the
/// VMIs being [`LOCAL_VMI`] and `vmis` (VMI JSON), for sync and, with a migration state naming a
/// decentralized target, for the migration RPCs.
pub fn cmd_seeds(vmis: &[Vec<u8>]) -> Vec<Vec<u8>> {
    use prost::Message as _;
    use qlauncher::sync::rpc::proto::cmd::v1 as cmd;
    let seed = |rpc: u8, m: &dyn Fn(&mut Vec<u8>)| {
        let mut v = vec![rpc];
        m(&mut v);
        v
    };
    let local: serde_json::Value = serde_json::from_str(LOCAL_VMI).expect("local VMI is JSON");
    let mut migrating = local.clone();
    migrating["status"]["migrationState"] = serde_json::json!({
        "migrationUid": "mig-1",
        "sourceState": {"migrationUID": "mig-1",
            "virtualMachineInstanceUID": "7e3c9a10-0000-4000-8000-0000000000f2"},
        "targetState": {"migrationUID": "mig-1",
            "virtualMachineInstanceUID": "7e3c9a10-0000-4000-8000-0000000000f3",
            "domainName": "fuzz2", "domainNamespace": "ns2"},
        "targetPod": "virt-launcher-fuzz-abcde"
    });
    let local = serde_json::to_vec(&local).expect("encodes");
    let migrating = serde_json::to_vec(&migrating).expect("encodes");
    let vmi = |json: &[u8]| {
        Some(cmd::Vmi {
            vmi_json: json.to_vec(),
        })
    };
    let options = cmd::VirtualMachineOptions {
        mem_balloon_stats_period: 10,
        preallocated_volumes: vec!["root".into()],
        interface_migration: [(
            "blue".to_owned(),
            cmd::InterfaceBindingMigration {
                method: "link-refresh".into(),
            },
        )]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let mut out = Vec::new();
    for json in std::iter::once(&local).chain(vmis) {
        out.push(seed(0, &|v| {
            cmd::VmiRequest {
                vmi: vmi(json),
                options: Some(options.clone()),
            }
            .encode(v)
            .expect("encodes")
        }));
    }
    out.push(seed(0x80, &|v| {
        cmd::VmiRequest {
            vmi: vmi(&migrating),
            options: Some(options.clone()),
        }
        .encode(v)
        .expect("encodes")
    }));
    out.push(seed(1, &|v| {
        cmd::MigrationRequest {
            vmi: vmi(&migrating),
            options: br#"{"Bandwidth":"64Mi","ProgressTimeout":150,"CompletionTimeoutPerGiB":800,"MaxDowntimeMs":300,"AllowAutoConverge":true,"AllowPostCopy":true,"ParallelMigrationThreads":8,"AllowWorkloadDisruption":true,"Compression":"zstd"}"#.to_vec(),
        }
        .encode(v)
        .expect("encodes")
    }));
    out.push(seed(2, &|v| {
        cmd::ExecRequest {
            domain_name: "ns1_fuzz".into(),
            command: "/bin/true".into(),
            args: vec!["-x".into()],
            timeout_seconds: 5,
        }
        .encode(v)
        .expect("encodes")
    }));
    out.push(seed(3, &|v| {
        cmd::GuestPingRequest {
            domain_name: "ns1_fuzz".into(),
            timeout_seconds: 5,
        }
        .encode(v)
        .expect("encodes")
    }));
    out.push(seed(4, &|v| {
        cmd::MemoryDumpRequest {
            vmi: vmi(&local),
            dump_path: "/var/run/kubevirt/memory-dump/fuzz.memory.dump".into(),
        }
        .encode(v)
        .expect("encodes")
    }));
    out.push(seed(5, &|v| {
        cmd::InjectLaunchSecretRequest {
            vmi: vmi(&local),
            options: br#"{"header":"aGVhZGVy","secret":"c2VjcmV0"}"#.to_vec(),
        }
        .encode(v)
        .expect("encodes")
    }));
    out
}

/// Writes `seeds` into `dir` as `seed-<n>` (the libFuzzer seed corpus of a target).
///
/// # Errors
/// Creating the directory or writing a file.
pub fn write_seeds(dir: &Path, seeds: &[Vec<u8>]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (i, s) in seeds.iter().enumerate() {
        std::fs::write(dir.join(format!("seed-{i:02}")), s)?;
    }
    Ok(())
}

/// The VMI JSON of every `*.yaml` VMI manifest directly under `dir` that parses (sorted by
/// name; none when `dir` does not exist).
pub fn vmi_jsons(dir: &Path) -> Vec<Vec<u8>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    paths.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    paths.sort();
    paths
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter_map(|t| Vmi::from_json_or_yaml(&t).ok())
        .filter_map(|v| serde_json::to_vec(&v).ok())
        .collect()
}

/// The `OnDefineDomain` hook input of [`LOCAL_VMI`] (what the launcher sends a hook sidecar).
pub fn local_hook_input() -> &'static str {
    static SENT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SENT.get_or_init(|| {
        let local = local_domain();
        qlauncher::hooks::domain_xml(&local.vmi, &context_for(&local.vmi), &local.plan)
            .expect("the local domain exports")
    })
}

/// A hook sidecar's `OnDefineDomain` answer (`data`, any bytes; the client refuses non-UTF-8
/// before this) against [`local_hook_input`]: the namespace-aware parse, the diff, the edits
/// applied to the local plan and the argv rendered. It gives edits or a refusal naming a path
/// under `domain`; an accepted answer's `qemu:arg` words are exactly the argv words before
/// `-sandbox`, each one word, and every other argv word is the plan's own or an `-smbios` value.
pub fn hook_answer(data: &[u8]) {
    let Ok(answer) = std::str::from_utf8(data) else {
        return;
    };
    let local = local_domain();
    match qlauncher::hooks::diff_answer(local_hook_input(), answer) {
        Err(refusal) => assert!(refusal.path.starts_with("domain"), "{refusal}"),
        Ok(edits) => {
            let mut plan = local.plan.clone();
            qlauncher::hooks::apply(&edits, &mut plan);
            let argv = render::argv(&plan);
            let sandbox = argv
                .iter()
                .position(|w| w == "-sandbox")
                .expect("the argv has -sandbox");
            let start = sandbox
                .checked_sub(plan.extra_args.len())
                .expect("the hook's words fit before -sandbox");
            assert_eq!(&argv[start..sandbox], plan.extra_args.as_slice());
            // A disk edit changes only the tier-2 keys of that disk's nodes and frontend.
            let without_cache = |w: &String| match serde_json::from_str::<serde_json::Value>(w) {
                Ok(serde_json::Value::Object(mut m)) => {
                    for k in [
                        "cache",
                        "write-cache",
                        "aio",
                        "discard",
                        "werror",
                        "rerror",
                        "num-queues",
                        "serial",
                        "device_id",
                    ] {
                        m.remove(k);
                    }
                    serde_json::Value::Object(m).to_string()
                }
                _ => w.clone(),
            };
            let own: Vec<String> = render::argv(&local.plan)
                .iter()
                .map(without_cache)
                .collect();
            let ours: Vec<&String> = argv[..start].iter().chain(&argv[sandbox..]).collect();
            let mut i = 0;
            while i < ours.len() {
                // SMBIOS tables, and the words the tier-2 features and clock rows change (the
                // -cpu flags, -rtc, the HPET machine option, the kvm-pit global, -no-hpet).
                let kvm_pit = ours[i] == "-global"
                    && ours
                        .get(i + 1)
                        .is_some_and(|w| w.contains("driver=kvm-pit,"));
                if ["-smbios", "-cpu", "-rtc", "-machine"].contains(&ours[i].as_str()) || kvm_pit {
                    i += 2;
                    continue;
                }
                if ours[i] == "-no-hpet" {
                    i += 1;
                    continue;
                }
                let word = without_cache(ours[i]);
                assert!(own.contains(&word), "unexpected argv word {:?}", ours[i]);
                i += 1;
            }
        }
    }
}

/// Seeds of [`hook_answer`]: the hook input itself (no change), KubeVirt's e2e `sed` on
/// `<baseBoard></baseBoard>`, an added `<qemu:commandline>` with an ElementTree prefix, a
/// refused change, and an added `<clock>` (a shifted RTC, no HPET) with Hyper-V spinlocks.
pub fn hook_seeds() -> Vec<Vec<u8>> {
    let sent = local_hook_input();
    let sed = sent.replace(
        "<baseBoard></baseBoard>",
        "<baseBoard><entry name=\"manufacturer\">Radical Edward</entry></baseBoard>",
    );
    let args = sent
        .replace(
            "<domain type=\"kvm\"",
            "<domain xmlns:ns0=\"http://libvirt.org/schemas/domain/qemu/1.0\" type=\"kvm\"",
        )
        .replace(
            "</domain>",
            "<ns0:commandline><ns0:arg value=\"-device\"/><ns0:arg value=\"isa-debugcon,iobase=0x402\"/><ns0:env name=\"G_MESSAGES_DEBUG\" value=\"all\"/></ns0:commandline></domain>",
        );
    let refused = sent.replace("<name>", "<name>x");
    let clock = sent.replacen(
        "\t<features>",
        "\t<clock offset=\"utc\" adjustment=\"60\"><timer name=\"hpet\" present=\"no\"></timer></clock>\n\
         \t<features><hyperv><spinlocks state=\"on\" retries=\"8191\"></spinlocks></hyperv>",
        1,
    );
    [sent.to_owned(), sed, args, refused, clock]
        .into_iter()
        .map(String::into_bytes)
        .collect()
}

/// A refusing libvirt migration target: what the server does with a source's bytes, never
/// what a target does with a domain.
struct RefusingTarget;

impl qlauncher::libvirt_rpc::server::MigrationTarget for RefusingTarget {
    async fn prepare(
        &mut self,
        args: qlauncher::libvirt_rpc::remote::Prepare3ParamsArgs,
    ) -> Result<
        qlauncher::libvirt_rpc::remote::Prepare3ParamsRet,
        qlauncher::libvirt_rpc::remote::RemoteError,
    > {
        use qlauncher::libvirt_rpc::remote::{param_string, ErrorCode, RemoteError};
        let _ = param_string(&args.params, "destination_xml");
        Err(RemoteError::qemu(ErrorCode::ConfigUnsupported, "fuzz"))
    }

    async fn finish(
        &mut self,
        _args: qlauncher::libvirt_rpc::remote::Finish3ParamsArgs,
    ) -> Result<
        qlauncher::libvirt_rpc::remote::Finish3ParamsRet,
        qlauncher::libvirt_rpc::remote::RemoteError,
    > {
        use qlauncher::libvirt_rpc::remote::{ErrorCode, RemoteError};
        Err(RemoteError::qemu(ErrorCode::OperationFailed, "fuzz"))
    }
}

/// libvirt's remote protocol from a migration source (the target side of a libvirt peer): the
/// bytes as one frame through `decode_frame` and every argument decoder, then as the whole
/// stream a source sends into the server (keepalive answered, calls dispatched to a refusing
/// target), and as the replies a qlauncher source's client reads (reply decoders, the first
/// calls). Nothing may panic, and no length read from the bytes may allocate beyond them
/// (libFuzzer's `-rss_limit_mb` catches that).
pub fn libvirt_rpc(rt: &tokio::runtime::Runtime, data: &[u8]) {
    use qlauncher::libvirt_rpc::{client, packet, remote, server};
    if let Ok(p) = packet::decode_frame(data) {
        let _ = remote::OpenArgs::decode(&p.body);
        let _ = remote::decode_supports_feature(&p.body);
        if let Ok(a) = remote::Prepare3ParamsArgs::decode(&p.body) {
            // What the target takes from a Prepare: the domain XML, its CPU as a -cpu, its
            // NICs, the stream URI it answers.
            use qlauncher::sync::migration::libvirt_peer;
            let _ = libvirt_peer::answered_uri(
                &a.params,
                std::path::Path::new("/var/run/kubevirt/migrationproxy/u-49152-source.sock"),
            );
            if let Some(xml) = remote::param_string(&a.params, "destination_xml") {
                let dname = remote::param_string(&a.params, "destination_name");
                if let Ok(d) = libvirt_peer::source_domain(xml, dname) {
                    let _ = libvirt_peer::compare_devices(&d.tree, &d.tree);
                    if let Ok(nics) = libvirt_peer::source_nics(&d.tree) {
                        let _ = libvirt_peer::adopted_macs(&nics, &nics);
                    }
                    if let Some(cpu) = &d.cpu {
                        let _ = qlauncher::cmdline::devices::cpu::adopted_cpu_plan(cpu);
                    }
                }
            }
        }
        let _ = remote::Finish3ParamsArgs::decode(&p.body);
        // The source's side: the same bytes as a stock target's reply bodies.
        let _ = remote::Prepare3ParamsRet::decode(&p.body);
        let _ = remote::Finish3ParamsRet::decode(&p.body);
        let _ = client::PeerError::decode(&p.body);
    }
    let stream = tokio::io::join(std::io::Cursor::new(data.to_vec()), tokio::io::sink());
    rt.block_on(async move {
        let _ = server::serve(stream, &mut RefusingTarget).await;
    });
    // The bytes as what a stock target answers a qlauncher source's first calls.
    let stream = tokio::io::join(std::io::Cursor::new(data.to_vec()), tokio::io::sink());
    rt.block_on(async move {
        let mut c = client::Client::new(stream);
        let _ = c.probe_peer().await;
        let _ = c.auth_list().await;
    });
}

/// One call frame of libvirt's remote program: `procedure` with `body`.
fn libvirt_call(procedure: i32, serial: u32, body: &[u8]) -> Vec<u8> {
    use qlauncher::libvirt_rpc::packet::{encode_frame, Header, MessageType, Status};
    use qlauncher::libvirt_rpc::remote::{REMOTE_PROGRAM, REMOTE_PROTOCOL_VERSION};
    encode_frame(
        &Header {
            program: REMOTE_PROGRAM,
            version: REMOTE_PROTOCOL_VERSION,
            procedure,
            kind: MessageType::Call,
            serial,
            status: Status::Ok,
        },
        body,
    )
}

/// Seeds of [`libvirt_rpc`]: a source's opening (AUTH_LIST, CONNECT_OPEN, SUPPORTS_FEATURE),
/// a keepalive PING, then PREPARE3_PARAMS with a domain XML, a migrate URI and a cookie, and
/// FINISH3_PARAMS cancelled, and CONNECT_CLOSE, as one stream; and the Prepare call alone.
pub fn libvirt_rpc_seeds() -> Vec<Vec<u8>> {
    use qlauncher::libvirt_rpc::packet::{encode_frame, Header, MessageType, Status};
    use qlauncher::libvirt_rpc::remote::{
        KEEPALIVE_PROC_PING, KEEPALIVE_PROGRAM, KEEPALIVE_PROTOCOL_VERSION,
    };
    use qlauncher::libvirt_rpc::xdr::Encoder;
    let mut open = Encoder::new();
    open.u32(1).string("qemu:///system").u32(0);
    let mut feature = Encoder::new();
    feature.i32(8);
    let ping = encode_frame(
        &Header {
            program: KEEPALIVE_PROGRAM,
            version: KEEPALIVE_PROTOCOL_VERSION,
            procedure: KEEPALIVE_PROC_PING,
            kind: MessageType::Message,
            serial: 0,
            status: Status::Ok,
        },
        &[],
    );
    let mut prepare = Encoder::new();
    prepare
        .u32(2)
        .string("destination_xml")
        .i32(7)
        .string(
            "<domain type='kvm'><name>default_vmi</name>\
             <uuid>5a5a5a5a-1111-4000-8000-0000000000aa</uuid>\
             <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type></os>\
             <cpu mode='custom' match='exact'><model>EPYC</model>\
             <feature policy='require' name='x2apic'/><feature policy='disable' name='svm'/></cpu>\
             <devices><disk type='file' device='disk'><alias name='ua-rootdisk'/>\
             <address type='pci' domain='0x0000' bus='0x03' slot='0x00' function='0x0'/></disk>\
             <controller type='pci' index='1' model='pcie-root-port'/>\
             <input type='mouse' bus='ps2'/></devices></domain>",
        )
        .string("migrate_uri")
        .i32(7)
        .string("unix:///var/run/kubevirt/migrationproxy/x.sock");
    prepare.opaque(b"<qemu-migration><name>default_vmi</name></qemu-migration>\0");
    prepare.u32(0x203);
    let prepare = libvirt_call(303, 4, &prepare.into_bytes());
    let mut finish = Encoder::new();
    finish.u32(0).opaque(b"").u32(0x203).i32(1);
    let stream = [
        libvirt_call(66, 1, &[]),
        libvirt_call(1, 2, &open.into_bytes()),
        libvirt_call(60, 3, &feature.into_bytes()),
        ping,
        prepare.clone(),
        libvirt_call(306, 5, &finish.into_bytes()),
        libvirt_call(2, 6, &[]),
    ]
    .concat();
    vec![stream, prepare]
}

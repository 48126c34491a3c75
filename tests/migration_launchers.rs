//! Live migration between two real launchers (`qlauncher launcher`) in two pod network
//! namespaces, the test playing both virt-handlers (the cmd RPCs, the notify servers) and the
//! migration proxy (a relay: unix sockets in each pod, TCP on the node's loopback between them).
//!
//! One boot of the test guest: a memory-writing workload (a counter in the guest's RAM) runs and a
//! file is written to the containerDisk overlay's ext4 `/data`; after `MigrateVirtualMachine` the
//! target's guest keeps counting from where it was, has the file, its address and its MAC (the
//! target pod has another), a TCP connection opened from the node to the guest's echo server
//! (through the pod IP) carries data after the pod IP fails over to the target pod, the source's
//! QEMU is gone, and both sides' notifications and `spec.metadata.kubevirt.migration` come in
//! KubeVirt's order; then the migrated domain moves on to a third pod in a decentralized
//! migration (the third pod's VMI has its own UID, name and namespace: its domain and QEMU are
//! named after it). The VMI's CPU is host-model: each target
//! starts from the source's expanded CPU (`-cpu base,...,enforce=on`, no `max`), and the guest's
//! CPU identity in `/proc/cpuinfo` is the same on all three. The pods are KubeVirt's default
//! non-root ones (each launcher and its QEMU run as 107 over kubelet-made emptyDirs, virt-handler
//! set up the pod network); the migrations use virt-handler's default options (8 multifd
//! channels), the first through a proxy that hands the target the main channel last; each
//! source launcher exits 0 once its domain migrated away. Needs root and the test guest
//! (`scripts/build-guest`).

use std::time::Duration;

use qlauncher::sync::domain::{LifeCycle as L, StateChangeReason as R};
use testkit::guest::GuestImages;
use testkit::launcher::{get_domain, sync, Pod};
use testkit::migration::{
    decentralized_vmis, exec_until_ok, history, metadata, migrate_on_with, migrating_vmi,
    multifd_options, plain_vmi, pod_pair, read_counter, wait_notified, Relay, Rpc, StreamOrder,
};

const BOOT: Duration = Duration::from_secs(240);
const MIGRATION: Duration = Duration::from_secs(240);

/// A TCP connection opened from `pod`'s node namespace to `addr`.
async fn connect_from(pod: &Pod, addr: &str) -> std::net::TcpStream {
    let addr: std::net::SocketAddr = addr.parse().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = qlauncher::net::netns::run_in(&pod.net.node.path(), move || {
            std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        })
        .expect("netns");
        match s {
            Ok(s) => return s,
            Err(e) => assert!(std::time::Instant::now() < deadline, "connect {addr}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Sends `line` and reads the echo (up to 60 s).
fn echo(s: &mut std::net::TcpStream, line: &str) -> String {
    use std::io::{BufRead, Write};
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    let mut got = String::new();
    r.read_line(&mut got)
        .unwrap_or_else(|e| panic!("echo of {line:?}: {e}"));
    got
}

/// The guest's CPU identity: the `/proc/cpuinfo` lines of vendor, family, model, model name,
/// stepping and flags, of every vCPU.
const CPU_IDENTITY: &str =
    "grep -E '^(vendor_id|cpu family|model|model name|stepping|flags)[[:space:]]*:' /proc/cpuinfo";

/// The `-cpu` value of QEMU `pid`, checking that no word of its argv is `max` or `host` and that
/// it is an adopted definition (`base,...,enforce=on`, with the identity properties).
fn adopted_cpu_arg(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let argv: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|w| String::from_utf8_lossy(w).into_owned())
        .collect();
    assert!(!argv.iter().any(|w| w == "max" || w == "host"), "{argv:?}");
    let i = argv.iter().position(|w| w == "-cpu").expect("-cpu");
    let cpu = argv[i + 1].clone();
    let words: Vec<&str> = cpu.split(',').collect();
    assert_eq!(words[0], "base", "{cpu}");
    assert_eq!(words.last(), Some(&"enforce=on"), "{cpu}");
    for key in ["family=", "model=", "stepping=", "vendor=", "model-id="] {
        assert!(words.iter().any(|w| w.starts_with(key)), "{key} in {cpu}");
    }
    cpu
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_guest_migrates_to_the_target_pod_and_keeps_its_state() {
    let images = GuestImages::locate();
    let (mut source, mut target) = pod_pair(&images.disk_qcow2);
    let uid = source.uid.clone();
    // Before the hand-off the VMI has no migration state.
    let plain = plain_vmi(&uid);
    // Pods get their own MACs from the CNI: the guest, whose MAC defaults to its first pod's,
    // must keep that one on the target.
    target
        .net
        .pod
        .ip(&["link", "set", "eth0", "address", "0a:58:0a:f4:00:66"]);

    let s = source.start_launcher();
    let mut sc = source.client(s).await;
    assert_eq!(sync(&mut sc, &plain).await, (true, String::new()));
    source.wait_event((L::Running, R::Unknown), BOOT).await;
    let source_qemu = source.wait_qemu(s, BOOT).await;
    exec_until_ok(&mut sc, "true", BOOT).await;
    // virt-handler reports the domain's guest MAC in status.interfaces.
    let guest_mac = get_domain(&mut sc).await.unwrap().spec.devices.interfaces[0]
        .mac
        .clone()
        .unwrap()
        .mac;
    assert_eq!(guest_mac, testkit::netns::POD_MAC);
    let vmi = migrating_vmi(&uid, "mig-1", &target.pod_name(), &guest_mac);
    let cpu_before = exec_until_ok(&mut sc, CPU_IDENTITY, Duration::from_secs(30)).await;
    assert!(cpu_before.contains("model name"), "{cpu_before}");

    // The workload: a counter in RAM, and a file on the overlay's ext4.
    exec_until_ok(
        &mut sc,
        "(i=0; while :; do i=$((i+1)); echo $i >/tmp/counter; sleep 0.05; done) \
         </dev/null >/dev/null 2>&1 & echo migrated-file >/data/migrated && sync",
        Duration::from_secs(30),
    )
    .await;
    let address = exec_until_ok(&mut sc, "ip -4 -o addr show eth0", Duration::from_secs(30)).await;
    assert!(address.contains("10.0.2.2/24"), "{address}");
    // An echo server in the guest and an open connection to it from the node (through the pod
    // IP and the masquerade DNAT).
    exec_until_ok(
        &mut sc,
        "nc -l -p 7777 -e /bin/cat </dev/null >/dev/null 2>&1 &",
        Duration::from_secs(30),
    )
    .await;
    let mut tcp = connect_from(&source, "10.244.0.5:7777").await;
    assert_eq!(echo(&mut tcp, "before\n"), "before\n");

    // Target handler: the pod is prepared, no QEMU yet; a repeat is harmless.
    let t = target.start_launcher();
    let mut tc = target.client(t).await;
    assert_eq!(Rpc::sync_target(&mut tc, &vmi).await, (true, String::new()));
    assert_eq!(Rpc::sync_target(&mut tc, &vmi).await, (true, String::new()));
    assert!(
        target.qemu_pids().is_empty(),
        "no QEMU before the source's definition"
    );
    assert!(get_domain(&mut tc).await.is_none());
    assert!(target.root.join("var/run/libvirt/virtqemud-sock").exists());

    // KubeVirt's proxy gives no order to the stream's connections: this one hands the main
    // channel to the target last (after the 8 multifd channels).
    let _relay = Relay::start_with(
        &source,
        &target,
        &uid,
        StreamOrder::Reversed { connections: 9 },
    )
    .await;
    let before = read_counter(&mut sc, Duration::from_secs(20)).await;

    // Source handler (KubeVirt's default options: 8 multifd channels): the RPC returns at once;
    // virt-handler repeats it until it sees progress.
    let opts = multifd_options("0", 150);
    assert_eq!(
        Rpc::migrate(&mut sc, &vmi, &opts).await,
        (true, String::new())
    );
    assert_eq!(
        Rpc::migrate(&mut sc, &vmi, &opts).await,
        (true, String::new())
    );

    let ended = wait_notified(
        &source,
        "source Shutoff/Migrated with EndTimestamp",
        MIGRATION,
        |d| d.status.status == L::Shutoff && metadata(d).is_some_and(|m| m.end_timestamp.is_some()),
    )
    .await;
    let m = metadata(&ended).unwrap();
    assert_eq!(ended.status.reason, R::Migrated);
    assert_eq!(m.uid, "mig-1");
    assert!(!m.failed, "{m:?}");
    assert_eq!(m.mode, "PreCopy");
    let done = wait_notified(
        &target,
        "target Running with EndTimestamp",
        MIGRATION,
        |d| d.status.status == L::Running && metadata(d).is_some_and(|m| m.end_timestamp.is_some()),
    )
    .await;
    assert_eq!(metadata(&done).unwrap().uid, "mig-1");

    // A second MigrateVirtualMachine of the ended migration is refused (one shot per UID).
    let (ok, msg) = Rpc::migrate(&mut sc, &vmi, &opts).await;
    // KubeVirt's text as it words it (`live-migration-source.go`), without a prefix of ours.
    assert!(
        !ok && msg.starts_with("migration job mig-1 already executed, finished at "),
        "{msg}"
    );

    // The source's QEMU is gone; after DeleteVirtualMachine the source launcher exits 0, as
    // KubeVirt's does (the source pod completes, it does not fail).
    assert!(!source.qemu_pids().contains(&source_qemu));
    assert_eq!(Rpc::delete(&mut sc, &vmi).await, (true, String::new()));
    let exit = source.wait_launcher(s, Duration::from_secs(60)).await;
    assert!(exit.success(), "{exit:?}; log:\n{}", source.log(s));

    // Target handler: finalize twice.
    assert_eq!(Rpc::finalize(&mut tc, &vmi).await, (true, String::new()));
    assert_eq!(Rpc::finalize(&mut tc, &vmi).await, (true, String::new()));

    // The guest on the target: counting on from where it was, the file, the address.
    let after = read_counter(&mut tc, Duration::from_secs(60)).await;
    assert!(after >= before, "counter went back: {before} -> {after}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let later = read_counter(&mut tc, Duration::from_secs(20)).await;
    assert!(later > after, "the workload stopped: {after} -> {later}");
    assert_eq!(
        exec_until_ok(&mut tc, "cat /data/migrated", Duration::from_secs(20)).await,
        "migrated-file\n"
    );
    let moved = exec_until_ok(&mut tc, "ip -4 -o addr show eth0", Duration::from_secs(20)).await;
    assert!(moved.contains("10.0.2.2/24"), "{moved}");
    let link = exec_until_ok(
        &mut tc,
        "cat /sys/class/net/eth0/address",
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(link.trim(), guest_mac);
    // The target's QEMU runs the source's expanded CPU, and the guest sees the same CPU.
    let target_cpu = adopted_cpu_arg(target.wait_qemu(t, Duration::from_secs(5)).await);
    assert_eq!(
        exec_until_ok(&mut tc, CPU_IDENTITY, Duration::from_secs(20)).await,
        cpu_before
    );

    // The pod IP fails over to the target pod (as a CNI with persistent IPs does once the target
    // is ready): the node's side of the target's veth replaces the source's in the node namespace
    // the connection lives in. Both pods have the same IP and MAC.
    let node_a = source.net.node.name.clone();
    source.net.node.ip(&["link", "del", "vpod"]);
    target
        .net
        .node
        .ip(&["link", "set", "vpod", "netns", &node_a]);
    source
        .net
        .node
        .ip(&["addr", "add", "10.244.0.1/24", "dev", "vpod"]);
    source.net.node.ip(&["link", "set", "vpod", "up"]);
    assert_eq!(
        echo(&mut tcp, "after\n"),
        "after\n",
        "the connection did not survive"
    );

    // Again, from the target to a third pod (KubeVirt's repeated migrations), this time
    // decentralized: the third pod's VMI is another cluster's copy with its own UID. The source
    // names its VMI's UID in the definition after the target's (the serial console's socket
    // path holds it, so without the rewrite the target refuses the definition), and the proxy
    // sockets keep the source VMI's UID.
    let mut third = Pod::new(&images.disk_qcow2, true);
    assert_ne!(third.uid, uid);
    let (mut vmi2, mut third_vmi) =
        decentralized_vmis(&uid, &third.uid, "mig-2", &third.pod_name(), &guest_mac);
    // The copy also has another name and namespace (`targetState.domainName` and
    // `domainNamespace` on both sides): the source sends its domain under the target's name,
    // with the cloud-init ISO's path (`<namespace>/<name>/noCloud.iso`) as the target's.
    third_vmi["metadata"]["name"] = "hv-copy".into();
    third_vmi["metadata"]["namespace"] = "cluster-b".into();
    for v in [&mut vmi2, &mut third_vmi] {
        let t = &mut v["status"]["migrationState"]["targetState"];
        t["domainName"] = "hv-copy".into();
        t["domainNamespace"] = "cluster-b".into();
    }
    let (_, mut hc, _relay2) = migrate_on_with(
        &target,
        &mut tc,
        &mut third,
        (&vmi2, &third_vmi),
        "mig-2",
        &opts,
        MIGRATION,
    )
    .await;
    wait_notified(&target, "target Shutoff/Migrated", MIGRATION, |d| {
        d.status.status == L::Shutoff && d.status.reason == R::Migrated
    })
    .await;
    let third_count = read_counter(&mut hc, Duration::from_secs(60)).await;
    // The adopted CPU is sent on unchanged.
    let third_qemu = third.qemu_pids();
    assert_eq!(third_qemu.len(), 1, "{third_qemu:?}");
    assert_eq!(adopted_cpu_arg(third_qemu[0]), target_cpu);
    assert_eq!(
        exec_until_ok(&mut hc, CPU_IDENTITY, Duration::from_secs(20)).await,
        cpu_before
    );
    assert!(third_count >= later, "{later} -> {third_count}");
    assert_eq!(
        exec_until_ok(&mut hc, "cat /data/migrated", Duration::from_secs(20)).await,
        "migrated-file\n"
    );
    // The third pod's domain is its own VMI's: its UID, name and namespace, and its QEMU is
    // named after it and reads the cloud-init ISO of its own VMI's path.
    let third_domain = get_domain(&mut hc).await.unwrap();
    assert_eq!(third_domain.spec.metadata.kubevirt.uid, third.uid);
    assert_eq!(third_domain.object_meta.name, "hv-copy");
    assert_eq!(third_domain.object_meta.namespace, "cluster-b");
    assert_eq!(third_domain.spec.name, "cluster-b_hv-copy");
    let third_argv = std::fs::read(format!("/proc/{}/cmdline", third_qemu[0])).unwrap();
    let third_argv = String::from_utf8_lossy(&third_argv);
    assert!(
        third_argv.contains("guest=cluster-b_hv-copy,"),
        "{third_argv}"
    );
    assert!(
        third_argv.contains("/cluster-b/hv-copy/noCloud.iso")
            && !third_argv.contains("/default/hv/"),
        "{third_argv}"
    );
    let m3 = metadata(&third_domain).unwrap();
    assert_eq!(m3.uid, "mig-2");
    assert!(!m3.failed && m3.end_timestamp.is_some(), "{m3:?}");

    // Notifications in KubeVirt's order.
    let src = history(&source);
    let i_start = src
        .iter()
        .position(|(_, st, _, m)| {
            st == "Running" && m.as_ref().is_some_and(|m| m.start_timestamp.is_some())
        })
        .unwrap_or_else(|| panic!("no Running + StartTimestamp: {src:#?}"));
    let i_pause = src
        .iter()
        .position(|(_, st, r, _)| st == "Paused" && r == "Migration")
        .unwrap_or_else(|| panic!("no Paused/Migration: {src:#?}"));
    let i_off = src
        .iter()
        .position(|(_, st, r, m)| {
            st == "Shutoff"
                && r == "Migrated"
                && m.as_ref().is_some_and(|m| m.end_timestamp.is_none())
        })
        .unwrap_or_else(|| panic!("no Shutoff/Migrated before EndTimestamp: {src:#?}"));
    let i_end = src
        .iter()
        .position(|(_, st, _, m)| {
            st == "Shutoff" && m.as_ref().is_some_and(|m| m.end_timestamp.is_some())
        })
        .unwrap();
    assert!(
        i_start < i_pause && i_pause < i_off && i_off < i_end,
        "{src:#?}"
    );
    assert!(
        !src.iter().any(|(_, st, _, _)| st == "ShuttingDown"),
        "{src:#?}"
    );

    let dst = history(&target);
    assert_eq!(dst[0].0, "ADDED", "{dst:#?}");
    assert_eq!(
        (dst[0].1.as_str(), dst[0].2.as_str()),
        ("Paused", "Migration"),
        "{dst:#?}"
    );
    let first = dst[0]
        .3
        .clone()
        .expect("the target's record from the first event");
    assert_eq!(first.uid, "mig-1");
    assert!(first.start_timestamp.is_some() && first.end_timestamp.is_none());
    let i_run = dst
        .iter()
        .position(|(_, st, _, m)| {
            st == "Running" && m.as_ref().is_some_and(|m| m.end_timestamp.is_none())
        })
        .unwrap_or_else(|| panic!("no Running before EndTimestamp: {dst:#?}"));
    let i_done = dst
        .iter()
        .position(|(_, st, _, m)| {
            st == "Running" && m.as_ref().is_some_and(|m| m.end_timestamp.is_some())
        })
        .unwrap();
    assert!(i_run < i_done, "{dst:#?}");
}

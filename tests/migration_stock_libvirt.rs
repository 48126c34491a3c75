//! Stock to qlauncher: a domain run by a real libvirt daemon (Debian 12's libvirtd 9.0, the
//! role of KubeVirt's stock virt-launcher and its virtqemud) live-migrates peer-to-peer into a
//! qlauncher launcher that virt-handler prepared as the migration target, as a workload update
//! from the stock launcher to qlauncher's image does.
//!
//! libvirtd runs in a private mount namespace (tmpfs over libvirt's directories, a private
//! passwd with libvirt's QEMU user, `qemu.conf` with root and no security driver), as
//! `scripts/qlbench/libvirt.py` runs it. The domain is defined from qlauncher's own export of the
//! VMI (compat/libvirt-xml) and booted by libvirt; its disk is a filesystem PVC both pods see
//! (shared storage: one image linked into each pod). The target pod's launcher gets
//! `SyncMigrationTarget`; then `virsh migrate --live --p2p --persistent` (KubeVirt's flags)
//! sends the domain to the target pod's `virtqemud-sock` through a relay that passes the bytes
//! on in order (virt-handler's proxy), and libvirt's QEMU streams to the socket the target's
//! answer names.
//!
//! One boot of the source serves every step. First a device qlauncher's conversion of the VMI
//! does not have (a SCSI disk hot-plugged into the source with a `ua-` alias) is refused in
//! Prepare, naming the disk, and the source runs on with the same boot. With the disk unplugged,
//! a slow migration (1 MiB/s) is cancelled mid-stream (`virsh domjobabort`): libvirt's Finish
//! says cancelled, the target's QEMU stops, the source runs on. Then a second target pod takes
//! the domain with KubeVirt's default 8 multifd channels (`--parallel`, put in order for QEMU
//! 7.2 by the target): the guest runs on qlauncher's QEMU with the same boot id (read through
//! the launcher's guest agent), the file it wrote to its disk under libvirt, the source's domain
//! stopped. The VMI has KubeVirt's default pod network (a masquerade interface): libvirtd runs in
//! the stock pod's network namespace, where the pod's binding (bridge, tap, nat rules) and its
//! launcher's DHCP server are, and the domain's NIC is on that pod's tap with its MAC. The guest's
//! DHCP client has its lease and answers HTTP through the source pod's IP; the target pods have
//! MACs of their own and the VMI names no guest MAC yet (no `status.interfaces`), so the target
//! adopts the guest MAC from libvirt's XML; after the move the guest keeps its MAC, its DHCP
//! client gets a lease from the target pod's DHCP server and it answers HTTP through the target
//! pod's IP. Then the target's identity as virt-handler reads it: the notifications (ADDED
//! Paused/Migration with the migration record started, Running, the record ended) and GetDomain
//! (name, UUID, the VMI's UID, Running/Unknown, the guest MAC), as KubeVirt's target launcher
//! reports them. A containerDisk VMI moves its overlay as KubeVirt's block migration does
//! (libvirt's NBD mirror to the target's export). A source whose libvirt dies mid-stream leaves
//! the target clean. Needs root, libvirtd (`scripts/install-deps`) and the test guest
//! (`scripts/build-guest`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use qlauncher::cmdline::context::{IfaceFacts, ImageFormat, StorageKind, TapSource, VolumeFacts};
use qlauncher::cmdline::qemu::FormatDriver;
use qlauncher::cmdline::{convert, FactsFile};
use qlauncher::sync::domain::{LifeCycle, StateChangeReason};
use qlauncher::sys::mac::MacAddr;
use qlauncher::vmi::{DefaultsConfig, Vmi};
use qlauncher_libvirt_xml::libvirt;
use qlauncher_libvirt_xml::{export, to_xml};
use testkit::cmdline::{chardev_dirs_and_blockdevs, create_pod_dirs, missing_images};
use testkit::guest::{Console, GuestImages, BOOT_TIMEOUT};
use testkit::launcher::{get_domain, Pod};
use testkit::migration::{
    dirty_bitmap, disk_node, exec_until_ok, history, metadata, wait_notified, Rpc,
};
use testkit::netns::{PodNet, PodNetSpec, POD_MAC};
use tokio::net::{UnixListener, UnixStream};

const DOMAIN: &str = "default_hv";
const MIGRATION: Duration = Duration::from_secs(300);
/// The CBT checkpoint (a persistent dirty bitmap) the block migration carries.
const CHECKPOINT: &str = "cbt-0001";
/// The target pods' own MAC (the CNI's), not the source pod's [`POD_MAC`].
const OTHER_POD_MAC: &str = "0a:58:0a:f4:00:66";

/// libvirt's directories, covered by a tmpfs each in the daemon's mount namespace.
const LIBVIRT_DIRS: &str =
    "/run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt /etc/libvirt";

/// A libvirtd in a private mount namespace (`unshare -m`): the setup runs in `sh` there, then
/// execs the daemon. Dropping it destroys its domain (the QEMU it started is not its child)
/// and stops it.
struct Libvirtd {
    child: Child,
    log: PathBuf,
}

impl Libvirtd {
    fn start(work: &Path) -> Libvirtd {
        Libvirtd::start_in(work, None)
    }

    /// [`Self::start`] in the network namespace `netns` (the stock launcher pod's, where its
    /// tap is), or the test's own.
    fn start_in(work: &Path, netns: Option<&Path>) -> Libvirtd {
        let log = work.join("libvirtd.log");
        let script = format!(
            r#"set -e
mount --make-rprivate /
for d in {LIBVIRT_DIRS}; do mkdir -p "$d"; mount -t tmpfs -o mode=0755 tmpfs "$d"; done
for db in passwd group; do
  if ! grep -q '^libvirt-qemu:' /etc/$db; then
    cp /etc/$db /run/libvirt/$db
    if [ $db = passwd ]; then
      echo 'libvirt-qemu:x:65534:65534:libvirt-qemu:/nonexistent:/usr/sbin/nologin' >>/run/libvirt/$db
    else
      echo 'libvirt-qemu:x:65534:' >>/run/libvirt/$db
    fi
    mount --bind /run/libvirt/$db /etc/$db
  fi
done
printf 'user = "root"\ngroup = "root"\ndynamic_ownership = 0\nsecurity_driver = "none"\nnamespaces = []\ncgroup_controllers = []\nstdio_handler = "file"\nremember_owner = 0\n' >/etc/libvirt/qemu.conf
printf 'listen_tls = 0\nlisten_tcp = 0\nlog_outputs = "3:stderr"\n' >/etc/libvirt/libvirtd.conf
# /run itself is the host's: the pid file goes to the private /run/libvirt (parallel daemons).
exec /usr/sbin/libvirtd --timeout 0 --pid-file /run/libvirt/libvirtd.pid"#
        );
        let mut cmd = Command::new("nsenter");
        if let Some(ns) = netns {
            cmd.arg(format!("--net={}", ns.display()));
        }
        let child = cmd
            .args([
                "--",
                "unshare",
                "-m",
                "--propagation",
                "private",
                "sh",
                "-c",
                &script,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("unshare");
        let d = Libvirtd { child, log };
        for _ in 0..300 {
            if d.virsh(&["version"]).status.success() {
                return d;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("libvirtd did not answer:\n{}", d.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `virsh -c qemu:///system ARGS` in the daemon's mount namespace.
    fn virsh(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg("-t")
            .arg(self.child.id().to_string())
            .args(["-m", "virsh", "-q", "-c", "qemu:///system"])
            .args(args)
            .output()
            .expect("nsenter virsh")
    }

    /// [`Self::virsh`] running in the background.
    fn virsh_spawn(&self, args: &[&str]) -> Child {
        Command::new("nsenter")
            .arg("-t")
            .arg(self.child.id().to_string())
            .args(["-m", "virsh", "-q", "-c", "qemu:///system"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nsenter virsh")
    }

    /// [`Self::virsh`], panicking with its error and the daemon's log unless it succeeds.
    fn virsh_ok(&self, args: &[&str]) -> String {
        let out = self.virsh(args);
        assert!(
            out.status.success(),
            "virsh {args:?}: {}\nlibvirtd:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn domstate(&self) -> String {
        self.virsh_ok(&["domstate", DOMAIN]).trim().to_owned()
    }

    /// The pid of the domain's QEMU (libvirt's pid file, seen through the daemon's root).
    fn qemu_pid(&self) -> Option<i32> {
        let p = format!(
            "/proc/{}/root/run/libvirt/qemu/{DOMAIN}.pid",
            self.child.id()
        );
        std::fs::read_to_string(p).ok()?.trim().parse().ok()
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        let pid = self.qemu_pid();
        let _ = self.virsh(&["destroy", DOMAIN]);
        if let Some(pid) = pid {
            // SAFETY: kill(2) of the QEMU libvirt started for this test's domain.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The VMI: the test guest's disk as a filesystem PVC (shared by both pods), KubeVirt's default
/// devices (serial console, guest agent channel, balloon, VNC), no pod network, as
/// virt-handler sends it to the target during the migration `migration_uid`.
fn vmi_json(uid: &str, migration_uid: &str, target_pod: &str) -> serde_json::Value {
    let mut v = container_disk_vmi_json(uid, migration_uid, target_pod);
    v["spec"]["domain"]["devices"]["disks"][0]["cache"] = "none".into();
    v["spec"]["volumes"][0] =
        serde_json::json!({"name": "rootdisk", "persistentVolumeClaim": {"claimName": "shared"}});
    v
}

/// [`vmi_json`] with the test guest as a containerDisk (pod-local: copied over NBD).
fn container_disk_vmi_json(uid: &str, migration_uid: &str, target_pod: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "hv", "namespace": "default", "uid": uid},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "domain": {
                "firmware": {"uuid": format!("bbbbbbbb-0000-4000-8000-{}", &uid[uid.len() - 12..])},
                "resources": {"requests": {"memory": "128Mi"}},
                "devices": {
                    "autoattachPodInterface": false,
                    "disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}]
                }
            },
            "volumes": [{"name": "rootdisk",
                         "containerDisk": {"image": "qlauncher/test-guest:latest"}}]
        },
        "status": {
            "migrationTransport": "Unix",
            "migrationState": {
                "migrationUid": migration_uid,
                "sourcePod": "virt-launcher-hv-stock",
                "targetPod": target_pod,
            }
        }
    })
}

/// The PVC's image in a pod root: `<private>/vmi-disks/rootdisk/disk.img`, a hard link of the
/// shared `image`.
fn link_pvc(private: &Path, image: &Path) -> PathBuf {
    let dir = private.join("vmi-disks/rootdisk");
    std::fs::create_dir_all(&dir).unwrap();
    let disk = dir.join("disk.img");
    let _ = std::fs::remove_file(&disk);
    std::fs::hard_link(image, &disk).unwrap();
    disk
}

/// The value of `path='…'` (or `"…"`) of the first `<serial>` of libvirt's live XML.
fn serial_path(xml: &str) -> PathBuf {
    let at = xml.find("<serial").expect("a serial console");
    let rest = &xml[at..];
    let p = rest.find("path=").expect("serial source path") + 5;
    let quote = rest.as_bytes()[p] as char;
    let end = rest[p + 1..].find(quote).unwrap();
    PathBuf::from(&rest[p + 1..p + 1 + end])
}

/// Passes every connection on `listen` to `dial`, both ways, in order (virt-handler's proxy of
/// the role-0 channel).
async fn relay(listen: UnixListener, dial: PathBuf) {
    while let Ok((mut a, _)) = listen.accept().await {
        let dial = dial.clone();
        tokio::spawn(async move {
            if let Ok(mut b) = UnixStream::connect(&dial).await {
                let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
            }
        });
    }
}

/// Starts a launcher in `pod`, sends it `SyncMigrationTarget` for `json` and relays
/// `<work>/proxy-<tag>.sock` to its role-0 socket. Returns the launcher's index, its client,
/// the libvirt URI of the relay and the relay's task.
async fn prepare_target(
    pod: &mut Pod,
    json: &serde_json::Value,
    work: &Path,
    tag: &str,
) -> (
    usize,
    testkit::handler::Client,
    String,
    tokio::task::JoinHandle<()>,
) {
    let n = pod.start_launcher();
    let mut c = pod.client(n).await;
    assert_eq!(Rpc::sync_target(&mut c, json).await, (true, String::new()));
    let sock = work.join(format!("proxy-{tag}.sock"));
    let listener = UnixListener::bind(&sock).unwrap();
    let proxy = tokio::spawn(relay(
        listener,
        pod.root.join("var/run/libvirt/virtqemud-sock"),
    ));
    let dest = format!("qemu+unix:///system?socket={}", sock.display());
    (n, c, dest, proxy)
}

/// `virsh migrate` with KubeVirt's flags to `dest`, and `extra`. `--unsafe` (KubeVirt's
/// UnsafeMigration): the PVC is shared between the pods, but on a local file system here, which
/// libvirt cannot tell from an unshared one (`qemuMigrationSrcIsSafe` wants NFS, Ceph or a
/// cluster file system).
fn migrate_args<'a>(dest: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["migrate", "--live", "--p2p", "--persistent", "--unsafe"];
    args.extend_from_slice(extra);
    args.extend([DOMAIN, dest]);
    args
}

/// The stock launcher pod's network: its namespaces, the masquerade binding of `eth0` (bridge
/// `k6t-eth0` with the gateway, the tap, KubeVirt's nat rules: virt-handler's setup) and the
/// launcher's DHCP server for the guest, made with qlauncher's own network code as the stock
/// pod would have them.
struct SourceNet {
    net: PodNet,
    plan: qlauncher::net::NetPlan,
    _dhcp: testkit::net::Servers,
    _resolv: tempfile::NamedTempFile,
}

impl SourceNet {
    fn new() -> SourceNet {
        let net = PodNet::with(&PodNetSpec {
            mtu: None,
            ..PodNetSpec::default()
        });
        let resolv = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            resolv.path(),
            "search default.svc.cluster.local\nnameserver 10.96.0.10\n",
        )
        .unwrap();
        let cfg = qlauncher::net::NetConfig {
            hostname: "hv".into(),
            ..Default::default()
        };
        let (plan, _) = testkit::net::setup(&net.pod, &cfg, resolv.path()).unwrap();
        let dhcp = testkit::net::Servers::start(&net.pod, &plan);
        SourceNet {
            net,
            plan,
            _dhcp: dhcp,
            _resolv: resolv,
        }
    }
}

/// `json` with KubeVirt's default pod network: interface `default` (masquerade) on the pod
/// network.
fn with_pod_nic(mut json: serde_json::Value) -> serde_json::Value {
    let devices = &mut json["spec"]["domain"]["devices"];
    devices
        .as_object_mut()
        .unwrap()
        .remove("autoattachPodInterface");
    devices["interfaces"] = serde_json::json!([{"name": "default", "masquerade": {}}]);
    json["spec"]["networks"] = serde_json::json!([{"name": "default", "pod": {}}]);
    json
}

/// The guest's HTTP reply (`GET /` of its busybox httpd) fetched from `node` through the pod IP
/// (the masquerade DNAT), retried for up to 60 s.
async fn http_from(node: &testkit::netns::Netns) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = qlauncher::net::netns::run_in(&node.path(), || {
            use std::io::{Read, Write};
            let addr = "10.244.0.5:80".parse().unwrap();
            let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
            let mut body = String::new();
            s.read_to_string(&mut body)?;
            Ok::<_, std::io::Error>(body)
        })
        .expect("netns");
        match got {
            Ok(body) if body.contains("qlg-http-ok") => return body,
            other => assert!(
                std::time::Instant::now() < deadline,
                "HTTP through the pod IP: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The stock side: libvirtd (in `work`) running the domain defined from qlauncher's export of
/// the VMI `json` in a pod root of its own, its disk the PVC `image`, booted to the guest's
/// prompt; with `net`, the daemon runs in that pod's network namespace and the domain's NIC is
/// on its tap, with the pod's MAC. Returns the daemon, the guest's serial console and its boot
/// id.
fn boot_source(
    work: &Path,
    json: &serde_json::Value,
    image: Option<&Path>,
    guest: &GuestImages,
    net: Option<&SourceNet>,
) -> (Libvirtd, Console, String) {
    let src_root = work.join("src");
    let mut vmi = Vmi::from_json_or_yaml(&json.to_string()).unwrap();
    vmi.apply_defaults(&DefaultsConfig::for_manifest(&vmi, "hv"));
    let mut ctx =
        testkit::cmdline::acceptance_context(&vmi, &FactsFile::default(), &src_root, "qlstk");
    ctx.qemu = libvirt::installed_qemu().expect("qemu-system-x86_64 --version");
    if let Some(net) = net {
        ctx.interfaces.insert(
            "default".into(),
            IfaceFacts {
                mac: Some(MacAddr(net.plan.guest_mac).to_string()),
                mtu: Some(net.plan.mtu),
                tap: TapSource::Ifname(net.plan.tap.clone()),
            },
        );
    }
    if let Some(image) = image {
        // The PVC as the target's launcher finds it (a preallocated raw file with O_DIRECT).
        ctx.volumes.insert(
            "rootdisk".into(),
            VolumeFacts {
                kind: StorageKind::File,
                format: ImageFormat::Raw,
                virtual_size: Some(std::fs::metadata(image).unwrap().len()),
                direct_io: true,
                preallocated: true,
                cbt_overlay: false,
            },
        );
    }
    let plan = convert(&vmi, &ctx).unwrap();
    create_pod_dirs(&src_root);
    let blockdevs = chardev_dirs_and_blockdevs(&plan);
    match image {
        Some(image) => {
            link_pvc(Path::new(&ctx.paths.private_dir), image);
        }
        None => {
            // The containerDisk: the image (raw) and the pod's own overlay on it.
            for (path, fmt) in missing_images(&blockdevs) {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                let ok = match fmt {
                    Some(FormatDriver::Qcow2) => Command::new("qemu-img")
                        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
                        .arg(&guest.disk_raw)
                        .arg(path)
                        .status()
                        .unwrap()
                        .success(),
                    _ => std::fs::copy(&guest.disk_raw, path).is_ok(),
                };
                assert!(ok, "image {}", path.display());
            }
        }
    }
    let xml = libvirt::for_libvirt9(&to_xml(&export(&vmi, &ctx, &plan).unwrap()).unwrap());
    std::fs::write(work.join("domain.xml"), &xml).unwrap();
    let ld = Libvirtd::start_in(work, net.map(|n| n.net.pod.path()).as_deref());
    let domain_xml = work.join("domain.xml").display().to_string();
    ld.virsh_ok(&["define", &domain_xml]);
    ld.virsh_ok(&["start", DOMAIN]);
    let live = ld.virsh_ok(&["dumpxml", DOMAIN]);
    let mut console = Console::connect(&serial_path(&live), Duration::from_secs(30)).unwrap();
    console
        .wait_for_marker("boot ok", BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\nlibvirtd:\n{}", ld.log()));
    console.wait_for_prompt(BOOT_TIMEOUT).unwrap();
    let boot = boot_id(&mut console);
    (ld, console, boot)
}

/// Waits (up to 60 s) until `pod` has a QEMU.
async fn wait_incoming_qemu(pod: &Pod, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while pod.qemu_pids().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no incoming QEMU:\n{}",
            pod.log(n)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (up to 30 s) until `pod` has no QEMU left.
async fn wait_no_qemu(pod: &Pod, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !pod.qemu_pids().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the target's QEMU still runs:\n{}",
            pod.log(n)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn boot_id(console: &mut Console) -> String {
    let (rc, out) = console
        .run(
            "cat /proc/sys/kernel/random/boot_id",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(rc, 0, "{out}");
    out.trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_of_stock_libvirt_migrates_into_qlaunchers_target() {
    let guest = GuestImages::locate();
    let work = tempfile::Builder::new().prefix("qlstk").tempdir().unwrap();
    let work = work.path();
    let image = work.join("shared.img");
    std::fs::copy(&guest.disk_raw, &image).unwrap();

    let mut target = Pod::new(&guest.disk_qcow2, false);
    let uid = target.uid.clone();
    let migration_uid = format!("mig-{}", &uid[uid.len() - 12..]);
    // The VMI as virt-handler sends it before it read the source's interfaces: no
    // status.interfaces, so the guest MAC comes from libvirt's XML alone.
    let json = with_pod_nic(vmi_json(&uid, &migration_uid, &target.pod_name()));
    link_pvc(&target.private(), &image);
    // Each target pod has a MAC of its own from the CNI; the guest runs with the source pod's.
    target
        .net
        .pod
        .ip(&["link", "set", "eth0", "address", OTHER_POD_MAC]);

    let src_net = SourceNet::new();
    let (ld, mut console, boot) = boot_source(work, &json, Some(&image), &guest, Some(&src_net));
    // The guest's DHCP client gets its lease from the stock pod's DHCP server, and the guest
    // serves HTTP through the source pod's IP.
    console
        .wait_for_marker("lease eth0 ip=10.0.2.2/24", BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\nlibvirtd:\n{}", ld.log()));
    http_from(&src_net.net.node).await;
    let (rc, out) = console
        .run(
            "echo written-under-libvirt >/data/stock && sync",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(rc, 0, "{out}");

    // The first target pod, prepared by "virt-handler", and its proxy.
    let (a_n, _a_client, a_dest, a_proxy) = prepare_target(&mut target, &json, work, "a").await;
    // A device qlauncher's conversion does not have: refused in Prepare, the source runs on.
    let extra = work.join("extra.img");
    std::fs::File::create(&extra)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let disk_xml = work.join("extra.xml");
    std::fs::write(
        &disk_xml,
        format!(
            "<disk type='file' device='disk'><driver name='qemu' type='raw' cache='none'/>\
             <source file='{}'/><target dev='sdb' bus='scsi'/><alias name='ua-unserved'/>\
             <address type='drive' controller='0' bus='0' target='0' unit='1'/></disk>",
            extra.display()
        ),
    )
    .unwrap();
    let disk_xml = disk_xml.display().to_string();
    ld.virsh_ok(&["attach-device", DOMAIN, &disk_xml, "--live"]);
    let refused = ld.virsh(&migrate_args(&a_dest, &[]));
    let err = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert!(!refused.status.success(), "the migration was not refused");
    assert!(
        err.contains("domain/devices/disk[ua-unserved]"),
        "the refusal names the disk: {err}"
    );
    assert_eq!(ld.domstate(), "running");
    assert_eq!(boot_id(&mut console), boot, "the source runs on, same boot");
    ld.virsh_ok(&["detach-device", DOMAIN, &disk_xml, "--live"]);

    // A cancel mid-stream (virsh domjobabort, KubeVirt's CancelVirtualMachineMigration):
    // libvirt's Finish says cancelled, the target's QEMU stops, the source runs on.
    let slow = ld.virsh_spawn(&migrate_args(&a_dest, &["--bandwidth", "1"]));
    wait_incoming_qemu(&target, a_n).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    ld.virsh_ok(&["domjobabort", DOMAIN]);
    let cancelled = slow.wait_with_output().unwrap();
    assert!(
        !cancelled.status.success(),
        "the migration was not cancelled"
    );
    assert_eq!(ld.domstate(), "running");
    assert_eq!(boot_id(&mut console), boot, "the source runs on, same boot");
    wait_no_qemu(&target, a_n).await;
    assert!(
        target
            .log(a_n)
            .contains("the libvirt source's Perform failed: stopping the target's QEMU"),
        "Finish said cancelled:\n{}",
        target.log(a_n)
    );
    a_proxy.abort();

    // The migration, to a second target pod, with KubeVirt's default options: 8 multifd
    // channels (`ParallelMigrationThreads`, VIR_MIGRATE_PARALLEL).
    let mut second = Pod::new(&guest.disk_qcow2, false);
    second.uid = uid.clone();
    link_pvc(&second.private(), &image);
    second
        .net
        .pod
        .ip(&["link", "set", "eth0", "address", OTHER_POD_MAC]);
    let json = with_pod_nic(vmi_json(&uid, &migration_uid, &second.pod_name()));
    let (n, mut tc, dest, proxy) = prepare_target(&mut second, &json, work, "b").await;
    let moved = ld.virsh(&migrate_args(
        &dest,
        &["--parallel", "--parallel-connections", "8"],
    ));
    assert!(
        moved.status.success(),
        "virsh migrate: {}\nlibvirtd:\n{}\ntarget launcher:\n{}",
        String::from_utf8_lossy(&moved.stderr),
        ld.log(),
        second.log(n)
    );
    assert!(
        second.log(n).contains("orders the multifd channels"),
        "the stream came in 8 multifd channels, put in order for QEMU 7.2:\n{}",
        second.log(n)
    );
    drop(console);
    wait_notified(
        &second,
        "target Running with EndTimestamp",
        MIGRATION,
        |d| {
            d.status.status == LifeCycle::Running
                && metadata(d).is_some_and(|m| m.uid == migration_uid && m.end_timestamp.is_some())
        },
    )
    .await;
    assert_eq!(Rpc::finalize(&mut tc, &json).await, (true, String::new()));
    assert_ne!(ld.domstate(), "running", "the source's domain stopped");
    let id = exec_until_ok(
        &mut tc,
        "cat /proc/sys/kernel/random/boot_id",
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(id.trim(), boot, "the same boot runs on qlauncher");
    let data = exec_until_ok(&mut tc, "cat /data/stock", Duration::from_secs(30)).await;
    assert_eq!(data.trim(), "written-under-libvirt");

    // The NIC: the guest keeps the source pod's MAC (adopted from libvirt's XML) and its
    // address; its DHCP client gets a lease from the target pod's DHCP server, and the guest
    // answers through the target pod's IP.
    assert!(
        second.log(n).contains("the source's guest MAC adopted"),
        "{}",
        second.log(n)
    );
    let mac = exec_until_ok(
        &mut tc,
        "cat /sys/class/net/eth0/address",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(mac.trim(), POD_MAC);
    let lease = exec_until_ok(
        &mut tc,
        "udhcpc -i eth0 -n -q -t 5 -T 1 -s /etc/qlg/udhcpc.script 2>&1",
        Duration::from_secs(60),
    )
    .await;
    assert!(lease.contains("lease of 10.0.2.2 obtained"), "{lease}");
    http_from(&second.net.node).await;

    // Identity: what KubeVirt's target launcher reports (`live-migration-target.go`,
    // `libvirt_helper.go`, v1.9.0): the domain appears (ADDED) Paused/Migration with the
    // migration record started (the migration's UID, PreCopy); once resumed it runs
    // (Running/Unknown: KubeVirt maps every RUNNING reason, MIGRATED included, to Unknown), and
    // the record ends (EndTimestamp, not failed) only after that.
    let dst = history(&second);
    assert_eq!(dst[0].0, "ADDED", "{dst:#?}");
    assert_eq!(
        (dst[0].1.as_str(), dst[0].2.as_str()),
        ("Paused", "Migration"),
        "{dst:#?}"
    );
    let first = dst[0].3.clone().expect("the record from the first event");
    assert_eq!(first.uid, migration_uid);
    assert_eq!(first.mode, "PreCopy");
    assert!(first.start_timestamp.is_some() && first.end_timestamp.is_none());
    let running = |ended: bool| {
        dst.iter().position(|(_, st, r, m)| {
            st == "Running"
                && r == "Unknown"
                && m.as_ref()
                    .is_some_and(|m| m.end_timestamp.is_some() == ended)
        })
    };
    let (i_run, i_done) = (running(false), running(true));
    assert!(
        i_run.is_some() && i_done.is_some() && i_run < i_done,
        "{dst:#?}"
    );
    // GetDomain: the same domain (name, UUID, the VMI's UID), running, the record ended and not
    // failed, and the guest MAC virt-handler copies into status.interfaces.
    let d = get_domain(&mut tc).await.expect("GetDomain");
    assert_eq!(
        (d.status.status, d.status.reason),
        (LifeCycle::Running, StateChangeReason::Unknown)
    );
    assert_eq!(d.spec.name, DOMAIN);
    assert_eq!(d.spec.uuid, json["spec"]["domain"]["firmware"]["uuid"]);
    assert_eq!(d.spec.metadata.kubevirt.uid, uid);
    let m = metadata(&d).unwrap();
    assert_eq!(m.uid, migration_uid);
    assert!(!m.failed && m.end_timestamp.is_some(), "{m:?}");
    let iface = &d.spec.devices.interfaces[0];
    assert_eq!(iface.mac.as_ref().map(|m| m.mac.as_str()), Some(POD_MAC));
    proxy.abort();
}

/// The source's libvirt dies mid-stream (killed while a slow migration runs): the control
/// connection drops, and the target stops its incoming QEMU (libvirt's auto-destroy of an
/// incoming domain whose connection went away); the launcher's migration failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_target_is_clean_when_the_stock_source_dies_mid_stream() {
    let guest = GuestImages::locate();
    let work = tempfile::Builder::new().prefix("qlstd").tempdir().unwrap();
    let work = work.path();
    let image = work.join("shared.img");
    std::fs::copy(&guest.disk_raw, &image).unwrap();
    let mut target = Pod::new(&guest.disk_qcow2, false);
    let uid = target.uid.clone();
    let migration_uid = format!("mig-{}", &uid[uid.len() - 12..]);
    let json = vmi_json(&uid, &migration_uid, &target.pod_name());
    link_pvc(&target.private(), &image);
    let (mut ld, _console, _) = boot_source(work, &json, Some(&image), &guest, None);
    let (n, _c, dest, proxy) = prepare_target(&mut target, &json, work, "a").await;
    let slow = ld.virsh_spawn(&migrate_args(&dest, &["--bandwidth", "1"]));
    wait_incoming_qemu(&target, n).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let qemu = ld.qemu_pid();
    ld.child.kill().unwrap();
    ld.child.wait().unwrap();
    let _ = slow.wait_with_output();
    wait_no_qemu(&target, n).await;
    assert!(
        target.log(n).contains("stopping the target's QEMU"),
        "{}",
        target.log(n)
    );
    if let Some(pid) = qemu {
        // SAFETY: kill(2) of the orphaned source QEMU this test's libvirtd started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    proxy.abort();
}

/// KubeVirt's block migration of a pod-local disk (a containerDisk's overlay): libvirt's source
/// mirrors it (`--copy-storage-inc`, `migrate_disks`, `disks_uri` on the proxy's NBD socket) to
/// the NBD export the target's Prepare made of its own overlay, and the file the guest wrote
/// under libvirt is on qlauncher's side after the move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_domain_on_a_container_disk_moves_its_disk_over_nbd() {
    let guest = GuestImages::locate();
    let work = tempfile::Builder::new().prefix("qlstn").tempdir().unwrap();
    let work = work.path();
    let mut target = Pod::new(&guest.disk_qcow2, false);
    let uid = target.uid.clone();
    let migration_uid = format!("mig-{}", &uid[uid.len() - 12..]);
    target.operator_qmp = true;
    let json = container_disk_vmi_json(&uid, &migration_uid, &target.pod_name());
    let (ld, mut console, boot) = boot_source(work, &json, None, &guest, None);
    // A CBT checkpoint under libvirt: a persistent dirty bitmap on the disk's format node, made
    // before the guest writes, so it has dirty blocks to carry.
    let monitor = |cmd: serde_json::Value| -> serde_json::Value {
        let out = ld.virsh_ok(&["qemu-monitor-command", DOMAIN, &cmd.to_string()]);
        serde_json::from_str(&out).unwrap()
    };
    let node = disk_node(
        &monitor(serde_json::json!({"execute": "query-block"})),
        "ua-rootdisk",
    );
    monitor(serde_json::json!({"execute": "block-dirty-bitmap-add",
        "arguments": {"node": node, "name": CHECKPOINT, "persistent": true}}));
    let (rc, out) = console
        .run(
            "echo copied-from-libvirt >/data/nbd && sync",
            Duration::from_secs(60),
        )
        .unwrap();
    assert_eq!(rc, 0, "{out}");
    let nodes = monitor(serde_json::json!({"execute": "query-named-block-nodes"}));
    let count = dirty_bitmap(&nodes, &node, CHECKPOINT).unwrap()["count"]
        .as_u64()
        .unwrap();
    assert!(count > 0, "{nodes}");
    let (n, mut tc, dest, proxy) = prepare_target(&mut target, &json, work, "a").await;
    let nbd = format!(
        "unix://{}",
        target
            .share()
            .join(format!("migrationproxy/{uid}-49153-source.sock"))
            .display()
    );
    let moved = ld.virsh(&migrate_args(
        &dest,
        &[
            "--copy-storage-inc",
            "--migrate-disks",
            "vda",
            "--disks-uri",
            &nbd,
        ],
    ));
    assert!(
        moved.status.success(),
        "virsh migrate: {}\nlibvirtd:\n{}\ntarget launcher:\n{}",
        String::from_utf8_lossy(&moved.stderr),
        ld.log(),
        target.log(n)
    );
    drop(console);
    wait_notified(
        &target,
        "target Running with EndTimestamp",
        MIGRATION,
        |d| {
            d.status.status == LifeCycle::Running
                && metadata(d).is_some_and(|m| m.uid == migration_uid && m.end_timestamp.is_some())
        },
    )
    .await;
    let id = exec_until_ok(
        &mut tc,
        "cat /proc/sys/kernel/random/boot_id",
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(id.trim(), boot, "the same boot runs on qlauncher");
    let data = exec_until_ok(
        &mut tc,
        "echo 3 >/proc/sys/vm/drop_caches; cat /data/nbd",
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(data.trim(), "copied-from-libvirt");
    // The checkpoint came along (libvirt's cookie agreement, the dirty-bitmaps capability and
    // block-bitmap-mapping): on qlauncher's overlay, persistent, recording, with at least the
    // source's dirty blocks, so the next incremental backup here is correct.
    assert!(
        target
            .log(n)
            .contains("dirty bitmaps migrate in the stream"),
        "{}",
        target.log(n)
    );
    let qmp = target.operator_qmp_socket();
    let (ours, moved) = tokio::task::spawn_blocking(move || {
        let mut q = testkit::guest::Qmp::connect(&qmp, Duration::from_secs(10)).unwrap();
        let block = q.execute("query-block", serde_json::json!({})).unwrap();
        let ours = disk_node(&block, "ua-rootdisk");
        let nodes = q
            .execute("query-named-block-nodes", serde_json::json!({}))
            .unwrap();
        let moved = dirty_bitmap(&nodes, &ours, CHECKPOINT);
        (ours, moved)
    })
    .await
    .unwrap();
    let moved = moved.unwrap_or_else(|| panic!("no {CHECKPOINT} on {ours}:\n{}", target.log(n)));
    assert_eq!(moved["persistent"], true, "{moved}");
    assert_eq!(moved["recording"], true, "{moved}");
    assert!(
        moved["count"].as_u64().unwrap() >= count,
        "{count} -> {moved}"
    );
    proxy.abort();
}

/// qlauncher to stock, the wire: qlauncher's libvirt RPC client against a real libvirtd 9.0,
/// as a qlauncher source would talk to a stock target's virtqemud through the migration proxy.
/// The private "are you qlauncher" call is answered "Cannot find program" on a connection that
/// stays open; then the p2p source's calls: auth list (none), open `qemu:///system`, the
/// feature probes a v3-params source needs; a Prepare with a domain libvirt cannot run (a
/// machine type its QEMU lacks) is refused with libvirt's own error, no domain is left behind
/// and the connection still closes cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qlaunchers_rpc_client_talks_to_a_stock_libvirtd_and_a_refused_prepare_leaves_nothing() {
    use qlauncher::libvirt_rpc::client::{Client, ClientError, PeerKind};
    use qlauncher::libvirt_rpc::remote::{Feature, Prepare3ParamsArgs, TypedParam};
    let work = tempfile::Builder::new().prefix("qlstc").tempdir().unwrap();
    let ld = Libvirtd::start(work.path());
    let sock = format!("/proc/{}/root/run/libvirt/libvirt-sock", ld.child.id());
    let conn = UnixStream::connect(&sock).await.expect("libvirtd's socket");
    let mut c = Client::new(conn);
    assert_eq!(c.probe_peer().await.unwrap(), PeerKind::StockLibvirt);
    assert!(c.auth_list().await.unwrap().contains(&0));
    c.open(Some("qemu:///system"), 0).await.unwrap();
    for f in [
        Feature::MigrationV3,
        Feature::MigrationP2p,
        Feature::MigrationParams,
        Feature::TypedParamString,
        Feature::XmlMigratable,
    ] {
        assert!(c.supports_feature(f).await.unwrap(), "{f:?}");
    }
    let xml = "<domain type='qemu'><name>ql-refused</name><memory unit='MiB'>64</memory>\
               <os><type arch='x86_64' machine='no-such-machine'>hvm</type></os></domain>";
    let prep = Prepare3ParamsArgs {
        params: vec![
            TypedParam::string("destination_xml", xml),
            TypedParam::string("destination_name", "ql-refused"),
        ],
        cookie: vec![],
        // VIR_MIGRATE_LIVE | VIR_MIGRATE_PERSIST_DEST, as KubeVirt's source passes them on.
        flags: 1 | 8,
    };
    match c.prepare3_params(&prep).await {
        Err(ClientError::Peer(e)) => assert!(!e.message.is_empty(), "{e:?}"),
        other => panic!("Prepare of an unrunnable domain: {other:?}\n{}", ld.log()),
    }
    c.close().await.unwrap();
    let all = ld.virsh_ok(&["list", "--all", "--name"]);
    assert!(!all.contains("ql-refused"), "{all}");
}

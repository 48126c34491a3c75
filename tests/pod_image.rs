//! The launcher image as KubeVirt v1.9.0 runs it. The image tree is assembled as the Containerfile
//! assembles it (`scripts/assemble-launcher-tree`), the image's config (USER, ENV PATH) is read
//! from the Containerfile, and every container of the pods KubeVirt renders with the launcher
//! image is run as the kubelet and runc run it ([`testkit::container`]: chroot into the tree, the
//! pod's mounts, env, user and capabilities, `execve` of the rendered command and args, no shell
//! of the test in between), with the argv, env, mounts and users of KubeVirt's templates
//! (`pkg/virt-controller/services/template.go`, `rendercontainer.go`, `rendervolumes.go`,
//! `serialconsolelog.go`, `pkg/container-disk/container-disk.go`,
//! `pkg/virt-operator/resource/generate/components/daemonsets.go`,
//! `pkg/storage/backend-storage/backend-storage.go`):
//!
//! - `support_pods_run_their_launcher_image_containers`: virt-handler's init container (the node
//!   labeller, `/bin/sh -c node-labeller.sh`, privileged) writes its files and exits 0; the image
//!   holder (`/bin/sh -c "sleep infinity"`, the image's USER) stays up; the WFFC temp pod's
//!   compute (`/bin/bash -c echo "bound PVCs" --allow-emulation`) and the hotplug trigger pod
//!   (`/bin/bash -c exit 0`) exit 0; the hotplug attachment pod (`/bin/sh -c "/usr/bin/container-disk
//!   --copy-path /path/hp"`) holds `/path/hp.sock` and exits 0 on SIGTERM; the recovery Job (`bash
//!   -c "ls /meta/migrated || exit 42"`, runAsNonRoot with no runAsUser: the image's USER) exits 0
//!   with the marker and 42 without; a virtiofs container (`/usr/libexec/virtiofsd ...`) serves
//!   its socket.
//! - `compute_pods_boot_a_container_disk_with_the_image_volume_gate_on_and_off`: the launcher pod
//!   of a containerDisk VMI twice, in parallel. Gate off: the guest-console-log sidecar (virt-tail)
//!   stays up, the `container-disk-binary` init container copies container-disk with `cp
//!   --preserve=all` as 107, the `volumerootdisk-init` container runs that copy (`--no-op`) in a
//!   scratch image that holds only the disk, the `volumerootdisk` container holds
//!   `disk_0.sock`; virt-handler's part (the test's) bind-mounts the disk from that container's
//!   root onto `disk_0.img`. Gate on: the `volumerootdisk` init container runs
//!   `/container-disk-binary/usr/bin/container-disk --no-op` from the launcher image mounted as an
//!   image volume, and compute gets `--image-volume` and the scratch image at
//!   `/var/run/kubevirt-image-volume/disk_0`. Both: the compute container (uid 107 over
//!   kubelet-made emptyDirs: root-owned, group 107, 2777) serves `launcher-sock`, a SyncVMI
//!   boots the guest, virt-tail prints the guest's console, the launcher holds
//!   `CAP_NET_BIND_SERVICE` as ambient (the monitor's file capability), and on SIGTERM compute
//!   exits 0, the disk holder exits 0, the sidecar exits 0. With the gate on also the probes
//!   (`virt-probe --guestAgentPing`, an exec probe) and the Velero hooks (`virt-freezer --freeze`
//!   / `--unfreeze`) exec'ed in the running compute container get KubeVirt's answers from the
//!   guest.
//!
//! Needs root, the companion programs built (`cargo build -p companions`, see
//! scripts/assemble-launcher-tree) and the test guest (`scripts/build-guest`).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use testkit::container::{Device, Spec, CAP_NET_BIND_SERVICE};
use testkit::guest::{Console, GuestImages, BOOT_TIMEOUT};
use testkit::kubelet::{empty_dir, QEMU_ID};
use testkit::netns::{Netns, PodNet, PodNetSpec};

/// How long an init container may take (the labeller probes QEMU: seconds under load).
const INIT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a long-running container must stay up to count as running.
const STAYS_UP: Duration = Duration::from_secs(3);

/// The image's config, as the Containerfile sets it (what the runtime applies).
struct ImageConfig {
    user: u32,
    path: String,
}

/// `USER` and `ENV PATH=` of the final stage of the Containerfile.
fn image_config() -> ImageConfig {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Containerfile"))
        .expect("read Containerfile");
    let last_stage = text.rsplit("\nFROM ").next().unwrap();
    let mut user = None;
    let mut path = None;
    for line in last_stage.lines() {
        if let Some(u) = line.strip_prefix("USER ") {
            user = Some(u.trim().parse::<u32>().expect("USER is numeric"));
        }
        if let Some(p) = line.strip_prefix("ENV PATH=") {
            path = Some(p.trim().to_string());
        }
    }
    ImageConfig {
        user: user.expect("the image has a USER"),
        path: path.expect("the image sets ENV PATH"),
    }
}

/// A launcher image tree assembled for one test, removed on drop.
struct Tree {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: ImageConfig,
}

impl Tree {
    fn assemble() -> Tree {
        let dir = tempfile::Builder::new()
            .prefix(&format!("qlpi-{}-", std::process::id()))
            .tempdir()
            .unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = dir.path().join("tree");
        let out = std::process::Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/assemble-launcher-tree"
        ))
        .arg(&root)
        .arg(env!("CARGO_BIN_EXE_qlauncher"))
        .output()
        .expect("run scripts/assemble-launcher-tree");
        assert!(
            out.status.success(),
            "assemble-launcher-tree: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let config = image_config();
        Tree {
            _dir: dir,
            root,
            config,
        }
    }

    fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// The uid and primary gid the runtime takes from the image: USER, and its /etc/passwd gid.
    fn image_user(&self) -> (u32, u32) {
        (self.config.user, self.passwd_gid(self.config.user))
    }

    /// The gid of `uid` in the tree's /etc/passwd (0 without an entry, as the runtime).
    fn passwd_gid(&self, uid: u32) -> u32 {
        let passwd = std::fs::read_to_string(self.root.join("etc/passwd")).unwrap_or_default();
        passwd
            .lines()
            .map(|l| l.split(':').collect::<Vec<_>>())
            .find(|f| f.len() >= 4 && f[2] == uid.to_string())
            .map(|f| f[3].parse().unwrap())
            .unwrap_or(0)
    }

    /// A container spec in this tree: the image's PATH, HOSTNAME, HOME of the user's passwd
    /// entry (containerd sets it) and the rest from `argv`.
    fn spec(&self, rootfs: &Path, argv: &[&str], hostname: &str) -> Spec {
        Spec::new(rootfs, argv)
            .env("PATH", &self.config.path)
            .env("HOSTNAME", hostname)
    }
}

/// A pod: a network namespace (every container of it runs there; dropping kills what is left),
/// its volume directories under `dir`.
struct Pod {
    name: String,
    dir: PathBuf,
    net: Option<PodNet>,
    ns: Option<Netns>,
    children: Vec<(String, Child)>,
}

impl Pod {
    fn new(tree: &Tree, name: &str, network: bool) -> Pod {
        let dir = tree.dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let (net, ns) = if network {
            (
                Some(PodNet::with(&PodNetSpec {
                    resolv_conf: Some(testkit::netns::KUBELET_RESOLV_CONF.into()),
                    ..PodNetSpec::default()
                })),
                None,
            )
        } else {
            (None, Some(Netns::new("pi")))
        };
        Pod {
            name: name.to_string(),
            dir,
            net,
            ns,
            children: Vec::new(),
        }
    }

    fn netns(&self) -> &Netns {
        self.net
            .as_ref()
            .map(|n| &n.pod)
            .or(self.ns.as_ref())
            .unwrap()
    }

    /// An emptyDir volume as the kubelet makes it for `fsGroup: 107`.
    fn empty_dir(&self, name: &str) -> PathBuf {
        let p = self.dir.join("vol").join(name);
        if !p.exists() {
            empty_dir(&p);
        }
        p
    }

    fn log(&self, container: &str) -> PathBuf {
        self.dir.join(format!("{container}.log"))
    }

    fn read_log(&self, container: &str) -> String {
        std::fs::read_to_string(self.log(container)).unwrap_or_default()
    }

    /// Starts `spec` as container `name` in this pod's network namespace.
    fn start(&mut self, name: &str, mut spec: Spec) -> u32 {
        spec.netns = Some(self.netns().path());
        let child = spec
            .command(&self.log(name))
            .spawn()
            .unwrap_or_else(|e| panic!("{}: container {name}: {e}", self.name));
        let pid = child.id();
        self.children.push((name.to_string(), child));
        pid
    }

    fn child(&mut self, name: &str) -> &mut Child {
        &mut self
            .children
            .iter_mut()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no container {name}"))
            .1
    }

    fn pid(&mut self, name: &str) -> u32 {
        self.child(name).id()
    }

    /// Waits up to `timeout` for container `name` to end.
    fn wait(&mut self, name: &str, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.child(name).try_wait().unwrap() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// An init container: it must exit 0 within [`INIT_TIMEOUT`].
    fn run_init(&mut self, name: &str, spec: Spec) {
        self.start(name, spec);
        let st = self.wait(name, INIT_TIMEOUT);
        assert!(
            st.is_some_and(|s| s.success()),
            "{}: init container {name} ended {st:?}, not with 0; its output:\n{}",
            self.name,
            self.read_log(name)
        );
    }

    /// Runs container `name` to its end (at most [`INIT_TIMEOUT`]) and returns its exit code.
    fn run_to_end(&mut self, name: &str, spec: Spec) -> i32 {
        self.start(name, spec);
        let st = self
            .wait(name, INIT_TIMEOUT)
            .unwrap_or_else(|| panic!("{}: {name} still runs", self.name));
        st.code()
            .unwrap_or_else(|| panic!("{}: {name} was killed: {st:?}", self.name))
    }

    /// A long-running container (a native sidecar, a main container) is still running.
    fn assert_running(&mut self, name: &str) {
        let st = self.child(name).try_wait().unwrap();
        assert!(
            st.is_none(),
            "{}: {name} ended ({st:?}); its output:\n{}",
            self.name,
            self.read_log(name)
        );
    }

    /// SIGTERM to container `name`; its exit code within `timeout`.
    fn terminate(&mut self, name: &str, timeout: Duration) -> i32 {
        let pid = self.pid(name);
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let st = self
            .wait(name, timeout)
            .unwrap_or_else(|| panic!("{}: {name} ignores SIGTERM", self.name));
        st.code()
            .unwrap_or_else(|| panic!("{}: {name} died: {st:?}", self.name))
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        self.netns().kill_all();
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The non-root identity of KubeVirt's containers: uid 107, gid 107 (runAsGroup, or the image's
/// passwd entry), fsGroup 107, `drop: ALL` plus `add`, no privilege escalation.
fn nonroot(spec: Spec, caps: &[u32]) -> Spec {
    spec.user(QEMU_ID, QEMU_ID, &[QEMU_ID], caps)
}

/// Waits for `path` to exist.
fn wait_for(path: &Path, timeout: Duration) -> bool {
    testkit::process::wait_until(timeout, || path.exists())
}

#[test]
fn support_pods_run_their_launcher_image_containers() {
    let tree = Tree::assemble();
    let t = &tree.root;
    let (image_uid, image_gid) = tree.image_user();
    assert_ne!(image_uid, 0, "the image's USER must be non-root");
    assert_eq!(
        (image_uid, image_gid),
        (QEMU_ID, QEMU_ID),
        "qemu in /etc/passwd"
    );

    // virt-handler's DaemonSet pod: the `virt-launcher` init container (node-labeller),
    // privileged, root, PREFERRED_VIRTTYPE / HYPERVISOR_DEVICE, the labeller hostPath.
    let mut handler = Pod::new(&tree, "virt-handler", false);
    let labels_dir = handler.dir.join("host/var/lib/kubevirt-node-labeller");
    std::fs::create_dir_all(&labels_dir).unwrap();
    let mut labeller = tree
        .spec(t, &["/bin/sh", "-c", "node-labeller.sh"], "node01")
        .env("PREFERRED_VIRTTYPE", "kvm")
        .env("HYPERVISOR_DEVICE", "kvm")
        .mount(&labels_dir, "/var/lib/kubevirt-node-labeller", false);
    labeller.caps = testkit::container::ALL_CAPS.to_vec();
    labeller.devices.push(kvm());
    handler.run_init("virt-launcher", labeller);
    for f in [
        "capabilities.xml",
        "virsh_domcapabilities.xml",
        "supported_features.xml",
    ] {
        let text = std::fs::read_to_string(labels_dir.join(f)).unwrap_or_default();
        assert!(text.starts_with('<'), "{f} is not written:\n{text}");
    }
    // The image holder (only with imagePullSecrets): no securityContext, the image's USER.
    let mut holder = tree.spec(t, &["/bin/sh", "-c", "sleep infinity"], "node01");
    holder.uid = image_uid;
    holder.gid = image_gid;
    handler.start("virt-launcher-image-holder", holder);
    std::thread::sleep(STAYS_UP);
    handler.assert_running("virt-launcher-image-holder");
    drop(handler);

    // The WaitForFirstConsumer temp pod: compute's command is bash's echo (flags appended as
    // positional arguments), as the non-root compute user.
    let mut wffc = Pod::new(&tree, "wffc", false);
    let private = wffc.empty_dir("private");
    let echo = nonroot(
        tree.spec(
            t,
            &["/bin/bash", "-c", "echo", "bound PVCs", "--allow-emulation"],
            "virt-launcher-wffc",
        ),
        &[CAP_NET_BIND_SERVICE],
    )
    .mount(&private, "/var/run/kubevirt-private", false);
    assert_eq!(
        wffc.run_to_end("compute", echo),
        0,
        "{}",
        wffc.read_log("compute")
    );
    drop(wffc);

    // The hotplug attachment pod: sh runs container-disk, which holds /path/hp.sock until
    // SIGTERM (the pod is deleted); user 107 without runAsGroup (gid from the image's passwd).
    let mut hp = Pod::new(&tree, "hp-volume", false);
    let hotplug = hp.empty_dir("hotplug-disks");
    let gid = tree.passwd_gid(QEMU_ID);
    let hp_spec = tree
        .spec(
            t,
            &[
                "/bin/sh",
                "-c",
                "/usr/bin/container-disk --copy-path /path/hp",
            ],
            "hp-volume-x",
        )
        .user(QEMU_ID, gid, &[QEMU_ID], &[])
        .mount(&hotplug, "/path", false);
    hp.start("hotplug-disk", hp_spec);
    assert!(
        wait_for(&hotplug.join("hp.sock"), INIT_TIMEOUT),
        "hotplug-disk made no hp.sock: {}",
        hp.read_log("hotplug-disk")
    );
    std::thread::sleep(STAYS_UP);
    hp.assert_running("hotplug-disk");
    assert_eq!(
        std::fs::metadata(hotplug.join("hp.sock")).unwrap().uid(),
        QEMU_ID
    );
    assert_eq!(hp.terminate("hotplug-disk", Duration::from_secs(10)), 0);
    // The trigger pod of a WFFC DataVolume being hotplugged.
    let trigger = tree
        .spec(t, &["/bin/bash", "-c", "exit", "0"], "hp-trigger")
        .user(QEMU_ID, gid, &[QEMU_ID], &[]);
    assert_eq!(hp.run_to_end("trigger", trigger), 0);
    drop(hp);

    // The backend-storage recovery Job: runAsNonRoot and no runAsUser, so the image's USER;
    // bash through PATH; exit 0 with the marker, 42 without.
    let mut job = Pod::new(&tree, "recover", false);
    let pvc = job.dir.join("vol/pvc/meta");
    std::fs::create_dir_all(&pvc).unwrap();
    std::os::unix::fs::chown(&pvc, Some(QEMU_ID), Some(QEMU_ID)).unwrap();
    let recovery = |tree: &Tree| {
        let mut s = tree
            .spec(
                &tree.root,
                &["bash", "-c", "ls /meta/migrated || exit 42"],
                "recover-x",
            )
            .user(image_uid, image_gid, &[], &[])
            .mount(&pvc, "/meta", false);
        s.groups = vec![];
        s
    };
    assert_eq!(
        job.run_to_end("no-marker", recovery(&tree)),
        42,
        "{}",
        job.read_log("no-marker")
    );
    std::fs::write(pvc.join("migrated"), b"").unwrap();
    assert_eq!(
        job.run_to_end("container", recovery(&tree)),
        0,
        "{}",
        job.read_log("container")
    );
    drop(job);

    // A virtiofs container (a PVC shared as a filesystem): KubeVirt's virtiofsd argv, 107.
    let mut fs = Pod::new(&tree, "virtiofs", false);
    let sockets = fs.empty_dir("virtiofs-containers");
    let shared = fs.dir.join("vol/pvc1");
    std::fs::create_dir_all(&shared).unwrap();
    std::os::unix::fs::chown(&shared, Some(QEMU_ID), Some(QEMU_ID)).unwrap();
    let vfs = nonroot(
        tree.spec(
            t,
            &[
                "/usr/libexec/virtiofsd",
                "--socket-path=/var/run/kubevirt/virtiofs-containers/pvc1.sock",
                "--shared-dir=/pvc1",
                "--sandbox=none",
                "--cache=auto",
                "--migration-on-error=guest-error",
                "--migration-mode=find-paths",
            ],
            "virt-launcher-fs",
        ),
        &[],
    )
    .mount(&sockets, "/var/run/kubevirt/virtiofs-containers", false)
    .mount(&shared, "/pvc1", false);
    fs.start("virtiofs-pvc1", vfs);
    assert!(
        wait_for(&sockets.join("pvc1.sock"), INIT_TIMEOUT),
        "virtiofsd made no socket: {}",
        fs.read_log("virtiofs-pvc1")
    );
    fs.assert_running("virtiofs-pvc1");
}

/// The KVM device plugin's `/dev/kvm` (and the labeller's privileged view of it).
fn kvm() -> Device {
    Device {
        name: "kvm".into(),
        major: 10,
        minor: 232,
    }
}

/// The tun device plugin's `/dev/net/tun`.
fn tun() -> Device {
    Device {
        name: "net/tun".into(),
        major: 10,
        minor: 200,
    }
}

/// The containerDisk VMI of a compute pod: the test guest as `rootdisk` (volume 0), NoCloud,
/// masquerade, a readiness exec probe and a guest-agent liveness probe.
fn vmi(name: &str, uid: &str) -> serde_json::Value {
    let mut v = testkit::launcher::guest_vmi(name, uid);
    v["spec"]["terminationGracePeriodSeconds"] = 5.into();
    v["spec"]["domain"]["firmware"] =
        serde_json::json!({"uuid": format!("cccccccc-0000-4000-8000-{}", &uid[uid.len() - 12..])});
    v
}

/// One compute pod of a containerDisk VMI, `image_volume` choosing the ImageVolume gate.
struct ComputePod {
    pod: Pod,
    uid: String,
    name: String,
    private: PathBuf,
    sockets: PathBuf,
    compute: Spec,
}

/// The scratch containerDisk image: only `/disk/disk.qcow2` (the test guest), owned 107.
fn scratch_image(dir: &Path, images: &GuestImages) -> PathBuf {
    let root = dir.join("scratch");
    std::fs::create_dir_all(root.join("disk")).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let disk = root.join("disk/disk.qcow2");
    std::fs::copy(&images.disk_qcow2, &disk).unwrap();
    std::os::unix::fs::chown(&disk, Some(QEMU_ID), Some(QEMU_ID)).unwrap();
    std::fs::set_permissions(&disk, std::fs::Permissions::from_mode(0o644)).unwrap();
    root
}

/// Starts the pod's init containers, sidecar, volume containers and compute, as the kubelet does
/// in order; returns once compute serves `launcher-sock`.
fn start_compute_pod(
    tree: &Tree,
    images: &GuestImages,
    name: &str,
    image_volume: bool,
) -> ComputePod {
    let t = &tree.root;
    let uid = format!("0a0b0c0d-1111-4222-8333-{:012x}", rand_suffix());
    let mut pod = Pod::new(tree, &format!("virt-launcher-{name}"), true);
    let hostname = format!("virt-launcher-{name}-abcde");
    let private = pod.empty_dir("private");
    let public = pod.empty_dir("public");
    let sockets = pod.empty_dir("sockets");
    let bin_share = pod.empty_dir("virt-bin-share-dir");
    let libvirt_runtime = pod.empty_dir("libvirt-runtime");
    let ephemeral = pod.empty_dir("ephemeral-disks");
    let container_disks = pod.empty_dir("container-disks");
    let hotplug = pod.empty_dir("hotplug-disks");
    let scratch = scratch_image(&pod.dir, images);
    let xdg = |s: Spec| {
        s.env("XDG_CACHE_HOME", "/var/run/kubevirt-private")
            .env("XDG_CONFIG_HOME", "/var/run/kubevirt-private")
            .env("XDG_RUNTIME_DIR", "/var/run")
    };

    // 1. guest-console-log: a native sidecar (must keep running); 107, gid from the image.
    let gid = tree.passwd_gid(QEMU_ID);
    let log_path = format!("/var/run/kubevirt-private/{uid}/virt-serial0-log");
    let tail = tree
        .spec(
            t,
            &["/usr/bin/virt-tail", "--logfile", &log_path],
            &hostname,
        )
        .env("VIRT_LAUNCHER_LOG_VERBOSITY", "2")
        .user(QEMU_ID, gid, &[QEMU_ID], &[])
        .mount(&private, "/var/run/kubevirt-private", true);
    pod.start("guest-console-log", tail);
    std::thread::sleep(Duration::from_millis(500));
    pod.assert_running("guest-console-log");

    if image_volume {
        // 2. volumerootdisk: the containerDisk image with the launcher image as an image volume.
        let init = tree
            .spec(
                &scratch,
                &["/container-disk-binary/usr/bin/container-disk", "--no-op"],
                &hostname,
            )
            .user(QEMU_ID, QEMU_ID, &[QEMU_ID], &[])
            .mount(t, "/container-disk-binary", true);
        pod.run_init("volumerootdisk", init);
    } else {
        // 2. container-disk-binary: cp from the launcher image into virt-bin-share-dir.
        let cp = xdg(nonroot(
            tree.spec(
                t,
                &[
                    "/usr/bin/cp",
                    "--preserve=all",
                    "/usr/bin/container-disk",
                    "/init/usr/bin/container-disk",
                ],
                &hostname,
            ),
            &[],
        ))
        .mount(&bin_share, "/init/usr/bin", false);
        pod.run_init("container-disk-binary", cp);
        // 3. volumerootdisk-init: the copy, in the scratch containerDisk image.
        let cd_mounts = |s: Spec| {
            nonroot(s, &[])
                .mount(
                    &container_disks,
                    &format!("/var/run/kubevirt-ephemeral-disks/container-disk-data/{uid}"),
                    false,
                )
                .mount(&bin_share, "/usr/bin", false)
        };
        pod.run_init(
            "volumerootdisk-init",
            cd_mounts(tree.spec(&scratch, &["/usr/bin/container-disk", "--no-op"], &hostname)),
        );
        // The holder: keeps disk_0.sock in the container-disks emptyDir.
        let copy_path =
            format!("/var/run/kubevirt-ephemeral-disks/container-disk-data/{uid}/disk_0");
        pod.start(
            "volumerootdisk",
            cd_mounts(tree.spec(
                &scratch,
                &["/usr/bin/container-disk", "--copy-path", &copy_path],
                &hostname,
            )),
        );
    }

    // The compute container.
    let mut argv: Vec<String> = [
        "/usr/bin/virt-launcher-monitor",
        "--qemu-timeout",
        "263s",
        "--name",
        name,
        "--uid",
        &uid,
        "--namespace",
        "default",
        "--kubevirt-share-dir",
        "/var/run/kubevirt",
        "--ephemeral-disk-dir",
        "/var/run/kubevirt-ephemeral-disks",
        "--container-disk-dir",
        "/var/run/kubevirt/container-disks",
        "--grace-period-seconds",
        "20",
        "--hook-sidecars",
        "0",
        "--ovmf-path",
        "/usr/share/edk2/ovmf",
        "--disk-memory-limit",
        "2097152000",
        "--hypervisor",
        "kvm",
        "--run-as-nonroot",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if image_volume {
        argv.push("--image-volume".into());
    }
    // The default KubeVirt CR's gates, then `--allow-emulation` (the CR's useEmulation: KVM
    // when it runs guests here, else TCG).
    argv.extend(
        [
            "--libvirt-hook-server-and-client",
            "--upgrade-ordinal-ifaces",
            "--allow-emulation",
        ]
        .map(String::from),
    );
    let argv_ref: Vec<&str> = argv.iter().map(String::as_str).collect();
    let resolv = pod.netns().etc().join("resolv.conf");
    let mut compute = xdg(nonroot(
        tree.spec(t, &argv_ref, &hostname),
        &[CAP_NET_BIND_SERVICE],
    ))
    .env("POD_NAME", &hostname)
    .env("HOME", "/home/qemu")
    .mount(&private, "/var/run/kubevirt-private", false)
    .mount(&public, "/var/run/kubevirt", false)
    .mount(&ephemeral, "/var/run/kubevirt-ephemeral-disks", false)
    .mount(&libvirt_runtime, "/var/run/libvirt", false)
    .mount(&sockets, "/var/run/kubevirt/sockets", false)
    .mount(&resolv, "/etc/resolv.conf", false);
    if image_volume {
        compute = compute
            .mount(&hotplug, "/var/run/kubevirt/hotplug-disks", false)
            .mount(&scratch, "/var/run/kubevirt-image-volume/disk_0", true);
    } else {
        compute = compute
            .mount(&container_disks, "/var/run/kubevirt/container-disks", false)
            .mount(&hotplug, "/var/run/kubevirt/hotplug-disks", false);
    }
    compute.devices = vec![kvm(), tun()];
    pod.start("compute", compute.clone());
    ComputePod {
        pod,
        uid,
        name: name.to_string(),
        private,
        sockets,
        compute,
    }
}

fn rand_suffix() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64;
    (std::process::id() as u64) << 32 | nanos
}

/// The capability sets of `pid` (`CapAmb` etc. of /proc/PID/status) as bit masks.
fn cap_mask(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:\t")))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap_or(0)
}

/// The pid of the process under `root` whose executable is `exe` (inside the tree).
fn find_process(root: i32, exe: &str) -> Option<i32> {
    testkit::process::descendants(root).into_iter().find(|p| {
        std::fs::read_link(format!("/proc/{p}/exe"))
            .is_ok_and(|e| e.to_string_lossy().ends_with(exe))
    })
}

/// Plays virt-handler for a compute pod: (gate off) bind-mounts the disk from the container-disk
/// holder's root onto `disk_0.img`, then SyncVMI; waits for the guest's boot marker.
fn sync_and_boot(tree: &Tree, cp: &mut ComputePod, image_volume: bool) -> Console {
    let sock = cp.sockets.join("launcher-sock");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let log = cp.pod.log("compute");
    let mut client = rt.block_on(testkit::handler::connect(&sock, BOOT_TIMEOUT, || {
        std::fs::read_to_string(&log).unwrap_or_default()
    }));
    let compute_pid = cp.pod.pid("compute");
    // The launcher made its directories as 107 over the emptyDirs.
    let owner = std::fs::metadata(cp.private.join(&cp.uid)).map(|m| m.uid());
    assert_eq!(owner.ok(), Some(QEMU_ID), "private/<uid> is the launcher's");
    if !image_volume {
        let holder_sock = cp.pod.dir.join("vol/container-disks/disk_0.sock");
        assert!(
            wait_for(&holder_sock, INIT_TIMEOUT),
            "volumerootdisk made no disk_0.sock: {}",
            cp.pod.read_log("volumerootdisk")
        );
        // virt-handler: the holder's pid (SO_PEERCRED), its root, the one file in /disk.
        let stream = std::os::unix::net::UnixStream::connect(&holder_sock).unwrap();
        let cred =
            nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
                .unwrap();
        let source = format!("/proc/{}/root/disk/disk.qcow2", cred.pid());
        let target = cp.pod.dir.join("vol/container-disks/disk_0.img");
        std::fs::write(&target, b"").unwrap();
        let inside = tree.root.join("run/kubevirt/container-disks/disk_0.img");
        testkit::run(&[
            "nsenter",
            "--target",
            &compute_pid.to_string(),
            "--mount",
            "--",
            "mount",
            "--bind",
            "-o",
            "ro",
            &source,
            inside.to_str().unwrap(),
        ]);
    }
    // virt-handler's network setup in the pod (NetConf.Setup, masquerade on eth0), as root:
    // the compute container has no NET_ADMIN, its launcher adopts it.
    let netns = cp.pod.netns();
    for c in testkit::net::kubevirt_masquerade_links(QEMU_ID, false) {
        let args: Vec<&str> = c.iter().map(String::as_str).collect();
        netns.ip(&args);
    }
    netns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    for c in testkit::net::kubevirt_nft(&qlauncher::net::NetConfig::default(), "10.244.0.5") {
        if c[2] != "ip" {
            continue;
        }
        let mut args = vec!["nft"];
        args.extend(c.iter().map(String::as_str));
        netns.sh(&args);
    }
    let vmi = vmi(&cp.name, &cp.uid);
    let (ok, message) = rt.block_on(testkit::handler::sync(&mut client, &vmi));
    assert!(
        ok,
        "SyncVMI: {message}\ncompute:\n{}",
        cp.pod.read_log("compute")
    );
    let serial = cp.private.join(&cp.uid).join("virt-serial0");
    let mut console = Console::connect(&serial, BOOT_TIMEOUT).expect("serial console");
    if let Err(e) = console.wait_for_marker("boot ok", BOOT_TIMEOUT) {
        panic!("{e}\ncompute:\n{}", cp.pod.read_log("compute"));
    }
    console
}

/// SIGTERM to compute (the pod is deleted): it exits 0; the disk holder exits 0 once the monitor
/// removed its socket; the sidecar exits 0 on its SIGTERM.
fn stop_compute_pod(cp: &mut ComputePod, image_volume: bool) {
    let code = cp.pod.terminate("compute", Duration::from_secs(60));
    assert_eq!(code, 0, "compute exit:\n{}", cp.pod.read_log("compute"));
    if !image_volume {
        let st = cp.pod.wait("volumerootdisk", Duration::from_secs(10));
        assert!(
            st.is_some_and(|s| s.success()),
            "volumerootdisk after compute ended: {st:?} {}",
            cp.pod.read_log("volumerootdisk")
        );
    }
    cp.pod.assert_running("guest-console-log");
    assert_eq!(
        cp.pod
            .terminate("guest-console-log", Duration::from_secs(10)),
        0
    );
}

/// Runs `argv` inside the running compute container (an exec probe or a Velero hook) and
/// returns its exit code and output.
fn exec_in_compute(cp: &mut ComputePod, name: &str, argv: &[&str]) -> (i32, String) {
    let pid = cp.pod.pid("compute");
    let log = cp.pod.log(name);
    let st = cp
        .compute
        .exec_in(pid, argv, &log)
        .status()
        .unwrap_or_else(|e| panic!("exec {argv:?}: {e}"));
    (
        st.code().unwrap_or(-1),
        std::fs::read_to_string(&log).unwrap_or_default(),
    )
}

#[test]
fn compute_pods_boot_a_container_disk_with_the_image_volume_gate_on_and_off() {
    let images = GuestImages::locate();
    let tree = Tree::assemble();
    std::thread::scope(|s| {
        let off = s.spawn(|| {
            let mut cp = start_compute_pod(&tree, &images, "cd-off", false);
            let _console = sync_and_boot(&tree, &mut cp, false);
            assert_running_pod(&mut cp);
            stop_compute_pod(&mut cp, false);
        });
        let mut cp = start_compute_pod(&tree, &images, "cd-on", true);
        let mut console = sync_and_boot(&tree, &mut cp, true);
        assert_running_pod(&mut cp);
        // The disk came through the image volume link (made in compute's mount namespace).
        assert!(
            cp.pod
                .read_log("compute")
                .contains("containerDisk image volume"),
            "no image volume link in the launcher's log"
        );
        probes_and_hooks(&mut cp, &mut console);
        stop_compute_pod(&mut cp, true);
        off.join().unwrap();
    });
}

/// The running pod as virt-controller and virt-handler see it: the sidecar up and printing the
/// guest's console, the launcher with NET_BIND_SERVICE ambient (raised by the monitor from its
/// file capability), every process of compute as 107.
fn assert_running_pod(cp: &mut ComputePod) {
    cp.pod.assert_running("guest-console-log");
    let tail_log = cp.pod.log("guest-console-log");
    assert!(
        testkit::process::wait_until(Duration::from_secs(30), || {
            std::fs::read_to_string(&tail_log)
                .unwrap_or_default()
                .contains("QLG: boot ok")
        }),
        "virt-tail does not print the guest console:\n{}",
        cp.pod.read_log("guest-console-log")
    );
    let monitor = cp.pod.pid("compute") as i32;
    // The monitor runs /usr/bin/virt-launcher, the image's link to qlauncher.
    let launcher = find_process(monitor, "/usr/bin/qlauncher").expect("virt-launcher runs");
    assert_ne!(
        cap_mask(launcher, "CapAmb") & (1 << CAP_NET_BIND_SERVICE),
        0,
        "virt-launcher has no ambient CAP_NET_BIND_SERVICE (the monitor's file capability)"
    );
    for p in std::iter::once(monitor).chain(testkit::process::descendants(monitor)) {
        if let Ok(m) = std::fs::metadata(format!("/proc/{p}")) {
            assert_eq!(m.uid(), QEMU_ID, "process {p} of compute is not 107");
        }
    }
}

/// virt-probe (guest-agent ping and an exec probe) and virt-freezer, exec'ed in compute as
/// kubelet and Velero do, against the running guest.
fn probes_and_hooks(cp: &mut ComputePod, console: &mut Console) {
    let _ = console.wait_for_marker("agent ready", BOOT_TIMEOUT);
    let domain = format!("default_{}", cp.name);
    // guestAgentPing: kubelet runs it every period until it passes; the agent may take a while.
    let deadline = Instant::now() + BOOT_TIMEOUT;
    let ping = loop {
        let r = exec_in_compute(
            cp,
            "probe-ping",
            &[
                "virt-probe",
                "--domainName",
                &domain,
                "--timeoutSeconds",
                "5",
                "--guestAgentPing",
            ],
        );
        if r.0 == 0 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    assert_eq!(ping.0, 0, "guestAgentPing probe: {}", ping.1);
    // An exec probe: the guest command's exit code is the probe's.
    let ok = exec_in_compute(
        cp,
        "probe-exec",
        &[
            "virt-probe",
            "--domainName",
            &domain,
            "--timeoutSeconds",
            "10",
            "--command",
            "/bin/sh",
            "--",
            "-c",
            "exit 0",
        ],
    );
    assert_eq!(ok.0, 0, "exec probe: {}", ok.1);
    let fail = exec_in_compute(
        cp,
        "probe-exec-fail",
        &[
            "virt-probe",
            "--domainName",
            &domain,
            "--timeoutSeconds",
            "10",
            "--command",
            "/bin/sh",
            "--",
            "-c",
            "exit 3",
        ],
    );
    assert_eq!(fail.0, 3, "failing exec probe: {}", fail.1);
    // Velero's pre and post hooks.
    let name = cp.name.clone();
    let freeze = exec_in_compute(
        cp,
        "hook-freeze",
        &[
            "/usr/bin/virt-freezer",
            "--freeze",
            "--name",
            &name,
            "--namespace",
            "default",
        ],
    );
    assert_eq!(freeze.0, 0, "virt-freezer --freeze: {}", freeze.1);
    let unfreeze = exec_in_compute(
        cp,
        "hook-unfreeze",
        &[
            "/usr/bin/virt-freezer",
            "--unfreeze",
            "--name",
            &name,
            "--namespace",
            "default",
        ],
    );
    assert_eq!(unfreeze.0, 0, "virt-freezer --unfreeze: {}", unfreeze.1);
}

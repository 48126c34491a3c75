//! qlauncher's test kit: what the integration tests (`tests/`) and the benchmarks (`benches/`)
//! share, so that each test file holds only what it asserts.
//!
//! - [`names`]: names unique among the tests of every test binary running at once.
//! - [`process`]: commands that must succeed, children killed on drop, waiting helpers, the
//!   process tree under a pid.
//! - [`netns`]: throwaway network namespaces ([`netns::Netns`]) and the pod/node pair joined by a
//!   veth ([`netns::PodNet`]), as a CNI plugin leaves a pod before virt-handler and the launcher
//!   run.
//! - [`net`]: qlauncher's network setup and DHCP servers run inside a namespace, DHCP clients,
//!   TCP probes.
//! - [`guest`]: the test guest (`scripts/build-guest`): its images, its serial console, a small
//!   QMP client, a plain QEMU running it.
//! - [`notify`]: virt-handler's side of the notify API (a gRPC server recording domain events).
//! - [`hook_sidecar`]: a KubeVirt hook sidecar (Info and the v1alpha1..3 callbacks on a unix
//!   socket) with scripted answers and a record of its calls.
//! - [`handler`]: virt-handler's side of the cmd API (connecting to `launcher-sock`, SyncVMI,
//!   GetDomain).
//! - [`migration`]: both virt-handlers of a live migration (the proxy relay, the RPCs).
//! - [`hotplug`]: the hot-plugged NIC `blue` and disk `hp1` of the migration tests.
//! - [`in_process`]: the launcher in the test's process: KubeVirt's directories under a temporary
//!   root, the cmd server with virt-handler's client, the notify server.
//! - [`container`]: one container of a pod run as kubelet and runc run it (chroot into the
//!   image tree, the pod's mounts, env, user, capabilities, no shell in between), and exec in it.
//! - [`kubelet`]: the kubelet's emptyDirs (root:107, 2777), the non-root compute container's
//!   identity and environment, device plugins' per-pod 0666 device nodes.
//! - [`launcher`]: a pod running `qlauncher launcher` as virt-launcher-monitor would, with the
//!   test guest as its containerDisk.
//! - [`libvirtd`]: a real libvirt daemon in a private mount namespace, the stock launcher's
//!   side of the migrations between qlauncher and libvirt.
//! - [`run`](mod@run): `qlauncher run` in a pod network namespace, as a user runs it.
//! - [`monitor`]: `qlauncher monitor` as a process, the launcher flags, the static launcher
//!   (a launcher whose domain is one fixed QEMU command line).
//! - [`qemu_launch`] and [`qmp`]: a QEMU started with an inherited QMP listener, for the qmp tests
//!   and benchmark; [`qmp_script`]: a scripted QMP peer, for what needs hardware this machine
//!   lacks.
//! - [`storage`]: scratch directories, tmpfs and loop mounts, the QEMU image tools.
//! - [`cmdline`]: the converter's fixture VMIs with their pod facts, and a context for starting
//!   them under the real QEMU.
//! - [`hostile`]: the hostile field values every VMI string field is tried with.
//! - [`backup`]: the backup tests' CBT VMI, BackupVirtualMachine call, guest writes, domain
//!   events and restore; [`export_server`]: a stand-in virt-exportserver for pull backups' Export.
//! - [`fuzz`]: the fuzz target bodies (shared with `fuzz/fuzz_targets`).
//!
//! Everything cleans up on drop, whether the test passes or not.

#![warn(missing_docs)]
// The docs are read with `cargo doc --document-private-items`, where links to private items resolve.
#![allow(rustdoc::private_intra_doc_links)]

pub mod backup;
pub mod cmdline;
pub mod container;
pub mod export_server;
pub mod fuzz;
pub mod guest;
pub mod handler;
pub mod hook_sidecar;
pub mod hostile;
pub mod hotplug;
pub mod in_process;
pub mod kubelet;
pub mod labels;
pub mod launcher;
pub mod libvirtd;
pub mod migration;
pub mod monitor;
pub mod names;
pub mod net;
pub mod netns;
pub mod notify;
pub mod process;
pub mod qemu_launch;
pub mod qmp;
pub mod qmp_script;
pub mod run;
pub mod storage;

pub use names::unique;
pub use process::{run, try_run};

/// The repository's root directory (where `examples/`, `tests/fixtures/` and `scripts/` are).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit/ has a parent")
        .to_path_buf()
}

/// The `qlauncher` binary under test: `QLAUNCHER_BIN` when set, else `qlauncher` in the target
/// directory of the running test or benchmark (cargo builds it for both).
pub fn qlauncher_bin() -> std::path::PathBuf {
    sibling_bin("qlauncher", "QLAUNCHER_BIN")
}

/// A binary of the qlauncher package next to the running test: `$env` when set, else
/// `<target>/<profile>/<name>` for a test or bench at `<target>/<profile>/deps/<test>-<hash>`.
pub(crate) fn sibling_bin(name: &str, env: &str) -> std::path::PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build it with cargo (cargo test builds it for the tests)",
        bin.display()
    );
    bin
}

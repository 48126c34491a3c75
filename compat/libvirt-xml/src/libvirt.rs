//! Running libvirt's own tools on an exported domain: the schema check
//! (`virt-xml-validate FILE domain`, Debian package libvirt-clients + libxml2-utils) and the argv
//! libvirt would start QEMU with (`virsh -c 'qemu:///embed?root=DIR' domxml-to-native qemu-argv
//! FILE`, packages libvirt-clients + libvirt-daemon-driver-qemu; no daemon is involved).
//!
//! Two settings keep the embedded QEMU driver fast (0.1-0.3 s per call instead of a minute of
//! capability re-probing; measured here with libvirt 9.0 and QEMU 7.2): `DIR/etc/qemu.conf` sets
//! `user = "root"` and `group = "root"` (so the probe runs as a user that can open `/dev/kvm` and
//! its cached capabilities stay valid), and the same `DIR` is reused, so the capabilities cache
//! under `DIR/cache` is probed once (about 4 s) and then read. The privileged embedded driver also
//! resolves the compiled-in user `libvirt-qemu` before reading `qemu.conf`, so that user must
//! exist (`useradd --system --user-group --no-create-home libvirt-qemu`; Debian's
//! libvirt-daemon-system creates it). As root, `virsh` runs in fresh network and mount
//! namespaces (`unshare -n -m`): domxml-to-native opens taps for `<interface type="ethernet">`,
//! and hugepage domains need a hugetlbfs, mounted at `DIR/hugepages` inside that namespace only.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::CompatError;

static COUNTER: AtomicU32 = AtomicU32::new(0);

fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false)
}

fn write(path: &Path, text: &str) -> Result<(), CompatError> {
    std::fs::write(path, text).map_err(|source| CompatError::WriteTemp {
        path: path.to_path_buf(),
        source,
    })
}

fn run(
    mut cmd: Command,
    program: &'static str,
    package: &'static str,
) -> Result<String, CompatError> {
    let out = cmd.output().map_err(|source| CompatError::SpawnTool {
        program,
        package,
        source,
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        // libvirt prefixes errors with info lines (version, hostname); keep the error lines.
        let errors: Vec<&str> = stderr
            .lines()
            .filter(|l| !l.contains(": info : ") && !l.contains(": warning : "))
            .collect();
        return Err(CompatError::ToolFailed {
            program,
            stderr: errors.join("\n").trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A directory holding a domain XML file for the duration of one tool run; removed on drop.
struct TempXml {
    path: PathBuf,
}

impl TempXml {
    fn new(dir: &Path, xml: &str) -> Result<Self, CompatError> {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("qlauncher-compat-{}-{n}.xml", std::process::id()));
        write(&path, xml)?;
        Ok(TempXml { path })
    }
}

impl Drop for TempXml {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Checks `xml` against libvirt's domain schema with `virt-xml-validate FILE domain`.
///
/// Errors: the tool is missing ([`CompatError::SpawnTool`]) or rejects the document
/// ([`CompatError::ToolFailed`] with its message).
pub fn validate(xml: &str) -> Result<(), CompatError> {
    let tmp = TempXml::new(&std::env::temp_dir(), xml)?;
    let mut cmd = Command::new("virt-xml-validate");
    cmd.arg(&tmp.path).arg("domain");
    run(cmd, "virt-xml-validate", "libvirt-clients libxml2-utils").map(|_| ())
}

/// An embedded QEMU driver root (`qemu:///embed?root=DIR`) set up for fast offline use.
#[derive(Debug)]
pub struct EmbedRoot {
    dir: PathBuf,
    remove: bool,
}

impl EmbedRoot {
    /// Uses (and keeps) `dir`, writing `etc/qemu.conf` there.
    pub fn keep(dir: &Path) -> Result<Self, CompatError> {
        Self::setup(dir, false)
    }

    /// Uses `dir` and removes it on drop (tests).
    pub fn temporary(dir: &Path) -> Result<Self, CompatError> {
        Self::setup(dir, true)
    }

    /// The default persistent root: `$XDG_CACHE_HOME/qlauncher-compat/libvirt-embed`, else
    /// `$HOME/.cache/...`, else `/var/tmp/qlauncher-compat-libvirt-embed`.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
            return PathBuf::from(d).join("qlauncher-compat/libvirt-embed");
        }
        if let Some(h) = std::env::var_os("HOME") {
            return PathBuf::from(h).join(".cache/qlauncher-compat/libvirt-embed");
        }
        PathBuf::from("/var/tmp/qlauncher-compat-libvirt-embed")
    }

    fn setup(dir: &Path, remove: bool) -> Result<Self, CompatError> {
        let etc = dir.join("etc");
        let hugepages = dir.join("hugepages");
        for d in [&etc, &hugepages] {
            std::fs::create_dir_all(d).map_err(|source| CompatError::WriteTemp {
                path: d.to_path_buf(),
                source,
            })?;
        }
        let mut conf = String::from("user = \"root\"\ngroup = \"root\"\n");
        if is_root() {
            // Mounted privately for each virsh run (see `domxml_to_native`).
            conf.push_str(&format!("hugetlbfs_mount = \"{}\"\n", hugepages.display()));
        }
        write(&etc.join("qemu.conf"), &conf)?;
        Ok(EmbedRoot {
            dir: dir.to_path_buf(),
            remove,
        })
    }

    /// The root directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// libvirt's QEMU argv for `xml`, without the environment assignments and the binary.
    ///
    /// Errors: `virsh` missing or failing (its error text, e.g. an unsupported configuration),
    /// or output that does not split into shell words.
    pub fn domxml_to_native(&self, xml: &str) -> Result<Vec<String>, CompatError> {
        let tmp = TempXml::new(&self.dir, xml)?;
        let uri = format!("qemu:///embed?root={}", self.dir.display());
        let mut cmd = if is_root() {
            // A private network namespace (domxml-to-native opens taps for ethernet
            // interfaces) and mount namespace with a hugetlbfs for hugepage domains. The paths
            // are passed as arguments, never spliced into the script.
            let mut c = Command::new("unshare");
            c.args(["-n", "-m", "sh", "-c"])
                .arg("mount -t hugetlbfs none \"$0\" 2>/dev/null; exec virsh \"$@\"")
                .arg(self.dir.join("hugepages"));
            c
        } else {
            Command::new("virsh")
        };
        cmd.arg("-c")
            .arg(uri)
            .arg("domxml-to-native")
            .arg("qemu-argv")
            .arg(&tmp.path);
        let out = run(cmd, "virsh", "libvirt-clients libvirt-daemon-driver-qemu")?;
        let words = shlex::split(out.trim()).ok_or(CompatError::SplitArgv)?;
        Ok(words
            .into_iter()
            .skip_while(|w| !w.starts_with('/') && w.contains('='))
            .skip(1)
            .collect())
    }
}

impl Drop for EmbedRoot {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Attributes KubeVirt v1.9 (libvirt 11.10) writes that Debian 12's libvirt 9.0 schema does not
/// know yet, as (element, attribute): removed by [`for_libvirt9`] before validating here.
pub const NEWER_THAN_LIBVIRT9: &[(&str, &str)] = &[("blockio", "discard_granularity")];

/// `xml` adapted to Debian 12's libvirt 9.0, for its schema check and domxml-to-native: without
/// the [`NEWER_THAN_LIBVIRT9`] attributes, and `<maxMemory slots="0">` (virtio-mem only, which
/// libvirt 11 accepts) as `slots="1"` (libvirt 9.0 insists on DIMM slots).
pub fn for_libvirt9(xml: &str) -> String {
    let mut out = String::with_capacity(xml.len());
    for line in xml.split_inclusive('\n') {
        let mut line = line.to_string();
        if line.trim_start().starts_with("<maxMemory ") {
            line = line.replace(" slots=\"0\"", " slots=\"1\"");
        }
        for (element, attr) in NEWER_THAN_LIBVIRT9 {
            if line.trim_start().starts_with(&format!("<{element} ")) {
                let needle = format!(" {attr}=\"");
                if let Some(start) = line.find(&needle) {
                    let rest = &line[start + needle.len()..];
                    if let Some(end) = rest.find('"') {
                        let cut = start + needle.len() + end + 1;
                        line.replace_range(start..cut, "");
                    }
                }
            }
        }
        out.push_str(&line);
    }
    out
}

/// The installed `qemu-system-x86_64`'s version (what libvirt probes), from `--version`.
pub fn installed_qemu() -> Option<qlauncher_core::cmdline::context::QemuVersion> {
    let out = Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let v = text.split_whitespace().nth(3)?;
    qlauncher_core::cmdline::context::QemuVersion::parse(v)
}

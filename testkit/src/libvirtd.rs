//! A real libvirt daemon for the tests of migrations between qlauncher and a stock launcher
//! (Debian 12's libvirtd 9.0, the role of KubeVirt's stock virt-launcher and its virtqemud), in
//! a private mount namespace (`unshare -m`: a tmpfs over each of libvirt's directories, a
//! private passwd with libvirt's QEMU user, `qemu.conf` with root and no security driver), as
//! `scripts/qlbench/libvirt.py` runs it. Bind mounts given at start put another directory
//! where a path is in the daemon's view: a stock target pod's directories at the source pod's
//! paths (KubeVirt's two pods see the same paths, each its own files).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

/// The domain name of the migration tests' VMI (`default/hv`).
pub const DOMAIN: &str = "default_hv";

/// libvirt's directories, covered by a tmpfs each in the daemon's mount namespace.
const LIBVIRT_DIRS: &str =
    "/run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt /etc/libvirt";

/// A libvirtd in a private mount namespace: the setup runs in `sh` there, then execs the
/// daemon. Dropping it destroys [`DOMAIN`] (the QEMU it started is not its child) and stops
/// it.
pub struct Libvirtd {
    /// The `unshare` process that became the daemon.
    pub child: Child,
    log: PathBuf,
}

impl Libvirtd {
    /// Starts the daemon, its log in `work/libvirtd.log`, with each `(from, at)` of `binds`
    /// bind-mounted (`from` seen at `at`, both existing directories) in its namespace; waits
    /// (up to 30 s) until `virsh version` answers.
    pub fn start(work: &Path, binds: &[(PathBuf, PathBuf)]) -> Libvirtd {
        let log = work.join("libvirtd.log");
        let mut mounts = String::new();
        for (from, at) in binds {
            // Paths come from the test (temporary directories): no quoting beyond this.
            mounts.push_str(&format!(
                "mount --bind '{}' '{}'\n",
                from.display(),
                at.display()
            ));
        }
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
{mounts}printf 'user = "root"\ngroup = "root"\ndynamic_ownership = 0\nsecurity_driver = "none"\nnamespaces = []\ncgroup_controllers = []\nstdio_handler = "file"\nremember_owner = 0\n' >/etc/libvirt/qemu.conf
printf 'listen_tls = 0\nlisten_tcp = 0\nlog_outputs = "3:stderr"\n' >/etc/libvirt/libvirtd.conf
# /run itself is the host's: the pid file goes to the private /run/libvirt (parallel daemons).
exec /usr/sbin/libvirtd --timeout 0 --pid-file /run/libvirt/libvirtd.pid"#
        );
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
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

    /// The daemon's log (errors and warnings).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's socket, reached through its mount namespace (`/proc/<pid>/root`): where a
    /// stock target pod's `virtqemud-sock` is.
    pub fn socket(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/root/run/libvirt/libvirt-sock",
            self.child.id()
        ))
    }

    /// `virsh -c qemu:///system ARGS` in the daemon's mount namespace.
    pub fn virsh(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg("-t")
            .arg(self.child.id().to_string())
            .args(["-m", "virsh", "-q", "-c", "qemu:///system"])
            .args(args)
            .output()
            .expect("nsenter virsh")
    }

    /// [`Self::virsh`], panicking with its error and the daemon's log unless it succeeds.
    pub fn virsh_ok(&self, args: &[&str]) -> String {
        let out = self.virsh(args);
        assert!(
            out.status.success(),
            "virsh {args:?}: {}\nlibvirtd:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The names of every domain, running or defined.
    pub fn domains(&self) -> Vec<String> {
        self.virsh_ok(&["list", "--all", "--name"])
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// `virsh domstate` of [`DOMAIN`].
    pub fn domstate(&self) -> String {
        self.virsh_ok(&["domstate", DOMAIN]).trim().to_owned()
    }

    /// The pid of [`DOMAIN`]'s QEMU (libvirt's pid file, seen through the daemon's root).
    pub fn qemu_pid(&self) -> Option<i32> {
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

/// The PVC's image in a pod's private directory: `<private>/vmi-disks/rootdisk/disk.img`, a
/// hard link of the shared `image` (a filesystem PVC both pods see).
pub fn link_pvc(private: &Path, image: &Path) -> PathBuf {
    let dir = private.join("vmi-disks/rootdisk");
    std::fs::create_dir_all(&dir).unwrap();
    let disk = dir.join("disk.img");
    let _ = std::fs::remove_file(&disk);
    std::fs::hard_link(image, &disk).unwrap();
    disk
}

/// The value of `path='…'` (or `"…"`) of the first `<serial>` of libvirt's live XML.
pub fn serial_path(xml: &str) -> PathBuf {
    let at = xml.find("<serial").expect("a serial console");
    let rest = &xml[at..];
    let p = rest.find("path=").expect("serial source path") + 5;
    let quote = rest.as_bytes()[p] as char;
    let end = rest[p + 1..].find(quote).unwrap();
    PathBuf::from(&rest[p + 1..p + 1 + end])
}

/// Makes every directory under `from` again under `to` (no files): a second pod's directory
/// layout at the same relative paths, empty.
pub fn copy_dir_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            copy_dir_tree(&e.path(), &to.join(e.file_name()));
        }
    }
}

//! One container of a pod, run as the kubelet and runc run it: its image's file tree as `/`
//! (chroot), the pod's volumes bind-mounted at the container's mount paths, `/proc`, `/sys`, a
//! `/dev` tmpfs with the usual nodes (plus device-plugin devices such as `/dev/kvm`, mode 0666),
//! the pod's network namespace, the rendered environment, uid, gid and supplementary groups, the
//! capability set (bounding = permitted = effective, nothing inheritable or ambient: containerd's
//! CRI spec) and `no_new_privs` when privilege escalation is off; then `execve` of the rendered
//! command and args, looked up through the container's `PATH` inside the tree when it is a bare
//! name (runc). No shell of the test is in between: everything is done in the forked child
//! before the exec.
//!
//! [`Spec::exec_in`] runs a command inside a running container (an exec probe, a Velero hook):
//! the container's mount and network namespaces, its root, user and capabilities.
//!
//! Not modelled: pid, ipc and uts namespaces, cgroups, seccomp. Cleanup is the caller's: run every
//! container in a throwaway network namespace and kill what is left in it
//! ([`crate::netns::Netns::kill_all`]); the mount namespace goes with its last process.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// `CAP_NET_BIND_SERVICE`.
pub const CAP_NET_BIND_SERVICE: u32 = 10;

/// containerd's default capabilities of a non-privileged container (`oci.DefaultCapabilities`):
/// CHOWN, DAC_OVERRIDE, FSETID, FOWNER, MKNOD, NET_RAW, SETGID, SETUID, SETFCAP, SETPCAP,
/// NET_BIND_SERVICE, SYS_CHROOT, KILL, AUDIT_WRITE.
pub const DEFAULT_CAPS: &[u32] = &[0, 1, 4, 3, 27, 13, 6, 7, 31, 8, 10, 18, 5, 29];

/// Every capability (a privileged container's set).
pub const ALL_CAPS: &[u32] = &[
    0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25,
    26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
];

/// containerd's default `PATH` when the image sets none; also what qlauncher's image sets.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A volume mount: a host directory or file (an emptyDir, a hostPath, an image volume's tree) at
/// `target` inside the container.
#[derive(Debug, Clone)]
pub struct Mount {
    /// The host path.
    pub source: PathBuf,
    /// The absolute path inside the container.
    pub target: String,
    /// `readOnly: true` (image volumes are always read-only).
    pub read_only: bool,
}

/// A character device the container gets (mode 0666), e.g. `("kvm", 10, 232)`.
#[derive(Debug, Clone)]
pub struct Device {
    /// The name under `/dev`.
    pub name: String,
    /// Major number.
    pub major: u32,
    /// Minor number.
    pub minor: u32,
}

/// What the kubelet and the runtime make of one container spec.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The container's image tree (its root file system).
    pub rootfs: PathBuf,
    /// Volume mounts, in the pod's order (parents before children).
    pub mounts: Vec<Mount>,
    /// Extra device nodes (device plugins).
    pub devices: Vec<Device>,
    /// `command` + `args`, as rendered.
    pub argv: Vec<String>,
    /// The environment (the runtime's `PATH` and `HOSTNAME` plus the container's `env`).
    pub env: Vec<(String, String)>,
    /// The uid.
    pub uid: u32,
    /// The primary gid.
    pub gid: u32,
    /// Supplementary groups (fsGroup, the image's `/etc/group` membership).
    pub groups: Vec<u32>,
    /// The capability numbers of the bounding, permitted and effective sets.
    pub caps: Vec<u32>,
    /// `allowPrivilegeEscalation: false`.
    pub no_new_privs: bool,
    /// The pod's network namespace (a file under `/var/run/netns`).
    pub netns: Option<PathBuf>,
}

/// `user_cap_header` and `user_cap_data` of capset(2), version 3.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}
const CAP_V3: u32 = 0x2008_0522;

fn cstr(p: impl AsRef<std::ffi::OsStr>) -> CString {
    CString::new(p.as_ref().as_bytes()).expect("no NUL in a path")
}

fn check(r: libc::c_int) -> std::io::Result<()> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Everything the child needs, made before the fork (no allocation after it).
struct Prepared {
    root: CString,
    netns: Option<std::fs::File>,
    /// (source, target, read-only, directory) of each volume, target under the root.
    binds: Vec<(CString, CString, bool, bool)>,
    proc_: CString,
    sys: CString,
    dev: CString,
    /// (path, mode|type, dev) of each node to make.
    nodes: Vec<(CString, libc::mode_t, libc::dev_t)>,
    dev_dirs: Vec<CString>,
    pts: CString,
    ptmx: CString,
    shm: CString,
    groups: Vec<libc::gid_t>,
    uid: u32,
    gid: u32,
    caps: CapData2,
    no_new_privs: bool,
    enter_mnt: Option<std::fs::File>,
}

#[derive(Clone, Copy)]
struct CapData2([CapData; 2]);

impl Spec {
    /// A spec for `argv` in `rootfs` as root with containerd's default capabilities, the default
    /// `PATH`, no mounts.
    pub fn new(rootfs: &Path, argv: &[&str]) -> Spec {
        Spec {
            rootfs: rootfs.to_path_buf(),
            mounts: Vec::new(),
            devices: Vec::new(),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: vec![("PATH".into(), DEFAULT_PATH.into())],
            uid: 0,
            gid: 0,
            groups: Vec::new(),
            caps: DEFAULT_CAPS.to_vec(),
            no_new_privs: false,
            netns: None,
        }
    }

    /// Adds a volume mount.
    pub fn mount(mut self, source: &Path, target: &str, read_only: bool) -> Spec {
        self.mounts.push(Mount {
            source: source.to_path_buf(),
            target: target.to_string(),
            read_only,
        });
        self
    }

    /// Sets an environment variable (replacing one of the same name).
    pub fn env(mut self, key: &str, value: &str) -> Spec {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
        self
    }

    /// KubeVirt's non-root container identity: uid and gid `uid`/`gid`, groups `groups`,
    /// capabilities `caps` (after `drop: ALL`), `allowPrivilegeEscalation: false`.
    pub fn user(mut self, uid: u32, gid: u32, groups: &[u32], caps: &[u32]) -> Spec {
        self.uid = uid;
        self.gid = gid;
        self.groups = groups.to_vec();
        self.caps = caps.to_vec();
        self.no_new_privs = true;
        self
    }

    /// The command that starts the container (stdin null, stdout and stderr to `log`).
    pub fn command(&self, log: &Path) -> Command {
        self.build(log, None)
    }

    /// The command that runs `argv` inside the running container whose process is `pid`
    /// (`kubectl exec`, an exec probe, a Velero hook): its mount and network namespaces, this
    /// spec's root, user, capabilities and environment.
    pub fn exec_in(&self, pid: u32, argv: &[&str], log: &Path) -> Command {
        let mut spec = self.clone();
        spec.argv = argv.iter().map(|s| s.to_string()).collect();
        spec.netns = Some(PathBuf::from(format!("/proc/{pid}/ns/net")));
        spec.build(log, Some(pid))
    }

    fn prepare(&self, enter: Option<u32>) -> Prepared {
        let under = |p: &str| self.rootfs.join(p.trim_start_matches('/'));
        let mut binds = Vec::new();
        if enter.is_none() {
            for m in &self.mounts {
                let target = under(&m.target);
                if m.source.is_dir() {
                    std::fs::create_dir_all(&target)
                        .unwrap_or_else(|e| panic!("{}: {e}", target.display()));
                } else if !target.exists() {
                    if let Some(parent) = target.parent() {
                        std::fs::create_dir_all(parent).unwrap();
                    }
                    std::fs::write(&target, b"").unwrap();
                }
                binds.push((
                    cstr(&m.source),
                    cstr(&target),
                    m.read_only,
                    m.source.is_dir(),
                ));
            }
            for d in ["proc", "sys", "dev", "tmp", "run"] {
                let _ = std::fs::create_dir_all(self.rootfs.join(d));
            }
        }
        let dev = self.rootfs.join("dev");
        let mut nodes: Vec<(CString, libc::mode_t, libc::dev_t)> = [
            ("null", 1, 3),
            ("zero", 1, 5),
            ("full", 1, 7),
            ("random", 1, 8),
            ("urandom", 1, 9),
            ("tty", 5, 0),
        ]
        .iter()
        .map(|(n, ma, mi)| {
            (
                cstr(dev.join(n)),
                libc::S_IFCHR | 0o666,
                libc::makedev(*ma, *mi),
            )
        })
        .collect();
        for d in &self.devices {
            nodes.push((
                cstr(dev.join(&d.name)),
                libc::S_IFCHR | 0o666,
                libc::makedev(d.major, d.minor),
            ));
        }
        let mut dev_dirs = vec![cstr(dev.join("pts")), cstr(dev.join("shm"))];
        for d in &self.devices {
            if let Some(parent) = Path::new(&d.name)
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
            {
                dev_dirs.push(cstr(dev.join(parent)));
            }
        }
        // The container's capabilities, as far as this process holds them (a test machine that
        // is itself a container may lack some, e.g. CAP_SYS_RESOURCE).
        let held = held_caps();
        let mut data = [CapData::default(); 2];
        for &c in &self.caps {
            let (i, bit) = ((c / 32) as usize, 1u32 << (c % 32));
            if held[i] & bit == 0 {
                continue;
            }
            data[i].effective |= bit;
            data[i].permitted |= bit;
        }
        Prepared {
            root: cstr(&self.rootfs),
            netns: self
                .netns
                .as_ref()
                .map(|p| std::fs::File::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))),
            binds,
            proc_: cstr(self.rootfs.join("proc")),
            sys: cstr(self.rootfs.join("sys")),
            dev: cstr(&dev),
            nodes,
            dev_dirs,
            pts: cstr(dev.join("pts")),
            ptmx: cstr(dev.join("ptmx")),
            shm: cstr(dev.join("shm")),
            groups: self.groups.clone(),
            uid: self.uid,
            gid: self.gid,
            caps: CapData2(data),
            no_new_privs: self.no_new_privs,
            enter_mnt: enter.map(|pid| {
                std::fs::File::open(format!("/proc/{pid}/ns/mnt"))
                    .unwrap_or_else(|e| panic!("mount namespace of {pid}: {e}"))
            }),
        }
    }

    fn build(&self, log: &Path, enter: Option<u32>) -> Command {
        let p = self.prepare(enter);
        let out = std::fs::File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let mut c = Command::new(&self.argv[0]);
        c.args(&self.argv[1..])
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out);
        // SAFETY: the closure runs in the forked child before exec; it only makes system calls on
        // data prepared before the fork (no allocation, no lock).
        unsafe {
            c.pre_exec(move || child_setup(&p));
        }
        c
    }
}

/// This process's permitted capabilities (capget), two 32-bit words.
fn held_caps() -> [u32; 2] {
    let header = CapHeader {
        version: CAP_V3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with a valid header and a two-element buffer (version 3).
    let r = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &header as *const CapHeader,
            data.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0, "capget: {}", std::io::Error::last_os_error());
    [data[0].permitted, data[1].permitted]
}

/// The child's side: namespaces, mounts, root, identity, capabilities.
fn child_setup(p: &Prepared) -> std::io::Result<()> {
    // SAFETY: plain system calls on valid C strings and buffers owned by `p`.
    unsafe {
        if let Some(ns) = &p.netns {
            check(libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET))?;
        }
        if let Some(mnt) = &p.enter_mnt {
            check(libc::setns(mnt.as_raw_fd(), libc::CLONE_NEWNS))?;
        } else {
            check(libc::unshare(libc::CLONE_NEWNS))?;
            let none = std::ptr::null();
            check(libc::mount(
                none,
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            for (src, dst, ro, dir) in &p.binds {
                // The mount point, inside a volume mounted before it (as runc makes it).
                if *dir {
                    let r = libc::mkdir(dst.as_ptr(), 0o755);
                    if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                } else {
                    let fd = libc::open(
                        dst.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd >= 0 {
                        libc::close(fd);
                    }
                }
                check(libc::mount(
                    src.as_ptr(),
                    dst.as_ptr(),
                    none,
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null(),
                ))?;
                if *ro {
                    check(libc::mount(
                        none,
                        dst.as_ptr(),
                        none,
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                        std::ptr::null(),
                    ))?;
                }
            }
            check(libc::mount(
                c"proc".as_ptr(),
                p.proc_.as_ptr(),
                c"proc".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"sysfs".as_ptr(),
                p.sys.as_ptr(),
                c"sysfs".as_ptr(),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            ))?;
            check(libc::mount(
                c"tmpfs".as_ptr(),
                p.dev.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID,
                c"mode=755".as_ptr().cast(),
            ))?;
            for d in &p.dev_dirs {
                check(libc::mkdir(d.as_ptr(), 0o755)).or_else(|e| {
                    if e.raw_os_error() == Some(libc::EEXIST) {
                        Ok(())
                    } else {
                        Err(e)
                    }
                })?;
            }
            for (path, mode, dev) in &p.nodes {
                check(libc::mknod(path.as_ptr(), *mode, *dev))?;
                check(libc::chmod(path.as_ptr(), 0o666))?;
            }
            check(libc::mount(
                c"devpts".as_ptr(),
                p.pts.as_ptr(),
                c"devpts".as_ptr(),
                libc::MS_NOSUID | libc::MS_NOEXEC,
                c"newinstance,ptmxmode=0666,mode=0620".as_ptr().cast(),
            ))?;
            check(libc::symlink(c"pts/ptmx".as_ptr(), p.ptmx.as_ptr()))?;
            check(libc::mount(
                c"shm".as_ptr(),
                p.shm.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                c"mode=1777".as_ptr().cast(),
            ))?;
        }
        check(libc::chroot(p.root.as_ptr()))?;
        check(libc::chdir(c"/".as_ptr()))?;
        // The bounding set: everything but the container's capabilities (numbers the kernel does
        // not have answer EINVAL).
        let keep = |c: u32| {
            let (i, bit) = ((c / 32) as usize, 1u32 << (c % 32));
            p.caps.0[i].permitted & bit != 0
        };
        for c in 0..64u32 {
            if !keep(c) {
                let r = libc::prctl(libc::PR_CAPBSET_DROP, c as libc::c_ulong, 0, 0, 0);
                if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
        check(libc::setgroups(p.groups.len(), p.groups.as_ptr()))?;
        check(libc::setresgid(p.gid, p.gid, p.gid))?;
        check(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0))?;
        check(libc::setresuid(p.uid, p.uid, p.uid))?;
        let header = CapHeader {
            version: CAP_V3,
            pid: 0,
        };
        let data = p.caps.0;
        check(
            libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr())
                as libc::c_int,
        )?;
        // No ambient capability (containerd's CRI sets none).
        check(libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        ))?;
        if p.no_new_privs {
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        }
    }
    Ok(())
}

//! Reading `/proc`: a process's parent, state and name, its CPU times, its children, QEMU
//! recognition and RSS.
//!
//! The monitor finds a leftover QEMU the way virt-handler does (`pkg/hypervisor/kvm/runtime.go`,
//! `pkg/hypervisor/common/process.go` of KubeVirt v1.9.0): among the direct children of PID 1, a
//! process whose name starts with `qemu-system` or `qemu-kvm`. It looks only at its own children,
//! so that several monitors on one host (tests, `qlauncher run`) never touch each other's QEMU.
use std::fs;

/// What `/proc/<pid>/stat` says about a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    /// Process id.
    pub pid: i32,
    /// `comm`: the first 15 bytes of the executable name (or `prctl(PR_SET_NAME)`).
    pub comm: String,
    /// State letter: `R`, `S`, `D`, `Z` (zombie), `T`, ...
    pub state: char,
    /// Parent process id.
    pub ppid: i32,
}

impl ProcStat {
    /// True for a zombie (exited, not yet reaped).
    pub fn is_zombie(&self) -> bool {
        self.state == 'Z'
    }
}

/// Parses the text of `/proc/<pid>/stat`; `comm` may hold spaces and parentheses.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let pid = text[..open].trim().parse().ok()?;
    let comm = text.get(open + 1..close)?.to_string();
    let mut rest = text.get(close + 1..)?.split_whitespace();
    let state = rest.next()?.chars().next()?;
    let ppid = rest.next()?.parse().ok()?;
    Some(ProcStat {
        pid,
        comm,
        state,
        ppid,
    })
}

/// `utime` and `stime` (clock ticks) of a `/proc/<pid>/stat` line.
pub fn stat_times(stat: &str) -> Option<(u64, u64)> {
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) ... utime(14) stime(15): indices 11 and 12 here.
    Some((fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?))
}

/// Reads `/proc/<pid>/stat`; `None` when the process is gone.
pub fn stat(pid: i32) -> Option<ProcStat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Every process whose parent is `parent`: read from `/proc/<parent>/task/*/children` (one file
/// per thread, `CONFIG_PROC_CHILDREN`), else found by scanning every `/proc/*/stat`.
pub fn children(parent: i32) -> Vec<ProcStat> {
    if let Some(pids) = listed_children(parent) {
        return pids
            .into_iter()
            .filter_map(stat)
            .filter(|s| s.ppid == parent)
            .collect();
    }
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(stat)
        .filter(|s| s.ppid == parent)
        .collect()
}

/// The pids the kernel lists as `parent`'s children, over all its threads; `None` when the
/// kernel has no `children` files (or `parent` is gone).
fn listed_children(parent: i32) -> Option<Vec<i32>> {
    let mut pids = Vec::new();
    for task in fs::read_dir(format!("/proc/{parent}/task")).ok()?.flatten() {
        let text = fs::read_to_string(task.path().join("children")).ok()?;
        pids.extend(
            text.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    pids.sort_unstable();
    pids.dedup();
    Some(pids)
}

/// `/proc/<pid>/cmdline` split at NUL bytes; `None` when gone, empty for a zombie.
pub fn cmdline(pid: i32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}

/// True when the name is a QEMU system emulator's (`qemu-system-*`, `qemu-kvm`), matching either
/// the `comm` or the base name of `argv[0]`.
pub fn is_qemu_name(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    base.starts_with("qemu-system") || base.starts_with("qemu-kvm")
}

/// The live (non-zombie) QEMU processes among the children of `parent`.
pub fn qemu_children(parent: i32) -> Vec<ProcStat> {
    children(parent)
        .into_iter()
        .filter(|s| !s.is_zombie())
        .filter(|s| {
            is_qemu_name(&s.comm)
                || cmdline(s.pid)
                    .and_then(|argv| argv.first().map(|a| is_qemu_name(a)))
                    .unwrap_or(false)
        })
        .collect()
}

/// Resident set size of a process in KiB (`VmRSS` of `/proc/<pid>/status`); `None` when gone.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_comm() {
        let text = "4242 (a) b (c)) Z 17 4242 4242 0 -1 4194560 0 0";
        assert_eq!(
            parse_stat(text),
            Some(ProcStat {
                pid: 4242,
                comm: "a) b (c)".into(),
                state: 'Z',
                ppid: 17,
            })
        );
    }

    #[test]
    fn qemu_names() {
        for (name, expected) in [
            ("qemu-system-x86", true),
            ("/usr/bin/qemu-system-x86_64", true),
            ("/usr/libexec/qemu-kvm", true),
            ("qemu-img", false),
            ("virt-launcher", false),
        ] {
            assert_eq!(is_qemu_name(name), expected, "{name}");
        }
    }

    #[test]
    fn children_of_this_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id() as i32;
        let found = children(me).iter().any(|c| c.pid == child.id() as i32);
        let _ = child.kill();
        let _ = child.wait();
        assert!(found);
    }

    #[test]
    fn own_stat_and_rss() {
        let me = std::process::id() as i32;
        let s = stat(me).expect("own stat");
        assert_eq!((s.pid, s.state == 'Z'), (me, false));
        assert!(rss_kib(me).unwrap_or(0) > 0);
    }
}

"""The host side of a run: the pod's binaries and their page cache, QEMU's version record, the
launcher's start line, the pod's memory cgroup, and the machine's description.
"""

import json
import os
import platform
import subprocess
import time
from pathlib import Path

from .common import BIN, REPO, STARTED, first_line, log


def pod_binaries():
    """The binaries a pod runs besides QEMU: qlauncher (also the launcher, as the image's
    virt-launcher is a link to it) and, when built next to it, the dedicated virt-launcher-monitor
    (`qlauncher run` then execs it, as the image does)."""
    return [p for p in (BIN, BIN.parent / "virt-launcher-monitor") if p.exists()]


def qemu_binary():
    """The QEMU both qlauncher and bare runs exec (resolved on PATH)."""
    import shutil
    found = shutil.which("qemu-system-x86_64")
    return Path(os.path.realpath(found)) if found else None


def make_version_record(work):
    """`qlauncher qemu-version-record` once into `work`; the path, or None when it failed (the
    launcher then probes QEMU itself, and the report says so)."""
    out = work / "qemu-version.json"
    r = subprocess.run([str(BIN), "qemu-version-record", "--out", str(out)], capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        log(f"qemu-version-record failed ({r.returncode}): {r.stderr.strip()[-300:]}")
        return None
    return out


def started_line(log_path):
    """The launcher's JSON log line STARTED as a dict, or None."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if STARTED in line:
            try:
                return json.loads(line[line.index("{"):])
            except ValueError:
                return None
    return None


def wall(ts):
    """An RFC 3339 UTC timestamp of the launcher's log as seconds since the epoch."""
    from datetime import datetime
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def evict_page_cache(paths):
    """Drops the page cache of `paths` (posix_fadvise DONTNEED), so the next run faults its
    binary in from scratch and the memory figures do not depend on what ran before."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class MemCgroup:
    """A memory cgroup below this script's own (v2 when its memory controller is there, else v1),
    standing in for the pod's: its charge (`memory.current` / `memory.usage_in_bytes`) counts
    anonymous memory and the page cache its processes fault in first, which is what a pod's
    memory limit sees. `path` is None when no memory cgroup can be made (the figure is then n/a)."""

    counter = 0

    def __init__(self):
        MemCgroup.counter += 1
        name = f"qlbench-{os.getpid()}-{MemCgroup.counter}"
        self.path, self.usage = None, None
        own = {}
        try:
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                _, ctrls, path = line.split(":", 2)
                for c in (ctrls.split(",") if ctrls else [""]):
                    own[c] = path
        except OSError:
            return
        v2 = Path("/sys/fs/cgroup")
        candidates = []
        controllers = v2 / "cgroup.controllers"
        if controllers.exists() and "memory" in controllers.read_text().split():
            candidates.append((v2 / own.get("", "/").lstrip("/") / name, "memory.current"))
        if "memory" in own and Path("/sys/fs/cgroup/memory").is_dir():
            candidates.append((Path("/sys/fs/cgroup/memory") / own["memory"].lstrip("/") / name,
                               "memory.usage_in_bytes"))
        for path, usage in candidates:
            try:
                path.mkdir()
                self.path, self.usage = path, usage
                return
            except OSError:
                continue

    def enter(self):
        """For preexec_fn: moves the calling (child) process into the cgroup."""
        if self.path:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def charge_kib(self):
        if not self.path:
            return None
        try:
            return int((self.path / self.usage).read_text()) // 1024
        except OSError:
            return None

    def remove(self):
        if not self.path:
            return
        end = time.monotonic() + 10
        while time.monotonic() < end:
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def machine_info():
    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
    return {
        "kernel": platform.release(),
        "cpu": f"{cpu}, {os.cpu_count()} CPUs",
        "memory": f"{int(mem) // 1024} MiB",
        "uptime": first_line(["uptime"]),
        "qemu": first_line(["qemu-system-x86_64", "--version"]),
        "qemu-img": first_line(["qemu-img", "--version"]),
        "rustc": first_line(["rustc", "--version"]),
        "nft": first_line(["nft", "--version"]),
        "ip": first_line(["ip", "-V"]),
        "xorriso": first_line(["xorrisofs", "-version"]),
        "genisoimage": first_line(["genisoimage", "--version"]),
        "libvirt": first_line(["dpkg-query", "-W", "-f", "${Version}", "libvirt-daemon"]),
        "qlauncher": first_line(["git", "-C", str(REPO), "describe", "--always", "--dirty"]),
        # The launchers inherit the environment: `QLAUNCHER_TRIM=fault-around scripts/bench`
        # measures memory with fault-around kept (monitor/src/trim.rs).
        "QLAUNCHER_TRIM": os.environ.get("QLAUNCHER_TRIM", "unset (trim on, fault-around off)"),
    }

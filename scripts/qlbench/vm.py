"""The runs of one VM: a `qlauncher run` process tree, and bare QEMU with qlauncher's argv.
"""

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from . import common
from .common import BIN, GUEST, MARKER
from .domain import vmi_yaml
from .host import started_line, wall
from .procs import comm, file_has, is_qemu, kib, tree, wait_for, wait_gone
from .qmp import Qmp


class QlVm:
    """One `qlauncher run` process tree."""

    counter = 0

    def __init__(self, work, tag):
        QlVm.counter += 1
        self.name = f"qlbench-{tag}-{QlVm.counter}"
        self.root = work / f"v{QlVm.counter}"  # short: unix socket paths stay under 108 bytes
        self.root.mkdir(parents=True)
        self.vmi = self.root / "vmi.yaml"
        self.vmi.write_text(vmi_yaml(self.name))
        if common.VERSION_RECORD:
            dest = self.root / "usr/share/qlauncher/qemu-version.json"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(common.VERSION_RECORD.read_bytes())
        self.log = open(self.root / "launcher.log", "wb")
        self.proc = None
        self.qemu = None

    def start(self, cgroup=None):
        self.cgroup = cgroup
        self.t0_wall = time.time()
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [str(BIN), "run", str(self.vmi), "--root", str(self.root), "--emulation", "on",
             "--kernel-boot-dir", str(GUEST)],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=cgroup.enter if cgroup else None)
        return self

    def launcher_sock(self, query):
        """`qlauncher launcher-sock SOCKET QUERY` against this VM's command socket; True on success."""
        sock = self.root / "var/run/kubevirt/sockets/launcher-sock"
        r = subprocess.run([str(BIN), "launcher-sock", str(sock), query], capture_output=True,
                           timeout=30)
        return r.returncode == 0

    def private(self):
        return self.root / "var/run/kubevirt-private"

    def serial_log(self):
        found = list(self.private().glob("*/virt-serial0-log"))
        return found[0] if found else None

    def find_qemu(self):
        for p in tree(self.proc.pid):
            if is_qemu(p):
                return p
        return None

    def running(self):
        """QMP `running`: SyncVMI publishes QEMU's pid after its `cont` returned, and the
        launcher then logs `domain started, watching QEMU` (src/monitor/launcher.rs)."""
        return file_has(self.root / "launcher.log", b"domain started, watching QEMU")

    def wait_running(self, timeout=120):
        wait_for(lambda: self.running() or self.dead(), timeout, f"{self.name} running")
        if self.dead():
            raise RuntimeError(f"{self.name} exited: {(self.root / 'launcher.log').read_text()[-2000:]}")
        self.t_running = time.monotonic() - self.t0
        # Exec of `qlauncher run` to the launcher's own timestamp of `cont` returned: no poll
        # granularity, no wait for the log line after it.
        line = started_line(self.root / "launcher.log")
        self.breakdown = None
        if line and line.get("timestamp"):
            self.t_running = wall(line["timestamp"]) - self.t0_wall
            self.breakdown = {k: (float(v) if k.endswith("_ms") else v) for k, v in line.items()
                              if k.endswith("_ms") or k.endswith("_source")}
        self.qemu = wait_for(self.find_qemu, 10, "qemu pid")
        return self.t_running

    def wait_boot(self, timeout=300):
        wait_for(lambda: (s := self.serial_log()) and file_has(s, MARKER), timeout,
                 f"{self.name} boot ok")
        self.t_boot = time.monotonic() - self.t0
        return self.t_boot

    def dead(self):
        return self.proc.poll() is not None

    def memory(self):
        """{'launcher_rss','launcher_pss','qemu_rss','qemu_pss'} in KiB, and the process names."""
        m = {"launcher_rss": 0, "launcher_pss": 0, "qemu_rss": 0, "qemu_pss": 0, "procs": []}
        for p in tree(self.proc.pid):
            k = "qemu" if is_qemu(p) else "launcher"
            m[f"{k}_rss"] += kib(p, "VmRSS")
            m[f"{k}_pss"] += kib(p, "Pss")
            if k == "launcher":
                m["procs"].append(f"{comm(p)}:{kib(p, 'VmRSS')}")
        m["cgroup"] = self.cgroup.charge_kib() if getattr(self, "cgroup", None) else None
        return m

    def argv(self):
        return Path(f"/proc/{self.qemu}/cmdline").read_bytes().split(b"\0")[:-1]

    def stop(self):
        if self.proc is None:
            return
        pids = tree(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            pass
        wait_gone(pids, 5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def bare_qemu(argv, work, runs):
    """Runs qlauncher's own QEMU argv directly (QEMU does its -S; this script sends cont)."""
    argv = [a.decode() for a in argv]
    qmp = None
    qmp_fd = None  # the launcher's pre-bound QMP listener (`-chardev socket,...,fd=N`)
    for i, a in enumerate(argv):
        if a in ("-qmp", "-chardev") and "charmonitor" in argv[i + 1] or a == "-qmp":
            m = re.search(r"path=([^,]+)", argv[i + 1]) or re.search(r"unix:([^,]+)", argv[i + 1])
            if m and qmp is None:
                qmp = m.group(1)
            m = re.search(r"(?:^|,)fd=(\d+)", argv[i + 1])
            if m and "charmonitor" in argv[i + 1]:
                qmp_fd = int(m.group(1))
    if qmp_fd is not None:
        # Same argv, same start: this script binds and listens as the launcher does and QEMU
        # inherits the listener as fd N.
        qmp = str(work / "bare-qmp.sock")
    serial = None
    for a in argv:
        m = re.search(r"logfile=([^,]+)", a)
        if m and "serial" in a:
            serial = m.group(1)
    if qmp is None or serial is None:
        raise RuntimeError(f"cannot find QMP socket or serial log in {argv}")
    out = {"running": [], "boot": [], "qemu_rss": [], "qemu_pss": []}
    for _ in range(runs):
        for f in (qmp, serial, serial.replace("-log", "")):
            try:
                os.unlink(f)
            except OSError:
                pass
        t0 = time.monotonic()
        listener = None
        spawn = {}
        if qmp_fd is not None:
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(qmp)
            listener.listen(16)
            lfd = listener.fileno()
            spawn = {"pass_fds": (lfd, qmp_fd), "preexec_fn": lambda: os.dup2(lfd, qmp_fd)}
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **spawn)
        if listener is not None:
            listener.close()
        try:
            q = Qmp(qmp)
            q.cmd("cont")
            out["running"].append(time.monotonic() - t0)
            wait_for(lambda: file_has(serial, MARKER), 300, "bare boot ok")
            out["boot"].append(time.monotonic() - t0)
            time.sleep(1)
            out["qemu_rss"].append(kib(p.pid, "VmRSS"))
            out["qemu_pss"].append(kib(p.pid, "Pss"))
            q.cmd("quit")
            q.close()
            p.wait(10)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out

"""/proc helpers: memory of a process, its children and tree, liveness, waiting.
"""

import os
import re
import signal
import time
from pathlib import Path


def kib(pid, field):
    """VmRSS from status, or Pss from smaps_rollup, in KiB; 0 when the process is gone."""
    try:
        if field == "Pss":
            text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        else:
            text = Path(f"/proc/{pid}/status").read_text()
        m = re.search(rf"^{field}:\s+(\d+)", text, re.M)
        return int(m.group(1)) if m else 0
    except OSError:
        return 0


def comm(pid):
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def children(pid):
    out = []
    try:
        for t in os.listdir(f"/proc/{pid}/task"):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{t}/children").read_text().split()]
    except OSError:
        pass
    return out


def tree(pid):
    """pid and all its descendants."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        seen.append(p)
        todo += children(p)
    return seen


def is_qemu(pid):
    return comm(pid).startswith("qemu")


def alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def wait_gone(pids, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end and any(alive(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.005)
    raise TimeoutError(what)


def file_has(path, needle):
    try:
        with open(path, "rb") as f:
            return needle in f.read()
    except OSError:
        return False

"""What every part shares: the repository, the guest and the binaries, the boot marker, logging,
subprocess helpers and the median/min/max summary.
"""

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent.parent
GUEST = Path(os.environ.get("QLAUNCHER_GUEST_DIR", "/var/cache/qlauncher/guest"))
BIN = Path(os.environ.get("QLAUNCHER_BENCH_BIN", REPO / "target" / "release" / "qlauncher"))
COMPAT = REPO / "target" / "release" / "qlauncher-compat"
MARKER = b"QLG: boot ok"
# The launcher's log line once QMP `cont` returned (src/sync/start.rs), with the start's breakdown.
STARTED = "domain started (sync received to cont acknowledged)"
# QEMU's version record (`qlauncher qemu-version-record`), copied into every VM root as the image
# build puts it into the image, so the launcher starts without running `qemu --version`.
VERSION_RECORD = None
MEM_MI = 128


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw).stdout


def first_line(cmd):
    try:
        out = subprocess.run(cmd, text=True, capture_output=True, timeout=20)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except Exception as e:  # noqa: BLE001 - best effort version strings
        return f"unavailable ({e})"


def stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}

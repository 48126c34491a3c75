"""The soak: one VM with stats and domain calls at an interval, and its memory growth.
"""

import statistics
import time

from .host import MemCgroup, evict_page_cache, pod_binaries
from .vm import QlVm


def soak(work, seconds, interval=10.0):
    """One VM for `seconds`: every `interval` the launcher's stats and domain calls
    (GetDomainStats, GetDomain, Ping through `qlauncher launcher-sock`, as virt-handler polls them)
    while the launcher polls the guest agent by itself; memory sampled each time. Returns the
    samples and the growth of the last quarter's median over the first quarter's."""
    evict_page_cache(pod_binaries())
    cg = MemCgroup()
    vm = QlVm(work, "soak").start(cg)
    samples, calls, failed = [], 0, 0
    try:
        vm.wait_running()
        vm.wait_boot()
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            for q in ("domain-stats", "get-domain", "ping"):
                calls += 1
                failed += 0 if vm.launcher_sock(q) else 1
            m = vm.memory()
            samples.append({"t": time.monotonic() - t0, "launcher_rss": m["launcher_rss"],
                            "launcher_pss": m["launcher_pss"], "cgroup": m["cgroup"]})
            time.sleep(interval)
    finally:
        vm.stop()
        cg.remove()
    q = max(1, len(samples) // 4)
    out = {"seconds": seconds, "interval": interval, "calls": calls, "failed_calls": failed,
           "samples": samples}
    for k in ("launcher_rss", "launcher_pss", "cgroup"):
        first = [x[k] for x in samples[:q] if x[k] is not None]
        last = [x[k] for x in samples[-q:] if x[k] is not None]
        out[f"{k}_growth"] = (statistics.median(last) / statistics.median(first) - 1
                              if first and last and statistics.median(first) else None)
    return out

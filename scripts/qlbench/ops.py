"""The per-operation figures: the cargo benches, parsed into table rows.
"""

import re
import subprocess

from .common import REPO, log


BENCHES = ["cmdline_convert", "storage", "net_setup", "net_dhcp", "qmp"]


def cargo_bench(name, *args, env=None):
    log(f"cargo bench --bench {name} -- {' '.join(args)}")
    r = subprocess.run(["cargo", "bench", "--quiet", "--bench", name, "--"] + list(args),
                       cwd=REPO, text=True, capture_output=True, env=env)
    if r.returncode != 0:
        log(f"{name} failed:\n{r.stderr[-3000:]}")
        return ""
    return r.stdout


OPS = ["cmdline_convert", "storage", "net_setup", "net_dhcp", "qmp"]


def per_operation(runs, which=OPS):
    """The cargo benches named in `which` (a subset of OPS), parsed into table rows."""
    ops = []  # (operation, qlauncher value, alternative name, alternative value, unit)
    raw = {}

    if "cmdline_convert" in which:
        out = cargo_bench("cmdline_convert", "--warm-up-time", "1", "--measurement-time", "2",
                          "basic$")
        raw["cmdline_convert"] = out
        m = re.search(r"convert\+render/basic\s+time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", out)
        if m:
            v = float(m.group(1)) * {"ns": 1e-3, "µs": 1, "us": 1, "ms": 1e3}[m.group(2)]
            ops.append(("VMI conversion per VMI (fixture basic.yaml: converter + argv + QMP plan)", v,
                        "us", None, None, None,
                        "KubeVirt: Go converter + domain XML + libvirt's XML parse and argv build (not measurable here)"))

    if "storage" in which:
        out = cargo_bench("storage", "20")
        raw["storage"] = out
        for line in out.splitlines():
            m = re.match(r"(.+?)\s+native\s+([\d.]+) ms\s+(\S+(?: \S+)*?)\s+([\d.]+) ms\s+ratio", line)
            if m:
                ops.append((m.group(1).strip(), float(m.group(2)), "ms", m.group(3).strip(),
                            float(m.group(4)), None, ""))

    if "net_setup" in which:
        out = cargo_bench("net_setup", str(max(runs * 2, 5)))
        raw["net_setup"] = out
        m = re.search(r"net-setup qlauncher (\S+) (\S+) (\S+) tools (\S+) (\S+) (\S+)", out)
        if m:
            v = [float(x) for x in m.groups()]
            ops.append(("pod network setup (masquerade, v4+v6)", v[0], "ms", "ip + nft processes",
                        v[3], (v[1], v[2], v[4], v[5]), ""))

    if "net_dhcp" in which:
        out = cargo_bench("net_dhcp")
        raw["net_dhcp"] = out
        m = re.search(r"DISCOVER->ACK latency .*?min (\d+) us, median (\d+) us, p99 (\d+) us, max (\d+) us", out)
        if m:
            ops.append(("DHCP DISCOVER to ACK", float(m.group(2)) / 1000, "ms", None, None,
                        (float(m.group(1)) / 1000, float(m.group(4)) / 1000, None, None),
                        "KubeVirt serves DHCP in virt-launcher too (Go, same packets); no separate tool to compare"))

    if "qmp" in which:
        raw["qmp"] = cargo_bench("qmp")
    return ops, raw


def qmp_hotplug_ms(raw, what="hotplug virtio-blk disk attach"):
    """A figure of the qmp bench (median ms), if printed."""
    for line in raw.get("qmp", "").splitlines():
        if line.startswith(what) and "median=" in line:
            return float(re.search(r"median=\s*([\d.]+) ms", line).group(1)), line.strip()
    return None, None

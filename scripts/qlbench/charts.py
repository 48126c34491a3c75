"""SVG charts (written next to BENCHMARKS.md).
"""

from pathlib import Path

from .common import stats


def svg_bars(title, unit, groups, note=""):
    """A horizontal bar chart: groups = [(label, [(series, value or None), ...]), ...]. Each
    bar is labelled with its value, and each group with its ratio to the group's first bar."""
    colors = ["#2b6cb0", "#dd6b20", "#718096", "#38a169"]
    bar_h, gap, left, width = 18, 10, 290, 420
    values = [v for _, bars in groups for _, v in bars if v is not None]
    vmax = max(values) if values else 1
    rows = sum(len(b) for _, b in groups)
    height = 50 + rows * (bar_h + 4) + len(groups) * gap + (20 if note else 0)
    esc = lambda t: str(t).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 130}" height="{height}" '
           'font-family="sans-serif" font-size="12">',
           f'<text x="10" y="20" font-size="14" font-weight="bold">{esc(title)}</text>']
    y = 40
    for label, bars in groups:
        base = bars[0][1] if bars and bars[0][1] else None
        for i, (series, v) in enumerate(bars):
            out.append(f'<text x="{left - 6}" y="{y + 13}" text-anchor="end">{esc(label + " · " + series if i == 0 else series)}</text>')
            if v is not None:
                w_ = max(1, v / vmax * width)
                ratio_txt = f" ({v / base:.2f}x)" if base and i > 0 else ""
                out.append(f'<rect x="{left}" y="{y}" width="{w_:.1f}" height="{bar_h}" fill="{colors[i % len(colors)]}"/>')
                out.append(f'<text x="{left + w_ + 4:.1f}" y="{y + 13}">{v:.3g} {esc(unit)}{ratio_txt}</text>')
            else:
                out.append(f'<text x="{left + 4}" y="{y + 13}" fill="#999">n/a</text>')
            y += bar_h + 4
        y += gap
    if note:
        out.append(f'<text x="10" y="{y + 8}" fill="#555">{esc(note)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_charts(r, out_dir):
    """bench-start.svg, bench-memory.svg, bench-scaling.svg in out_dir; returns their names."""
    ql, bare, lv = r["qlauncher"], r["bare"], r.get("libvirt", {}).get("vm")
    med = lambda xs: (stats(xs) or {}).get("median")  # noqa: E731
    mib = lambda v: v / 1024 if v is not None else None  # noqa: E731
    start = [("to QMP running", [("qlauncher", med(ql["running"])),
                                 ("bare QEMU, same argv", med(bare["running"]))]
              + ([("libvirt virsh create", med(lv["create"]))] if lv else [])),
             ("to boot ok", [("qlauncher", med(ql["boot"])), ("bare QEMU, same argv", med(bare["boot"]))]
              + ([("libvirt virsh create", med(lv["boot"]))] if lv else []))]
    memory = [("non-QEMU RSS", [("qlauncher", mib(med(ql["launcher_rss"])))]
               + ([("libvirt daemons", mib(med(lv["daemon_rss"])))] if lv else [])
               + [("KubeVirt (published)", 123.6)]),
              ("non-QEMU PSS", [("qlauncher", mib(med(ql["launcher_pss"])))]
               + ([("libvirt daemons", mib(med(lv["daemon_pss"])))] if lv else [])),
              ("pod cgroup charge", [("qlauncher + QEMU", mib(med(ql.get("cgroup", []))))]),
              ("QEMU RSS", [("under qlauncher", mib(med(ql["qemu_rss"]))),
                            ("bare", mib(med(bare["qemu_rss"])))])]
    scaling = [(f"{s['n']} VMs {s['mode']}", [("launcher RSS per VM", s["launcher_rss"] / 1024),
                                              ("launcher PSS per VM", s["launcher_pss"] / 1024)])
               for s in r.get("scale", [])]
    charts = {"bench-start.svg": svg_bars("Start latency (median, s; ratio to qlauncher)", "s", start),
              "bench-memory.svg": svg_bars("Memory while the guest runs (median, MiB)", "MiB", memory),
              "bench-scaling.svg": svg_bars("Scaling: qlauncher's memory per VM (MiB)", "MiB", scaling)}
    for name, text in charts.items():
        (Path(out_dir) / name).write_text(text)
    return list(charts)

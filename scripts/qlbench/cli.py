"""The command line: the options, the run's phases in order, the results file and the report.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import common
from .charts import write_charts
from .common import BIN, GUEST, REPO, first_line, log
from .host import (
    MemCgroup,
    evict_page_cache,
    machine_info,
    make_version_record,
    pod_binaries,
    qemu_binary,
)
from .libvirt import libvirt_phase, run_libvirt
from .ops import OPS, per_operation
from .procs import wait_for
from .report import render
from .size import image_size, render_size
from .soak import soak
from .vm import QlVm, bare_qemu


def main(doc):
    """Runs scripts/bench; `doc` is the entry script's docstring (the --help text)."""
    a = options(doc)
    if a.libvirt_phase:
        libvirt_phase(a.libvirt_phase)
        return
    if a.render_from:
        render_only(a)
        return
    if os.geteuid() != 0:
        sys.exit("scripts/bench needs root (network namespaces, nftables, libvirt)")
    if a.soak_only:
        soak_only(a)
        return
    if a.size_only:
        size_only()
        return
    full_run(a)


def options(doc):
    """The command line's options; `doc` is the --help text."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=str(REPO / "BENCHMARKS.md"))
    ap.add_argument("--skip-libvirt", action="store_true")
    ap.add_argument("--skip-ops", action="store_true")
    ap.add_argument("--scale", default="1,5,10")
    ap.add_argument("--render-from", metavar="JSON",
                    help="only write the report from a results file (target/bench-results.json)")
    ap.add_argument("--soak", type=int, metavar="SECONDS",
                    help="also run one VM this long with stats and domain calls every 10 s and "
                         "report its memory growth (the issue's soak: 3600)")
    ap.add_argument("--soak-only", action="store_true",
                    help="run only the soak (--soak SECONDS) and write its result to --soak-out; "
                         "no BENCHMARKS.md (a later full run adds it with --soak-result)")
    ap.add_argument("--soak-out", metavar="JSON", help="with --soak-only: where the soak's result goes")
    ap.add_argument("--soak-result", metavar="JSON",
                    help="a soak result written by --soak-only, reported in the Soak section (also "
                         "with --render-from, to merge a soak that ended after the full run)")
    ap.add_argument("--idle", type=int, default=60, metavar="SECONDS",
                    help="after the memory sample at `boot ok` + 1 s, idle this long and sample "
                         "again (0: skip)")
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--skip-migration", action="store_true")
    ap.add_argument("--migration-runs", type=int, metavar="N",
                    help="runs of the live-migration phase (default: --runs; 15 give the rank "
                         "test of the downtimes)")
    ap.add_argument("--migration-result", metavar="MD",
                    help="with --render-from: the section of a later `scripts/bench-migration "
                         "--markdown MD` replaces the run's own (the section says so)")
    ap.add_argument("--skip-labeller", action="store_true")
    ap.add_argument("--skip-backup", action="store_true",
                    help="skip the push backup section (scripts/bench-backup)")
    ap.add_argument("--skip-size", action="store_true",
                    help="skip the image size phase (the compute container's tree, `du -sb`)")
    ap.add_argument("--size-only", action="store_true",
                    help="only the image size phase, from the release binaries already built; "
                         "prints its section (no BENCHMARKS.md)")
    ap.add_argument("--ops", default=",".join(OPS),
                    help="the cargo benches of the per-operation table (default: all of "
                         + ", ".join(OPS) + ")")
    ap.add_argument("--libvirt-phase", help=argparse.SUPPRESS)
    return ap.parse_args()


def render_only(a):
    """--render-from: the report (and charts) from a stored results file, with a soak result
    merged in when given."""
    r = json.loads(Path(a.render_from).read_text())
    if a.soak_result:
        # The hour soak ran beside the full run and ended after it: merge it in and keep it.
        r["soak"] = json.loads(Path(a.soak_result).read_text())
        Path(a.render_from).write_text(json.dumps(r, indent=1))
    if a.migration_result:
        # More migration runs than the full run had (the rank test needs about 15 a side).
        md = Path(a.migration_result)
        stamp = time.strftime("%H:%M UTC", time.gmtime(md.stat().st_mtime))
        r["migration_md"] = (md.read_text().rstrip("\n")
                             + f"\n\nThis section is from a separate `scripts/bench-migration` "
                             f"run that ended at {stamp}, after the full run; the rest of this "
                             "file is from the full run.\n")
        Path(a.render_from).write_text(json.dumps(r, indent=1))
    write_charts(r, Path(a.out).parent)
    text = render(r)
    Path(a.out).write_text(text)
    print(text)


def soak_only(a):
    """--soak-only: one VM for --soak seconds, its result written to --soak-out."""
    if not a.soak or not a.soak_out:
        sys.exit("--soak-only needs --soak SECONDS and --soak-out JSON")
    if not BIN.exists():
        sys.exit(f"{BIN} is not built (cargo build --release, or QLAUNCHER_BENCH_BIN)")
    work = Path(tempfile.mkdtemp(prefix="qls", dir="/tmp"))
    try:
        common.VERSION_RECORD = make_version_record(work)
        log(f"soak only: one VM for {a.soak} s with stats and domain calls")
        res = soak(work, a.soak)
    finally:
        subprocess.run(["rm", "-rf", str(work)])
    res["info"] = machine_info()
    res["uptime_end"] = first_line(["uptime"])
    Path(a.soak_out).write_text(json.dumps(res, indent=1))
    log(f"soak result written to {a.soak_out}: RSS growth {res.get('launcher_rss_growth')}, "
        f"{res['calls']} calls, {res['failed_calls']} failed")


def size_only():
    """--size-only: the image size phase from the binaries already built, its section printed."""
    if not BIN.exists():
        sys.exit(f"{BIN} is not built (cargo build --release, or QLAUNCHER_BENCH_BIN)")
    lines = []
    render_size(image_size(), lines.append)
    print("\n".join(lines))


def full_run(a):
    """The whole benchmark: the pod's binaries built, then the phases in order (qlauncher and bare
    QEMU, scaling, migration, node labeller, soak, libvirt, per operation), the results file,
    charts and BENCHMARKS.md. Every VM and the background build are stopped at the end."""
    started = time.monotonic()
    info = machine_info()
    log(f"machine: {info['cpu']}, load: {info['uptime']}")
    build_binaries()
    results = {"info": info, "runs": a.runs, "idle_s": a.idle}
    if not a.skip_size:
        # Before the VM phases: the tree is assembled from the release binaries just built.
        results["size"] = image_size()
    bench_build, marker = background_build(a)
    work = Path(tempfile.mkdtemp(prefix="qlb", dir="/tmp"))
    common.VERSION_RECORD = make_version_record(work)
    results["version_record"] = common.VERSION_RECORD is not None
    qemu_bin = qemu_binary()
    vms = []
    try:
        argv = start_and_memory(a, work, qemu_bin, vms, results)
        results["kernel61"] = memory_without_uffd(a, work, vms)
        results["scale"] = scaling(a, work, vms)
        other_scripts(a, results)
        # 6. soak (its own run's result when given: the hour runs beside the full bench).
        if a.soak_result:
            if Path(a.soak_result).exists():
                results["soak"] = json.loads(Path(a.soak_result).read_text())
            else:
                log(f"{a.soak_result} is not there yet (the soak still runs): merge it when it "
                    f"is with scripts/bench --render-from target/bench-results.json --soak-result "
                    f"{a.soak_result} --out {a.out}")
        elif a.soak:
            log(f"soak: one VM for {a.soak} s with stats and domain calls")
            results["soak"] = soak(work, a.soak)

        # 3. libvirt.
        if not a.skip_libvirt:
            log("libvirt: virtlogd + libvirtd in a private mount namespace, virsh create")
            try:
                try:
                    wait_for(lambda: marker.exists() or bench_build.poll() is not None, 900,
                             "qlauncher-compat build")
                except TimeoutError:
                    log("qlauncher-compat not built in time; the hand-derived XML is used")
                results["libvirt"] = run_libvirt(work, a.runs, vms[a.runs - 1], argv)
            except Exception as e:  # noqa: BLE001 - reported in the output
                log(f"libvirt phase failed: {e}")
                results["libvirt_error"] = str(e)

        # 5. per operation.
        if not a.skip_ops:
            # `cargo bench` waits for the background build's lock by itself.
            ops, raw = per_operation(a.runs, [b for b in a.ops.split(",") if b in OPS])
            results["ops"] = ops
            results["raw"] = raw
    finally:
        if bench_build.poll() is None:
            os.killpg(bench_build.pid, signal.SIGTERM)
            bench_build.wait()
        for vm in vms:
            try:
                vm.stop()
            except Exception:  # noqa: BLE001 - cleanup
                pass
        subprocess.run(["rm", "-rf", str(work)])
    results["total_s"] = time.monotonic() - started
    results["uptime_end"] = first_line(["uptime"])
    (REPO / "target" / "bench-results.json").write_text(json.dumps(results, indent=1))
    write_charts(results, Path(a.out).parent)
    text = render(results)
    Path(a.out).write_text(text)
    print(text)


def build_binaries():
    """The test guest when missing, and the release build of the pod's binaries (unless
    QLAUNCHER_BENCH_BIN names a prebuilt one)."""
    if not (GUEST / "vmlinuz").exists():
        log("building the test guest (scripts/build-guest)")
        subprocess.run([str(REPO / "scripts/build-guest")], check=True)
    log("release build of qlauncher (cargo build --release)")
    if not os.environ.get("QLAUNCHER_BENCH_BIN"):  # a prebuilt binary (testing the script)
        # With one bench target selected the dev-dependencies' features are unified in, so this
        # build and the benches' (`cargo bench`, built below) share one set of artifacts.
        subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "qlauncher", "--bin",
                        "virt-launcher-monitor", "--bench", "storage"], cwd=REPO, check=True)


def background_build(a):
    """Starts the background build of qlauncher-compat and the cargo benches; returns the process
    and the marker file it touches once qlauncher-compat is built."""
    # Compile the libvirt XML exporter and then the cargo benches while the VMs run (saves
    # minutes on a small machine; the compile is part of the machine's load in the VM phases).
    log("compiling qlauncher-compat and the cargo benches in the background")
    marker = REPO / "target" / "bench-compat-built"
    if marker.exists():
        marker.unlink()
    chain = ""
    if not a.skip_ops:
        which = [b for b in a.ops.split(",") if b in OPS]
        chain += ("cargo build --release --quiet --bin qlauncher "
                  + " ".join(f"--bench {b}" for b in which) + "; ")
    chain += f"cargo build --release --quiet -p qlauncher-libvirt-xml --bin qlauncher-compat; touch {marker}"
    bench_build = subprocess.Popen(["bash", "-c", chain], cwd=REPO, stdout=subprocess.DEVNULL,
                                   stderr=open(REPO / "target" / "bench-build.log", "wb"),
                                   start_new_session=True)
    return bench_build, marker


# The trim's modes without the userfaultfd registration, as on a kernel before 6.7 (Debian 12's
# 6.1) or under a seccomp profile without userfaultfd (monitor/src/trim.rs, QLAUNCHER_TRIM).
KERNEL61_MODES = {"fallback": "fault-around", "before": "fault-around,readahead"}


def memory_without_uffd(a, work, vms):
    """Phase 2b: the memory of qlauncher's non-QEMU processes as on a 6.1 kernel: the trim's
    switch skips the userfaultfd registration; with (`fallback`, today's code) and without
    (`before`) its MADV_RANDOM fallback. min(--runs, 3) runs per mode, interleaved; RSS and PSS
    1 s after `boot ok` and after min(--idle, 20) s more (two of the launcher's trims)."""
    runs = min(a.runs, 3)
    idle = min(a.idle, 20)
    out = {k: {"rss": [], "pss": [], "idle_rss": [], "idle_pss": [], "procs": None}
           for k in KERNEL61_MODES}
    out["idle_s"] = idle
    for i in range(runs):
        for key, mode in KERNEL61_MODES.items():
            log(f"qlauncher run, QLAUNCHER_TRIM={mode} {i + 1}/{runs}")
            evict_page_cache(pod_binaries())
            os.environ["QLAUNCHER_TRIM"] = mode
            try:
                vm = QlVm(work, "k61").start()
            finally:
                del os.environ["QLAUNCHER_TRIM"]
            vms.append(vm)
            run = sample_run(vm, idle)
            m = run["memory"]
            out[key]["rss"].append(m["launcher_rss"])
            out[key]["pss"].append(m["launcher_pss"])
            out[key]["procs"] = m["procs"]
            if run["idle"]:
                out[key]["idle_rss"].append(run["idle"]["launcher_rss"])
                out[key]["idle_pss"].append(run["idle"]["launcher_pss"])
            vm.stop()
    return out


def sample_run(vm, idle):
    """The sampling both memory phases do on a started VM: waits for `running` and `boot ok`,
    samples the memory 1 s later and, when `idle` (s) is not 0, again `idle` s after that.
    Returns {"running", "boot"} (s from the start), {"memory", "idle"} (`QlVm.memory()`, idle None
    when not sampled). The VM keeps running: the caller stops it."""
    running = vm.wait_running()
    boot = vm.wait_boot()
    time.sleep(1)
    memory = vm.memory()
    idle_memory = None
    if idle:
        time.sleep(idle)
        idle_memory = vm.memory()
    return {"running": running, "boot": boot, "memory": memory, "idle": idle_memory}


def start_and_memory(a, work, qemu_bin, vms, results):
    """Phases 1 and 2: --runs qlauncher runs, each followed by bare QEMU with its argv; their start
    latency and memory into `results`. Returns the first run's QEMU argv (bytes)."""
    # 1 and 2. qlauncher and bare QEMU with the same argv, interleaved run by run (A B A B),
    # so that a change of load hits both. The binaries' page cache is evicted before each
    # qlauncher run; the run's processes live in a memory cgroup of their own (the pod's).
    ql = {"running": [], "boot": [], "launcher_rss": [], "launcher_pss": [], "qemu_rss": [],
          "qemu_pss": [], "cgroup": [], "procs": None, "breakdown": [],
          "idle_launcher_rss": [], "idle_launcher_pss": [], "idle_cgroup": [], "idle_procs": None}
    bare = {"running": [], "boot": [], "qemu_rss": [], "qemu_pss": []}
    argv = None
    for i in range(a.runs):
        log(f"qlauncher run {i + 1}/{a.runs}")
        # Both start from the same state: the binaries each execs are cold (qlauncher's two
        # and QEMU's for this run, QEMU's for the bare run below); shared libraries stay warm.
        evict_page_cache(pod_binaries() + ([qemu_bin] if qemu_bin else []))
        cg = MemCgroup()
        vm = QlVm(work, "start").start(cg)
        vms.append(vm)
        run = sample_run(vm, a.idle)
        ql["running"].append(run["running"])
        ql["boot"].append(run["boot"])
        m = run["memory"]
        for k in ("launcher_rss", "launcher_pss", "qemu_rss", "qemu_pss", "cgroup"):
            ql[k].append(m[k])
        ql["procs"] = m["procs"]
        ql["breakdown"].append(vm.breakdown)
        if run["idle"]:
            m = run["idle"]
            ql["idle_launcher_rss"].append(m["launcher_rss"])
            ql["idle_launcher_pss"].append(m["launcher_pss"])
            ql["idle_cgroup"].append(m["cgroup"])
            ql["idle_procs"] = m["procs"]
        run_argv = vm.argv()
        argv = argv or run_argv
        vm.stop()
        cg.remove()
        # bare QEMU with this run's argv (its root's files are still in place).
        log(f"bare qemu-system-x86_64 with qlauncher's argv {i + 1}/{a.runs}")
        if qemu_bin:
            evict_page_cache([qemu_bin])
        for k, v in bare_qemu(run_argv, work, 1).items():
            bare[k] += v
    results["qlauncher"] = ql
    results["argv"] = [x.decode() for x in argv]
    results["bare"] = bare
    return argv


def scaling(a, work, vms):
    """Phase 4: 1, 5 and 10 VMs (--scale) started one after another and at once; time and memory
    per VM."""
    scale = []
    for n in ([] if a.skip_scale else [int(x) for x in a.scale.split(",") if x]):
        for mode in ("sequential", "parallel"):
            log(f"scaling: {n} VMs {mode}")
            group = []
            t0 = time.monotonic()
            if mode == "sequential":
                for _ in range(n):
                    vm = QlVm(work, f"s{n}").start()
                    group.append(vm)
                    vms.append(vm)
                    vm.wait_running()
            else:
                for _ in range(n):
                    vm = QlVm(work, f"p{n}").start()
                    group.append(vm)
                    vms.append(vm)
                for vm in group:
                    vm.wait_running()
            t_all_running = time.monotonic() - t0
            for vm in group:
                vm.wait_boot(timeout=600)
            t_all_boot = time.monotonic() - t0
            time.sleep(1)
            mem = [vm.memory() for vm in group]
            scale.append({
                "n": n, "mode": mode, "all_running_s": t_all_running, "all_boot_s": t_all_boot,
                "running_per_vm": [vm.t_running for vm in group],
                "boot_per_vm": [vm.t_boot for vm in group],
                "launcher_pss": sum(x["launcher_pss"] for x in mem) / n,
                "launcher_rss": sum(x["launcher_rss"] for x in mem) / n,
                "qemu_rss": sum(x["qemu_rss"] for x in mem) / n,
                "qemu_pss": sum(x["qemu_pss"] for x in mem) / n,
            })
            for vm in group:
                if vm.proc.poll() is None:
                    vm.proc.send_signal(signal.SIGTERM)
            for vm in group:
                vm.stop()
    return scale


def other_scripts(a, results):
    """Phases 7, 7b and 8: live migration (scripts/bench-migration), push backups
    (scripts/bench-backup) and the node labeller (scripts/bench-labeller), each a markdown
    section of its own."""
    # 7. live migration (its own script; libvirt's side unless --skip-libvirt).
    if not a.skip_migration:
        log("live migration: scripts/bench-migration")
        cmd = [str(REPO / "scripts/bench-migration"), "--runs", str(a.migration_runs or a.runs),
               "--json", str(REPO / "target" / "bench-migration.json")]
        if a.skip_libvirt:
            cmd.append("--skip-libvirt")
        mig = subprocess.run(cmd, text=True, stdout=subprocess.PIPE)
        if mig.returncode == 0:
            results["migration_md"] = mig.stdout
        else:
            results["migration_md"] = ("## Live migration\n\nscripts/bench-migration failed "
                                       f"(exit {mig.returncode}); see its log above.\n")

    # 7b. push backups of a CBT overlay against qemu-img convert (its own script).
    if not a.skip_backup:
        log("push backups: scripts/bench-backup")
        bk = subprocess.run([str(REPO / "scripts/bench-backup"), "--runs", str(a.runs),
                             "--json", str(REPO / "target" / "bench-backup.json")],
                            text=True, stdout=subprocess.PIPE)
        results["backup_md"] = bk.stdout if bk.returncode == 0 else (
            "## Backup (push, CBT overlay)\n\nscripts/bench-backup failed "
            f"(exit {bk.returncode}); see its log above.\n")

    # 8. the node labeller (its own script; it needs libvirt's daemon).
    if not a.skip_labeller and not a.skip_libvirt:
        log("node labeller: scripts/bench-labeller")
        lab = subprocess.run([str(REPO / "scripts/bench-labeller"), "--runs", str(a.runs),
                              "--json", str(REPO / "target" / "bench-labeller.json")],
                             text=True, stdout=subprocess.PIPE)
        results["labeller_md"] = lab.stdout if lab.returncode == 0 else (
            "## Node labeller\n\nscripts/bench-labeller failed "
            f"(exit {lab.returncode}); see its log above.\n")

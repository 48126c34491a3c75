"""libvirt (runs as `scripts/bench --libvirt-phase` inside `unshare -m`): the daemons in a private
mount namespace, `virsh create`, memory, attach-device.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from .common import COMPAT, MARKER, REPO, log
from .domain import domain_xml
from .procs import file_has, is_qemu, kib, wait_for


LIBVIRT_DIRS = ["/run/libvirt", "/var/run/libvirt", "/var/lib/libvirt", "/var/cache/libvirt",
                "/var/log/libvirt", "/etc/libvirt"]


def ensure_libvirt():
    if Path("/usr/sbin/libvirtd").exists() and Path("/usr/sbin/virtlogd").exists() and \
            Path("/usr/lib/x86_64-linux-gnu/libvirt/connection-driver/libvirt_driver_qemu.so").exists() \
            and Path("/usr/bin/virsh").exists():
        return
    log("installing Debian's libvirt daemon with apt-get (libvirt-daemon, libvirt-daemon-driver-qemu, libvirt-clients)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    pkgs = ["libvirt-daemon", "libvirt-daemon-driver-qemu", "libvirt-clients"]
    r = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends"] + pkgs, env=env)
    if r.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends"] + pkgs,
                       env=env, check=True)


def libvirt_phase(params_path):
    """Inside a private mount namespace: tmpfs over libvirt's directories, virtlogd + libvirtd,
    `virsh create` runs, memory, attach-device; everything stopped before returning."""
    params = json.loads(Path(params_path).read_text())
    work = Path(params["work"])
    runs = params["runs"]
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    etc_copy = {}
    for f in ("libvirt.conf", "libvirt-admin.conf"):
        p = Path("/etc/libvirt") / f
        if p.exists():
            etc_copy[f] = p.read_text()
    for d in LIBVIRT_DIRS:
        Path(d).mkdir(parents=True, exist_ok=True)
        if os.path.realpath(d) != d:
            continue
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", d], check=True)
    for f, t in etc_copy.items():
        (Path("/etc/libvirt") / f).write_text(t)
    # libvirt's QEMU driver resolves its build's default user (Debian: libvirt-qemu) even when
    # qemu.conf names root, and fails to start where the host has no such user: a private
    # passwd and group with it (in the private /run/libvirt), as scripts/bench-labeller does.
    for db, entry in (("passwd", "libvirt-qemu:x:65534:65534:libvirt-qemu:/nonexistent:/usr/sbin/nologin"),
                      ("group", "libvirt-qemu:x:65534:")):
        text = Path(f"/etc/{db}").read_text()
        if not any(l.startswith("libvirt-qemu:") for l in text.splitlines()):
            private = Path("/run/libvirt") / f"qlbench-{db}"
            private.write_text(text.rstrip("\n") + "\n" + entry + "\n")
            subprocess.run(["mount", "--bind", str(private), f"/etc/{db}"], check=True)
    # Root QEMU without sandboxing extras, as KubeVirt's virtqemud runs QEMU (no cgroup or mount
    # namespace management by libvirt inside the pod, no security driver).
    Path("/etc/libvirt/qemu.conf").write_text(
        'user = "root"\ngroup = "root"\ndynamic_ownership = 0\nsecurity_driver = "none"\n'
        'namespaces = []\ncgroup_controllers = []\nstdio_handler = "logd"\n'
        'remember_owner = 0\n')
    Path("/etc/libvirt/libvirtd.conf").write_text(
        'listen_tls = 0\nlisten_tcp = 0\nlog_outputs = "3:stderr"\n')
    Path("/etc/libvirt/virtlogd.conf").write_text('log_outputs = "3:stderr"\n')
    res = {}
    daemons = []
    uri = "qemu:///system"

    def virsh(*args, check=True):
        return subprocess.run(["virsh", "-q", "-c", uri] + list(args), text=True,
                              capture_output=True, check=check)

    try:
        # Pid files in the private /run/libvirt: the defaults (/run/libvirtd.pid, /run/virtlogd.pid)
        # are the host's, whose lock a concurrent daemon (a test's, the host's own) may hold.
        vl = subprocess.Popen(["/usr/sbin/virtlogd", "--pid-file", "/run/libvirt/virtlogd.pid"], stdout=subprocess.DEVNULL,
                              stderr=open(work / "virtlogd.log", "wb"))
        daemons.append(vl)
        t = time.monotonic()
        ld = subprocess.Popen(["/usr/sbin/libvirtd", "--timeout", "0", "--pid-file",
                               "/run/libvirt/libvirtd.pid"], stdout=subprocess.DEVNULL,
                              stderr=open(work / "libvirtd.log", "wb"))
        daemons.append(ld)
        wait_for(lambda: Path("/run/libvirt/libvirt-sock").exists() or ld.poll() is not None, 60,
                 "libvirtd socket")
        wait_for(lambda: virsh("version", check=False).returncode == 0 or ld.poll() is not None,
                 60, "libvirtd answers")
        res["libvirtd_ready_s"] = time.monotonic() - t
        res["libvirtd_version"] = virsh("version").stdout.strip().replace("\n", "; ")
        res["idle_libvirtd_rss"] = kib(ld.pid, "VmRSS")
        res["idle_virtlogd_rss"] = kib(vl.pid, "VmRSS")
        xml = Path(params["xml"])
        text = xml.read_text()
        dom = re.search(r"<name>([^<]+)</name>", text).group(1)
        serial = Path(re.search(r"<log file=['\"]([^'\"]+)['\"]", text).group(1))
        out = {"create": [], "boot": [], "daemon_rss": [], "daemon_pss": [], "qemu_rss": [],
               "qemu_pss": [], "attach": [], "detach": []}
        disk = work / "hp.raw"
        with open(disk, "wb") as f:
            f.truncate(1 << 20)
        disk_xml = work / "disk.xml"
        disk_xml.write_text(
            f"<disk type='file' device='disk'><driver name='qemu' type='raw'/>"
            f"<source file='{disk}'/><target dev='vdb' bus='virtio'/></disk>")
        for i in range(runs):
            if serial.exists():
                serial.unlink()
            t0 = time.monotonic()
            r = virsh("create", str(xml), check=False)
            if r.returncode != 0:
                raise RuntimeError(f"virsh create: {r.stderr}\n{(work / 'libvirtd.log').read_text()[-3000:]}")
            out["create"].append(time.monotonic() - t0)
            wait_for(lambda: file_has(serial, MARKER), 300, "libvirt guest boot ok")
            out["boot"].append(time.monotonic() - t0)
            time.sleep(1)
            qpid = int(Path(f"/run/libvirt/qemu/{dom}.pid").read_text().strip())
            out["qemu_rss"].append(kib(qpid, "VmRSS"))
            out["qemu_pss"].append(kib(qpid, "Pss"))
            out["daemon_rss"].append(sum(kib(d.pid, "VmRSS") for d in daemons))
            out["daemon_pss"].append(sum(kib(d.pid, "Pss") for d in daemons))
            out["daemon_detail"] = {"libvirtd": kib(ld.pid, "VmRSS"), "virtlogd": kib(vl.pid, "VmRSS")}
            if i == 0:
                for _ in range(runs):
                    t = time.monotonic()
                    virsh("attach-device", dom, str(disk_xml), "--live")
                    out["attach"].append(time.monotonic() - t)
                    time.sleep(1.5)  # guest notices the disk
                    t = time.monotonic()
                    virsh("detach-device", dom, str(disk_xml), "--live")
                    wait_for(lambda: "vdb" not in virsh("domblklist", dom).stdout, 60,
                             "detach")
                    out["detach"].append(time.monotonic() - t)
            virsh("destroy", dom)
        res["vm"] = out
    finally:
        for d in reversed(daemons):
            if d.poll() is None:
                d.terminate()
                try:
                    d.wait(10)
                except subprocess.TimeoutExpired:
                    d.kill()
                    d.wait()
        # Any QEMU libvirt left behind.
        for pidfile in Path("/run/libvirt/qemu").glob("*.pid") if Path("/run/libvirt/qemu").exists() else []:
            try:
                pid = int(pidfile.read_text().strip())
                if is_qemu(pid):
                    os.kill(pid, signal.SIGKILL)
            except (OSError, ValueError):
                pass
    Path(params["out"]).write_text(json.dumps(res))


def export_xml(vm, argv):
    """The domain XML for `vm`'s VMI: qlauncher-compat's export (KubeVirt's XML for the VMI, TCG,
    QEMU 7.2) with KubeVirt's paths moved under the VM's run root; the hand-derived XML when
    the exporter fails. Returns (xml, source)."""
    try:
        r = subprocess.run([str(COMPAT), "convert", str(vm.vmi), "--tcg", "--qemu-version", "7.2"],
                           text=True, capture_output=True)
    except OSError as e:
        r = subprocess.CompletedProcess([], 1, "", f"{COMPAT}: {e}")
    if r.returncode == 0 and "<domain" in r.stdout:
        xml = r.stdout.replace("'/var/run/", f"'{vm.root}/var/run/").replace(
            '"/var/run/', f'"{vm.root}/var/run/').replace(">/var/run/", f">{vm.root}/var/run/")
        return xml, "exported by `qlauncher-compat convert --tcg --qemu-version 7.2` (compat/libvirt-xml)"
    log(f"qlauncher-compat failed ({r.stderr.strip()[-300:]}); using the hand-derived domain XML")
    run_dir = next((d for d in vm.private().iterdir() if d.is_dir() and d.name != "qlauncher"),
                   vm.private())
    return (domain_xml(f"default_{vm.name}", str(uuid.uuid4()), run_dir, [a.decode() for a in argv]),
            "hand-derived from qlauncher's argv (the exporter failed: " + r.stderr.strip()[-200:] + ")")


def run_libvirt(work, runs, vm, argv):
    ensure_libvirt()
    params = work / "libvirt-params.json"
    outp = work / "libvirt-result.json"
    xml, source = export_xml(vm, argv)
    (work / "domain.xml").write_text(xml)
    params.write_text(json.dumps({"work": str(work), "runs": runs, "out": str(outp),
                                  "xml": str(work / "domain.xml")}))
    p = subprocess.run(["unshare", "-m", "--propagation", "private", sys.executable,
                        str(REPO / "scripts" / "bench"), "--libvirt-phase", str(params)])
    if p.returncode != 0 or not outp.exists():
        raise RuntimeError("libvirt phase failed (see the logs under %s)" % work)
    res = json.loads(outp.read_text())
    res["xml"], res["xml_source"] = xml, source
    return res

"""The VMI of the benchmark and its hand-derived libvirt domain.
"""

import uuid

from .common import GUEST, MEM_MI


def vmi_yaml(name, grace=3):
    return f"""apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: {name}
  namespace: default
  uid: {uuid.uuid4()}
spec:
  terminationGracePeriodSeconds: {grace}
  domain:
    devices:
      autoattachPodInterface: false
      logSerialConsole: true
    firmware:
      kernelBoot:
        kernelArgs: console=ttyS0
        container:
          image: local/qlg-kernel
          kernelPath: /vmlinuz
          initrdPath: /initrd.img
    memory:
      guest: {MEM_MI}Mi
    resources:
      requests:
        memory: {MEM_MI}Mi
"""


def domain_xml(name, uuid, run_dir, argv):
    """The libvirt domain equivalent to qlauncher's argv for the bench VMI: what KubeVirt's
    converter would hand virtqemud (q35, TCG, same memory, CPU model, kernel boot, serial console
    on a unix socket logged by virtlogd, no NIC, same controllers). Hand-derived: the
    compat/libvirt-xml exporter was not ready when this was written."""
    cpu = "qemu64"
    if "-cpu" in argv:
        cpu = argv[argv.index("-cpu") + 1].split(",")[0]
    cpu_xml = (
        "<cpu mode='custom' match='exact'><model fallback='allow'>%s</model></cpu>" % cpu
        if cpu not in ("host", "max")
        else "<cpu mode='%s'/>" % ("maximum" if cpu == "max" else "host-passthrough")
    )
    return f"""<domain type='qemu'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <memory unit='MiB'>{MEM_MI}</memory>
  <vcpu placement='static'>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{GUEST}/vmlinuz</kernel>
    <initrd>{GUEST}/initrd.img</initrd>
    <cmdline>console=ttyS0</cmdline>
  </os>
  <features><acpi/></features>
  {cpu_xml}
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <controller type='usb' model='none'/>
    <controller type='virtio-serial' index='0'/>
    <serial type='unix'>
      <source mode='bind' path='{run_dir}/virt-serial0'/>
      <log file='{run_dir}/virt-serial0-log' append='on'/>
      <target type='isa-serial' port='0'><model name='isa-serial'/></target>
    </serial>
    <console type='unix'>
      <source mode='bind' path='{run_dir}/virt-serial0'/>
      <target type='serial' port='0'/>
    </console>
    <memballoon model='virtio-non-transitional'><stats period='10'/></memballoon>
    <graphics type='vnc'><listen type='socket' socket='{run_dir}/virt-vnc'/></graphics>
  </devices>
</domain>
"""

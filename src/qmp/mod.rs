//! QEMU: launching it, speaking QMP to it, and hotplugging devices.
//!
//! An async, tolerant QMP client (id-tagged commands, an event stream with many listeners,
//! per-command timeouts, fd passing over SCM_RIGHTS), the QEMU process launch from a plan's argv,
//! lifecycle control mapped to KubeVirt's domain states, and transactional hotplug of disks and NICs.

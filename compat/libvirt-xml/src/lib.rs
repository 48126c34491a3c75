//! libvirt domain XML for qlauncher's plans.
//!
//! This crate will hold the exporter that turns a `DomainPlan` (and the VMI it came from) into the
//! libvirt domain XML that KubeVirt v1.9's converter would hand to libvirt, and the comparison
//! harness that asks libvirt (`virsh domxml-to-native qemu-argv`) for the argv it would run and
//! compares it, device by device, with qlauncher's own argv. It reads only the plan: nothing here
//! launches QEMU or touches the pod.

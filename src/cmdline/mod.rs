//! The converter: a KubeVirt VMI becomes one typed `DomainPlan`.
//!
//! One configurator per device family (as KubeVirt's `pkg/virt-launcher/virtwrap/converter/`), each a
//! pure function of the VMI and a `ConverterContext` that carries every fact gathered from the pod
//! beforehand (image formats and sizes, file or block, MACs, MTU, QEMU version). Renderers turn the
//! plan into a QEMU command line (QEMU 7.2 and 10.x) and a QMP device plan for hotplug. Nothing here
//! touches the file system, spawns a process or uses tokio.

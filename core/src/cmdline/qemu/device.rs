//! `-device` / `device_add` argument structs, one per QEMU device, with QEMU's property names.
//!
//! Each struct serializes to the JSON object QEMU's `-device` (JSON syntax, QEMU >= 6.2) and QMP
//! `device_add` accept. The bus and PCI address are not in these structs: the PCI pass decides
//! them and [`crate::cmdline::render::device_json`] merges them in, so a device is described once for argv and QMP.

use serde::Serialize;
use serde_with::skip_serializing_none;

/// `werror` / `rerror` values (QEMU `BlockdevOnError`), from KubeVirt's `errorPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    /// Pause the VM (KubeVirt's default, `stop`).
    Stop,
    /// Report the error to the guest.
    Report,
    /// Ignore the error.
    Ignore,
    /// Stop on ENOSPC, report others.
    Enospc,
}

/// `pcie-root-port`: one hot-pluggable PCIe slot (libvirt: `port` 0x10+n, `chassis` n, id `pci.n`).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DevicePcieRootPort {
    /// Always `pcie-root-port`.
    pub driver: &'static str,
    /// PCIe port number.
    pub port: u32,
    /// Chassis number (unique per port).
    pub chassis: u32,
    /// QEMU id, `pci.<n>`.
    pub id: String,
    /// `true` on function 0 of a slot that holds more functions.
    pub multifunction: Option<bool>,
}

/// A virtio block device (`virtio-blk-pci[-non-transitional]`).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceVirtioBlk {
    /// `virtio-blk-pci-non-transitional`, `virtio-blk-pci-transitional` or `virtio-blk-pci`.
    pub driver: &'static str,
    /// `true` on a `shareable` disk: other processes may open the image for writing (libvirt's
    /// `<shareable/>` rendering, `qemuBuildDiskDeviceProps`).
    #[serde(rename = "share-rw")]
    pub share_rw: Option<bool>,
    /// Node name of the top blockdev.
    pub drive: String,
    /// QEMU id (`ua-<disk name>`).
    pub id: String,
    /// Boot order.
    pub bootindex: Option<u32>,
    /// `on` / `off` (cache mode).
    #[serde(rename = "write-cache")]
    pub write_cache: Option<&'static str>,
    /// Write error policy.
    pub werror: Option<OnError>,
    /// Read error policy.
    pub rerror: Option<OnError>,
    /// Disk serial.
    pub serial: Option<String>,
    /// IOThread id.
    pub iothread: Option<String>,
    /// Queue count (`blockMultiQueue`).
    #[serde(rename = "num-queues")]
    pub num_queues: Option<u32>,
    /// Logical block size in bytes.
    pub logical_block_size: Option<u32>,
    /// Physical block size in bytes.
    pub physical_block_size: Option<u32>,
    /// Discard granularity in bytes.
    pub discard_granularity: Option<u32>,
}

/// An IDE/SATA (AHCI) or SCSI or USB disk frontend (`ide-hd`, `ide-cd`, `scsi-hd`, `scsi-cd`,
/// `scsi-block`, `usb-storage`).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceDiskFrontend {
    /// The QEMU driver name.
    pub driver: &'static str,
    /// Bus: `ide.<n>` (q35's built-in AHCI), `scsi0.0`, `usb.0`.
    pub bus: String,
    /// SCSI channel (always 0).
    pub channel: Option<u32>,
    /// SCSI target id (always 0).
    #[serde(rename = "scsi-id")]
    pub scsi_id: Option<u32>,
    /// SCSI LUN (the unit).
    pub lun: Option<u32>,
    /// SCSI VPD page 0x83 device id (`scsi-hd`, `scsi-cd`): the serial when set, else
    /// `drive-<id>`, as libvirt passes it so that guest `/dev/disk/by-id` names stay stable.
    pub device_id: Option<String>,
    /// USB port.
    pub port: Option<String>,
    /// `true` on a `shareable` disk (libvirt's `<shareable/>` rendering).
    #[serde(rename = "share-rw")]
    pub share_rw: Option<bool>,
    /// Node name of the top blockdev (absent for an empty cdrom).
    pub drive: Option<String>,
    /// QEMU id (`ua-<disk name>`).
    pub id: String,
    /// Boot order.
    pub bootindex: Option<u32>,
    /// `on` / `off` (cache mode).
    #[serde(rename = "write-cache")]
    pub write_cache: Option<&'static str>,
    /// Write error policy.
    pub werror: Option<OnError>,
    /// Read error policy.
    pub rerror: Option<OnError>,
    /// Disk serial.
    pub serial: Option<String>,
    /// Logical block size in bytes.
    pub logical_block_size: Option<u32>,
    /// Physical block size in bytes.
    pub physical_block_size: Option<u32>,
    /// Discard granularity in bytes.
    pub discard_granularity: Option<u32>,
    /// Removable medium (usb-storage).
    pub removable: Option<bool>,
    /// SCSI World Wide Name (`scsi-hd`, `scsi-cd`; a hook's `<wwn>`, libvirt's `P:wwn`: the 16
    /// hex digits as a number).
    pub wwn: Option<u64>,
}

/// A NIC frontend (`virtio-net-pci[-non-transitional]`, `e1000`, `e1000e`, `rtl8139`).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceNic {
    /// QEMU driver name.
    pub driver: &'static str,
    /// The netdev id (`hostua-<name>`).
    pub netdev: String,
    /// QEMU id (`ua-<name>`).
    pub id: String,
    /// MAC address `aa:bb:cc:dd:ee:ff`.
    pub mac: Option<String>,
    /// virtio-net host MTU.
    pub host_mtu: Option<u32>,
    /// `""` disables the option ROM.
    pub romfile: Option<String>,
    /// The ROM's PCI BAR shown (1) or hidden (0) (a hook's `<rom bar>`).
    pub rombar: Option<u32>,
    /// virtio-net receive queue size (a hook's `<driver rx_queue_size>`; a power of two, 256
    /// to 1024).
    pub rx_queue_size: Option<u16>,
    /// virtio-net transmit queue size (a hook's `<driver tx_queue_size>`; as `rx_queue_size`).
    pub tx_queue_size: Option<u16>,
    /// Boot order.
    pub bootindex: Option<u32>,
    /// Multiqueue on (virtio-net).
    pub mq: Option<bool>,
    /// MSI-X vectors (2 * queues + 2 with multiqueue).
    pub vectors: Option<u32>,
    /// ACPI index (stable guest interface name).
    #[serde(rename = "acpi-index")]
    pub acpi_index: Option<u32>,
}

/// A device that only has a driver and an id (controllers, balloon-less models, tablets, watchdog,
/// video).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceSimple {
    /// QEMU driver name (`qemu-xhci`, `virtio-serial-pci-non-transitional`, `i6300esb`, `VGA`, ...).
    pub driver: &'static str,
    /// QEMU id.
    pub id: String,
    /// Bus for non-PCI devices (`usb.0` for `usb-tablet`).
    pub bus: Option<String>,
    /// USB port (`usb-tablet`).
    pub port: Option<String>,
}

/// `qemu-xhci`, the USB controller KubeVirt adds when a USB device exists (`p2`, `p3` ports).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceQemuXhci {
    /// Always `qemu-xhci`.
    pub driver: &'static str,
    /// USB 2 ports.
    pub p2: u32,
    /// USB 3 ports.
    pub p3: u32,
    /// QEMU id (`usb`).
    pub id: String,
}

/// `virtio-scsi-pci[-non-transitional]`: KubeVirt's SCSI controller `scsi0`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceVirtioScsi {
    /// QEMU driver name.
    pub driver: &'static str,
    /// QEMU id (`scsi0`).
    pub id: String,
    /// IOThread id.
    pub iothread: Option<String>,
    /// Request queues.
    pub num_queues: Option<u32>,
}

/// Video devices: `VGA` (`vgamem_mb`), `bochs-display` (`vgamem` bytes), `virtio-vga`
/// (`max_outputs`).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceVideo {
    /// QEMU driver name.
    pub driver: &'static str,
    /// QEMU id (`video0`).
    pub id: String,
    /// VGA memory in MiB (`VGA`: 16 from KubeVirt's vram 16384 KiB).
    pub vgamem_mb: Option<u32>,
    /// Video memory in bytes (`bochs-display`).
    pub vgamem: Option<u64>,
    /// Display heads (`virtio-vga`, `virtio-gpu-pci`: KubeVirt's `heads="1"`).
    pub max_outputs: Option<u32>,
}

/// `virtio-balloon-pci[-non-transitional]`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceVirtioBalloon {
    /// QEMU driver name.
    pub driver: &'static str,
    /// QEMU id (`balloon0`).
    pub id: String,
    /// Free page reporting.
    #[serde(rename = "free-page-reporting")]
    pub free_page_reporting: Option<bool>,
}

/// `virtio-rng-pci[-non-transitional]` with its `rng-random` backend object id.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceVirtioRng {
    /// QEMU driver name.
    pub driver: &'static str,
    /// The backend object id (`objrng0`).
    pub rng: String,
    /// QEMU id (`rng0`).
    pub id: String,
}

/// `isa-serial` on a chardev.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceIsaSerial {
    /// Always `isa-serial`.
    pub driver: &'static str,
    /// Chardev id (`charserial0`).
    pub chardev: String,
    /// QEMU id (`serial0`).
    pub id: String,
    /// Serial port index (0 = ttyS0).
    pub index: u32,
}

/// `virtserialport` on `virtio-serial0.0` (guest agent, downward metrics).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceVirtserialport {
    /// Always `virtserialport`.
    pub driver: &'static str,
    /// Bus (`virtio-serial0.0`).
    pub bus: String,
    /// Port number.
    pub nr: u32,
    /// Chardev id (`charchannel0`).
    pub chardev: String,
    /// QEMU id (`channel0`).
    pub id: String,
    /// Port name seen by the guest (`org.qemu.guest_agent.0`).
    pub name: String,
}

/// Sound cards: `ich9-intel-hda` (with an `hda-duplex` codec) or `AC97`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceSound {
    /// QEMU driver name.
    pub driver: &'static str,
    /// QEMU id (`ua-<name>`).
    pub id: String,
    /// Audio backend id (`AC97`, `hda-duplex`).
    pub audiodev: Option<String>,
    /// Bus of a codec (`<card id>.0`).
    pub bus: Option<String>,
    /// Codec address (0).
    pub cad: Option<u32>,
}

/// `tpm-tis` / `tpm-crb` on a `-tpmdev emulator`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceTpm {
    /// QEMU driver name.
    pub driver: &'static str,
    /// tpmdev id (`tpm-tpm0`).
    pub tpmdev: String,
    /// QEMU id (`tpm0`).
    pub id: String,
}

/// `vhost-vsock-pci[-non-transitional]` with the guest CID from `status.VSOCKCID`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceVhostVsock {
    /// QEMU driver name.
    pub driver: &'static str,
    /// QEMU id (`vsock0`).
    pub id: String,
    /// Guest context id.
    #[serde(rename = "guest-cid")]
    pub guest_cid: u32,
    /// Pre-opened `/dev/vhost-vsock` fd number, as a string (QEMU's property type).
    pub vhostfd: Option<String>,
}

/// A host device passed through with VFIO (`vfio-pci`, or `vfio-pci-nohotplug` for a mediated
/// device with a ramfb display), as libvirt renders `<hostdev mode="subsystem">`: a PCI function
/// by `host` address, or a mediated device by its sysfs path.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceVfioPci {
    /// `vfio-pci` or `vfio-pci-nohotplug`.
    pub driver: &'static str,
    /// Host PCI address `DDDD:BB:SS.F`; absent when the context did not report the device (the
    /// plan then lists it in `missing_hardware`).
    pub host: Option<String>,
    /// QEMU id (`ua-gpu-<name>`, `ua-hostdevice-<name>`, `ua-sriov-<interface>`).
    pub id: String,
    /// Mediated device: `/sys/bus/mdev/devices/<uuid>`.
    pub sysfsdev: Option<String>,
    /// `on`: the mediated device provides a display (KubeVirt's vGPU default).
    pub display: Option<&'static str>,
    /// Boot framebuffer for the vGPU display.
    pub ramfb: Option<bool>,
    /// Boot order (SR-IOV interfaces).
    pub bootindex: Option<u32>,
}

/// `vhost-user-fs-pci`: a virtiofs filesystem served by virtiofsd over a vhost-user socket.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceVhostUserFs {
    /// Always `vhost-user-fs-pci`.
    pub driver: &'static str,
    /// QEMU id (`fs<N>`, libvirt's name for an alias-less `<filesystem>`).
    pub id: String,
    /// The vhost-user chardev id (`chr-vu-fs<N>`).
    pub chardev: String,
    /// Virtqueue size (KubeVirt's `queue="1024"`).
    #[serde(rename = "queue-size")]
    pub queue_size: u32,
    /// Mount tag the guest uses (the filesystem name).
    pub tag: String,
}

/// One `-device`: the closed set of devices the converter emits.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Device {
    /// PCIe root port.
    PcieRootPort(DevicePcieRootPort),
    /// virtio-blk.
    VirtioBlk(DeviceVirtioBlk),
    /// IDE/SCSI/USB disk frontends.
    DiskFrontend(DeviceDiskFrontend),
    /// NIC.
    Nic(DeviceNic),
    /// Driver + id devices.
    Simple(DeviceSimple),
    /// qemu-xhci.
    QemuXhci(DeviceQemuXhci),
    /// virtio-scsi.
    VirtioScsi(DeviceVirtioScsi),
    /// Video.
    Video(DeviceVideo),
    /// Balloon.
    VirtioBalloon(DeviceVirtioBalloon),
    /// RNG.
    VirtioRng(DeviceVirtioRng),
    /// ISA serial port.
    IsaSerial(DeviceIsaSerial),
    /// virtio serial port.
    Virtserialport(DeviceVirtserialport),
    /// Sound card or codec.
    Sound(DeviceSound),
    /// TPM frontend.
    Tpm(DeviceTpm),
    /// vsock.
    VhostVsock(DeviceVhostVsock),
    /// VFIO host device.
    VfioPci(DeviceVfioPci),
    /// virtiofs.
    VhostUserFs(DeviceVhostUserFs),
}

impl Device {
    /// Drops the device's `bootindex`, on the device kinds that have one.
    pub fn clear_bootindex(&mut self) {
        match self {
            Device::VirtioBlk(d) => d.bootindex = None,
            Device::DiskFrontend(d) => d.bootindex = None,
            Device::Nic(d) => d.bootindex = None,
            Device::VfioPci(d) => d.bootindex = None,
            _ => {}
        }
    }

    /// The QEMU id of this device.
    pub fn id(&self) -> &str {
        match self {
            Device::PcieRootPort(d) => &d.id,
            Device::VirtioBlk(d) => &d.id,
            Device::DiskFrontend(d) => &d.id,
            Device::Nic(d) => &d.id,
            Device::Simple(d) => &d.id,
            Device::QemuXhci(d) => &d.id,
            Device::VirtioScsi(d) => &d.id,
            Device::Video(d) => &d.id,
            Device::VirtioBalloon(d) => &d.id,
            Device::VirtioRng(d) => &d.id,
            Device::IsaSerial(d) => &d.id,
            Device::Virtserialport(d) => &d.id,
            Device::Sound(d) => &d.id,
            Device::Tpm(d) => &d.id,
            Device::VhostVsock(d) => &d.id,
            Device::VfioPci(d) => &d.id,
            Device::VhostUserFs(d) => &d.id,
        }
    }

    /// The node name of the top blockdev this device reads (`drive`), for the disk frontends;
    /// `None` for other devices and for an empty cdrom. Mutable so that a hot-plugged disk's
    /// nodes can be renumbered on the typed value.
    pub fn drive_mut(&mut self) -> Option<&mut String> {
        match self {
            Device::VirtioBlk(d) => Some(&mut d.drive),
            Device::DiskFrontend(d) => d.drive.as_mut(),
            _ => None,
        }
    }

    /// The QEMU driver name of this device.
    pub fn driver(&self) -> &'static str {
        match self {
            Device::PcieRootPort(d) => d.driver,
            Device::VirtioBlk(d) => d.driver,
            Device::DiskFrontend(d) => d.driver,
            Device::Nic(d) => d.driver,
            Device::Simple(d) => d.driver,
            Device::QemuXhci(d) => d.driver,
            Device::VirtioScsi(d) => d.driver,
            Device::Video(d) => d.driver,
            Device::VirtioBalloon(d) => d.driver,
            Device::VirtioRng(d) => d.driver,
            Device::IsaSerial(d) => d.driver,
            Device::Virtserialport(d) => d.driver,
            Device::Sound(d) => d.driver,
            Device::Tpm(d) => d.driver,
            Device::VhostVsock(d) => d.driver,
            Device::VfioPci(d) => d.driver,
            Device::VhostUserFs(d) => d.driver,
        }
    }
}

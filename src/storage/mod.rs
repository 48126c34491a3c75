//! Disk images and config volumes, made natively (no qemu-img, xorriso or shell).
//!
//! qcow2 overlays over containerDisk and ephemeral bases, empty disks and host disks, the facts the
//! converter needs about each image (format, virtual size, file or block, O_DIRECT support), and the
//! ISO images for cloud-init (NoCloud, ConfigDrive) and ConfigMap/Secret/DownwardAPI/ServiceAccount/
//! Sysprep volumes, at the paths KubeVirt v1.9.0 uses. Files are written under a temporary name,
//! fsynced and renamed.

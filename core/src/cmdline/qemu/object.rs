//! `-object` / `object-add` argument structs (QEMU `ObjectOptions`).

use serde::Serialize;
use serde_with::skip_serializing_none;

/// A memory backend (`memory-backend-ram`, `memory-backend-memfd`) of the given size.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObjectMemoryBackend {
    /// `memory-backend-ram` or `memory-backend-memfd`.
    #[serde(rename = "qom-type")]
    pub qom_type: &'static str,
    /// Object id (`pc.ram` or `ram-node0`).
    pub id: String,
    /// Size in bytes.
    pub size: u64,
    /// memfd: back with hugetlbfs pages.
    pub hugetlb: Option<bool>,
    /// memfd: hugepage size in bytes.
    pub hugetlbsize: Option<u64>,
    /// Shared mapping (memfd, vhost-user, virtiofs).
    pub share: Option<bool>,
    /// Preallocate (hugepages).
    pub prealloc: Option<bool>,
}

/// `iothread` object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObjectIothread {
    /// Always `iothread`.
    #[serde(rename = "qom-type")]
    pub qom_type: &'static str,
    /// Object id (`iothread<N>`).
    pub id: String,
}

/// `rng-random` backend reading a host file (`/dev/urandom`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObjectRngRandom {
    /// Always `rng-random`.
    #[serde(rename = "qom-type")]
    pub qom_type: &'static str,
    /// Object id (`objrng0`).
    pub id: String,
    /// Entropy source.
    pub filename: String,
}

/// The confidential-guest object libvirt builds from `<launchSecurity>` (id `lsec0`):
/// `sev-guest` (SEV, SEV-ES), `sev-snp-guest` (QEMU >= 9.1) or `tdx-guest` (QEMU >= 10.1).
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ObjectLaunchSecurity {
    /// `sev-guest`, `sev-snp-guest` or `tdx-guest`.
    #[serde(rename = "qom-type")]
    pub qom_type: &'static str,
    /// Object id (`lsec0`).
    pub id: String,
    /// C-bit position in page table entries (the host's, from `query-sev-capabilities`).
    pub cbitpos: Option<u32>,
    /// Physical address bits lost to encryption (the host's).
    #[serde(rename = "reduced-phys-bits")]
    pub reduced_phys_bits: Option<u32>,
    /// Guest policy (SEV: NoDebug, plus EncryptedState for SEV-ES; SNP: 0x30000).
    pub policy: Option<u64>,
}

/// One `-object`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Object {
    /// Memory backend.
    MemoryBackend(ObjectMemoryBackend),
    /// IOThread.
    Iothread(ObjectIothread),
    /// RNG backend.
    RngRandom(ObjectRngRandom),
}

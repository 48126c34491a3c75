//! `<features>` (Hyper-V enlightenments, KVM), `<cpu>` (topology, NUMA, features) and `<vcpu>`.

use serde::Serialize;
use serde_with::skip_serializing_none;

use super::*;

/// `<features>`.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Features {
    /// ACPI on.
    pub acpi: Option<Empty>,
    /// APIC.
    pub apic: Option<Empty>,
    /// Hyper-V enlightenments.
    pub hyperv: Option<HyperV>,
    /// SMM.
    pub smm: Option<Empty>,
    /// `<kvm><hidden state=".."/></kvm>`.
    pub kvm: Option<Kvm>,
    /// Paravirtual spinlocks.
    pub pvspinlock: Option<State>,
    /// `<pmu state=".."/>`: the vCPU's performance monitoring unit (QEMU's `pmu`).
    pub pmu: Option<State>,
    /// `<vmport state="off"/>` (amd64).
    pub vmport: Option<State>,
}

/// `<hyperv>`: each enlightenment with `state`.
#[skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HyperV {
    /// `passthrough` (`hypervPassthrough`).
    #[serde(rename = "@mode")]
    pub mode: Option<String>,
    /// relaxed.
    pub relaxed: Option<State>,
    /// vapic.
    pub vapic: Option<State>,
    /// spinlocks.
    pub spinlocks: Option<Spinlocks>,
    /// vpindex.
    pub vpindex: Option<State>,
    /// runtime.
    pub runtime: Option<State>,
    /// synic.
    pub synic: Option<State>,
    /// stimer (+direct).
    pub stimer: Option<Stimer>,
    /// reset.
    pub reset: Option<State>,
    /// vendor_id.
    pub vendor_id: Option<VendorId>,
    /// frequencies.
    pub frequencies: Option<State>,
    /// reenlightenment.
    pub reenlightenment: Option<State>,
    /// tlbflush (+direct, +extended).
    pub tlbflush: Option<TlbFlush>,
    /// ipi.
    pub ipi: Option<State>,
    /// evmcs.
    pub evmcs: Option<State>,
}

/// `<spinlocks state="on" retries="4096"/>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Spinlocks {
    /// on/off.
    #[serde(rename = "@state")]
    pub state: String,
    /// Retry count.
    #[serde(rename = "@retries")]
    pub retries: Option<u32>,
}

/// `<stimer state="on"><direct state="on"/></stimer>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stimer {
    /// on/off.
    #[serde(rename = "@state")]
    pub state: String,
    /// Direct mode.
    pub direct: Option<State>,
}

/// `<tlbflush state="on"><direct state="on"/><extended state="on"/></tlbflush>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TlbFlush {
    /// on/off.
    #[serde(rename = "@state")]
    pub state: String,
    /// Direct flushes (`hv-tlbflush-direct`).
    pub direct: Option<State>,
    /// Extended flushes (`hv-tlbflush-ext`).
    pub extended: Option<State>,
}

/// `<vendor_id state="on" value=".."/>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VendorId {
    /// on/off.
    #[serde(rename = "@state")]
    pub state: String,
    /// Vendor string.
    #[serde(rename = "@value")]
    pub value: Option<String>,
}

/// `<kvm>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kvm {
    /// Hide the KVM signature.
    pub hidden: State,
}

/// `<cpu>`.
/// Fields in the order of KubeVirt's `api.CPU` (v1.9.0 `virtwrap/api/schema.go`): the hook
/// input (`hooks::kubevirt_input`) prints them in that order, as Go's `encoding/xml` does.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cpu {
    /// `host-model`, `host-passthrough` or `custom`.
    #[serde(rename = "@mode")]
    pub mode: String,
    /// `exact` for a running host-model CPU sent to a stock target (libvirt's own live XML).
    #[serde(rename = "@match")]
    pub match_: Option<String>,
    /// `full` for a running host-model CPU sent to a stock target: the target's libvirt refuses
    /// a QEMU whose CPU differs in any feature it names (`virCPUx86UpdateLive`).
    #[serde(rename = "@check")]
    pub check: Option<String>,
    /// Named model (mode `custom`).
    pub model: Option<CpuModelName>,
    /// `<vendor>` of a running host-model CPU (`AMD`, `Intel`).
    pub vendor: Option<String>,
    /// Features.
    #[serde(default)]
    pub feature: Vec<CpuFeature>,
    /// Topology.
    pub topology: Topology,
    /// `<maxphysaddr mode='emulate' bits=..>` (libvirt 8.7 on).
    pub maxphysaddr: Option<MaxPhysAddr>,
    /// Guest NUMA topology.
    pub numa: Option<Numa>,
}

/// `<model [fallback=..]>NAME</model>`.
#[skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuModelName {
    /// `forbid`: libvirt may not replace the model by another (a running host-model CPU).
    #[serde(rename = "@fallback")]
    pub fallback: Option<String>,
    /// The `cpu_map` model.
    #[serde(rename = "$text")]
    pub name: String,
}

/// `<maxphysaddr mode=".." bits=".."/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MaxPhysAddr {
    /// `emulate`: QEMU's `phys-bits` is `bits`.
    #[serde(rename = "@mode")]
    pub mode: String,
    /// Physical address bits.
    #[serde(rename = "@bits")]
    pub bits: u32,
}

/// `<numa>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Numa {
    /// Cells.
    pub cell: Vec<NumaCell>,
}

/// `<cell id="0" cpus="0-3" memory="N" unit="b"/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaCell {
    /// Cell id.
    #[serde(rename = "@id")]
    pub id: u32,
    /// vCPU list (`0-3`).
    #[serde(rename = "@cpus")]
    pub cpus: String,
    /// Memory.
    #[serde(rename = "@memory")]
    pub memory: u64,
    /// `b`.
    #[serde(rename = "@unit")]
    pub unit: String,
}

/// `<topology sockets cores threads/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Topology {
    /// Sockets.
    #[serde(rename = "@sockets")]
    pub sockets: u32,
    /// Cores per socket.
    #[serde(rename = "@cores")]
    pub cores: u32,
    /// Threads per core.
    #[serde(rename = "@threads")]
    pub threads: u32,
}

/// `<feature name=".." policy=".."/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuFeature {
    /// libvirt feature name.
    #[serde(rename = "@name")]
    pub name: String,
    /// require / disable / force / optional / forbid.
    #[serde(rename = "@policy")]
    pub policy: String,
}

/// `<vcpu placement="static">N</vcpu>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vcpu {
    /// `static`.
    #[serde(rename = "@placement")]
    pub placement: String,
    /// Maximum vCPUs.
    #[serde(rename = "$text")]
    pub count: u32,
}

/// `<vcpus>` (CPU hotplug).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vcpus {
    /// One per vCPU.
    pub vcpu: Vec<VcpuState>,
}

/// `<vcpu id enabled hotpluggable/>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VcpuState {
    /// vCPU id.
    #[serde(rename = "@id")]
    pub id: u32,
    /// `yes` for the vCPUs present at boot.
    #[serde(rename = "@enabled")]
    pub enabled: String,
    /// `no` for the first socket.
    #[serde(rename = "@hotpluggable")]
    pub hotpluggable: String,
}

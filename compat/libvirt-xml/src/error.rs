//! `CompatError`: everything that can fail in the exporter, the libvirt runners and the harness.

use std::path::PathBuf;

/// Errors of the compat crate; each variant names the failing step and the object.
#[derive(Debug, thiserror::Error)]
pub enum CompatError {
    /// The plan has a disk whose blockdev chain does not reach its frontend's `drive`.
    #[error("disk {disk}: the blockdev chain has no node {node}")]
    ExportBlockdevChain {
        /// VMI disk name.
        disk: String,
        /// The missing node name.
        node: String,
    },
    /// A planned device carries no VMI name where one is needed.
    #[error("device {id}: no VMI name in the plan")]
    ExportUnnamedDevice {
        /// QEMU id of the device.
        id: String,
    },
    /// A planned device the exporter has no element for: the domain would miss it (and
    /// GetDomain would not show it), so the export fails instead.
    #[error("device {id}: the domain cannot show it: {why}")]
    ExportUnshown {
        /// QEMU id of the device.
        id: String,
        /// What the exporter found.
        why: String,
    },
    /// The plan needs host hardware the exporter does not write (TDX), or a
    /// VFIO device (GPU, host device, SR-IOV VF) the context did not report, so the plan has no
    /// host address for it.
    #[error("{path}: exporting {what} is not supported")]
    ExportHardware {
        /// The VMI field that asks for it.
        path: String,
        /// What it is.
        what: String,
    },
    /// The domain model could not be serialised as JSON (the `api.DomainSpec` renderer).
    #[error("cannot serialise the domain as JSON")]
    SerializeJson(#[source] serde_json::Error),
    /// quick-xml could not serialise the domain.
    #[error("cannot serialise the domain XML")]
    SerializeXml(#[source] quick_xml::SeError),
    /// A temporary file or directory for libvirt could not be written.
    #[error("cannot write {path}")]
    WriteTemp {
        /// The path.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A libvirt tool could not be started.
    #[error("cannot run {program} (install {package})")]
    SpawnTool {
        /// Program name.
        program: &'static str,
        /// Debian package that provides it.
        package: &'static str,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A libvirt tool exited non-zero.
    #[error("{program} failed: {stderr}")]
    ToolFailed {
        /// Program name.
        program: &'static str,
        /// Its standard error (trimmed).
        stderr: String,
    },
    /// libvirt's argv could not be split into words.
    #[error("cannot split libvirt's command line into words")]
    SplitArgv,
    /// An argv option that takes a value came last.
    #[error("option {option} has no value")]
    ArgvMissingValue {
        /// The option.
        option: String,
    },
    /// A JSON option value did not parse.
    #[error("option {option}: bad JSON value")]
    ArgvJson {
        /// The option.
        option: String,
        /// Cause.
        #[source]
        source: serde_json::Error,
    },
    /// An XML document did not parse.
    #[error("cannot parse XML ({what})")]
    ParseXml {
        /// Which document.
        what: String,
        /// Cause.
        #[source]
        source: quick_xml::Error,
    },
}

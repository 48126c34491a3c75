//! The capability probe of the image's QEMU: a `-machine none` QEMU asked over QMP what libvirt's
//! `virQEMUCapsInitQMPMonitor` asks (libvirt 9.0 to 11.x, `src/qemu/qemu_capabilities.c`), in
//! libvirt's order: `query-version`, `query-kvm`, `qom-list-types`, `query-machines`,
//! `query-cpu-definitions`, `query-sev-capabilities` (when QEMU has `sev-guest` and KVM runs), and
//! the static expansion of the host CPU (`host` under KVM, `max` under TCG) twice, as is and with
//! `migratable: false` (`virQEMUCapsProbeQMPHostCPU`).
//!
//! QEMU runs as libvirt starts it (`qemuProcessQMPLaunch`: `-S -no-user-config -nodefaults
//! -machine none,accel=..`) with its monitor on one end of a socket pair that it inherits as fd 3,
//! so no socket file is made. Every step that fails is left out of [`QemuProbe`] with a warning;
//! a QEMU that does not start gives an empty probe.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use crate::qmp::commands::{
    CpuModel, CpuModelExpansionType, MachineInfo, ProbeCpuModelExpansion, ProbedProp, QomListTypes,
    QueryCpuDefinitions, QueryKvm, QueryMachines, QuerySevCapabilities, QueryVersion, Quit,
};
use crate::qmp::{QmpClient, QmpError};

use super::x86::{libvirt_name, HostProp, QemuModel, Usable};

/// The accelerator a probe asks QEMU for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// `accel=kvm:tcg`: KVM when it works (then `query-kvm` says `enabled`), else TCG.
    Kvm,
    /// `accel=tcg`.
    Tcg,
}

/// SEV as QEMU reports it (`query-sev-capabilities`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SevProbe {
    /// C-bit position.
    pub cbitpos: i64,
    /// Physical address bits lost.
    pub reduced_phys_bits: i64,
    /// CPU0 id (base64), when QEMU gives it.
    pub cpu0_id: Option<String>,
}

/// What the probe learnt. `None` members are steps that failed (warned about).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QemuProbe {
    /// `major.minor.micro` from `query-version`.
    pub version: Option<String>,
    /// KVM is the accelerator of the probe (`query-kvm` `enabled`).
    pub kvm: bool,
    /// `query-machines`, `none` left out.
    pub machines: Option<Vec<MachineInfo>>,
    /// `query-cpu-definitions`, blockers in libvirt's spelling.
    pub cpu_models: Option<Vec<QemuModel>>,
    /// The host CPU (`host` or `max`), both expansions merged, by QEMU property name.
    pub host_cpu: Option<Vec<(String, HostProp)>>,
    /// The QOM types (`qom-list-types`).
    pub types: Option<Vec<String>>,
    /// SEV, when QEMU has it and the platform answers.
    pub sev: Option<SevProbe>,
}

/// Starts `qemu` for `accel`, runs [`probe_monitor`] on it and ends it. `timeout` bounds the
/// greeting and each command. A QEMU that cannot start gives an empty probe and a warning with
/// the end of its standard error.
pub async fn probe_qemu(
    qemu: &Path,
    accel: Accel,
    timeout: Duration,
    warnings: &mut Vec<String>,
) -> QemuProbe {
    match spawn(qemu, accel) {
        Ok((mut child, ours)) => {
            let stream = tokio::net::UnixStream::from_std(ours);
            let probe = match stream {
                Ok(s) => match QmpClient::from_stream(s, timeout).await {
                    Ok(client) => {
                        let p = probe_monitor(&client, accel, warnings).await;
                        let _ = client.run(&Quit).await;
                        p
                    }
                    Err(e) => {
                        warnings.push(format!("QEMU {} gave no QMP monitor: {e}", qemu.display()));
                        QemuProbe::default()
                    }
                },
                Err(e) => {
                    warnings.push(format!("QMP socket: {e}"));
                    QemuProbe::default()
                }
            };
            let status = tokio::time::timeout(timeout, child.wait()).await;
            let mut stderr = String::new();
            if let Some(mut err) = child.stderr.take() {
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), err.read_to_string(&mut stderr))
                        .await;
            }
            match status {
                Ok(Ok(s)) if s.success() => {}
                Ok(Ok(s)) => warnings.push(format!(
                    "QEMU {} exited with {s}{}",
                    qemu.display(),
                    tail(&stderr)
                )),
                _ => {
                    let _ = child.kill().await;
                    warnings.push(format!("QEMU {} did not quit; killed", qemu.display()));
                }
            }
            probe
        }
        Err(e) => {
            warnings.push(format!("cannot start QEMU {}: {e}", qemu.display()));
            QemuProbe::default()
        }
    }
}

fn tail(stderr: &str) -> String {
    let t = stderr.trim();
    if t.is_empty() {
        return String::new();
    }
    let last: Vec<&str> = t.lines().rev().take(3).collect();
    let joined: Vec<&str> = last.into_iter().rev().collect();
    format!(": {}", joined.join(" / "))
}

/// The argv of the probe QEMU (after the binary).
pub fn probe_args(accel: Accel) -> Vec<String> {
    let accel = match accel {
        Accel::Kvm => "none,accel=kvm:tcg",
        Accel::Tcg => "none,accel=tcg",
    };
    [
        "-S",
        "-no-user-config",
        "-nodefaults",
        "-display",
        "none",
        "-machine",
        accel,
        "-chardev",
        "socket,id=qmp,fd=3",
        "-mon",
        "chardev=qmp,mode=control",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// QEMU's monitor descriptor in the probe process.
const QMP_FD: i32 = 3;

fn spawn(
    qemu: &Path,
    accel: Accel,
) -> std::io::Result<(tokio::process::Child, std::os::unix::net::UnixStream)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    let theirs: OwnedFd = theirs.into();
    let mut cmd = std::process::Command::new(qemu);
    cmd.args(probe_args(accel))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let raw = theirs.as_raw_fd();
    // SAFETY: the closure runs between fork and exec and calls only dup2 and fcntl, which are
    // async-signal-safe; `theirs` stays open in the parent until the spawn returned.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if raw == QMP_FD {
                let flags = libc::fcntl(raw, libc::F_GETFD);
                if flags < 0 || libc::fcntl(raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(raw, QMP_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut cmd = tokio::process::Command::from(cmd);
    cmd.kill_on_drop(true);
    let child = cmd.spawn()?;
    drop(theirs);
    Ok((child, ours))
}

/// Runs libvirt's probe sequence on a connected monitor. `accel` is what the QEMU was started
/// with; the host CPU is `host` when `query-kvm` says KVM runs, else `max`.
pub async fn probe_monitor(
    client: &QmpClient,
    accel: Accel,
    warnings: &mut Vec<String>,
) -> QemuProbe {
    let mut probe = QemuProbe::default();
    match client.run(&QueryVersion).await {
        Ok(v) => {
            let q = v.qemu;
            probe.version = Some(format!("{}.{}.{}", q.major, q.minor, q.micro));
        }
        Err(e) => step("query-version", e, warnings),
    }
    match client.run(&QueryKvm).await {
        Ok(k) => probe.kvm = k.enabled,
        Err(e) => step("query-kvm", e, warnings),
    }
    if accel == Accel::Kvm && !probe.kvm {
        warnings.push(
            "KVM was asked for but QEMU runs without it (query-kvm: not enabled); \
             the files describe TCG"
                .into(),
        );
    }
    match client.run(&QomListTypes::default()).await {
        Ok(t) => probe.types = Some(t.into_iter().map(|t| t.name).collect()),
        Err(e) => step("qom-list-types", e, warnings),
    }
    match client.run(&QueryMachines).await {
        Ok(m) => probe.machines = Some(m.into_iter().filter(|m| m.name != "none").collect()),
        Err(e) => step("query-machines", e, warnings),
    }
    match client.run(&QueryCpuDefinitions).await {
        Ok(defs) => probe.cpu_models = Some(qemu_models(defs)),
        Err(e) => step("query-cpu-definitions", e, warnings),
    }
    let has_sev_type = probe
        .types
        .as_ref()
        .is_some_and(|t| t.iter().any(|n| n == "sev-guest"));
    if probe.kvm && has_sev_type {
        match client.run(&QuerySevCapabilities).await {
            Ok(s) => {
                probe.sev = Some(SevProbe {
                    cbitpos: s.cbitpos,
                    reduced_phys_bits: s.reduced_phys_bits,
                    cpu0_id: Some(s.cpu0_id).filter(|c| !c.is_empty()),
                })
            }
            // "SEV is not enabled in KVM" / "Failed to open /dev/sev": no SEV, as libvirt reads it.
            Err(QmpError::Command { .. }) => {}
            Err(e) => step("query-sev-capabilities", e, warnings),
        }
    }
    let model = if probe.kvm { "host" } else { "max" };
    probe.host_cpu = expand_host(client, model, warnings).await;
    probe
}

fn step(what: &str, e: QmpError, warnings: &mut Vec<String>) {
    warnings.push(format!("QEMU probe: {what} failed, skipped: {e}"));
}

async fn expand_host(
    client: &QmpClient,
    model: &str,
    warnings: &mut Vec<String>,
) -> Option<Vec<(String, HostProp)>> {
    let expansion = |migratable: bool| ProbeCpuModelExpansion {
        kind: CpuModelExpansionType::Static,
        model: CpuModel {
            name: model.to_owned(),
            props: if migratable {
                Default::default()
            } else {
                [(
                    "migratable".to_owned(),
                    crate::qmp::commands::CpuProp::Bool(false),
                )]
                .into()
            },
        },
    };
    let first = match client.run(&expansion(true)).await {
        Ok(r) if !r.model.props.is_empty() => r.model.props,
        Ok(_) => {
            warnings.push(format!(
                "QEMU probe: static expansion of CPU model {model} has no properties, skipped"
            ));
            return None;
        }
        Err(e) => {
            warnings.push(format!(
                "QEMU probe: static expansion of CPU model {model} failed, skipped: {e}"
            ));
            return None;
        }
    };
    let mut props: Vec<(String, HostProp)> = first
        .into_iter()
        .filter_map(|(name, v)| {
            let v = match v {
                ProbedProp::Bool(on) => HostProp::Bool {
                    on,
                    non_migratable: false,
                },
                ProbedProp::Int(n) => HostProp::Int(n),
                ProbedProp::Text(s) => HostProp::Text(s),
                ProbedProp::Other(_) => return None,
            };
            Some((name, v))
        })
        .collect();
    match client.run(&expansion(false)).await {
        Ok(r) => {
            for (name, v) in r.model.props {
                let ProbedProp::Bool(nm_on) = v else { continue };
                if let Some((_, HostProp::Bool { on, non_migratable })) =
                    props.iter_mut().find(|(n, _)| *n == name)
                {
                    if !*on && nm_on {
                        *on = true;
                        *non_migratable = true;
                    }
                }
            }
        }
        Err(e) => warnings.push(format!(
            "QEMU probe: expansion of {model} with migratable=off failed, non-migratable \
             features (invtsc) left out: {e}"
        )),
    }
    Some(props)
}

/// The default QEMU of the image.
pub const IMAGE_QEMU: &str = "/usr/bin/qemu-system-x86_64";

/// `path` when it exists, else `qemu-system-x86_64` on `PATH`, else `path`.
pub fn find_qemu(path: &Path) -> PathBuf {
    if path.exists() {
        return path.to_path_buf();
    }
    std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("qemu-system-x86_64"))
                .find(|c| c.exists())
        })
        .unwrap_or_else(|| path.to_path_buf())
}

/// QEMU's `query-cpu-definitions` answer as libvirt keeps it (`virQEMUCapsFetchCPUDefinitions`):
/// each model usable or not, its blockers in libvirt's spelling.
pub fn qemu_models(defs: Vec<crate::qmp::commands::CpuDefinitionInfo>) -> Vec<QemuModel> {
    defs.into_iter()
        .map(|d| {
            let (usable, blockers) = match d.unavailable_features {
                None => (Usable::Unknown, Vec::new()),
                Some(b) if b.is_empty() => (Usable::Yes, b),
                Some(b) => (
                    Usable::No,
                    b.iter().map(|n| libvirt_name(n).to_owned()).collect(),
                ),
            };
            QemuModel {
                name: d.name,
                usable,
                blockers,
                deprecated: d.deprecated,
            }
        })
        .collect()
}

//! `qlauncher node-labeller` and the image's `/usr/bin/node-labeller.sh` (a link to the
//! `qlauncher` binary, which acts on that name): virt-handler's init container runs
//! `/bin/sh -c node-labeller.sh`, the shell finds the link through `PATH` and execs it, and the
//! labeller ([`qlauncher::labeller`]) writes the node-labeller files. No shell of ours runs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use qlauncher::labeller::{self, HostPaths, Options};

/// `qlauncher node-labeller [--out DIR] [--qemu BIN] [--cpu-map DIR] [--virttype kvm|qemu] ...`:
/// the files `node-labeller.sh` writes, by default into `/var/lib/kubevirt-node-labeller`, with
/// `HYPERVISOR_DEVICE` and `PREFERRED_VIRTTYPE` from the environment as KubeVirt sets them.
#[derive(clap::Args)]
pub struct NodeLabellerArgs {
    /// Where the files go.
    #[arg(long, value_name = "DIR", default_value = labeller::OUT_DIR)]
    pub out: PathBuf,
    /// The QEMU to probe (default: the image's /usr/bin/qemu-system-x86_64, else the one on PATH).
    #[arg(long, value_name = "BIN")]
    pub qemu: Option<PathBuf>,
    /// libvirt's CPU map directory (default: /usr/share/qlauncher/cpu_map, else
    /// /usr/share/libvirt/cpu_map).
    #[arg(long, value_name = "DIR")]
    pub cpu_map: Option<PathBuf>,
    /// The virt type, instead of node-labeller.sh's rule (`kvm` with the hypervisor device,
    /// else `qemu`).
    #[arg(long, value_parser = ["kvm", "qemu"])]
    pub virttype: Option<String>,
    /// Prepare the hypervisor device as node-labeller.sh does: `mknod` it when /proc/misc lists
    /// it, `chmod o+rw` it and /dev/sev. Without it the host is only read.
    #[arg(long)]
    pub prepare_device: bool,
    /// The host's /dev (the hypervisor device, /dev/kvm for the TSC).
    #[arg(long, value_name = "DIR", default_value = "/dev")]
    pub dev: PathBuf,
    /// The host's /sys (NUMA nodes, CPU topology).
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sys: PathBuf,
    /// The host's /proc (misc devices, meminfo).
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc: PathBuf,
    /// Bound on QEMU's start and on each QMP command, e.g. `30s`.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// Runs the subcommand.
pub fn run(args: NodeLabellerArgs) -> ExitCode {
    let mut opts = Options::from_env();
    opts.out_dir = args.out;
    if let Some(q) = args.qemu {
        opts.qemu = q;
    }
    opts.cpu_map = args.cpu_map;
    opts.host = HostPaths {
        dev: args.dev,
        sys: args.sys,
        proc: args.proc,
    };
    opts.timeout = args.timeout;
    opts.virttype = args.virttype;
    opts.prepare_device = args.prepare_device;
    execute(&opts)
}

/// `node-labeller.sh` (argv\[0\]): KubeVirt passes no arguments, only the environment.
pub fn main_as_script() -> ExitCode {
    if !cfg!(target_arch = "x86_64") {
        // node-labeller.sh writes nothing on an architecture it does not know.
        return ExitCode::SUCCESS;
    }
    execute(&Options::from_env())
}

fn execute(opts: &Options) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("node-labeller: error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(labeller::run(opts)) {
        Ok(report) => {
            for w in &report.warnings {
                eprintln!("node-labeller: warning: {w}");
            }
            eprintln!(
                "node-labeller: wrote {} files into {} (virttype {}, QEMU {} {}, {} warnings)",
                report.files.len(),
                opts.out_dir.display(),
                report.virttype,
                opts.qemu.display(),
                report.qemu_version.as_deref().unwrap_or("?"),
                report.warnings.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("node-labeller: error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::FAILURE
        }
    }
}

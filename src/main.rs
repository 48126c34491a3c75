//! The `qlauncher` command.
use std::process::ExitCode;

use clap::Parser;

mod cli;

/// qlauncher: a libvirt-free virt-launcher for KubeVirt.
#[derive(Parser)]
#[command(version, about)]
enum Cli {
    /// Read a VMI (or VirtualMachine) manifest, apply KubeVirt's defaults and validate it.
    Validate(cli::validate::Args),
    /// Print the QEMU command line or QMP device plan for a VMI.
    Convert(cli::convert::ConvertArgs),
    /// Compare qlauncher's QEMU argv with the one libvirt makes of the exported domain XML
    /// (`virsh domxml-to-native`, no daemon); exits 1 on a difference not in the allowlist.
    Compare {
        #[command(flatten)]
        common: qlauncher_libvirt_xml::cli::Common,
        /// libvirt embed root, reused between runs (capabilities cache).
        #[arg(long, value_name = "DIR")]
        libvirt_root: Option<std::path::PathBuf>,
    },
    /// Compare the exported domain XML with an expected one (e.g. KubeVirt's converter test
    /// data), element by element; exits 1 on a difference not in the golden allowlist.
    Golden {
        #[command(flatten)]
        common: qlauncher_libvirt_xml::cli::Common,
        /// The expected domain XML.
        expected: std::path::PathBuf,
    },
    /// What a hook sidecar's OnDefineDomain answer (AFTER) asks of the domain XML it was sent
    /// (BEFORE, `convert --format hook-xml`): the plan edits, or the refusal naming the element
    /// (exit 1).
    HookDiff(cli::hook_diff::HookDiffArgs),
    /// PID 1 of the compute container (virt-launcher-monitor): starts the launcher, reaps
    /// zombies, forwards signals. Takes virt-launcher-monitor's and virt-launcher's flags.
    Monitor {
        /// virt-launcher-monitor flags, passed on to the launcher.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The launcher (virt-launcher): runs one VMI's QEMU. Takes virt-launcher's flags.
    Launcher {
        /// virt-launcher flags.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Query a launcher's command socket (Info, Ping, GetDomain, GetQemuVersion, GetDomainStats) as
    /// virt-handler does.
    LauncherSock(cli::sync::LauncherSockArgs),
    /// Run one QMP command on a QEMU's monitor socket and print the reply.
    Qmp(cli::qmp::QmpArgs),
    /// Hotplug or unplug a disk or NIC through a QEMU's monitor socket.
    Hotplug(cli::qmp::HotplugArgs),
    /// Run one VMI outside Kubernetes: monitor, launcher and QEMU in this network namespace.
    Run(cli::run::RunArgs),
    /// Print the pod interface facts and the masquerade NAT tables (read-only).
    NetProbe(cli::net::NetProbe),
    /// Write the node-labeller files virt-handler reads (what the image's node-labeller.sh runs):
    /// capabilities.xml, virsh_domcapabilities.xml, supported_features.xml, from a QMP probe of
    /// QEMU and the host, without libvirt.
    NodeLabeller(cli::node_labeller::NodeLabellerArgs),
    /// Record `qemu-system-x86_64 --version` for the launcher (run when the image is built).
    #[command(hide = true)]
    QemuVersionRecord(cli::qemu_version::QemuVersionRecordArgs),
}

/// Exit status for commands that only succeed or fail.
fn ok(result: anyhow::Result<()>) -> anyhow::Result<ExitCode> {
    result.map(|()| ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    // Installed under KubeVirt's names, the binary behaves as that program.
    let mut argv = std::env::args();
    let argv0 = argv.next().unwrap_or_default();
    match argv0.rsplit('/').next().unwrap_or_default() {
        "virt-launcher-monitor" => return cli::monitor::main(argv.collect()),
        "virt-launcher" => return qlauncher::sync::launcher::main(argv.collect()),
        "node-labeller.sh" => return cli::node_labeller::main_as_script(),
        _ => {}
    }
    let result = match Cli::parse() {
        Cli::Validate(args) => cli::validate::run(args),
        Cli::Convert(args) => ok(cli::convert::run(&args)),
        Cli::Compare {
            common,
            libvirt_root,
        } => qlauncher_libvirt_xml::cli::compare_cmd(&common, libvirt_root),
        Cli::Golden { common, expected } => {
            qlauncher_libvirt_xml::cli::golden_cmd(&common, &expected)
        }
        Cli::HookDiff(args) => cli::hook_diff::run(&args),
        Cli::Monitor { args } => return cli::monitor::main(args),
        Cli::Launcher { args } => return qlauncher::sync::launcher::main(args),
        Cli::LauncherSock(args) => ok(cli::sync::run(args)),
        Cli::Run(args) => cli::run::run(args),
        Cli::NetProbe(args) => ok(cli::net::run(args)),
        Cli::Qmp(args) => ok(cli::qmp::run_qmp(args)),
        Cli::Hotplug(args) => ok(cli::qmp::run_hotplug(args)),
        Cli::NodeLabeller(args) => return cli::node_labeller::run(args),
        Cli::QemuVersionRecord(args) => ok(cli::qemu_version::run(args)),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

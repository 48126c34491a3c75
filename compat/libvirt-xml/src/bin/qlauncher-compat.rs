//! `qlauncher-compat`: libvirt compatibility tools for qlauncher.
//!
//! * `convert FILE --format libvirt-xml`: prints the libvirt domain XML KubeVirt v1.9 would
//!   hand libvirt for the VMI (`--format argv` prints qlauncher's own argv for comparison).
//! * `compare FILE`: exports the XML, asks libvirt (`virsh domxml-to-native`) for its argv,
//!   prints the side-by-side table and exits 1 when a difference is not allowlisted.
//!
//! The same commands are reachable as `qlauncher convert FILE --format libvirt-xml`,
//! `qlauncher compare FILE` and `qlauncher golden FILE EXPECTED`; see [`qlauncher_libvirt_xml::cli`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use qlauncher_libvirt_xml::cli::{compare_cmd, convert_cmd, golden_cmd, Common, Format};

/// libvirt compatibility tools for qlauncher.
#[derive(Parser)]
#[command(version, about)]
enum Cli {
    /// Print the libvirt domain XML (or qlauncher's argv) for a VMI.
    Convert {
        #[command(flatten)]
        common: Common,
        /// Output format.
        #[arg(long, value_enum, default_value = "libvirt-xml")]
        format: Format,
        /// Also check the XML with `virt-xml-validate` (to standard error).
        #[arg(long)]
        validate: bool,
    },
    /// Compare qlauncher's argv with libvirt's for the exported XML.
    Compare {
        #[command(flatten)]
        common: Common,
        /// libvirt embed root, reused between runs (capabilities cache).
        #[arg(long, value_name = "DIR")]
        libvirt_root: Option<PathBuf>,
    },
    /// Compare the exported XML with an expected domain XML (e.g. KubeVirt's converter test
    /// data), element by element; exits 1 on a difference not in the golden allowlist.
    Golden {
        #[command(flatten)]
        common: Common,
        /// The expected domain XML.
        expected: PathBuf,
    },
}

fn run() -> anyhow::Result<ExitCode> {
    match Cli::parse() {
        Cli::Convert {
            common,
            format,
            validate,
        } => convert_cmd(&common, format, validate),
        Cli::Compare {
            common,
            libvirt_root,
        } => compare_cmd(&common, libvirt_root),
        Cli::Golden { common, expected } => golden_cmd(&common, &expected),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::from(2)
        }
    }
}

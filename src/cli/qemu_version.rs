//! `qlauncher qemu-version-record` (hidden): runs `qemu-system-x86_64 --version` once and writes
//! the version record the launcher reads at start instead of running QEMU
//! ([`qlauncher::sync::qemu_version::QemuVersionRecord`]). `scripts/assemble-launcher-tree` runs it when
//! the compute image is built.

use std::path::PathBuf;

use anyhow::Context;

/// `qlauncher qemu-version-record [--qemu BIN] [--as PATH] --out FILE`.
#[derive(clap::Args)]
pub struct QemuVersionRecordArgs {
    /// The QEMU binary to probe and stat (default: `qemu-system-x86_64` on `PATH`).
    #[arg(long, value_name = "BIN")]
    pub qemu: Option<PathBuf>,
    /// The path the launcher runs that binary by, recorded in place of `--qemu` (e.g.
    /// `/usr/bin/qemu-system-x86_64` while the image's tree is assembled in another directory).
    #[arg(long = "as", value_name = "PATH")]
    pub as_path: Option<PathBuf>,
    /// Where to write the record (its directory is created), e.g.
    /// `<tree>/usr/share/qlauncher/qemu-version.json`.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
}

/// Probes, writes `--out` atomically (temp + rename) and prints the version line.
pub fn run(args: QemuVersionRecordArgs) -> anyhow::Result<()> {
    let qemu = args
        .qemu
        .unwrap_or_else(|| qlauncher::sync::config::find_in_path("qemu-system-x86_64"));
    let as_path = args.as_path.unwrap_or_else(|| qemu.clone());
    let record = qlauncher::sync::qemu_version::QemuVersionRecord::probe(&qemu, &as_path)
        .with_context(|| format!("probing {}", qemu.display()))?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    record
        .write(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!("{}", record.version_line);
    Ok(())
}

//! `qlauncher qmp` and `qlauncher hotplug`: QMP-level tools for operators.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use qlauncher::qmp::{hotplug, tap, DiskAttach, DiskDetach, NicAttach, NicDetach, QmpClient};
use serde_json::Value;

/// `qlauncher qmp SOCKET COMMAND [JSON]`: runs one QMP command and prints QEMU's reply.
#[derive(Args, Debug)]
pub struct QmpArgs {
    /// QMP Unix socket of the QEMU.
    pub socket: PathBuf,
    /// QMP command (`query-status`, `device_del`, ...).
    pub command: String,
    /// Arguments as a JSON object.
    pub arguments: Option<String>,
    /// Timeout in seconds for connecting and for the command.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
}

/// `qlauncher hotplug SOCKET disk|nic attach|detach ...`.
#[derive(Args, Debug)]
pub struct HotplugArgs {
    /// QMP Unix socket of the QEMU.
    pub socket: PathBuf,
    /// Timeout in seconds for each command and for the unplug event.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
    /// Device kind.
    #[command(subcommand)]
    pub kind: HotplugKind,
}

/// Device kind to hotplug.
#[derive(Subcommand, Debug)]
pub enum HotplugKind {
    /// Disks: blockdev-add + device_add, or device_del + DEVICE_DELETED + blockdev-del.
    #[command(subcommand)]
    Disk(DiskOp),
    /// NICs: getfd + netdev_add + device_add, or device_del + DEVICE_DELETED + netdev_del.
    #[command(subcommand)]
    Nic(NicOp),
}

/// Disk operations.
#[derive(Subcommand, Debug)]
pub enum DiskOp {
    /// Attach: `--blockdev JSON` (repeat, bottom node first) and `--device JSON`.
    Attach {
        /// blockdev-add arguments (JSON object with node-name), bottom node first.
        #[arg(long = "blockdev", required = true)]
        blockdevs: Vec<String>,
        /// device_add arguments (JSON object with id and drive).
        #[arg(long)]
        device: String,
    },
    /// Detach: `--id ID` and `--node NAME` (repeat, top node first).
    Detach {
        /// Device id.
        #[arg(long)]
        id: String,
        /// Node names to delete after the device is gone, top first.
        #[arg(long = "node")]
        nodes: Vec<String>,
    },
}

/// NIC operations.
#[derive(Subcommand, Debug)]
pub enum NicOp {
    /// Attach: opens `--tap NAME`, passes it as `--fd-name`, then netdev_add and device_add.
    Attach {
        /// Existing tap device name.
        #[arg(long)]
        tap: String,
        /// Name of the fd inside QEMU (referenced by the netdev's "fd").
        #[arg(long)]
        fd_name: String,
        /// netdev_add arguments (JSON object).
        #[arg(long)]
        netdev: String,
        /// device_add arguments (JSON object).
        #[arg(long)]
        device: String,
    },
    /// Detach: `--id ID --netdev ID`.
    Detach {
        /// Device id.
        #[arg(long)]
        id: String,
        /// Netdev id.
        #[arg(long)]
        netdev: String,
    },
}

fn parse_json(what: &str, s: &str) -> anyhow::Result<Value> {
    serde_json::from_str(s).with_context(|| format!("{what} is not valid JSON"))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// Runs `qlauncher qmp`.
pub fn run_qmp(args: QmpArgs) -> anyhow::Result<()> {
    let arguments = args
        .arguments
        .as_deref()
        .map(|a| parse_json("arguments", a))
        .transpose()?;
    let timeout = Duration::from_secs(args.timeout);
    runtime()?.block_on(async {
        let client = QmpClient::connect(&args.socket, timeout).await?;
        let reply = client.execute(&args.command, arguments).await?;
        println!("{}", serde_json::to_string_pretty(&reply)?);
        Ok(())
    })
}

/// Runs `qlauncher hotplug`.
pub fn run_hotplug(args: HotplugArgs) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.timeout);
    runtime()?.block_on(async {
        let client = QmpClient::connect(&args.socket, timeout).await?;
        match args.kind {
            HotplugKind::Disk(DiskOp::Attach { blockdevs, device }) => {
                let disk = DiskAttach {
                    blockdevs: blockdevs
                        .iter()
                        .map(|b| parse_json("--blockdev", b))
                        .collect::<anyhow::Result<_>>()?,
                    device: parse_json("--device", &device)?,
                };
                hotplug::attach_disk(&client, &disk).await?;
            }
            HotplugKind::Disk(DiskOp::Detach { id, nodes }) => {
                let disk = DiskDetach {
                    device_id: id,
                    node_names: nodes,
                };
                hotplug::detach_disk(&client, &disk, timeout).await?;
            }
            HotplugKind::Nic(NicOp::Attach {
                tap,
                fd_name,
                netdev,
                device,
            }) => {
                let nic = NicAttach {
                    tap_fd: tap::open_tap(&tap, true)?,
                    fd_name,
                    extra_fds: vec![],
                    netdev: parse_json("--netdev", &netdev)?,
                    device: parse_json("--device", &device)?,
                };
                hotplug::attach_nic(&client, &nic).await?;
            }
            HotplugKind::Nic(NicOp::Detach { id, netdev }) => {
                let nic = NicDetach {
                    device_id: id,
                    netdev_id: netdev,
                };
                hotplug::detach_nic(&client, &nic, timeout).await?;
            }
        }
        println!("{{}}");
        Ok(())
    })
}

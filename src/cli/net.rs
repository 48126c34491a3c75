//! `qlauncher net-probe`: read-only look at the pod network from inside the pod.
//!
//! Discovers the pod interface and resolv.conf in the current network namespace, prints the
//! [`qlauncher::net::PodFacts`] as JSON and the nftables NAT tables the masquerade binding would
//! commit (in `nft -s list ruleset` form). Changes nothing.

use qlauncher::net::{self, NetConfig};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `net-probe`.
#[derive(clap::Args)]
pub struct NetProbe {
    /// The pod interface (`eth0`, or a Multus interface).
    #[arg(long, default_value = "eth0")]
    iface: String,
    /// The resolv.conf to read.
    #[arg(long, default_value = "/etc/resolv.conf")]
    resolv_conf: PathBuf,
}

/// Runs `net-probe`.
pub fn run(args: NetProbe) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let (handle, conn) = net::apply::connect().await?;
        let facts = net::discover(&handle, &args.iface, &args.resolv_conf).await;
        conn.abort();
        let facts = facts?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string_pretty(&facts)?)?;
        let cfg = NetConfig {
            pod_iface: args.iface.clone(),
            ..Default::default()
        };
        let plan = net::plan(&cfg, &facts)?;
        for t in &plan.nat_tables {
            write!(out, "{t}")?;
        }
        Ok(())
    })
}

//! `qlauncher launcher-sock`: query a launcher's command socket the way virt-handler does, for
//! checking a running launcher (`launcher-sock`) by hand.

use anyhow::{bail, Context};
use qlauncher::sync::rpc::proto::cmd::info::{cmd_info_client::CmdInfoClient, CmdInfoRequest};
use qlauncher::sync::rpc::proto::cmd::v1::{cmd_client::CmdClient, EmptyRequest, Response};
use qlauncher::sync::rpc::uds;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `qlauncher launcher-sock`.
#[derive(clap::Args)]
pub struct LauncherSockArgs {
    /// The command socket, e.g. /var/run/kubevirt/sockets/launcher-sock.
    socket: PathBuf,
    /// What to ask.
    #[arg(value_enum)]
    query: Query,
}

/// The read-only queries `launcher-sock` can send.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Query {
    /// CmdInfo.Info: the supported command API versions.
    Info,
    /// Cmd.Ping.
    Ping,
    /// Cmd.GetDomain: the domain JSON.
    GetDomain,
    /// Cmd.GetQemuVersion.
    QemuVersion,
    /// Cmd.GetDomainStats: the domain's stats JSON (what virt-handler's metrics poll).
    DomainStats,
}

fn check(response: Option<Response>) -> anyhow::Result<()> {
    match response {
        Some(Response { success: true, .. }) => Ok(()),
        Some(Response { message, .. }) => bail!("launcher answered success=false: {message}"),
        None => bail!("launcher answered without a response"),
    }
}

/// Connects to the socket, sends the query, prints the answer on stdout.
pub fn run(args: LauncherSockArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let channel = uds::connect(&args.socket, Duration::from_secs(2))
            .await
            .with_context(|| format!("cannot connect to {}", args.socket.display()))?;
        match args.query {
            Query::Info => {
                let info = CmdInfoClient::new(channel)
                    .info(CmdInfoRequest {})
                    .await?
                    .into_inner();
                println!("supportedCmdVersions: {:?}", info.supported_cmd_versions);
            }
            Query::Ping => {
                let answer = CmdClient::new(channel)
                    .ping(EmptyRequest {})
                    .await?
                    .into_inner();
                check(Some(answer))?;
                println!("ok");
            }
            Query::GetDomain => {
                let answer = CmdClient::new(channel)
                    .get_domain(EmptyRequest {})
                    .await?
                    .into_inner();
                check(answer.response)?;
                println!("{}", answer.domain);
            }
            Query::QemuVersion => {
                let answer = CmdClient::new(channel)
                    .get_qemu_version(EmptyRequest {})
                    .await?
                    .into_inner();
                check(answer.response)?;
                println!("{}", answer.version);
            }
            Query::DomainStats => {
                let answer = CmdClient::new(channel)
                    .get_domain_stats(EmptyRequest {})
                    .await?
                    .into_inner();
                check(answer.response)?;
                println!("{}", answer.domain_stats);
            }
        }
        Ok(())
    })
}

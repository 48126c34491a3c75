//! `GetVMStats` (KubeVirt 1.9, Alpha gate `VMStatsCollector`, launcher flag
//! `--vm-stats-collector`; `cmd-server/vmstats.go`, `manager.go` agent caches, v1.9.0).
//!
//! With the flag off the RPC is a gRPC error ([`VM_STATS_DISABLED`]). Otherwise each requested
//! part is answered: `domainStats` as `GetDomainStats`, `dirtyRate` as
//! `GetDomainDirtyRateStats`, and for any agent part `guestAgentVersion` (the poller's
//! `guest-info` version) plus, per requested command, `Response{success, message: <the agent's
//! raw reply, {"return": ...} included>}`. Agent replies come from per-command caches refreshed
//! only after their TTL ([`agent_ttl`]). Any failure makes the top-level `success` false with the
//! failures joined by `"; "`, each prefixed `domain stats: `, `dirty rate stats: ` or
//! `agent data <cmd>: `.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Mutex;

use crate::sync::guest::agent::{GuestAgent, DEFAULT_AGENT_TIMEOUT};
use crate::sync::rpc::proto::cmd::v1 as cmd;

/// The gRPC error text when the flag is off (KubeVirt's).
pub const VM_STATS_DISABLED: &str = "VMStatsCollector feature gate is not enabled";

/// How long an agent command's reply is served again (KubeVirt's cache TTLs).
pub fn agent_ttl(command: &str) -> Duration {
    match command {
        "guest-get-load" | "guest-get-cpustats" | "guest-get-diskstats" => Duration::from_secs(20),
        "guest-get-time"
        | "guest-get-vcpus"
        | "guest-get-memory-block-info"
        | "guest-get-users" => Duration::from_secs(60),
        "guest-get-memory-blocks" => Duration::from_secs(30 * 60),
        _ => Duration::from_secs(5 * 60),
    }
}

/// The agent commands `request` asks for, in the response's field order.
pub fn requested_agent_commands(request: &cmd::VmStatsRequest) -> Vec<&'static str> {
    let r = request;
    [
        (r.guest_get_load.is_some(), "guest-get-load"),
        (r.guest_get_cpu_stats.is_some(), "guest-get-cpustats"),
        (r.guest_get_disk_stats.is_some(), "guest-get-diskstats"),
        (r.guest_get_time.is_some(), "guest-get-time"),
        (r.guest_get_vcpus.is_some(), "guest-get-vcpus"),
        (
            r.guest_get_memory_block_info.is_some(),
            "guest-get-memory-block-info",
        ),
        (r.guest_get_users.is_some(), "guest-get-users"),
        (r.guest_get_os_info.is_some(), "guest-get-osinfo"),
        (r.guest_get_disks.is_some(), "guest-get-disks"),
        (r.guest_get_host_name.is_some(), "guest-get-host-name"),
        (r.guest_get_timezone.is_some(), "guest-get-timezone"),
        (
            r.guest_network_get_route.is_some(),
            "guest-network-get-route",
        ),
        (
            r.guest_network_get_interfaces.is_some(),
            "guest-network-get-interfaces",
        ),
        (
            r.guest_get_memory_blocks.is_some(),
            "guest-get-memory-blocks",
        ),
    ]
    .into_iter()
    .filter_map(|(on, c)| on.then_some(c))
    .collect()
}

/// Per-command caches of raw agent replies.
#[derive(Debug, Default)]
pub struct AgentReplyCache {
    entries: Mutex<HashMap<String, (Instant, String)>>,
}

impl AgentReplyCache {
    /// The raw reply of `command` (`{"return": ...}`), asked again after its TTL. Errors are not
    /// cached.
    ///
    /// # Errors
    /// The agent client's error text.
    pub async fn get(&self, agent: &GuestAgent, command: &str) -> Result<String, String> {
        let mut entries = self.entries.lock().await;
        if let Some((at, reply)) = entries.get(command) {
            if at.elapsed() < agent_ttl(command) {
                return Ok(reply.clone());
            }
        }
        let value = agent
            .command(command, None, DEFAULT_AGENT_TIMEOUT)
            .await
            .map_err(|e| e.to_string())?;
        let reply = json!({ "return": value }).to_string();
        entries.insert(command.to_string(), (Instant::now(), reply.clone()));
        Ok(reply)
    }
}

fn response(r: &Result<String, String>) -> cmd::Response {
    match r {
        Ok(m) => cmd::Response {
            success: true,
            message: m.clone(),
        },
        Err(e) => cmd::Response {
            success: false,
            message: e.clone(),
        },
    }
}

/// The parts of one `GetVMStats` answer, computed by the caller for what was requested.
#[derive(Debug, Default)]
pub struct VmStatsParts {
    /// `GetDomainStats`'s JSON string, when requested.
    pub domain_stats: Option<Result<String, String>>,
    /// The dirty rate in MB/s, when requested.
    pub dirty_rate: Option<Result<i64, String>>,
    /// The agent's `guest-info` version (from the poller's store).
    pub agent_version: String,
    /// Raw replies of the requested agent commands.
    pub agent: Vec<(&'static str, Result<String, String>)>,
}

/// Builds the response from `parts`.
pub fn assemble(parts: VmStatsParts) -> cmd::VmStatsResponse {
    let mut failures = Vec::new();
    let mut out = cmd::VmStatsResponse::default();
    if let Some(d) = parts.domain_stats {
        if let Err(e) = &d {
            failures.push(format!("domain stats: {e}"));
        }
        out.domain_stats = Some(cmd::DomainStatsResponse {
            response: Some(response(&d.clone().map(|_| String::new()))),
            domain_stats: d.unwrap_or_default(),
        });
    }
    if let Some(r) = parts.dirty_rate {
        if let Err(e) = &r {
            failures.push(format!("dirty rate stats: {e}"));
        }
        out.dirty_rate_stats = Some(cmd::DirtyRateStatsResponse {
            response: Some(response(&r.clone().map(|_| String::new()))),
            dirty_rate_mbs: r.unwrap_or(-1),
        });
    }
    if !parts.agent.is_empty() {
        out.guest_agent_version = Some(cmd::Response {
            success: true,
            message: parts.agent_version,
        });
    }
    for (command, reply) in parts.agent {
        if let Err(e) = &reply {
            failures.push(format!("agent data {command}: {e}"));
        }
        let r = Some(response(&reply));
        match command {
            "guest-get-load" => out.guest_get_load = r,
            "guest-get-cpustats" => out.guest_get_cpu_stats = r,
            "guest-get-diskstats" => out.guest_get_disk_stats = r,
            "guest-get-time" => out.guest_get_time = r,
            "guest-get-vcpus" => out.guest_get_vcpus = r,
            "guest-get-memory-block-info" => out.guest_get_memory_block_info = r,
            "guest-get-users" => out.guest_get_users = r,
            "guest-get-osinfo" => out.guest_get_os_info = r,
            "guest-get-disks" => out.guest_get_disks = r,
            "guest-get-host-name" => out.guest_get_host_name = r,
            "guest-get-timezone" => out.guest_get_timezone = r,
            "guest-network-get-route" => out.guest_network_get_route = r,
            "guest-network-get-interfaces" => out.guest_network_get_interfaces = r,
            "guest-get-memory-blocks" => out.guest_get_memory_blocks = r,
            _ => {}
        }
    }
    out.response = Some(cmd::Response {
        success: failures.is_empty(),
        message: failures.join("; "),
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_join_with_prefixes() {
        let out = assemble(VmStatsParts {
            domain_stats: Some(Ok("{}".into())),
            dirty_rate: Some(Err("no measurement".into())),
            agent_version: "7.2.22".into(),
            agent: vec![
                ("guest-get-load", Err("CommandNotFound".into())),
                (
                    "guest-get-host-name",
                    Ok(r#"{"return":{"host-name":"qlg"}}"#.into()),
                ),
            ],
        });
        let r = out.response.unwrap();
        assert!(!r.success);
        assert_eq!(
            r.message,
            "dirty rate stats: no measurement; agent data guest-get-load: CommandNotFound"
        );
        assert_eq!(out.domain_stats.unwrap().domain_stats, "{}");
        assert_eq!(out.guest_agent_version.unwrap().message, "7.2.22");
        assert!(out.guest_get_host_name.unwrap().success);
    }

    #[test]
    fn request_fields_map_to_agent_commands() {
        let req = cmd::VmStatsRequest {
            guest_get_users: Some(cmd::AgentUsersRequest {}),
            guest_network_get_interfaces: Some(cmd::AgentNetworkInterfacesRequest {}),
            ..cmd::VmStatsRequest::default()
        };
        assert_eq!(
            requested_agent_commands(&req),
            vec!["guest-get-users", "guest-network-get-interfaces"]
        );
        assert_eq!(agent_ttl("guest-get-users"), Duration::from_secs(60));
        assert_eq!(agent_ttl("guest-get-osinfo"), Duration::from_secs(300));
    }
}

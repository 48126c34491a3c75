//! `virt-probe`: the exec and guest-agent-ping probes KubeVirt puts on the compute container
//! (`cmd/virt-probe/virt-probe.go`, v1.9.0; `pkg/virt-controller/services/rendercontainer.go`
//! wraps a VMI's probes as `virt-probe --domainName <ns>_<name> --timeoutSeconds <t>
//! --guestAgentPing` or `... --command <cmd> -- <args>`, found through PATH).
//!
//! - Flags: `--socket` (default [`DEFAULT_SOCKET`]), `--domainName`, `--command`,
//!   `--timeoutSeconds` (default 1), `--guestAgentPing`, `--memProfile` (accepted; no Go heap to
//!   profile, so nothing is written), `-v`; words after `--` (and other positional words) are the
//!   guest command's arguments. An unknown flag or a bad value exits 2, `-h` exits 0.
//! - Not connecting, or a launcher without cmd version 1: exit 1.
//! - `--guestAgentPing`: `GuestPing`; a gRPC error exits 1, anything else 0.
//! - Otherwise `Exec`: the guest command's stdout (and a newline) when not empty, then its exit
//!   code as the probe's (the low 8 bits, as any exit); a gRPC error exits 255 (-1).

use crate::cmd_client::{runtime, LauncherClient};
use crate::flags::{self, Flag, Kind};
use crate::log;
use std::io::Write;
use std::path::Path;

/// The log component name.
pub const COMPONENT: &str = "virt-probe";
/// The launcher's cmd socket in the compute container (`cmdclient.SocketOnGuest()`).
pub const DEFAULT_SOCKET: &str = "/var/run/kubevirt/sockets/launcher-sock";

/// virt-probe's flags.
pub const FLAGS: [Flag; 7] = [
    Flag {
        name: "socket",
        kind: Kind::String,
        default: DEFAULT_SOCKET,
        usage: "Socket for connecting to the cmd server",
    },
    Flag {
        name: "domainName",
        kind: Kind::String,
        default: "",
        usage:
            "Domain Name of the Virtual Machine to connect the agent to. Usually namespace_vmname",
    },
    Flag {
        name: "command",
        kind: Kind::String,
        default: "",
        usage: "Command to execute on the guest",
    },
    Flag {
        name: "memProfile",
        kind: Kind::String,
        default: "",
        usage: "Path to store a memory profile. Profiling is skipped if empty",
    },
    Flag {
        name: "timeoutSeconds",
        kind: Kind::Int32,
        default: "1",
        usage: "Duration in seconds the probe will wait for the guest command to return.",
    },
    Flag {
        name: "guestAgentPing",
        kind: Kind::Bool,
        default: "false",
        usage: "Flag to specify readiness probe based of guest-agent ping",
    },
    Flag {
        name: "v",
        kind: Kind::Int32,
        default: "2",
        usage: "log level for V logs",
    },
];

/// The program; returns the exit code.
pub fn main() -> i32 {
    let parsed = flags::parse_or_exit("virt-probe", &FLAGS, false);
    log::set_verbosity(parsed.int32("v", log::DEFAULT_VERBOSITY));
    let socket = if parsed.given("socket") {
        parsed.string("socket")
    } else {
        DEFAULT_SOCKET.to_string()
    };
    let domain_name = parsed.string("domainName");
    let command = parsed.string("command");
    let timeout = parsed.int32("timeoutSeconds", 1);
    let runtime = match runtime() {
        Ok(r) => r,
        Err(e) => {
            log::error(COMPONENT, "Failed to connect cmd client", Some(&e));
            return 1;
        }
    };
    runtime.block_on(async move {
        let mut client = match LauncherClient::connect(Path::new(&socket)).await {
            Ok(c) => c,
            Err(e) => {
                log::error(COMPONENT, "Failed to connect cmd client", Some(&e));
                return 1;
            }
        };
        if parsed.bool("guestAgentPing") {
            return match client.guest_ping(&domain_name, timeout).await {
                Ok(()) => 0,
                Err(e) => {
                    log::line(COMPONENT, "critical", "Failed to ping the guest", Some(&e));
                    1
                }
            };
        }
        let (code, stdout, error) = client
            .exec(&domain_name, &command, &parsed.args, timeout)
            .await;
        if !stdout.is_empty() {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(stdout.as_bytes());
            let _ = out.write_all(b"\n");
            let _ = out.flush();
        }
        if let Some(e) = error {
            log::line(
                COMPONENT,
                "critical",
                "Failed executing the command",
                Some(&e),
            );
        }
        code
    })
}

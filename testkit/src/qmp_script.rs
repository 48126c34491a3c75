//! A scripted QMP peer, for the tests of QMP sequences that need hardware this machine lacks
//! (SR-IOV VFs, SEV): it greets as QEMU 10.1, accepts `qmp_capabilities`, answers a script of
//! [`Step`]s in order and records every command it got.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use qlauncher::qmp::QmpClient;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio::sync::Notify;

const GREETING: &str = r#"{"QMP": {"version": {"qemu": {"micro": 0, "minor": 1, "major": 10}, "package": "scripted"}, "capabilities": []}}"#;

/// One scripted exchange: the command expected, its reply (`{"return": ..}` or `{"error": ..}`),
/// held back until `gate` is notified when there is one, and the events QEMU sends after it.
pub struct Step {
    /// The command expected.
    pub execute: &'static str,
    /// Its reply (the peer sets its `id`).
    pub reply: Value,
    /// The events sent right after the reply.
    pub events: Vec<Value>,
    /// When set, the reply waits until this is notified.
    pub gate: Option<Arc<Notify>>,
}

/// A step that answers `execute` with `reply` at once, with no events.
pub fn step(execute: &'static str, reply: Value) -> Step {
    Step {
        execute,
        reply,
        events: Vec::new(),
        gate: None,
    }
}

/// A QMP peer on `dir/qmp.sock` that answers `script` in order and returns every command it got
/// (`execute` and `arguments`); a command out of script gets a `GenericError` (and uses up its
/// step). Returns the client connected to it and the peer's task.
pub async fn scripted(
    dir: &Path,
    script: Vec<Step>,
) -> (QmpClient, tokio::task::JoinHandle<Vec<Value>>) {
    let path = dir.join("qmp.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let peer = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        let (r, mut w) = s.into_split();
        let mut lines = BufReader::new(r).lines();
        w.write_all(format!("{GREETING}\n").as_bytes())
            .await
            .unwrap();
        let caps: Value = serde_json::from_str(&lines.next_line().await.unwrap().unwrap()).unwrap();
        assert_eq!(caps["execute"], "qmp_capabilities");
        w.write_all(format!("{}\n", json!({"return": {}, "id": caps["id"]})).as_bytes())
            .await
            .unwrap();
        let mut got = Vec::new();
        let mut script = script.into_iter();
        while let Ok(Some(line)) = lines.next_line().await {
            let cmd: Value = serde_json::from_str(&line).unwrap();
            let mut seen = json!({"execute": cmd["execute"]});
            if let Some(a) = cmd.get("arguments") {
                seen["arguments"] = a.clone();
            }
            got.push(seen);
            let (mut reply, events) = match script.next() {
                Some(s) if s.execute == cmd["execute"] => {
                    if let Some(gate) = s.gate {
                        gate.notified().await;
                    }
                    (s.reply, s.events)
                }
                _ => (
                    json!({"error": {"class": "GenericError", "desc": "not in the script"}}),
                    Vec::new(),
                ),
            };
            reply["id"] = cmd["id"].clone();
            let mut out = format!("{reply}\n");
            for e in events {
                out.push_str(&format!("{e}\n"));
            }
            if w.write_all(out.as_bytes()).await.is_err() {
                break;
            }
        }
        got
    });
    let client = QmpClient::connect(&path, Duration::from_secs(5))
        .await
        .unwrap();
    (client, peer)
}

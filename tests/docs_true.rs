//! The module docs say what the code does: no module doc of `src/`, `core/`, `compat/` or
//! `monitor/` names a cmd RPC as not implemented or not supported while the command service
//! serves it. The RPCs the service refuses outright are those whose method in
//! `src/sync/rpc/service.rs` answers `unsupported("<Rpc>")` without asking the manager; every
//! other RPC of `proto/kubevirt/cmd/v1/cmd.proto` is served.

use std::path::{Path, PathBuf};

/// Words a module doc uses for an RPC besides its name.
const TOPICS: &[(&str, &[&str])] = &[
    (
        "MigrateVirtualMachine",
        &["live migration", "migration,", "migration)"],
    ),
    ("FreezeVirtualMachine", &["freeze"]),
    ("BackupVirtualMachine", &["backup"]),
    ("GetSEVInfo", &["sev,", "sev attestation", "sev)"]),
    ("GetScreenshot", &["screenshot"]),
    ("VirtualMachineMemoryDump", &["memory dump"]),
    ("GetGuestInfo", &["guest-agent quer", "guest agent quer"]),
    ("GetVMStats", &["vm stats"]),
    (
        "HotplugHostDevices",
        &["host-device hotplug", "host device hotplug"],
    ),
    ("GetDomainDirtyRateStats", &["dirty rate"]),
];

/// Phrases that say something is missing.
const REFUSALS: &[&str] = &[
    "not implement",
    "not supported",
    "unsupported",
    "no support",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `rpc Name(` of the cmd proto.
fn proto_rpcs() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("proto/kubevirt/cmd/v1/cmd.proto")).unwrap();
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("rpc "))
        .filter_map(|l| l.split('(').next())
        .map(|n| n.trim().to_owned())
        .collect()
}

/// The RPCs the service answers `unsupported` without asking the manager.
fn refused_rpcs() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("src/sync/rpc/service.rs")).unwrap();
    let mut out = Vec::new();
    for method in text.split("async fn ").skip(1) {
        if method.contains("self.manager") {
            continue;
        }
        for part in method.split("unsupported(\"").skip(1) {
            if let Some(name) = part.split('"').next() {
                out.push(name.to_owned());
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "target" || n == "tests") {
                continue;
            }
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module doc of `text` in paragraphs (blank `//!` lines separate them), lower case.
fn doc_paragraphs(text: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    for line in text.lines() {
        let Some(doc) = line.trim_start().strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim();
        if doc.is_empty() {
            out.push(String::new());
        } else if let Some(last) = out.last_mut() {
            last.push(' ');
            last.push_str(&doc.to_lowercase());
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

/// The sentences of a paragraph (split at `. ` and `; `).
fn sentences(paragraph: &str) -> Vec<&str> {
    paragraph.split(". ").flat_map(|s| s.split("; ")).collect()
}

/// Whether `word` stands in `text` as a whole word (no letter or digit on either side).
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
    })
}

#[test]
fn no_module_doc_calls_a_served_rpc_unsupported() {
    let rpcs = proto_rpcs();
    assert!(rpcs.len() > 30, "cmd.proto read: {rpcs:?}");
    let refused = refused_rpcs();
    // Every RPC is served now (the backup ones last, issue 31).
    assert!(refused.is_empty(), "{refused:?}");
    let served: Vec<&String> = rpcs.iter().filter(|r| !refused.contains(r)).collect();
    let mut files = Vec::new();
    for dir in ["src", "core/src", "compat", "monitor/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    let mut stale = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let paragraphs = doc_paragraphs(&text);
        for paragraph in paragraphs.iter().flat_map(|p| sentences(p)) {
            if !REFUSALS.iter().any(|r| paragraph.contains(r)) {
                continue;
            }
            for rpc in &served {
                let words = TOPICS
                    .iter()
                    .find(|(name, _)| name == rpc)
                    .map(|(_, w)| *w)
                    .unwrap_or_default();
                let named = has_word(paragraph, &rpc.to_lowercase())
                    || words.iter().any(|w| paragraph.contains(w));
                if named {
                    stale.push(format!("{}: {rpc}: {paragraph}", file.display()));
                }
            }
        }
    }
    assert!(
        stale.is_empty(),
        "module docs call served RPCs unsupported:\n{}",
        stale.join("\n")
    );
}

#[test]
fn the_check_sees_a_stale_doc() {
    let stale = "//! The RPCs qlauncher does not implement (migration, freeze, backup, SEV,\n\
                 //! screenshots) answer at once.\n";
    let paragraphs = doc_paragraphs(stale);
    assert_eq!(paragraphs.len(), 1);
    assert!(REFUSALS.iter().any(|r| paragraphs[0].contains(r)));
    assert!(paragraphs[0].contains("freeze"));
    assert!(has_word("`guestping` and `ping`", "ping"));
    assert!(!has_word("`guestping`", "ping"));
    assert_eq!(sentences("a b. c; d").len(), 3);
}

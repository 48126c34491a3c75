//! `qlauncher hook-diff BEFORE.xml AFTER.xml`: what a hook sidecar's `OnDefineDomain` answer
//! (AFTER) asks of the domain it was sent (BEFORE, e.g. `qlauncher convert --format hook-xml`),
//! as the launcher decides it (`qlauncher::hooks::diff_answer`): the plan edits one a line, or
//! `no change`, or the refusal with the element path and both values (exit 1). A user can check
//! a hook script without a cluster.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

/// Arguments of `hook-diff`.
#[derive(Debug, clap::Args)]
pub struct HookDiffArgs {
    /// The domain XML sent to the hook.
    pub before: PathBuf,
    /// The hook's answer.
    pub after: PathBuf,
}

/// Reads at most one byte more than the launcher accepts, so a huge file is refused, not read.
fn read(path: &Path) -> anyhow::Result<String> {
    let limit = qlauncher_libvirt_xml::hooks::MAX_ANSWER_BYTES as u64 + 1;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(limit).read_to_end(&mut bytes))
        .with_context(|| format!("cannot read {}", path.display()))?;
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))
}

/// Runs `hook-diff`: prints the edits and exits 0, or prints the refusal and exits 1.
pub fn run(args: &HookDiffArgs) -> anyhow::Result<ExitCode> {
    let before = read(&args.before)?;
    let after = read(&args.after)?;
    match qlauncher_libvirt_xml::hooks::hook_diff(&before, &after) {
        Ok(text) => {
            print!("{text}");
            Ok(ExitCode::SUCCESS)
        }
        Err(refusal) => {
            println!("refused: {refusal}");
            Ok(ExitCode::FAILURE)
        }
    }
}

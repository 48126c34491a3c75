//! QEMU's version before a domain exists: the image's version record (`/usr/share/qlauncher/
//! qemu-version.json`, read when its stat identity matches the binary: no process) or `qemu
//! --version`, run once in the background when the launcher starts ([`QemuProbe`]). The converter
//! and `GetQemuVersion` wait for its answer; a running domain answers `query-version` instead.

use std::path::{Path, PathBuf};

use crate::cmdline::context::QemuVersion;
/// Where QEMU's version was learnt: the version record (no process) or `qemu --version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionSource {
    /// A [`QemuVersionRecord`] whose stat identity matched the binary.
    Record,
    /// `qemu --version`, run once.
    Probe,
}

impl VersionSource {
    /// `record` or `probe`, as logged.
    pub fn as_str(self) -> &'static str {
        match self {
            VersionSource::Record => "record",
            VersionSource::Probe => "probe",
        }
    }
}

type Answer = (Option<(QemuVersion, String)>, VersionSource);

/// The answer of `qemu --version`, asked once: `(7.2, "7.2.22")`, or None when QEMU does not answer.
/// With a version record ([`QemuProbe::with_record`]) that matches the binary, the answer is the
/// record's and no process runs. Cheap to clone; every clone shares the one answer.
#[derive(Debug, Clone)]
pub struct QemuProbe {
    qemu: PathBuf,
    record: Option<PathBuf>,
    answer: std::sync::Arc<tokio::sync::OnceCell<Answer>>,
}

impl QemuProbe {
    /// A probe of the QEMU binary `qemu`; nothing runs until [`QemuProbe::answer`] (call it from
    /// a spawned task to have the answer ready before it is needed).
    pub fn new(qemu: PathBuf) -> QemuProbe {
        QemuProbe {
            qemu,
            record: None,
            answer: std::sync::Arc::default(),
        }
    }

    /// A probe of `qemu` that first reads the version record at `record` (a few microseconds:
    /// one `stat` and one small file, no process). When the record matches the binary
    /// ([`QemuVersionRecord::matches`]) the answer is ready at once; otherwise (missing, stale,
    /// malformed: the reason at debug level) [`QemuProbe::answer`] runs `qemu --version` as
    /// [`QemuProbe::new`]'s does, and then writes the record to `record` when its directory
    /// exists and is writable (temp + rename; a failure is logged at debug and changes nothing),
    /// so that the next launcher finds it.
    pub fn with_record(qemu: PathBuf, record: PathBuf) -> QemuProbe {
        let answer = match QemuVersionRecord::load(&record, &qemu) {
            Ok(r) => {
                tracing::debug!(record = %record.display(), version = %r.version_line, "QEMU version from its record");
                let parsed = parse_version_line(&r.version_line);
                tokio::sync::OnceCell::new_with(Some((parsed, VersionSource::Record)))
            }
            Err(why) => {
                tracing::debug!(record = %record.display(), %why, "QEMU version record not used: probing");
                tokio::sync::OnceCell::new()
            }
        };
        QemuProbe {
            qemu,
            record: Some(record),
            answer: std::sync::Arc::new(answer),
        }
    }

    /// Runs `qemu --version` the first time (on a blocking thread) and returns its answer; the
    /// record's answer without a process when it matched.
    pub async fn answer(&self) -> Option<(QemuVersion, String)> {
        self.answer_with_source().await.0
    }

    /// [`QemuProbe::answer`] and where it came from.
    pub async fn answer_with_source(&self) -> (Option<(QemuVersion, String)>, VersionSource) {
        self.answer
            .get_or_init(|| {
                let qemu = self.qemu.clone();
                let record = self.record.clone();
                async move {
                    let answer = tokio::task::spawn_blocking(move || {
                        let line = qemu_version_line(&qemu)?;
                        if let Some(record) = record {
                            cache_record(&qemu, &line, &record);
                        }
                        parse_version_line(&line)
                    })
                    .await
                    .ok()
                    .flatten();
                    (answer, VersionSource::Probe)
                }
            })
            .await
            .clone()
    }
}

/// The first line of `qemu --version` (`QEMU emulator version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u19)`);
/// None when QEMU does not run or says nothing.
fn qemu_version_line(qemu: &Path) -> Option<String> {
    let out = std::process::Command::new(qemu)
        .arg("--version")
        .env_clear()
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Some(text.lines().next()?.trim().to_owned())
}

/// `QEMU emulator version 7.2.19 (...)` → (7.2, `7.2.19`); None when the line has no version.
fn parse_version_line(line: &str) -> Option<(QemuVersion, String)> {
    let v = line.split_whitespace().nth(3)?;
    Some((QemuVersion::parse(v)?, v.to_owned()))
}

/// Writes the record of `qemu` (first `--version` line `line`) to `record` when its directory
/// exists; a failure is logged at debug level only.
fn cache_record(qemu: &Path, line: &str, record: &Path) {
    if !record.parent().is_some_and(Path::is_dir) {
        return;
    }
    match QemuVersionRecord::of(qemu, line).and_then(|r| r.write(record)) {
        Ok(()) => tracing::debug!(record = %record.display(), "QEMU version record written"),
        Err(e) => {
            tracing::debug!(record = %record.display(), error = %e, "QEMU version record not written")
        }
    }
}

/// The default place of the QEMU version record under the launcher's root (`/` in a pod):
/// `usr/share/qlauncher/qemu-version.json`, next to the image's binaries.
pub const QEMU_VERSION_RECORD: &str = "usr/share/qlauncher/qemu-version.json";

/// What `qemu-system-x86_64 --version` says, recorded when the compute image is built
/// (`qlauncher qemu-version-record`, run by `scripts/assemble-launcher-tree`) so that the launcher
/// learns QEMU's version without starting a process. JSON:
/// `{"qemu":"/usr/bin/qemu-system-x86_64","size":..,"mtime":..,"mtime_nsec":..,"inode":..,
/// "version_line":"QEMU emulator version 7.2.19 (...)","major":7,"minor":2}`.
///
/// The binary's identity is its path, size and modification time in whole seconds: the inode and
/// the sub-second part are recorded but not compared, because the image's layers are unpacked on
/// every node (new inodes) and a layer's tar may keep whole seconds only.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QemuVersionRecord {
    /// The QEMU binary's absolute path as the launcher runs it.
    pub qemu: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    /// Its mtime, seconds since the epoch.
    pub mtime: i64,
    /// The nanoseconds of its mtime (informational).
    pub mtime_nsec: i64,
    /// Its inode when recorded (informational).
    pub inode: u64,
    /// The first line of `--version`.
    pub version_line: String,
    /// The major version parsed from `version_line`.
    pub major: u32,
    /// The minor version parsed from `version_line`.
    pub minor: u32,
}

impl QemuVersionRecord {
    /// The record of the binary at `qemu` (stat now) whose `--version` first line is `line`;
    /// errors when `qemu` cannot be stat'ed or `line` has no version.
    pub fn of(qemu: &Path, line: &str) -> std::io::Result<QemuVersionRecord> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(qemu)?;
        let (version, _) = parse_version_line(line).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("no version in {line:?}"),
            )
        })?;
        Ok(QemuVersionRecord {
            qemu: qemu.to_owned(),
            size: m.size(),
            mtime: m.mtime(),
            mtime_nsec: m.mtime_nsec(),
            inode: m.ino(),
            version_line: line.to_owned(),
            major: version.major,
            minor: version.minor,
        })
    }

    /// Runs `qemu --version` once and records it, naming the binary `as_path` (the path the
    /// launcher will run it by: `/usr/bin/qemu-system-x86_64` in the image, while the image is
    /// assembled elsewhere).
    pub fn probe(qemu: &Path, as_path: &Path) -> std::io::Result<QemuVersionRecord> {
        let line = qemu_version_line(qemu).ok_or_else(|| {
            std::io::Error::other(format!("{} --version gave no answer", qemu.display()))
        })?;
        let mut r = QemuVersionRecord::of(qemu, &line)?;
        r.qemu = as_path.to_owned();
        Ok(r)
    }

    /// Why this record does not describe the binary at `qemu` (path, size or mtime differ, or the
    /// version line and the parsed version disagree); Ok when it does.
    pub fn matches(&self, qemu: &Path) -> Result<(), String> {
        use std::os::unix::fs::MetadataExt;
        if self.qemu != qemu {
            return Err(format!("recorded for {}", self.qemu.display()));
        }
        let m = std::fs::metadata(qemu).map_err(|e| format!("stat {}: {e}", qemu.display()))?;
        if (m.size(), m.mtime()) != (self.size, self.mtime) {
            return Err(format!(
                "stale: size {} mtime {} recorded, {} {} now",
                self.size,
                self.mtime,
                m.size(),
                m.mtime()
            ));
        }
        match parse_version_line(&self.version_line) {
            Some((v, _)) if (v.major, v.minor) == (self.major, self.minor) => Ok(()),
            _ => Err(format!("bad version line {:?}", self.version_line)),
        }
    }

    /// The record at `path` when it parses and [`QemuVersionRecord::matches`] `qemu`; else why
    /// not. Reads at most 64 KiB.
    pub fn load(path: &Path, qemu: &Path) -> Result<QemuVersionRecord, String> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(64 * 1024).read_to_string(&mut text))
            .map_err(|e| format!("read: {e}"))?;
        let r: QemuVersionRecord =
            serde_json::from_str(&text).map_err(|e| format!("malformed: {e}"))?;
        r.matches(qemu)?;
        Ok(r)
    }

    /// Writes the record to `path` atomically: a temporary file in the same directory, then
    /// rename.
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let mut json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        json.push(b'\n');
        let result = std::fs::write(&tmp, &json).and_then(|()| std::fs::rename(&tmp, path));
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::config::find_in_path;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("qlauncher-rec-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const LINE: &str = "QEMU emulator version 7.2.5 (Debian 1:7.2+dfsg-7)";

    #[tokio::test]
    async fn a_matching_record_answers_without_a_process() {
        let d = scratch("match");
        // Not an executable: a process could not answer.
        let qemu = d.join("qemu");
        std::fs::write(&qemu, b"not qemu").unwrap();
        let record = d.join("qemu-version.json");
        QemuVersionRecord::of(&qemu, LINE)
            .unwrap()
            .write(&record)
            .unwrap();
        let probe = QemuProbe::with_record(qemu, record);
        assert_eq!(
            probe.answer_with_source().await,
            (
                Some((QemuVersion { major: 7, minor: 2 }, "7.2.5".into())),
                VersionSource::Record
            )
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn a_stale_record_is_ignored() {
        let d = scratch("stale");
        let qemu = d.join("qemu");
        std::fs::write(&qemu, b"not qemu").unwrap();
        let record = d.join("qemu-version.json");
        let r = QemuVersionRecord::of(&qemu, LINE).unwrap();
        r.write(&record).unwrap();
        assert_eq!(QemuVersionRecord::load(&record, &qemu), Ok(r.clone()));
        // Another binary's path.
        assert!(QemuVersionRecord::load(&record, &d.join("other")).is_err());
        // Same size, other mtime.
        let f = std::fs::File::options().write(true).open(&qemu).unwrap();
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
            .unwrap();
        drop(f);
        let why = QemuVersionRecord::load(&record, &qemu).unwrap_err();
        assert!(why.starts_with("stale"), "{why}");
        // Other size, recorded mtime.
        let r = QemuVersionRecord::of(&qemu, LINE).unwrap();
        r.write(&record).unwrap();
        std::fs::write(&qemu, b"not qemu either").unwrap();
        let f = std::fs::File::options().write(true).open(&qemu).unwrap();
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
            .unwrap();
        drop(f);
        let why = QemuVersionRecord::load(&record, &qemu).unwrap_err();
        assert!(why.starts_with("stale"), "{why}");
        // The launcher then probes: this "QEMU" does not run, so no version, and no panic.
        let probe = QemuProbe::with_record(qemu, record.clone());
        assert_eq!(
            probe.answer_with_source().await,
            (None, VersionSource::Probe)
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn a_malformed_record_falls_back_to_the_probe() {
        let d = scratch("malformed");
        let qemu = d.join("qemu");
        std::fs::write(&qemu, b"not qemu").unwrap();
        let record = d.join("qemu-version.json");
        let good = serde_json::to_value(QemuVersionRecord::of(&qemu, LINE).unwrap()).unwrap();
        let mut wrong_version = good.clone();
        wrong_version["major"] = 9.into();
        let mut no_version = good.clone();
        no_version["version_line"] = "QEMU".into();
        for text in [
            String::new(),
            "{not json".into(),
            "[]".into(),
            "\u{0}\u{ff}".into(),
            wrong_version.to_string(),
            no_version.to_string(),
            "x".repeat(100_000),
        ] {
            std::fs::write(&record, &text).unwrap();
            assert!(
                QemuVersionRecord::load(&record, &qemu).is_err(),
                "{text:.40}"
            );
            let probe = QemuProbe::with_record(qemu.clone(), record.clone());
            assert_eq!(
                probe.answer_with_source().await,
                (None, VersionSource::Probe)
            );
        }
        // A directory in its place, or none at all.
        std::fs::remove_file(&record).unwrap();
        assert!(QemuVersionRecord::load(&record, &qemu).is_err());
        std::fs::create_dir(&record).unwrap();
        assert!(QemuVersionRecord::load(&record, &qemu).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[tokio::test]
    async fn a_probe_writes_the_record_for_the_next_launcher() {
        let qemu = find_in_path("qemu-system-x86_64");
        let Some((version, text)) = QemuProbe::new(qemu.clone()).answer().await else {
            return; // no QEMU here
        };
        let d = scratch("cache");
        let record = d.join("qemu-version.json");
        let probe = QemuProbe::with_record(qemu.clone(), record.clone());
        assert_eq!(
            probe.answer_with_source().await,
            (Some((version, text.clone())), VersionSource::Probe)
        );
        let r = QemuVersionRecord::load(&record, &qemu).unwrap();
        assert_eq!((r.major, r.minor), (version.major, version.minor));
        let again = QemuProbe::with_record(qemu, record);
        assert_eq!(
            again.answer_with_source().await,
            (Some((version, text)), VersionSource::Record)
        );
        // No temporary file left.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        // A record directory that does not exist is not created.
        let missing = d.join("no/such/dir/qemu-version.json");
        let probe = QemuProbe::with_record(find_in_path("qemu-system-x86_64"), missing.clone());
        assert!(probe.answer().await.is_some());
        assert!(!missing.parent().unwrap().exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}

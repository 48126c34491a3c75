//! The qlauncher test guest (built by `scripts/build-guest`, documented in `guest/README.md`).
//!
//! - [`GuestImages::locate`]: the guest's files under `QLAUNCHER_GUEST_DIR`
//!   (default `/var/cache/qlauncher/guest`), or a panic telling to run `scripts/build-guest`.
//! - [`Console`]: a client of a serial console on a unix socket; it collects the `QLG: ` markers
//!   and types commands at the `QLG# ` shell prompt.
//! - [`Qmp`]: a small synchronous QMP client (greeting, `qmp_capabilities`, one command).
//! - [`Vm`]: a plain `qemu-system-x86_64 -accel tcg` process with its serial console and QMP socket
//!   in a private temporary directory; dropping it kills QEMU and removes the directory.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The default directory of the guest images (`scripts/build-guest` writes there).
pub const DEFAULT_GUEST_DIR: &str = "/var/cache/qlauncher/guest";

/// Time a TCG guest gets to reach `QLG: boot ok` and its shell on a loaded 2-core machine.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

/// Files of the built test guest.
#[derive(Debug, Clone)]
pub struct GuestImages {
    /// The directory holding them.
    pub dir: PathBuf,
    /// Kernel of the kernelBoot pair.
    pub vmlinuz: PathBuf,
    /// Initramfs of the kernelBoot pair.
    pub initrd: PathBuf,
    /// Bootable raw disk image (SeaBIOS, syslinux).
    pub disk_raw: PathBuf,
    /// The same disk as qcow2.
    pub disk_qcow2: PathBuf,
    /// Byte offset of the guest-writable scratch partition (partition 2) in the disk.
    pub scratch_offset: u64,
    /// Size in bytes of the scratch partition.
    pub scratch_size: u64,
}

impl GuestImages {
    /// Locates the guest under `QLAUNCHER_GUEST_DIR` (default [`DEFAULT_GUEST_DIR`]).
    ///
    /// Panics with a message telling to run `scripts/build-guest` when a file is missing.
    pub fn locate() -> GuestImages {
        GuestImages::try_locate().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`GuestImages::locate`], with the message as an error (a benchmark skips the guest).
    pub fn try_locate() -> Result<GuestImages, String> {
        let dir = std::env::var_os("QLAUNCHER_GUEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_GUEST_DIR));
        let file = |name: &str| {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(format!(
                    "test guest file {} is missing: run scripts/build-guest (it builds into \
                     $QLAUNCHER_GUEST_DIR, default {DEFAULT_GUEST_DIR})",
                    p.display()
                ))
            }
        };
        let env = std::fs::read_to_string(file("guest.env")?).unwrap_or_default();
        let value = |key: &str| -> Result<u64, String> {
            env.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
                .and_then(|v| v.trim().parse().ok())
                .ok_or_else(|| format!("{key} missing in guest.env: run scripts/build-guest"))
        };
        Ok(GuestImages {
            vmlinuz: file("vmlinuz")?,
            initrd: file("initrd.img")?,
            disk_raw: file("disk.raw")?,
            disk_qcow2: file("disk.qcow2")?,
            scratch_offset: value("SCRATCH_OFFSET")?,
            scratch_size: value("SCRATCH_SIZE")?,
            dir,
        })
    }

    /// QEMU's arguments for booting the guest from its kernel and initramfs with the console on
    /// ttyS0 (`-kernel VMLINUZ -initrd INITRD -append console=ttyS0`).
    pub fn kernel_boot_args(&self) -> Vec<String> {
        vec![
            "-kernel".into(),
            self.vmlinuz.display().to_string(),
            "-initrd".into(),
            self.initrd.display().to_string(),
            "-append".into(),
            "console=ttyS0".into(),
        ]
    }
}

/// Splits a marker's text into its first words and its `key=value` fields.
///
/// `"lease eth0 ip=10.0.2.15/24 router=10.0.2.2"` gives `(["lease", "eth0"], {ip: .., router: ..})`.
pub fn marker_fields(marker: &str) -> (Vec<String>, BTreeMap<String, String>) {
    let mut words = Vec::new();
    let mut fields = BTreeMap::new();
    for w in marker.split_whitespace() {
        match w.split_once('=') {
            Some((k, v)) => {
                fields.insert(k.to_string(), v.to_string());
            }
            None => words.push(w.to_string()),
        }
    }
    (words, fields)
}

/// Waits until the serial console log file `log` (QEMU's `logfile=`, written from the guest's
/// first byte on) holds a line with a marker starting with `prefix` (which includes `QLG: `, e.g.
/// `"QLG: lease eth0"`); returns the line from `QLG: ` on. Polls every 200 ms; panics with the log
/// after `timeout`.
pub async fn wait_log_marker(log: &Path, prefix: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        // A marker may follow the shell prompt on the same line.
        if let Some(line) = text.lines().find_map(|l| {
            let at = l.find("QLG: ")?;
            let m = l[at..].trim_end();
            m.starts_with(prefix).then(|| m.to_string())
        }) {
            return line;
        }
        assert!(
            Instant::now() < deadline,
            "no {prefix:?} within {timeout:?} (a guest without `QLG: agent` markers predates \
             guest/qga: run scripts/build-guest); serial log:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Removes ANSI escape sequences (`ESC [ ... letter`) and carriage returns from a console line.
fn clean_line(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    for c in chars.by_ref() {
                        if c.is_ascii_alphabetic() {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

/// A serial console on a unix socket, read and written by the test.
pub struct Console {
    stream: UnixStream,
    /// Complete lines received so far, cleaned (no `\r`, no escape sequences).
    lines: Vec<String>,
    /// Bytes of the current incomplete line.
    partial: Vec<u8>,
    /// Everything received, raw, for failure messages.
    raw: Vec<u8>,
    commands: u64,
    prompt_seen: bool,
}

/// A console wait that ran out of time or lost the connection.
#[derive(Debug)]
pub struct ConsoleError(pub String);

impl std::fmt::Display for ConsoleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConsoleError {}

impl Console {
    /// Connects to the console socket at `path`, retrying until `timeout` (the socket may not
    /// exist yet).
    pub fn connect(path: &Path, timeout: Duration) -> std::io::Result<Console> {
        let deadline = Instant::now() + timeout;
        loop {
            match UnixStream::connect(path) {
                Ok(stream) => {
                    return Ok(Console {
                        stream,
                        lines: Vec::new(),
                        partial: Vec::new(),
                        raw: Vec::new(),
                        commands: 0,
                        prompt_seen: false,
                    })
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Reads what arrives within `wait` (at most); returns false when the peer closed.
    fn pump(&mut self, wait: Duration) -> bool {
        let wait = wait.max(Duration::from_millis(1));
        let _ = self.stream.set_read_timeout(Some(wait));
        let mut buf = [0u8; 4096];
        match self.stream.read(&mut buf) {
            Ok(0) => false,
            Ok(n) => {
                self.raw.extend_from_slice(&buf[..n]);
                for &b in &buf[..n] {
                    if b == b'\n' {
                        let line = clean_line(&self.partial);
                        self.partial.clear();
                        self.lines.push(line);
                    } else {
                        self.partial.push(b);
                    }
                }
                if clean_line(&self.partial).contains("QLG# ") {
                    self.prompt_seen = true;
                }
                true
            }
            // EINTR is no close: a read with SO_RCVTIMEO is never restarted after a signal
            // handler, nor after a stop and continue of the process (signal(7)), which then
            // interrupts every console wait of the test binary at the same moment.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                true
            }
            Err(_) => false,
        }
    }

    /// Number of complete lines received so far: a position for [`Console::wait_for_marker_after`].
    pub fn position(&self) -> usize {
        self.lines.len()
    }

    /// All `QLG: ` markers received so far (the text after `QLG: `), in order.
    pub fn markers(&self) -> Vec<String> {
        self.lines
            .iter()
            .filter_map(|l| l.find("QLG: ").map(|i| l[i + 5..].trim_end().to_string()))
            .collect()
    }

    /// The whole console output so far (lossy UTF-8), for failure messages.
    pub fn transcript(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }

    /// Waits for a marker whose text starts with `prefix` (e.g. `"lease eth0 "`), anywhere in the
    /// output since the connection; returns the whole marker text (after `QLG: `).
    pub fn wait_for_marker(
        &mut self,
        prefix: &str,
        timeout: Duration,
    ) -> Result<String, ConsoleError> {
        self.wait_for_marker_after(0, prefix, timeout)
    }

    /// Like [`Console::wait_for_marker`], among the lines from position `from` on.
    pub fn wait_for_marker_after(
        &mut self,
        from: usize,
        prefix: &str,
        timeout: Duration,
    ) -> Result<String, ConsoleError> {
        let deadline = Instant::now() + timeout;
        let mut checked = from;
        loop {
            for line in &self.lines[checked.min(self.lines.len())..] {
                if let Some(i) = line.find("QLG: ") {
                    let text = line[i + 5..].trim_end();
                    if text.starts_with(prefix) {
                        return Ok(text.to_string());
                    }
                }
            }
            checked = checked.max(self.lines.len());
            let now = Instant::now();
            if now >= deadline {
                return Err(self.error(&format!(
                    "no marker starting with {prefix:?} within {timeout:?}"
                )));
            }
            if !self.pump(deadline - now) {
                return Err(self.error(&format!(
                    "console closed before a marker starting with {prefix:?}"
                )));
            }
        }
    }

    fn error(&self, what: &str) -> ConsoleError {
        let t = self.transcript();
        let tail: String = t
            .chars()
            .rev()
            .take(3000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        ConsoleError(format!("{what}; console output (last 3000 chars):\n{tail}"))
    }

    /// Waits until the shell prompt `QLG# ` has been printed once.
    pub fn wait_for_prompt(&mut self, timeout: Duration) -> Result<(), ConsoleError> {
        let deadline = Instant::now() + timeout;
        while !self.prompt_seen && !self.lines.iter().any(|l| l.contains("QLG# ")) {
            let now = Instant::now();
            if now >= deadline {
                return Err(self.error("no shell prompt"));
            }
            if !self.pump(deadline - now) {
                return Err(self.error("console closed before the shell prompt"));
            }
        }
        self.prompt_seen = true;
        Ok(())
    }

    /// Sends raw bytes to the console.
    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    /// Types `command` at the `QLG# ` prompt and returns its exit status and output (lines joined
    /// with `\n`, without `\r` and escape sequences; marker lines printed meanwhile are left out).
    ///
    /// `command` must be one line of shell; its output is found between two sentinel echoes.
    pub fn run(&mut self, command: &str, timeout: Duration) -> Result<(i32, String), ConsoleError> {
        self.wait_for_prompt(timeout)?;
        self.commands += 1;
        let n = self.commands;
        let begin = format!("QLG-BEGIN-{n}");
        let end_tag = format!("QLG-END-{n} ");
        let start = self.lines.len();
        // The typed text holds `QLG-BEGIN-$((n))`, the output `QLG-BEGIN-n`: even when the shell's
        // line editing wraps the echoed command, no piece of it equals an output sentinel.
        let line = format!("echo QLG-BEGIN-$(({n})); {command}; echo QLG-END-$(({n})) $?\n");
        self.send(line.as_bytes())
            .map_err(|e| self.error(&format!("write to console: {e}")))?;
        let deadline = Instant::now() + timeout;
        loop {
            let first = self.lines[start..]
                .iter()
                .position(|l| l.trim_end() == begin);
            if let Some(first) = first {
                let body = &self.lines[start + first + 1..];
                let end = body.iter().position(|l| {
                    l.strip_prefix(&end_tag)
                        .is_some_and(|r| r.trim().parse::<i32>().is_ok())
                });
                if let Some(end) = end {
                    let status = body[end][end_tag.len()..]
                        .trim()
                        .parse::<i32>()
                        .unwrap_or(-1);
                    let output: Vec<&str> = body[..end]
                        .iter()
                        .filter(|l| !l.contains("QLG: "))
                        .map(|l| l.as_str())
                        .collect();
                    return Ok((status, output.join("\n")));
                }
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.error(&format!(
                    "command {command:?} did not finish within {timeout:?}"
                )));
            }
            if !self.pump(deadline - now) {
                return Err(self.error(&format!("console closed while running {command:?}")));
            }
        }
    }

    /// Reads until the peer closes the console (QEMU exited) or `timeout` passes; true when closed.
    pub fn wait_closed(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            if !self.pump(deadline - now) {
                return true;
            }
        }
    }
}

/// A QMP exchange failed (I/O, bad JSON, or an `error` reply).
#[derive(Debug)]
pub struct QmpError(pub String);

impl std::fmt::Display for QmpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for QmpError {}

/// A small synchronous QMP client: connect, read the greeting, negotiate, run commands.
pub struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    /// Events received while waiting for replies.
    pub events: Vec<serde_json::Value>,
}

impl Qmp {
    /// Connects to the QMP socket at `path` (retrying until `timeout`) and negotiates capabilities.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Qmp, QmpError> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(QmpError(format!("connect {}: {e}", path.display())))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| QmpError(e.to_string()))?;
        let writer = stream.try_clone().map_err(|e| QmpError(e.to_string()))?;
        let mut qmp = Qmp {
            reader: BufReader::new(stream),
            writer,
            events: Vec::new(),
        };
        let greeting = qmp.read_message()?;
        if greeting.get("QMP").is_none() {
            return Err(QmpError(format!("unexpected greeting {greeting}")));
        }
        qmp.execute("qmp_capabilities", serde_json::json!({}))?;
        Ok(qmp)
    }

    fn read_message(&mut self) -> Result<serde_json::Value, QmpError> {
        let mut line = String::new();
        let n = self
            .reader
            .read_line(&mut line)
            .map_err(|e| QmpError(format!("read: {e}")))?;
        if n == 0 {
            return Err(QmpError("QMP connection closed".into()));
        }
        serde_json::from_str(&line).map_err(|e| QmpError(format!("bad JSON {line:?}: {e}")))
    }

    /// Runs `command` with `arguments` (a JSON object) and returns its `return` value.
    pub fn execute(
        &mut self,
        command: &str,
        arguments: serde_json::Value,
    ) -> Result<serde_json::Value, QmpError> {
        let msg = serde_json::json!({"execute": command, "arguments": arguments});
        let mut text = msg.to_string();
        text.push('\n');
        self.writer
            .write_all(text.as_bytes())
            .map_err(|e| QmpError(format!("write: {e}")))?;
        loop {
            let reply = self.read_message()?;
            if let Some(r) = reply.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = reply.get("error") {
                return Err(QmpError(format!("{command}: {e}")));
            }
            self.events.push(reply);
        }
    }
}

/// A `qemu-system-x86_64` started from a rendered argv (stdout null, stderr piped), killed and
/// reaped on drop; for tests that check what QEMU made of a command line.
pub struct QemuChild {
    child: Child,
    argv: Vec<String>,
}

impl QemuChild {
    /// Spawns `qemu-system-x86_64 ARGV` with `envs` added to the environment.
    pub fn spawn(argv: &[String], envs: &[(String, String)]) -> QemuChild {
        let child = Command::new("qemu-system-x86_64")
            .args(argv)
            .envs(envs.iter().cloned())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn QEMU");
        QemuChild {
            child,
            argv: argv.to_vec(),
        }
    }

    /// QEMU's pid.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Connects to QEMU's QMP socket `sock` (its `-qmp`/`-chardev` path), waiting up to `timeout`
    /// for it, and negotiates; panics with QEMU's stderr and argv when QEMU exits first or sends
    /// no greeting.
    pub fn qmp(&mut self, sock: &Path, timeout: Duration) -> Qmp {
        let deadline = Instant::now() + timeout;
        while UnixStream::connect(sock).is_err() {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("QEMU exited {st}: {}\nargv: {:?}", self.stderr(), self.argv);
            }
            assert!(Instant::now() < deadline, "no QMP socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        match Qmp::connect(sock, timeout) {
            Ok(q) => q,
            Err(e) => {
                let _ = self.child.wait();
                panic!("{e}: {}\nargv: {:?}", self.stderr(), self.argv)
            }
        }
    }

    fn stderr(&mut self) -> String {
        let mut err = String::new();
        if let Some(e) = self.child.stderr.as_mut() {
            let _ = e.read_to_string(&mut err);
        }
        err
    }
}

impl Drop for QemuChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

static VM_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A plain `qemu-system-x86_64 -accel tcg` process with a serial console and a QMP socket in a
/// private temporary directory. Dropping it kills QEMU (if still running) and removes the directory.
pub struct Vm {
    child: Child,
    /// The private directory (sockets, overlays a test puts there).
    pub dir: tempfile::TempDir,
    /// The serial console (ttyS0), connected before the guest started.
    pub console: Console,
    /// Path of the QMP socket.
    pub qmp_path: PathBuf,
    exit: Option<ExitStatus>,
}

impl Vm {
    /// Makes the private directory for a VM; `args_for(dir)` returns the machine-specific
    /// arguments (drives, NICs, kernel) given that directory. The helper adds `-accel tcg -machine q35
    /// -m 256 -nodefaults -display none`, the serial console socket (`server=on,wait=on`: QEMU waits
    /// for the console before starting the guest) and the QMP socket.
    pub fn start(args_for: impl FnOnce(&Path) -> Vec<String>) -> Vm {
        Vm::start_in(None, args_for)
    }

    /// Like [`Vm::start`], but with `/usr/bin/qemu-system-x86_64` run by `chroot ROOT` when `root`
    /// is given. The private directory is then made under `ROOT/tmp`; `args_for` still gets its
    /// host path and must give QEMU paths as seen inside ROOT (see [`Vm::in_root`]).
    pub fn start_in(root: Option<&Path>, args_for: impl FnOnce(&Path) -> Vec<String>) -> Vm {
        let n = VM_COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = tempfile::Builder::new()
            .prefix(&format!("qlg-vm-{}-{n}-", std::process::id()))
            .tempdir_in(root.map_or_else(std::env::temp_dir, |r| r.join("tmp")))
            .expect("temporary directory");
        let serial = dir.path().join("serial.sock");
        let qmp_path = dir.path().join("qmp.sock");
        let mut args: Vec<String> = [
            "-accel",
            "tcg",
            "-machine",
            "q35",
            "-m",
            "256",
            "-nodefaults",
            "-display",
            "none",
            "-no-user-config",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let seen = |p: &Path| Vm::in_root(root, p).display().to_string();
        args.push("-chardev".into());
        args.push(format!(
            "socket,id=ser0,path={},server=on,wait=on",
            seen(&serial)
        ));
        args.push("-serial".into());
        args.push("chardev:ser0".into());
        args.push("-qmp".into());
        args.push(format!("unix:{},server=on,wait=off", seen(&qmp_path)));
        args.extend(args_for(dir.path()));
        let log = std::fs::File::create(dir.path().join("qemu.log")).expect("qemu log file");
        let mut cmd = match root {
            Some(r) => {
                let mut c = Command::new("chroot");
                c.arg(r).arg("/usr/bin/qemu-system-x86_64");
                c
            }
            None => Command::new("qemu-system-x86_64"),
        };
        let child = cmd
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("qemu log file"))
            .stderr(log)
            .spawn()
            .expect("run qemu-system-x86_64 (scripts/install-deps installs it)");
        let mut vm = Vm {
            child,
            dir,
            console: Console {
                stream: UnixStream::pair().expect("socket pair").0,
                lines: Vec::new(),
                partial: Vec::new(),
                raw: Vec::new(),
                commands: 0,
                prompt_seen: false,
            },
            qmp_path,
            exit: None,
        };
        match Console::connect(&serial, Duration::from_secs(30)) {
            Ok(c) => vm.console = c,
            Err(e) => panic!(
                "connect to the serial console: {e}; QEMU log:\n{}",
                vm.qemu_log()
            ),
        }
        vm
    }

    /// `path` (on the host, under `root`) as QEMU sees it when chrooted into `root`.
    pub fn in_root(root: Option<&Path>, path: &Path) -> PathBuf {
        match root.and_then(|r| path.strip_prefix(r).ok()) {
            Some(rel) => Path::new("/").join(rel),
            None => path.to_path_buf(),
        }
    }

    /// QEMU's stdout and stderr so far.
    pub fn qemu_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("qemu.log")).unwrap_or_default()
    }

    /// Opens a QMP session (one at a time: close it before opening another).
    pub fn qmp(&self) -> Result<Qmp, QmpError> {
        Qmp::connect(&self.qmp_path, Duration::from_secs(30))
    }

    /// Waits for `QLG: boot ok` and the shell prompt; panics with the console output otherwise.
    pub fn wait_booted(&mut self) {
        if let Err(e) = self.console.wait_for_marker("boot ok", BOOT_TIMEOUT) {
            panic!("{e}\nQEMU log:\n{}", self.qemu_log());
        }
        if let Err(e) = self.console.wait_for_prompt(BOOT_TIMEOUT) {
            panic!("{e}");
        }
    }

    /// Presses the ACPI power button (QMP `system_powerdown`), waits for the guest's
    /// `QLG: poweroff` and for QEMU to exit, each up to `timeout`; returns QEMU's exit status.
    /// Panics when a step fails or times out.
    pub fn power_off(&mut self, timeout: Duration) -> ExitStatus {
        self.qmp()
            .unwrap()
            .execute("system_powerdown", serde_json::json!({}))
            .unwrap();
        self.console.wait_for_marker("poweroff", timeout).unwrap();
        self.wait_exit(timeout)
            .expect("QEMU exits after the guest powers off")
    }

    /// Waits until QEMU exits, up to `timeout`; returns its status, or None when still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exit {
                return Some(s);
            }
            if let Ok(Some(s)) = self.child.try_wait() {
                self.exit = Some(s);
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            // Keep draining the console so QEMU never blocks on it.
            self.console.pump(Duration::from_millis(100));
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixListener;

    /// A stop and continue of the test process (a debugger, a cgroup freeze of the CI's
    /// container) interrupts a console read that has a receive timeout with EINTR: the console
    /// is still open, so a wait goes on and sees what QEMU writes next.
    #[test]
    fn a_stop_and_continue_is_not_a_closed_console() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("serial.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let mut console = Console::connect(&path, Duration::from_secs(5)).unwrap();
        let (mut qemu, _) = listener.accept().unwrap();
        let waiter = std::thread::spawn(move || {
            console
                .wait_for_marker("after-resume", Duration::from_secs(30))
                .map_err(|e| e.to_string())
        });
        std::thread::sleep(Duration::from_millis(300));
        let me = std::process::id().to_string();
        // The continue comes from a process that is not stopped with us.
        let mut resume = Command::new("sh")
            .args(["-c", "sleep 0.5; kill -CONT \"$0\"", &me])
            .spawn()
            .unwrap();
        let _ = Command::new("kill").args(["-STOP", &me]).status();
        let _ = resume.wait();
        std::thread::sleep(Duration::from_millis(200));
        // A console the wait took for closed is gone: the write may fail then.
        let _ = qemu.write_all(b"QLG: after-resume\n");
        assert_eq!(waiter.join().unwrap(), Ok("after-resume".to_string()));
    }
}

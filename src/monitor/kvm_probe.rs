//! Whether KVM actually runs a guest here: a tiny probe guest started with `-accel kvm`.
//!
//! `/dev/kvm` opening is not enough. Under nested virtualization without hardware support (a KVM
//! that emulates the guest instruction by instruction, as this project's CI machine has), a
//! real-mode `hlt` and SeaBIOS run, but a Linux kernel needs minutes to decompress itself and looks
//! hung: each instruction costs microseconds (measured there: a 2M-iteration store loop took 27 s
//! under KVM against 0.03 s under TCG). QEMU's `-cpu host` may also abort before the guest runs
//! (`failed to set MSR 0x10a`). So [`probe`] boots the guest of `kvm_probe.S` (beside this file) the
//! way a Linux kernel boots (real mode, protected mode, PAE paging, long mode), makes it run a
//! 10M-iteration loop and fill and check 8 MiB of memory, and requires it to report success
//! through `isa-debug-exit` within [`ProbeOptions::run_timeout`] of its first instruction. A
//! hardware KVM needs milliseconds for this (10M iterations at GHz speed), TCG about 0.2 s (measured
//! here), an emulating KVM minutes.
//!
//! QEMU runs it as `-machine q35,accel=kvm -nodefaults -display none -no-user-config -no-reboot
//! -m 32 -cpu <cpu> -bios <64 KiB image>` with the stage bytes on an `isa-debugcon` at port 0x402
//! (stdout) and `isa-debug-exit` at port 0xf4. The image is built in memory from [`PROBE_CODE`]
//! (no toolchain at run time) and written to a scratch file that is removed afterwards. No program
//! other than QEMU runs. [`probe_cached`] keeps the first answer for the life of the process.
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::MonitorError;

/// Size of the `-bios` image: QEMU requires a multiple of 64 KiB.
pub const BIOS_SIZE: usize = 64 * 1024;
/// Offset of [`PROBE_CODE`] in the image: the code is linked at 0xfffffe00 (`BASE` in
/// `kvm_probe.S`), 512 bytes below the 4 GiB boundary where QEMU maps the image's end.
pub const CODE_OFFSET: usize = BIOS_SIZE - 512;
/// QEMU's exit status when the guest writes 0x2a to `isa-debug-exit`: `(0x2a << 1) | 1`.
pub const SUCCESS_STATUS: i32 = 85;
/// QEMU's exit status when the guest found its memory pattern changed: `(0x15 << 1) | 1`.
pub const MEMORY_MISMATCH_STATUS: i32 = 43;

/// The probe guest's code: `kvm_probe.S` assembled (`as --64`, `objcopy -O binary`), without the
/// zero padding up to the reset vector. A test reassembles the source and compares.
#[rustfmt::skip]
pub const PROBE_CODE: [u8; 270] = [
    // 0x000: real mode: report 'R', load the GDT, set CR0.PE, far jump to 0x08:pm32
    0xfa, 0xfc, 0xba, 0x02, 0x04, 0xb0, 0x52, 0xee, 0x2e, 0x66, 0x0f, 0x01, 0x16, 0x08, 0xff, 0x0f,
    0x20, 0xc0, 0x0c, 0x01, 0x0f, 0x22, 0xc0, 0x66, 0xea, 0x1f, 0xfe, 0x0f, 0x00, 0x08, 0x00,
    // 0x01f: 32-bit protected mode: report 'P', build PML4/PDPT/PD at 0x1000 (1 GiB of 2 MiB pages), CR4.PAE, CR3, EFER.LME, CR0.PG, far jump to 0x18:lm64
    0xb8, 0x10, 0x00, 0x00, 0x00, 0x8e, 0xd8, 0x8e, 0xc0, 0x8e, 0xd0, 0xb0, 0x50, 0xee, 0xbf, 0x00,
    0x10, 0x00, 0x00, 0x31, 0xc0, 0xb9, 0x00, 0x0c, 0x00, 0x00, 0xf3, 0xab, 0xc7, 0x05, 0x00, 0x10,
    0x00, 0x00, 0x03, 0x20, 0x00, 0x00, 0xc7, 0x05, 0x00, 0x20, 0x00, 0x00, 0x03, 0x30, 0x00, 0x00,
    0xbf, 0x00, 0x30, 0x00, 0x00, 0xb8, 0x83, 0x00, 0x00, 0x00, 0xb9, 0x00, 0x02, 0x00, 0x00, 0x89,
    0x07, 0x05, 0x00, 0x00, 0x20, 0x00, 0x83, 0xc7, 0x08, 0xe2, 0xf4, 0x0f, 0x20, 0xe0, 0x0c, 0x20,
    0x0f, 0x22, 0xe0, 0xb8, 0x00, 0x10, 0x00, 0x00, 0x0f, 0x22, 0xd8, 0xb9, 0x80, 0x00, 0x00, 0xc0,
    0x0f, 0x32, 0x80, 0xcc, 0x01, 0x0f, 0x30, 0x0f, 0x20, 0xc0, 0x0d, 0x00, 0x00, 0x00, 0x80, 0x0f,
    0x22, 0xc0, 0xea, 0x98, 0xfe, 0x0f, 0x00, 0x18, 0x00,
    // 0x098: long mode: report 'L', 10M-iteration loop, 'C', fill and check 8 MiB at 2 MiB, 'M', write 0x2a (or 'X' and 0x15) to isa-debug-exit, hlt
    0x66, 0xba, 0x02, 0x04, 0xb0, 0x4c, 0xee, 0xb9, 0x80, 0x96, 0x98, 0x00, 0xff, 0xc9, 0x75, 0xfc,
    0xb0, 0x43, 0xee, 0x48, 0xb8, 0x3c, 0x3c, 0xc3, 0xc3, 0xa5, 0xa5, 0x5a, 0x5a, 0xbf, 0x00, 0x00,
    0x20, 0x00, 0xb9, 0x00, 0x00, 0x10, 0x00, 0xf3, 0x48, 0xab, 0xbf, 0x00, 0x00, 0x20, 0x00, 0xb9,
    0x00, 0x00, 0x10, 0x00, 0xf3, 0x48, 0xaf, 0x75, 0x07, 0xb0, 0x4d, 0xee, 0xb0, 0x2a, 0xeb, 0x05,
    0xb0, 0x58, 0xee, 0xb0, 0x15, 0x66, 0xba, 0xf4, 0x00, 0xee, 0xf4, 0xeb, 0xfd, 0x00, 0x00, 0x00,
    // 0x0e8: GDT: null, 0x08 32-bit code, 0x10 data, 0x18 64-bit code
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x9b, 0xcf, 0x00,
    0xff, 0xff, 0x00, 0x00, 0x00, 0x93, 0xcf, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x9b, 0xaf, 0x00,
    // 0x108: GDTR: limit 0x1f, base 0x000ffee8
    0x1f, 0x00, 0xe8, 0xfe, 0x0f, 0x00,
];

/// The reset vector at 0xfffffff0 (image offset `BIOS_SIZE - 16`): `jmp start` (16-bit, relative).
const RESET_VECTOR: [u8; 3] = [0xe9, 0x0d, 0xfe];

/// The 64 KiB `-bios` image: zeros, [`PROBE_CODE`] at [`CODE_OFFSET`], the reset jump at the end.
pub fn bios_image() -> Vec<u8> {
    let mut image = vec![0u8; BIOS_SIZE];
    image[CODE_OFFSET..CODE_OFFSET + PROBE_CODE.len()].copy_from_slice(&PROBE_CODE);
    image[BIOS_SIZE - 16..BIOS_SIZE - 16 + RESET_VECTOR.len()].copy_from_slice(&RESET_VECTOR);
    image
}

/// How far the probe guest got; each stage is one byte on its debug console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// No byte yet: QEMU did not start the guest.
    NotStarted,
    /// `R`: first instructions ran in real mode.
    RealMode,
    /// `P`: 32-bit protected mode.
    ProtectedMode,
    /// `L`: long mode with paging.
    LongMode,
    /// `C`: the 10M-iteration compute loop finished.
    ComputeLoop,
    /// `M`: 8 MiB of memory filled and checked.
    Memory,
}

impl Stage {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            b'R' => Stage::RealMode,
            b'P' => Stage::ProtectedMode,
            b'L' => Stage::LongMode,
            b'C' => Stage::ComputeLoop,
            b'M' => Stage::Memory,
            _ => return None,
        })
    }

    /// What the guest does after this stage (for "did not get past" messages).
    fn next_step(self) -> &'static str {
        match self {
            Stage::NotStarted => "its first real-mode instruction",
            Stage::RealMode => "entering protected mode",
            Stage::ProtectedMode => "entering long mode with paging",
            Stage::LongMode => "a 10M-iteration compute loop",
            Stage::ComputeLoop => "filling and checking 8 MiB of memory",
            Stage::Memory => "writing to isa-debug-exit",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::NotStarted => "not started",
            Stage::RealMode => "real mode",
            Stage::ProtectedMode => "protected mode",
            Stage::LongMode => "long mode",
            Stage::ComputeLoop => "compute loop done",
            Stage::Memory => "memory checked",
        })
    }
}

/// The accelerator the probe runs under (TCG only to test the probe itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeAccel {
    /// `accel=kvm`.
    Kvm,
    /// `accel=tcg`.
    Tcg,
}

/// How to run the probe.
#[derive(Debug, Clone)]
pub struct ProbeOptions {
    /// The QEMU binary (the one the domain will use).
    pub qemu: PathBuf,
    /// `-cpu` value; `None` leaves QEMU's default model. The launcher passes `host,migratable=on`,
    /// what the converter renders for host-model and host-passthrough under KVM.
    pub cpu: Option<String>,
    /// Accelerator.
    pub accel: ProbeAccel,
    /// Directory for the scratch `-bios` file (removed after the probe).
    pub scratch_dir: PathBuf,
    /// Bound on QEMU's start-up, until the guest's first byte (QEMU itself, not the guest).
    pub start_timeout: Duration,
    /// Bound on the guest's work, from its first byte to its success report.
    pub run_timeout: Duration,
}

impl ProbeOptions {
    /// KVM with `-cpu host,migratable=on`, 10 s for QEMU to start, 2 s for the guest.
    pub fn kvm(qemu: impl Into<PathBuf>, scratch_dir: impl Into<PathBuf>) -> Self {
        Self {
            qemu: qemu.into(),
            cpu: Some("host,migratable=on".into()),
            accel: ProbeAccel::Kvm,
            scratch_dir: scratch_dir.into(),
            start_timeout: Duration::from_secs(10),
            run_timeout: Duration::from_secs(2),
        }
    }
}

/// A successful probe: when each stage was reported, from QEMU's spawn.
#[derive(Debug, Clone)]
pub struct ProbeReport {
    /// Stages in order with their time since QEMU was spawned.
    pub stages: Vec<(Stage, Duration)>,
    /// From spawning QEMU to its exit.
    pub elapsed: Duration,
}

impl ProbeReport {
    /// Time from the guest's first instruction to its last stage.
    pub fn guest_time(&self) -> Duration {
        match (self.stages.first(), self.stages.last()) {
            (Some((_, a)), Some((_, b))) => b.saturating_sub(*a),
            _ => Duration::ZERO,
        }
    }
}

/// Boots the probe guest under `opts.accel` and waits for its success report.
///
/// Errors: [`MonitorError::KvmProbeImage`] when the scratch image cannot be written,
/// [`MonitorError::SpawnQemu`] when QEMU does not start, [`MonitorError::KvmProbeTimeout`] when the
/// guest does not finish in time (QEMU is killed), [`MonitorError::KvmProbeExited`] when QEMU ends
/// without the success status (its last stderr line is kept).
pub fn probe(opts: &ProbeOptions) -> Result<ProbeReport, MonitorError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let path = opts.scratch_dir.join(format!(
        "kvm-probe-{}-{}.bin",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let scratch = Scratch(path);
    std::fs::write(&scratch.0, bios_image()).map_err(|source| MonitorError::KvmProbeImage {
        path: scratch.0.clone(),
        source,
    })?;
    let mut command = Command::new(&opts.qemu);
    let accel = match opts.accel {
        ProbeAccel::Kvm => "kvm",
        ProbeAccel::Tcg => "tcg",
    };
    command.args([
        "-machine",
        &format!("q35,accel={accel}"),
        "-nodefaults",
        "-display",
        "none",
        "-no-user-config",
        "-no-reboot",
        "-m",
        "32",
    ]);
    if let Some(cpu) = &opts.cpu {
        command.args(["-cpu", cpu]);
    }
    command
        .arg("-bios")
        .arg(&scratch.0)
        .args([
            "-chardev",
            "stdio,id=probe,signal=off",
            "-device",
            "isa-debugcon,iobase=0x402,chardev=probe",
            "-device",
            "isa-debug-exit,iobase=0xf4,iosize=4",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = command.spawn().map_err(|source| MonitorError::SpawnQemu {
        program: opts.qemu.clone(),
        source,
    })?;
    let (tx, rx) = mpsc::channel::<(u8, Instant)>();
    let stdout_reader = child.stdout.take().map(|mut out| {
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let now = Instant::now();
                for &b in &buf[..n] {
                    let _ = tx.send((b, now));
                }
            }
        })
    });
    let stderr_reader = child.stderr.take().map(|mut err| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = err.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        })
    });
    let mut stages: Vec<(Stage, Duration)> = Vec::new();
    let mut deadline = started + opts.start_timeout;
    let timed_out = loop {
        let now = Instant::now();
        if now >= deadline {
            break true;
        }
        match rx.recv_timeout(deadline - now) {
            Ok((byte, at)) => {
                if let Some(stage) = Stage::from_byte(byte) {
                    if stages.is_empty() {
                        deadline = at + opts.run_timeout;
                    }
                    stages.push((stage, at - started));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => break true,
            Err(mpsc::RecvTimeoutError::Disconnected) => break false,
        }
    };
    if timed_out {
        let _ = child.kill();
    }
    let status = child.wait();
    let elapsed = started.elapsed();
    if let Some(t) = stdout_reader {
        let _ = t.join();
    }
    let stderr = stderr_reader
        .and_then(|t| t.join().ok())
        .unwrap_or_default();
    let last = stages.last().map_or(Stage::NotStarted, |s| s.0);
    let reached = match stages.last() {
        Some((stage, at)) => format!("{stage} at {} ms", at.as_millis()),
        None => "nothing".to_string(),
    };
    if timed_out {
        let timeout = if last == Stage::NotStarted {
            opts.start_timeout
        } else {
            opts.run_timeout
        };
        return Err(MonitorError::KvmProbeTimeout {
            reached,
            next: last.next_step().to_string(),
            timeout,
        });
    }
    let status = status.map_err(|source| MonitorError::WatchQemu {
        pid: child.id() as i32,
        source,
    })?;
    if status.code() == Some(SUCCESS_STATUS) && last == Stage::Memory {
        return Ok(ProbeReport { stages, elapsed });
    }
    let status_text = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (Some(MEMORY_MISMATCH_STATUS), _) => {
            "status 43 (guest memory did not keep its pattern)".to_string()
        }
        (Some(code), _) => format!("status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => "an unknown status".to_string(),
    };
    Err(MonitorError::KvmProbeExited {
        status: status_text,
        reached,
        stderr: last_lines(&stderr),
    })
}

/// [`probe`] once per process: the first call runs it with `opts()`, later calls return the same
/// answer (the error as its text with causes).
pub fn probe_cached(opts: impl FnOnce() -> ProbeOptions) -> &'static Result<ProbeReport, String> {
    static ANSWER: OnceLock<Result<ProbeReport, String>> = OnceLock::new();
    ANSWER.get_or_init(|| probe(&opts()).map_err(|e| error_chain(&e)))
}

use crate::sys::error::error_chain;

/// The last two non-empty lines of QEMU's stderr, without "terminating on signal" notes, joined
/// with "; " ("" when there are none).
fn last_lines(stderr: &str) -> String {
    let mut lines: Vec<&str> = stderr
        .lines()
        .rev()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.contains("terminating on signal"))
        .take(2)
        .collect();
    lines.reverse();
    lines.join("; ")
}

/// Removes the scratch image when the probe ends, whatever the outcome.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Reassembles `kvm_probe.S` with binutils (`as`, `objcopy`) when they are installed and
    /// compares with the embedded bytes.
    #[test]
    fn bytes_match_the_source() {
        let dir = std::env::temp_dir().join(format!("qlauncher-kvm-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        struct RemoveDir(PathBuf);
        impl Drop for RemoveDir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _cleanup = RemoveDir(dir.clone());
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/monitor/kvm_probe.S");
        let obj = dir.join("kvm_probe.o");
        let bin = dir.join("kvm_probe.bin");
        let assembled = Command::new("as")
            .arg("--64")
            .arg("-o")
            .arg(&obj)
            .arg(&src)
            .status();
        match assembled {
            Ok(s) => assert!(s.success(), "as failed on {}", src.display()),
            Err(e) => {
                eprintln!("binutils' as is not installed ({e}); skipping the comparison");
                return;
            }
        }
        let copied = Command::new("objcopy")
            .args(["-O", "binary", "-j", ".text"])
            .arg(&obj)
            .arg(&bin)
            .status()
            .unwrap();
        assert!(copied.success());
        let bytes = std::fs::read(&bin).unwrap();
        let image = bios_image();
        assert_eq!(bytes.len(), 512);
        assert_eq!(bytes, image[CODE_OFFSET..].to_vec());
    }

    #[test]
    fn image_layout() {
        let image = bios_image();
        assert_eq!(image.len(), BIOS_SIZE);
        assert_eq!(image[BIOS_SIZE - 16], 0xe9);
        assert_eq!(image[CODE_OFFSET], 0xfa); // cli
    }

    #[test]
    fn stderr_tail() {
        let text =
            "warning: x\nerror: failed to set MSR 0x10a to 0x69\nkvm.c:3183: Assertion failed.\n";
        assert_eq!(
            last_lines(text),
            "error: failed to set MSR 0x10a to 0x69; kvm.c:3183: Assertion failed."
        );
        assert_eq!(
            last_lines("qemu-system-x86_64: terminating on signal 9 from pid 1\n"),
            ""
        );
    }
}

//! The monitor's process tests: the binary under test, virt-launcher's flags with every directory
//! under a test directory, and the static launcher: `qlauncher-static-launcher`, qlauncher's
//! launcher lifecycle whose domain is one fixed QEMU command line (an idle QEMU, or the test guest
//! booted from its kernel), started by `qlauncher monitor` in place of `qlauncher launcher`
//! through `QLAUNCHER_TEST_LAUNCHER`.

use std::path::{Path, PathBuf};

use crate::guest::GuestImages;

/// The monitor's variable naming the program it runs as the launcher (instead of
/// `qlauncher launcher`), with the launcher's arguments.
pub const TEST_LAUNCHER_ENV: &str = "QLAUNCHER_TEST_LAUNCHER";

/// The static launcher's variable: JSON `{"argv": [...], "qmp": "/path/to/qmp.sock"}`, the QEMU
/// it starts as the domain.
pub const STATIC_QEMU_ENV: &str = "QLAUNCHER_STATIC_QEMU";

/// The `qlauncher` binary under test, as a string for `Command::new`.
pub fn bin() -> String {
    crate::qlauncher_bin().display().to_string()
}

/// The static launcher binary (`qlauncher-static-launcher`, built by cargo for the tests).
pub fn static_launcher_bin() -> PathBuf {
    crate::sibling_bin("qlauncher-static-launcher", "QLAUNCHER_STATIC_LAUNCHER_BIN")
}

/// The environment that makes `qlauncher monitor` run the static launcher with an idle QEMU
/// (QMP socket `<dir>/qmp.sock`) as its domain.
pub fn static_launcher(dir: &Path) -> [(&'static str, String); 2] {
    static_launcher_with(test_qemu_spec(dir))
}

/// The environment that makes `qlauncher monitor` run the static launcher with the test guest,
/// booted from its kernel with the serial console to `serial`, as its domain.
pub fn static_launcher_with_guest(dir: &Path, serial: &Path) -> [(&'static str, String); 2] {
    static_launcher_with(guest_qemu_spec(dir, serial))
}

fn static_launcher_with(spec: String) -> [(&'static str, String); 2] {
    [
        (
            TEST_LAUNCHER_ENV,
            static_launcher_bin().display().to_string(),
        ),
        (STATIC_QEMU_ENV, spec),
    ]
}

/// `qemu-system-x86_64 -accel tcg -nodefaults -display none -m MEM -name
/// guest=default_testvmi,debug-threads=on` (vCPU threads named, as virt-handler expects).
fn qemu_argv(mem: &str) -> Vec<String> {
    [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-nodefaults",
        "-display",
        "none",
        "-m",
        mem,
        "-name",
        "guest=default_testvmi,debug-threads=on",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// A QEMU command line with no guest (`-S`, 64 MiB, QMP on `qmp`): it ignores the ACPI power
/// button and just sits there.
pub fn idle_qemu_argv(qmp: &Path) -> Vec<String> {
    let mut argv = qemu_argv("64");
    argv.extend([
        "-S".into(),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", qmp.display()),
    ]);
    argv
}

/// The [`STATIC_QEMU_ENV`] value for an idle QEMU with its QMP socket in `dir`.
pub fn test_qemu_spec(dir: &Path) -> String {
    let qmp = dir.join("qmp.sock");
    serde_json::json!({ "argv": idle_qemu_argv(&qmp), "qmp": qmp }).to_string()
}

/// Launcher flags that keep every directory under `dir` (nothing under /var/run), then `extra`.
pub fn launcher_flags(dir: &Path, extra: &[&str]) -> Vec<String> {
    let d = |s: &str| dir.join(s).display().to_string();
    let mut v = vec![
        "--name".into(),
        "testvmi".into(),
        "--namespace".into(),
        "default".into(),
        "--uid".into(),
        "1234".into(),
        "--kubevirt-share-dir".into(),
        d("share"),
        "--ephemeral-disk-dir".into(),
        d("ephemeral"),
        "--container-disk-dir".into(),
        d("share/container-disks"),
        "--hotplug-disk-dir".into(),
        d("share/hotplug-disks"),
        "--private-dir".into(),
        d("private"),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// The [`STATIC_QEMU_ENV`] value for the test guest booted from its kernel, serial to a file.
pub fn guest_qemu_spec(dir: &Path, serial: &Path) -> String {
    let qmp = dir.join("qmp.sock");
    let mut argv = qemu_argv("256");
    argv.extend(["-machine".into(), "q35".into()]);
    argv.extend(GuestImages::locate().kernel_boot_args());
    argv.extend([
        "-serial".into(),
        format!("file:{}", serial.display()),
        "-qmp".into(),
        format!("unix:{},server=on,wait=off", qmp.display()),
    ]);
    serde_json::json!({ "argv": argv, "qmp": qmp }).to_string()
}

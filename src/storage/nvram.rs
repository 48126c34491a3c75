//! EFI firmware files and the per-VM NVRAM (`<nvram dir>/<vmi name>_VARS.fd`).
//!
//! KubeVirt's converter names the NVRAM file `<PathForNVram>/<vmi name>_VARS.fd`
//! (`converter/compute/os.go`; `/var/lib/libvirt/qemu/nvram` for root,
//! `/var/run/kubevirt-private/libvirt/qemu/nvram` for non-root, `pkg/util/util.go`) and libvirt
//! copies the vars template there when the file is missing (`qemuPrepareNVRAMFile`), keeping an
//! existing one: the guest's EFI variables (boot entries, secure-boot keys) survive QEMU restarts,
//! and with `efi.persistent` KubeVirt mounts backend storage at that directory so they survive the
//! pod too. Here [`prepare_nvram`] does the copy (temporary name, fsync, rename without
//! replacing, the qemu owner) and [`detect_efi`] finds the firmware: KubeVirt's file names in its
//! `--ovmf-path` first (`efi/efi.go DetectEFIEnvironment`), then the pairs Debian's `ovmf`
//! package installs in `/usr/share/OVMF` (whose secure-boot template with Microsoft's keys
//! enrolled is `OVMF_VARS_4M.ms.fd`, not KubeVirt's `OVMF_VARS.secboot.fd`).

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::cmdline::context::EfiFiles;

use super::staged::{create_dir_all, Replace, Staged};
use super::{Outcome, Owner, StorageError};

/// Mode of a new NVRAM file (libvirt creates it 0600, owned by the qemu user).
pub const NVRAM_MODE: u32 = 0o600;

/// Where Debian 12's `ovmf` package installs its firmware.
pub const DEBIAN_OVMF_DIR: &str = "/usr/share/OVMF";

/// A vars template larger than this is not an OVMF vars store (they are 128 KiB or 528 KiB).
const MAX_TEMPLATE: u64 = 16 << 20;

/// (code, vars) file names of one firmware flavour, in the order they are tried in a directory.
type Pairs = &'static [(&'static str, &'static str)];

/// Plain (no secure boot) pairs: KubeVirt's names, then Debian's 4 MiB and 2 MiB builds. The
/// secure-boot code with the plain vars template comes first (KubeVirt v1.9.0's
/// `DetectEFIEnvironment`: the guest then reports secure boot disabled rather than missing), the
/// plain code only where no secure-boot code is.
const PLAIN_KUBEVIRT: Pairs = &[
    ("OVMF_CODE.secboot.fd", "OVMF_VARS.fd"),
    ("OVMF_CODE.fd", "OVMF_VARS.fd"),
];
const PLAIN_DEBIAN: Pairs = &[
    ("OVMF_CODE_4M.secboot.fd", "OVMF_VARS_4M.fd"),
    ("OVMF_CODE_4M.fd", "OVMF_VARS_4M.fd"),
    ("OVMF_CODE.secboot.fd", "OVMF_VARS.fd"),
    ("OVMF_CODE.fd", "OVMF_VARS.fd"),
];
/// Secure-boot pairs (SMM build, template with the Microsoft keys enrolled).
const SECURE_KUBEVIRT: Pairs = &[("OVMF_CODE.secboot.fd", "OVMF_VARS.secboot.fd")];
const SECURE_DEBIAN: Pairs = &[
    ("OVMF_CODE_4M.secboot.fd", "OVMF_VARS_4M.ms.fd"),
    ("OVMF_CODE.secboot.fd", "OVMF_VARS.ms.fd"),
];

/// The firmware files for the converter: for each flavour the first (code, vars) pair whose two
/// files both exist, looked up with KubeVirt's names in `ovmf_dir` (virt-launcher's
/// `--ovmf-path`), then with Debian's names in `debian_dir` (normally [`DEBIAN_OVMF_DIR`]). A
/// pair is taken whole so code and vars always come from one build (a 2 MiB code image with a
/// 4 MiB build's vars does not start). A flavour found nowhere keeps KubeVirt's path in
/// `ovmf_dir`, so QEMU's error names the file KubeVirt would use. The confidential-computing
/// images (SEV, SNP, TDX) only have KubeVirt's names. Only `stat(2)` is done.
pub fn detect_efi(ovmf_dir: &Path, debian_dir: &Path) -> EfiFiles {
    let pick = |kubevirt: Pairs, debian: Pairs| -> (String, String) {
        let tried = kubevirt
            .iter()
            .map(|(c, v)| (ovmf_dir.join(c), ovmf_dir.join(v)))
            .chain(
                debian
                    .iter()
                    .map(|(c, v)| (debian_dir.join(c), debian_dir.join(v))),
            );
        let mut first = None;
        for (code, vars) in tried {
            if first.is_none() {
                first = Some((code.clone(), vars.clone()));
            }
            if code.is_file() && vars.is_file() {
                return (code.display().to_string(), vars.display().to_string());
            }
        }
        let (code, vars) = first.unwrap_or_default();
        (code.display().to_string(), vars.display().to_string())
    };
    let (code, vars) = pick(PLAIN_KUBEVIRT, PLAIN_DEBIAN);
    let (secure_code, secure_vars) = pick(SECURE_KUBEVIRT, SECURE_DEBIAN);
    let kv = |name: &str| ovmf_dir.join(name).display().to_string();
    EfiFiles {
        code,
        vars,
        secure_code,
        secure_vars,
        sev_code: kv("OVMF_CODE.cc.fd"),
        snp_rom: kv("OVMF.amdsev.fd"),
        tdx_rom: kv("OVMF.inteltdx.fd"),
        tdx_secure_rom: kv("OVMF.inteltdx.secboot.fd"),
    }
}

/// One NVRAM file to prepare.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvramSpec {
    /// The VMI name, for errors (the NVRAM belongs to the VM, not to a volume).
    pub vmi: String,
    /// The vars template (`FirmwarePlan::Efi::vars_template`).
    pub template: PathBuf,
    /// The per-VM file (`FirmwarePlan::Efi::vars`).
    pub vars: PathBuf,
    /// Owner given to a new file (the runtime uid of QEMU), or `None` to keep the creator's.
    pub owner: Option<Owner>,
}

/// Creates `spec.vars` as a copy of `spec.template` unless it exists: an existing regular file
/// is kept untouched ([`Outcome::Kept`]; the guest's EFI variables persist across restarts), a
/// missing one is created again from the template. The directory is created when missing. The
/// copy is written under a temporary name in the same directory, fsynced and renamed without
/// replacing a file a concurrent creator put there.
///
/// # Errors
/// [`StorageError::Nvram`] naming the VMI and the file: the template is missing, not a regular
/// file or larger than 16 MiB; something that is not a regular file (a symlink, a directory) is
/// at `spec.vars`; or the copy fails (nothing is left behind, also on `ENOSPC`).
pub fn prepare_nvram(spec: &NvramSpec) -> Result<Outcome, StorageError> {
    let fail = |path: &Path, source: io::Error| StorageError::Nvram {
        vmi: spec.vmi.clone(),
        path: path.to_path_buf(),
        source,
    };
    let invalid =
        |path: &Path, why: &str| fail(path, io::Error::new(io::ErrorKind::InvalidInput, why));
    match std::fs::symlink_metadata(&spec.vars) {
        Ok(m) if m.is_file() => return Ok(Outcome::Kept),
        Ok(_) => {
            return Err(invalid(
                &spec.vars,
                "something other than a regular file is at the NVRAM path",
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(fail(&spec.vars, e)),
    }
    let mut template = std::fs::File::open(&spec.template).map_err(|e| fail(&spec.template, e))?;
    let meta = template.metadata().map_err(|e| fail(&spec.template, e))?;
    if !meta.is_file() {
        return Err(invalid(
            &spec.template,
            "the vars template is not a regular file",
        ));
    }
    if meta.len() > MAX_TEMPLATE {
        return Err(invalid(
            &spec.template,
            "the vars template is larger than 16 MiB",
        ));
    }
    if let Some(dir) = spec.vars.parent() {
        create_dir_all(dir).map_err(|e| fail(dir, e))?;
    }
    let write_fail = |e: io::Error| fail(&spec.vars, e);
    let staged = Staged::create(&spec.vars, NVRAM_MODE).map_err(write_fail)?;
    let mut data = Vec::with_capacity(meta.len() as usize);
    Read::by_ref(&mut template)
        .take(MAX_TEMPLATE + 1)
        .read_to_end(&mut data)
        .map_err(|e| fail(&spec.template, e))?;
    staged.file().write_all(&data).map_err(write_fail)?;
    let created = staged
        .commit(spec.owner, NVRAM_MODE, Replace::No)
        .map_err(write_fail)?;
    Ok(if created {
        Outcome::Created
    } else {
        Outcome::Kept
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn touch(dir: &Path, names: &[&str]) {
        for n in names {
            std::fs::write(dir.join(n), n.as_bytes()).unwrap();
        }
    }

    #[test]
    fn kubevirt_names_first_then_debian_pairs_whole() {
        let kv = tempfile::tempdir().unwrap();
        let deb = tempfile::tempdir().unwrap();
        // Debian 12's ovmf package (both builds).
        touch(
            deb.path(),
            &[
                "OVMF_CODE.fd",
                "OVMF_VARS.fd",
                "OVMF_CODE_4M.fd",
                "OVMF_VARS_4M.fd",
                "OVMF_CODE.secboot.fd",
                "OVMF_VARS.ms.fd",
                "OVMF_CODE_4M.secboot.fd",
                "OVMF_VARS_4M.ms.fd",
            ],
        );
        let d = |n: &str| deb.path().join(n).display().to_string();
        let k = |n: &str| kv.path().join(n).display().to_string();
        let efi = detect_efi(kv.path(), deb.path());
        assert_eq!(
            (&efi.code, &efi.vars, &efi.secure_code, &efi.secure_vars),
            (
                &d("OVMF_CODE_4M.secboot.fd"),
                &d("OVMF_VARS_4M.fd"),
                &d("OVMF_CODE_4M.secboot.fd"),
                &d("OVMF_VARS_4M.ms.fd")
            )
        );
        assert_eq!(efi.sev_code, k("OVMF_CODE.cc.fd"));

        // Without a secure-boot code the plain one.
        let plain = tempfile::tempdir().unwrap();
        touch(plain.path(), &["OVMF_CODE_4M.fd", "OVMF_VARS_4M.fd"]);
        let efi = detect_efi(kv.path(), plain.path());
        let p = |n: &str| plain.path().join(n).display().to_string();
        assert_eq!(
            (&efi.code, &efi.vars),
            (&p("OVMF_CODE_4M.fd"), &p("OVMF_VARS_4M.fd"))
        );

        // KubeVirt's image layout wins (the secure-boot code with the plain vars, as v1.9.0
        // picks); a half pair is skipped.
        touch(
            kv.path(),
            &["OVMF_CODE.fd", "OVMF_VARS.fd", "OVMF_CODE.secboot.fd"],
        );
        let efi = detect_efi(kv.path(), deb.path());
        assert_eq!(
            (&efi.code, &efi.vars, &efi.secure_code, &efi.secure_vars),
            (
                &k("OVMF_CODE.secboot.fd"),
                &k("OVMF_VARS.fd"),
                &d("OVMF_CODE_4M.secboot.fd"),
                &d("OVMF_VARS_4M.ms.fd")
            )
        );

        // Nothing anywhere: KubeVirt's paths, for QEMU's error message.
        let none = tempfile::tempdir().unwrap();
        let efi = detect_efi(none.path(), none.path());
        let n = |f: &str| none.path().join(f).display().to_string();
        assert_eq!(
            (efi.code, efi.vars, efi.secure_vars),
            (
                n("OVMF_CODE.secboot.fd"),
                n("OVMF_VARS.fd"),
                n("OVMF_VARS.secboot.fd")
            )
        );
    }

    #[test]
    fn nvram_is_copied_once_kept_after_and_recreated_when_missing() {
        let dir = tempfile::tempdir().unwrap();
        let template = dir.path().join("VARS.fd");
        std::fs::write(&template, vec![0x5au8; 128 << 10]).unwrap();
        let spec = NvramSpec {
            vmi: "vm".into(),
            template: template.clone(),
            vars: dir.path().join("nvram/vm_VARS.fd"),
            owner: None,
        };
        assert_eq!(prepare_nvram(&spec).unwrap(), Outcome::Created);
        let meta = std::fs::metadata(&spec.vars).unwrap();
        assert_eq!((meta.len(), meta.mode() & 0o777), (128 << 10, NVRAM_MODE));
        // The guest changed a variable: a second start keeps it.
        std::fs::write(&spec.vars, b"guest state").unwrap();
        assert_eq!(prepare_nvram(&spec).unwrap(), Outcome::Kept);
        assert_eq!(std::fs::read(&spec.vars).unwrap(), b"guest state");
        // Lost (a new pod without persistent storage): made again from the template.
        std::fs::remove_file(&spec.vars).unwrap();
        assert_eq!(prepare_nvram(&spec).unwrap(), Outcome::Created);
        assert_eq!(std::fs::read(&spec.vars).unwrap(), vec![0x5au8; 128 << 10]);
        let names: Vec<_> = std::fs::read_dir(dir.path().join("nvram"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("vm_VARS.fd")]);
    }

    #[test]
    fn bad_templates_and_non_files_are_named_errors_and_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let spec = NvramSpec {
            vmi: "vm".into(),
            template: dir.path().join("missing.fd"),
            vars: dir.path().join("nvram/vm_VARS.fd"),
            owner: None,
        };
        let err = prepare_nvram(&spec).unwrap_err().to_string();
        assert!(err.starts_with("VMI vm: NVRAM "), "{err}");
        assert!(err.contains("missing.fd"), "{err}");
        assert!(!dir.path().join("nvram").exists());

        let template = dir.path().join("VARS.fd");
        std::fs::write(&template, b"vars").unwrap();
        std::fs::create_dir_all(dir.path().join("nvram")).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", &spec.vars).unwrap();
        let spec = NvramSpec { template, ..spec };
        assert!(prepare_nvram(&spec).is_err());
        assert_eq!(
            std::fs::read_link(&spec.vars).unwrap(),
            Path::new("/etc/shadow")
        );
    }
}

//! Checks for VMI names that become QEMU ids and path components, and KubeVirt's naming rules
//! (`ua-` aliases, `vd`/`sd` target names).

use super::error::{ConvertError, FieldPath};

/// Longest accepted object name (a Kubernetes DNS label; also keeps ids and paths short).
pub const MAX_NAME: usize = 63;

/// Accepts names made of `[A-Za-z0-9._-]`, starting with a letter or digit, at most `max` bytes,
/// and not `.`/`..`. Such a name is a well-formed QEMU id suffix and a safe path component.
///
/// Errors: [`ConvertError::InvalidValue`] at `path`.
pub fn check_name_len(path: &FieldPath, name: &str, max: usize) -> Result<(), ConvertError> {
    if name.is_empty() {
        return Err(ConvertError::invalid(path.clone(), "empty name"));
    }
    if name.len() > max {
        return Err(ConvertError::invalid(
            path.clone(),
            format!("name longer than {max} characters"),
        ));
    }
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(ConvertError::invalid(
            path.clone(),
            format!("{name:?} may only hold letters, digits, '.', '_' and '-', starting with a letter or digit"),
        ));
    }
    Ok(())
}

/// [`check_name_len`] with [`MAX_NAME`].
pub fn check_name(path: &FieldPath, name: &str) -> Result<(), ConvertError> {
    check_name_len(path, name, MAX_NAME)
}

/// Accepts a token for QEMU's `-cpu` parser (model and feature names, Hyper-V vendor id), which
/// has no escape for commas: `[A-Za-z0-9._-]`, starting with a letter or digit, 1..=64 bytes.
pub fn check_token(path: &FieldPath, s: &str) -> Result<(), ConvertError> {
    if s.is_empty()
        || s.len() > 64
        || !s.as_bytes()[0].is_ascii_alphanumeric()
        || !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return Err(ConvertError::invalid(
            path.clone(),
            format!("{s:?} is not a valid name (letters, digits, '.', '_', '-')"),
        ));
    }
    Ok(())
}

/// Rejects control characters (newlines, NUL) in free text that reaches QEMU verbatim.
pub fn check_text(path: &FieldPath, s: &str, max: usize) -> Result<(), ConvertError> {
    if s.len() > max {
        return Err(ConvertError::invalid(
            path.clone(),
            format!("longer than {max} characters"),
        ));
    }
    if s.chars().any(|c| c.is_control()) {
        return Err(ConvertError::invalid(
            path.clone(),
            "control characters are not allowed",
        ));
    }
    Ok(())
}

/// KubeVirt's user-defined alias, used as the QEMU device id: `ua-<name>`
/// (`api/schema.go NewUserDefinedAlias`).
pub fn alias(name: &str) -> String {
    format!("ua-{name}")
}

/// Linux-style device name suffix: 0 -> `a`, 25 -> `z`, 26 -> `aa` (KubeVirt `FormatDeviceName`).
pub fn device_suffix(mut index: usize) -> String {
    let mut out = Vec::new();
    loop {
        out.push(b'a' + (index % 26) as u8);
        if index < 26 {
            break;
        }
        index = index / 26 - 1;
    }
    out.reverse();
    String::from_utf8(out).unwrap_or_default()
}

/// The index of a [`device_suffix`] (`a` -> 0, `z` -> 25, `aa` -> 26); `None` for anything but
/// 1 to 3 lowercase letters.
pub fn device_index(suffix: &str) -> Option<usize> {
    if suffix.is_empty() || suffix.len() > 3 || !suffix.bytes().all(|b| b.is_ascii_lowercase()) {
        return None;
    }
    Some(
        suffix
            .bytes()
            .fold(0usize, |n, b| n * 26 + usize::from(b - b'a') + 1)
            - 1,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_index_inverts_device_suffix() {
        for i in [0, 1, 25, 26, 27, 701, 702, 18277] {
            assert_eq!(device_index(&device_suffix(i)), Some(i), "{i}");
        }
        for bad in ["", "A", "a1", "aaaa"] {
            assert_eq!(device_index(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn device_suffix_counts_like_linux() {
        assert_eq!(device_suffix(0), "a");
        assert_eq!(device_suffix(25), "z");
        assert_eq!(device_suffix(26), "aa");
        assert_eq!(device_suffix(27), "ab");
        assert_eq!(device_suffix(701), "zz");
        assert_eq!(device_suffix(702), "aaa");
    }

    #[test]
    fn names_with_separators_are_rejected() {
        let p = FieldPath::new("spec.volumes[0].name");
        assert!(check_name(&p, "disk0").is_ok());
        assert!(check_name(&p, "cdrom_tray.1-x").is_ok());
        for bad in ["a,b", "a=b", "a\"b", "a\nb", "../x", "..", "", "-a", "a/b"] {
            assert_eq!(check_name(&p, bad).unwrap_err().path(), &p, "{bad:?}");
        }
        assert!(check_name(&p, &"a".repeat(64)).is_err());
    }
}

//! Sysctls under `/proc/sys`, which resolve to the network namespace of the calling thread.

use crate::net::NetError;
use std::path::PathBuf;

/// `/proc/sys/<key with dots as slashes>`. Interface names in keys keep their own characters
/// (a `k6t-eth0` stays one path element); a key with `..` or `/` elements is rejected.
fn path(key: &str) -> Result<PathBuf, NetError> {
    if key.split('.').any(|p| p.is_empty() || p.contains('/')) {
        return Err(NetError::invalid(
            "sysctl",
            format!("{key:?} is not a sysctl key"),
        ));
    }
    Ok(PathBuf::from("/proc/sys").join(key.replace('.', "/")))
}

/// Reads a sysctl, trimmed.
pub fn read(key: &str) -> Result<String, NetError> {
    let p = path(key)?;
    std::fs::read_to_string(&p)
        .map(|s| s.trim().to_string())
        .map_err(|source| NetError::Sysctl {
            key: key.into(),
            source,
        })
}

/// Writes a sysctl.
pub fn write(key: &str, value: &str) -> Result<(), NetError> {
    let p = path(key)?;
    std::fs::write(&p, value).map_err(|source| NetError::Sysctl {
        key: key.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_proc_paths() {
        assert_eq!(
            path("net.ipv4.conf.k6t-eth0.route_localnet").unwrap(),
            PathBuf::from("/proc/sys/net/ipv4/conf/k6t-eth0/route_localnet")
        );
        assert!(path("net..ipv4").is_err());
        assert!(path("net.ipv4/../x").is_err());
    }
}

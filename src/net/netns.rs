//! Running work inside a network namespace without moving the caller's thread.
//!
//! `setns(CLONE_NEWNET)` changes the namespace of the calling thread only; sockets (netlink,
//! nftables, DHCP) keep the namespace they were created in. [`run_in`] therefore runs a
//! closure on a fresh thread that first enters the namespace; [`block_on_in`] does the same
//! with a current-thread tokio runtime for async work such as [`crate::net::apply()`].

use crate::net::NetError;
use std::future::Future;
use std::path::{Path, PathBuf};

fn enter(path: &Path) -> Result<(), NetError> {
    let err = |source| NetError::EnterNetns {
        path: path.display().to_string(),
        source,
    };
    let f = std::fs::File::open(path).map_err(err)?;
    nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| err(std::io::Error::from(e)))
}

/// Runs `f` on a new thread inside the network namespace at `path` (`/run/netns/<name>` or
/// `/proc/<pid>/ns/net`) and returns its result.
///
/// Errors: [`NetError::EnterNetns`] when the namespace cannot be entered,
/// [`NetError::NetnsThread`] when the thread cannot start or panics.
pub fn run_in<R, F>(path: &Path, f: F) -> Result<R, NetError>
where
    R: Send + 'static,
    F: FnOnce() -> R + Send + 'static,
{
    let path: PathBuf = path.to_path_buf();
    let handle = std::thread::Builder::new()
        .name("netns".into())
        .spawn(move || -> Result<R, NetError> {
            enter(&path)?;
            Ok(f())
        })
        .map_err(|_| NetError::NetnsThread)?;
    handle.join().map_err(|_| NetError::NetnsThread)?
}

/// Runs the future made by `make` to completion on a current-thread tokio runtime, on a new
/// thread inside the network namespace at `path`.
pub fn block_on_in<R, Fut, F>(path: &Path, make: F) -> Result<R, NetError>
where
    R: Send + 'static,
    Fut: Future<Output = R>,
    F: FnOnce() -> Fut + Send + 'static,
{
    run_in(path, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|_| NetError::NetnsThread)?;
        Ok(rt.block_on(make()))
    })?
}

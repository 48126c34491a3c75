//! The launcher in the test's own process: a [`SyncVmi`] with KubeVirt's directories under a
//! temporary root ([`LauncherRoot`]), served on its cmd socket to virt-handler's client with the
//! notify server recording its domain events ([`InProcess`]). QEMU and the network setup run in
//! the calling thread's network namespace (the tests unshare one first).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use qlauncher::sync::rpc::notify::{Notifier, NotifyTiming};
use qlauncher::sync::rpc::server::{CmdServer, CmdSocketPaths};
use qlauncher::sync::{SyncConfig, SyncVmi};

use crate::handler::Client;
use crate::launcher::KillQemu;
use crate::notify::Received;

/// KubeVirt's directories under a temporary root ([`SyncConfig::under_root`]): the containerDisk
/// `container-disks/disk_0.img` is a link to `disk`, and the per-VMI private directory of `uid`
/// (serial console, agent channel: virt-launcher makes it at start) exists. Removed on drop.
pub struct LauncherRoot {
    /// The temporary root.
    pub dir: tempfile::TempDir,
    /// The launcher's configuration under it, to adjust before [`InProcess::start`].
    pub config: SyncConfig,
    /// `config.paths.private_dir`.
    pub private: PathBuf,
}

impl LauncherRoot {
    /// Makes the root. Panics when a directory or the link cannot be made.
    pub fn new(disk: &Path, uid: &str) -> LauncherRoot {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = SyncConfig::under_root(dir.path());
        let disks = PathBuf::from(&config.paths.container_disks);
        std::fs::create_dir_all(&disks).expect("container-disks");
        std::os::unix::fs::symlink(disk, disks.join("disk_0.img")).expect("link disk_0.img");
        let private = PathBuf::from(&config.paths.private_dir);
        std::fs::create_dir_all(private.join(uid)).expect("the VMI's private directory");
        LauncherRoot {
            dir,
            config,
            private,
        }
    }

    /// The root directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// KubeVirt's share directory, `<root>/var/run/kubevirt` (sockets, notify pipe).
    pub fn share_dir(&self) -> PathBuf {
        self.path().join("var/run/kubevirt")
    }
}

/// An in-process launcher as virt-handler sees it: the [`SyncVmi`] of a [`LauncherRoot`]'s
/// configuration, notifying a notify server on `domain-notify-pipe.sock` (KubeVirt's timing),
/// served on `launcher-sock` (marked ready) with a connected [`Client`]. On drop the cmd server
/// and the notify server stop and QEMU is killed.
pub struct InProcess {
    /// The launcher.
    pub manager: Arc<SyncVmi>,
    /// virt-handler's cmd client, connected to `launcher-sock`.
    pub client: Client,
    /// The domain events the notify server received, in order.
    pub received: Received,
    // Dropped in this order: the cmd server stops, QEMU is killed, the notify server stops.
    _server: CmdServer,
    _stop_server: tokio::sync::oneshot::Sender<()>,
    _kill: KillQemu,
    _stop_notify: tokio::sync::oneshot::Sender<()>,
}

impl InProcess {
    /// Starts the launcher with `config` (its share directory `share`, made when missing). Panics
    /// when the notify or cmd server cannot start.
    pub async fn start(config: SyncConfig, share: &Path) -> InProcess {
        std::fs::create_dir_all(share).expect("share dir");
        let notify_socket = share.join("domain-notify-pipe.sock");
        let (received, stop_notify) = crate::notify::start(&notify_socket);
        let notifier = Notifier::start(notify_socket, NotifyTiming::KUBEVIRT);
        let manager = Arc::new(SyncVmi::new(config, Some(notifier)));
        let kill = KillQemu(manager.clone());
        let (stop_server, stopped) = tokio::sync::oneshot::channel::<()>();
        let paths = CmdSocketPaths::in_share_dir(share);
        let server = CmdServer::start(manager.clone(), paths.clone(), async move {
            let _ = stopped.await;
        })
        .await
        .expect("start the cmd server");
        server.mark_ready().expect("mark the cmd server ready");
        let client =
            crate::handler::connect(&paths.ready, Duration::from_secs(5), String::new).await;
        InProcess {
            manager,
            client,
            received,
            _server: server,
            _stop_server: stop_server,
            _kill: kill,
            _stop_notify: stop_notify,
        }
    }
}

/// The runtime an in-process test drives the launcher with: multi-threaded with two workers (the
/// launcher's event, agent and notify tasks run while the test awaits), all drivers enabled.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

//! Serves libvirt's remote protocol on a socket and refuses every Prepare, printing each call
//! and the Prepare parameters: how the procedures a libvirt source calls were found
//! (`virsh migrate --live --p2p --persistent DOM qemu+unix:///system?socket=SOCK`).
//! Usage: `libvirt_peer_probe SOCK`.

use qlauncher::libvirt_rpc::remote::{
    ErrorCode, Finish3ParamsArgs, Finish3ParamsRet, Prepare3ParamsArgs, Prepare3ParamsRet,
    RemoteError,
};
use qlauncher::libvirt_rpc::server::{serve, MigrationTarget};

struct Refuse;

impl MigrationTarget for Refuse {
    async fn prepare(&mut self, a: Prepare3ParamsArgs) -> Result<Prepare3ParamsRet, RemoteError> {
        println!("prepare flags {:#x}", a.flags);
        for p in &a.params {
            println!("  param {} = {:?}", p.field, p.value);
        }
        println!("  cookie {}", String::from_utf8_lossy(&a.cookie));
        Err(RemoteError::qemu(
            ErrorCode::ConfigUnsupported,
            "probe refuses",
        ))
    }

    async fn finish(&mut self, a: Finish3ParamsArgs) -> Result<Finish3ParamsRet, RemoteError> {
        println!("finish cancelled {}", a.cancelled);
        Err(RemoteError::qemu(ErrorCode::OperationFailed, "probe"))
    }
}

#[tokio::main]
async fn main() {
    let path = std::env::args().nth(1).expect("socket path");
    let _ = std::fs::remove_file(&path);
    let l = tokio::net::UnixListener::bind(&path).unwrap();
    loop {
        let (c, _) = l.accept().await.unwrap();
        let r = serve(c, &mut Refuse).await;
        println!("connection ended: {r:?}");
    }
}

//! libvirt's remote RPC protocol, the subset a live-migration peer speaks: the wire format
//! ([`xdr`], [`packet`]), the remote program's procedures and structs ([`remote`]), a
//! target-side connection loop ([`server`]) and a source-side client ([`client`]). KubeVirt's
//! stock source launcher migrates with
//! `virDomainMigrateToURI3(VIR_MIGRATE_LIVE | VIR_MIGRATE_PEER2PEER | VIR_MIGRATE_PERSIST_DEST)`
//! (`pkg/virt-launcher/virtwrap/live-migration-source.go`); its libvirt then calls the
//! target pod's `/var/run/libvirt/virtqemud-sock` through virt-handler's migration proxy
//! (`pkg/virt-handler/migration-target.go`, `handleTargetMigrationProxy`). What the target does
//! with the calls is `crate::sync::migration::libvirt_peer`'s.

pub mod client;
pub mod packet;
pub mod remote;
pub mod server;
pub mod xdr;

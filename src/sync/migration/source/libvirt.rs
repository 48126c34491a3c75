//! The source's half of a migration to a stock target: the target pod's virtqemud (a stock
//! virt-launcher's libvirt) answers qlauncher's probe as libvirt does
//! ([`crate::libvirt_rpc::client::PeerKind::StockLibvirt`]), so this source drives it as a
//! peer-to-peer libvirt source drives its peer (`qemuMigrationSrcPerformPeer2Peer3`,
//! `src/qemu/qemu_migration.c`): `AUTH_LIST` (none), `CONNECT_SUPPORTS_FEATURE` of
//! `PROGRAM_KEEPALIVE` (libvirt's server then pings), `CONNECT_OPEN` of the URI KubeVirt's
//! source opens (`qemu:///system`, `qemu:///session` for a non-root pod), the features a v3
//! params source needs, then `DOMAIN_MIGRATE_PREPARE3_PARAMS` with the parameters KubeVirt's
//! `generateMigrationParams` passes (`live-migration-source.go`, v1.9.0): `destination_xml` and
//! `persistent_xml` (the domain XML qlauncher exports for its running plan, with the resolved
//! machine type), `destination_name`, `migrate_uri` and, with copied disks, `migrate_disks` and
//! `disks_uri` on the proxy's sockets (the same path in both pods), `parallel.connections` with
//! multifd, the flags `LIVE | PEER2PEER | PERSIST_DEST` (KubeVirt's `generateMigrationFlags`).
//! The cookie names the domain and this host (a host UUID of its own: libvirt refuses one equal
//! to its own) and, with copied disks, asks for the target's NBD server (`<nbd>` with each
//! disk's capacity, `qemuMigrationCookieNBDXMLFormat`).
//!
//! The stream and the disk mirrors stay qlauncher's ([`super::monitor::migrate`]: QMP
//! `migrate` to the proxy's stream socket, the NBD mirrors to the target's `drive-<alias>`
//! exports), with libvirt's keepalive answered meanwhile. Then Finish3 (`cancelled` 0): the
//! target resumes the guest; the caller stops the source QEMU (libvirt's Confirm). On a failure
//! after Prepare: the mirrors rolled back, the source resumed, and Finish3 with `cancelled` 1,
//! so that the target's libvirt drops its incoming domain.

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tracing::{info, warn};

use super::{capabilities, mirrors, monitor, rolled_back, SourceEnd, SourceEvent, SourcePlan};
use super::{FAILED_OUTCOME_TIMEOUT, PEER_TIMEOUT};
use crate::libvirt_rpc::client::{Client, ClientError};
use crate::libvirt_rpc::remote::{
    Feature, Finish3ParamsArgs, Prepare3ParamsArgs, TypedParam, TypedValue,
};
use crate::qmp::QmpClient;
use crate::sync::migration::bitmap_cookie::{self, BitmapAlias, DiskBitmaps};
use crate::sync::migration::libvirt_peer::flags;
use crate::sync::migration::protocol::RunningDomain;
use crate::sync::migration::MigrationError;

/// What the stock target is sent besides the running definition.
#[derive(Debug, Clone)]
pub struct StockTarget {
    /// The URI opened on the target's daemon (`qemu:///system`, `qemu:///session`).
    pub uri: String,
    /// The domain XML (`destination_xml`, `persistent_xml`).
    pub xml: String,
    /// The domain's name (`destination_name`, the cookie's `<name>`).
    pub name: String,
    /// The domain's UUID (the cookie's `<uuid>`).
    pub uuid: String,
    /// The target device names (`vda`) of the copied disks, in the order of
    /// [`RunningDomain::copied_disks`], with their sizes in bytes.
    pub copied: Vec<(String, u64)>,
}

/// The source's `<qemu-migration>` cookie (NUL-terminated, as libvirt sends cookies): the
/// domain's name and UUID, this host's name and UUID, and with copied disks `<nbd>` listing each
/// disk's target and capacity (libvirt's target starts its NBD server only for a cookie with
/// it, and pre-creates a missing image of that capacity).
///
/// `bitmaps`: the copied disks' persistent dirty bitmaps offered to the target
/// ([`bitmap_cookie`]; libvirt offers bitmaps only with the disks it copies).
pub fn source_cookie(
    target: &StockTarget,
    hostname: &str,
    host_uuid: &uuid::Uuid,
    bitmaps: &[DiskBitmaps],
) -> Vec<u8> {
    let esc = |s: &str| quick_xml::escape::escape(s).into_owned();
    let mut xml = format!(
        "<qemu-migration>\n  <name>{}</name>\n  <uuid>{}</uuid>\n  <hostname>{}</hostname>\n  \
         <hostuuid>{}</hostuuid>\n",
        esc(&target.name),
        esc(&target.uuid),
        esc(hostname),
        host_uuid.hyphenated()
    );
    if !target.copied.is_empty() {
        xml.push_str("  <nbd>\n");
        for (dev, capacity) in &target.copied {
            xml.push_str(&format!(
                "    <disk target='{}' capacity='{capacity}'/>\n",
                esc(dev)
            ));
        }
        xml.push_str("  </nbd>\n");
    }
    xml.push_str(&bitmap_cookie::element(bitmaps));
    xml.push_str("</qemu-migration>\n");
    let mut out = xml.into_bytes();
    out.push(0);
    out
}

/// The Prepare's `flags` and `params` for `domain` (its capabilities negotiated) as KubeVirt's
/// source passes them to libvirt, and libvirt on to its peer (without `AUTO_CONVERGE` and
/// `ABORT_ON_ERROR`, which libvirt's source keeps to itself).
pub fn prepare_params(
    domain: &RunningDomain,
    target: &StockTarget,
    plan: &SourcePlan,
) -> (u32, Vec<TypedParam>) {
    let uri = |p: &std::path::Path| format!("unix://{}", p.display());
    let mut f = flags::LIVE | flags::PEER2PEER | flags::PERSIST_DEST;
    let mut params = vec![
        TypedParam::string("migrate_uri", uri(&plan.stream)),
        TypedParam::string("destination_name", target.name.clone()),
        TypedParam::string("destination_xml", target.xml.clone()),
        TypedParam::string("persistent_xml", target.xml.clone()),
    ];
    if plan.options.unsafe_migration {
        f |= flags::UNSAFE;
    }
    if domain.paused {
        f |= flags::PAUSED;
    }
    if domain.capabilities.iter().any(|c| c == "postcopy-ram") {
        f |= flags::POSTCOPY;
    }
    if let Some(n) = domain.multifd_channels {
        f |= flags::PARALLEL;
        params.push(TypedParam {
            field: "parallel.connections".into(),
            value: TypedValue::Int(i32::try_from(n).unwrap_or(i32::MAX)),
        });
    }
    if !target.copied.is_empty() {
        f |= flags::NON_SHARED_INC;
        for (dev, _) in &target.copied {
            params.push(TypedParam::string("migrate_disks", dev.clone()));
        }
        params.push(TypedParam::string("disks_uri", uri(&plan.nbd)));
    }
    (f, params)
}

/// The connection's calls before Prepare: auth none, keepalive, open, the features, the
/// daemon's libvirt version (returned).
async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    rpc: &mut Client<S>,
    uri: &str,
) -> Result<u64, ClientError> {
    let auth = rpc.auth_list().await?;
    if !auth.contains(&0) {
        return Err(ClientError::Unexpected(format!(
            "the target offers auth types {auth:?}, not none"
        )));
    }
    rpc.supports_feature(Feature::ProgramKeepalive).await?;
    rpc.open(Some(uri), 0).await?;
    for f in [
        Feature::MigrationP2p,
        Feature::MigrationV3,
        Feature::MigrationParams,
    ] {
        if !rpc.supports_feature(f).await? {
            return Err(ClientError::Unexpected(format!(
                "the target's libvirt does not support {f:?}"
            )));
        }
    }
    rpc.lib_version().await
}

fn peer(what: &str, e: ClientError) -> MigrationError {
    match e {
        ClientError::Peer(p) => MigrationError::Peer(format!(
            "the target's libvirt refused {what}: {}",
            p.message
        )),
        e => MigrationError::Peer(format!("the target's libvirt, {what}: {e}")),
    }
}

async fn bounded<T>(
    f: impl std::future::Future<Output = Result<T, ClientError>>,
    what: &str,
) -> Result<T, MigrationError> {
    match tokio::time::timeout(PEER_TIMEOUT, f).await {
        Ok(r) => r.map_err(|e| peer(what, e)),
        Err(_) => Err(MigrationError::Timeout(format!(
            "no answer from the target's libvirt to {what} within {PEER_TIMEOUT:?}"
        ))),
    }
}

/// Runs the migration of the QEMU behind `qmp` to the stock target on `rpc` (its probe
/// answered). `domain` is the running definition (capabilities negotiated here), `target`
/// what libvirt is sent. Results as [`super::run_source_with`]'s: on success the source QEMU
/// is in `postmigrate` (the caller stops it); on failure it runs again.
pub async fn run_source_libvirt<S: AsyncRead + AsyncWrite + Unpin>(
    rpc: &mut Client<S>,
    qmp: &QmpClient,
    mut domain: RunningDomain,
    target: &StockTarget,
    plan: &SourcePlan,
    abort: watch::Receiver<bool>,
    on_event: &mut (dyn FnMut(SourceEvent) + Send),
) -> Result<SourceEnd, MigrationError> {
    let mut caps = capabilities::negotiate(qmp, &plan.options, &mut domain, false).await?;
    let offered = offered_bitmaps(qmp, &domain, target).await?;
    let was_running = !domain.paused;
    let version = bounded(handshake(rpc, &target.uri), "the connection").await?;
    // What KubeVirt v1.9's libvirt 11.10 reads, as an older stock launcher's libvirt (Debian
    // 12's 9.0) reads it: without the elements and attributes it does not know yet.
    let xml = if version < 10_000_000 {
        qlauncher_libvirt_xml::libvirt::for_libvirt9(&target.xml)
    } else {
        target.xml.clone()
    };
    let target = &StockTarget {
        xml,
        ..target.clone()
    };
    info!(libvirt = version, uri = %target.uri, "connected to the stock target's libvirt");
    let hostname = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "qlauncher".into());
    let cookie = source_cookie(target, &hostname, &uuid::Uuid::new_v4(), &offered);
    let (flags, params) = prepare_params(&domain, target, plan);
    let prepare = Prepare3ParamsArgs {
        params: params.clone(),
        cookie: cookie.clone(),
        flags,
    };
    let prepared = bounded(rpc.prepare3_params(&prepare), "the domain (Prepare)").await?;
    info!(uri = ?prepared.uri, "the stock target's QEMU waits for the stream");
    let finish = |cancelled: bool| Finish3ParamsArgs {
        params: params.clone(),
        cookie: cookie.clone(),
        flags,
        cancelled,
    };
    // The stream goes through the proxy's socket, whose path is the one the target listens
    // on in its pod (KubeVirt's `migrate_uri`); any other answer cannot be reached from here.
    let ours = format!("unix://{}", plan.stream.display());
    if let Some(uri) = prepared.uri.as_deref().filter(|u| *u != ours) {
        let e = MigrationError::Peer(format!(
            "the target's libvirt waits for the stream on {uri}, the migration proxy carries \
             {ours}"
        ));
        let _ = bounded(rpc.finish3_params(&finish(true)), "the cancel (Finish)").await;
        return Err(e);
    }
    let nbd_granted = String::from_utf8_lossy(&prepared.cookie).contains("<nbd");
    if !domain.copied_disks.is_empty() && !nbd_granted {
        let _ = bounded(rpc.finish3_params(&finish(true)), "the cancel (Finish)").await;
        return Err(MigrationError::Peer(
            "the target's libvirt started no NBD server for the copied disks (its cookie has \
             no <nbd>)"
                .into(),
        ));
    }
    if let Err(e) =
        stream_bitmaps(qmp, &prepared.cookie, &offered, &domain, target, &mut caps).await
    {
        let _ = bounded(rpc.finish3_params(&finish(true)), "the cancel (Finish)").await;
        return Err(e);
    }
    let exports: Vec<String> = domain
        .copied_disks
        .iter()
        .map(|d| d.export.clone())
        .collect();
    if !exports.is_empty() {
        info!(exports = ?exports, "the disks go to the stock target's NBD server");
    }

    // QEMU's stream and the mirrors; libvirt's pings answered meanwhile, and a connection
    // lost mid-stream stops the migration as a cancel would (reported as the loss).
    let (stop_tx, mut stop) = watch::channel(*abort.borrow());
    let stop_on_abort = stop_tx.clone();
    let mut user_abort = abort.clone();
    let forward = async move {
        loop {
            if *user_abort.borrow_and_update() {
                stop_on_abort.send_replace(true);
            }
            if user_abort.changed().await.is_err() {
                break;
            }
        }
        std::future::pending::<()>().await
    };
    let mut mirrors = Vec::new();
    let mut post_copy = monitor::PostCopy::default();
    let migrating = async {
        tokio::select! {
            r = monitor::migrate(
                qmp, &domain, &exports, plan, &mut mirrors, &mut stop, &mut post_copy, on_event,
            ) => r,
            // Never: `forward` only passes the cancel on.
            () = forward => Err(MigrationError::Aborted),
        }
    };
    let (result, lost) = rpc
        .keepalive_while(migrating, || {
            stop_tx.send_replace(true);
        })
        .await;
    let result = match (&lost, result) {
        (Some(e), Err(MigrationError::Aborted)) if !*abort.borrow() => Err(MigrationError::Peer(
            format!("the target's libvirt connection failed mid-stream: {e}"),
        )),
        (_, r) => r,
    };
    if result.is_err() {
        mirrors::cut_links(&mut mirrors);
    }
    let post_copy = if result.is_err() && post_copy.requested && !post_copy.entered {
        monitor::entered_post_copy(qmp).await
    } else {
        post_copy.requested
    };
    let was_running = was_running && !post_copy;
    match result {
        Ok(end) => {
            match bounded(rpc.finish3_params(&finish(false)), "the finish (Finish)").await {
                Ok(done) => {
                    info!(domain = %done.domain.name, id = done.domain.id, "the stock target runs the domain");
                    let _ = tokio::time::timeout(FAILED_OUTCOME_TIMEOUT, rpc.close()).await;
                    Ok(end)
                }
                Err(e) => {
                    // The target could not take over: run here again (libvirt's Confirm of a
                    // cancelled migration).
                    if was_running {
                        let _ = crate::qmp::lifecycle::resume(qmp).await;
                    }
                    Err(e)
                }
            }
        }
        Err(e) => {
            let e = if post_copy {
                e
            } else {
                rolled_back(e, mirrors::roll_back(qmp, &mirrors, was_running).await)
            };
            if lost.is_none() {
                let cancelled =
                    tokio::time::timeout(FAILED_OUTCOME_TIMEOUT, rpc.finish3_params(&finish(true)))
                        .await;
                if let Ok(Err(f)) = cancelled {
                    // libvirt answers a cancelled Finish with an error of its own.
                    info!(answer = %f, "the stock target dropped its incoming domain");
                }
                let _ = tokio::time::timeout(FAILED_OUTCOME_TIMEOUT, rpc.close()).await;
            } else {
                warn!("the stock target's connection is gone: its libvirt drops the domain");
            }
            Err(e)
        }
    }
}

/// The persistent, consistent dirty bitmaps of the disks `domain` copies to `target` (the
/// bitmaps a stock target can take: libvirt's source offers only the copied disks',
/// `qemuMigrationSrcBeginPhaseBlockDirtyBitmaps`), by target device, with libvirt's aliases.
/// A VMI's checkpoints on a disk that is not copied (a CBT overlay on shared storage) stay in
/// its image: the source's QEMU stores them there when it hands the disk over.
///
/// # Errors
/// [`MigrationError::Qmp`] from `query-named-block-nodes`.
async fn offered_bitmaps(
    qmp: &QmpClient,
    domain: &RunningDomain,
    target: &StockTarget,
) -> Result<Vec<DiskBitmaps>, MigrationError> {
    if domain.copied_disks.is_empty() {
        return Ok(Vec::new());
    }
    let nodes = qmp.run(&crate::qmp::commands::QueryNamedBlockNodes).await?;
    let offered: Vec<DiskBitmaps> = domain
        .copied_disks
        .iter()
        .zip(&target.copied)
        .filter_map(|(disk, (dev, _))| {
            let node = nodes.iter().find(|n| n.node_name == disk.node)?;
            let bitmaps: Vec<BitmapAlias> = node
                .dirty_bitmaps
                .iter()
                .filter(|b| b.persistent && !b.inconsistent)
                .filter(|b| {
                    bitmap_cookie::alias(dev, &b.name).len() <= bitmap_cookie::MAX_ALIAS_BYTES
                })
                .map(|b| BitmapAlias {
                    name: b.name.clone(),
                    alias: bitmap_cookie::alias(dev, &b.name),
                })
                .collect();
            (!bitmaps.is_empty()).then(|| DiskBitmaps {
                target: dev.clone(),
                bitmaps,
            })
        })
        .collect();
    Ok(offered)
}

/// After Prepare: the bitmaps of `offered` the target's cookie `answer` kept go in the stream
/// (this QEMU's `block-bitmap-mapping` over the copied disks' nodes, libvirt's node and bitmap
/// aliases, and the `dirty-bitmaps` capability added to `caps`), as libvirt's source does in
/// Perform. An answer that cannot be read sends none (the target's QEMU then has none: the next
/// backup is full). Nothing is set when the target kept none.
///
/// # Errors
/// [`MigrationError::Qmp`] from QEMU.
async fn stream_bitmaps(
    qmp: &QmpClient,
    answer: &[u8],
    offered: &[DiskBitmaps],
    domain: &RunningDomain,
    target: &StockTarget,
    caps: &mut Vec<crate::qmp::migration::Capability>,
) -> Result<(), MigrationError> {
    if offered.is_empty() {
        return Ok(());
    }
    let kept = match bitmap_cookie::parse(answer) {
        Ok(kept) => bitmap_cookie::agreed(&kept, offered),
        Err(e) => {
            warn!(error = %e, "the stock target's cookie cannot be read: no dirty bitmaps migrate");
            Vec::new()
        }
    };
    let node_of = |dev: &str| {
        let i = target.copied.iter().position(|(d, _)| d == dev)?;
        domain.copied_disks.get(i).map(|d| d.node.clone())
    };
    let mapping = bitmap_cookie::mapping(&kept, node_of);
    if mapping.is_empty() {
        info!("the stock target takes none of the copied disks' dirty bitmaps");
        return Ok(());
    }
    qmp.run(&crate::qmp::migration::MigrateSetParameters {
        block_bitmap_mapping: Some(mapping),
        ..Default::default()
    })
    .await?;
    caps.push(crate::qmp::migration::Capability::DirtyBitmaps);
    qmp.run(&capabilities::set_capabilities(caps)).await?;
    info!(
        bitmaps = kept.iter().map(|d| d.bitmaps.len()).sum::<usize>(),
        "the copied disks' dirty bitmaps go to the stock target in the stream"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::migration::protocol::CopiedDisk;
    use crate::sync::migration::MigrationOptions;

    fn target(copied: Vec<(String, u64)>) -> StockTarget {
        StockTarget {
            uri: "qemu:///system".into(),
            xml: "<domain/>".into(),
            name: "default_hv".into(),
            uuid: "bbbbbbbb-0000-4000-8000-000000000001".into(),
            copied,
        }
    }

    fn plan(options: MigrationOptions) -> SourcePlan {
        SourcePlan {
            stream: "/var/run/kubevirt/migrationproxy/u-49152-source.sock".into(),
            nbd: "/var/run/kubevirt/migrationproxy/u-49153-source.sock".into(),
            options,
            data_bytes: 0,
        }
    }

    fn domain() -> RunningDomain {
        RunningDomain {
            vmi_uid: "u".into(),
            migration_uid: "m".into(),
            machine: "pc-q35-7.2".into(),
            argv: Vec::new(),
            hotplugged: Vec::new(),
            copied_disks: Vec::new(),
            capabilities: Vec::new(),
            multifd_channels: None,
            paused: false,
            cpu: None,
            hooked: None,
        }
    }

    /// KubeVirt's flags and parameters: the proxy's sockets as `migrate_uri` and `disks_uri`,
    /// the disks by target name, multifd as `PARALLEL` with its channels.
    #[test]
    fn the_prepare_carries_kubevirts_flags_and_parameters() {
        let (f, params) = prepare_params(&domain(), &target(Vec::new()), &plan(Default::default()));
        assert_eq!(f, 1 | 2 | 8);
        let s = |n| crate::libvirt_rpc::remote::param_string(&params, n).map(str::to_owned);
        assert_eq!(
            s("migrate_uri").as_deref(),
            Some("unix:///var/run/kubevirt/migrationproxy/u-49152-source.sock")
        );
        assert_eq!(s("destination_name").as_deref(), Some("default_hv"));
        assert_eq!(s("destination_xml"), s("persistent_xml"));
        assert_eq!(s("disks_uri"), None);

        let mut d = domain();
        d.multifd_channels = Some(8);
        d.capabilities = vec!["multifd".into()];
        d.copied_disks = vec![CopiedDisk {
            node: "libvirt-1-format".into(),
            export: "drive-ua-rootdisk".into(),
            size: 1 << 30,
        }];
        let t = target(vec![("vda".into(), 1 << 30)]);
        let (f, params) = prepare_params(&d, &t, &plan(Default::default()));
        assert_eq!(f, 1 | 2 | 8 | (1 << 7) | (1 << 17));
        assert_eq!(
            crate::libvirt_rpc::remote::param_strings(&params, "migrate_disks"),
            vec!["vda"]
        );
        assert!(params
            .iter()
            .any(|p| p.field == "parallel.connections" && p.value == TypedValue::Int(8)));
        let cookie =
            String::from_utf8(source_cookie(&t, "node<1>", &uuid::Uuid::nil(), &[])).unwrap();
        assert!(cookie.ends_with("</qemu-migration>\n\0"), "{cookie}");
        assert!(
            cookie.contains("<hostname>node&lt;1&gt;</hostname>"),
            "{cookie}"
        );
        assert!(
            cookie.contains("<disk target='vda' capacity='1073741824'/>"),
            "{cookie}"
        );
    }
}

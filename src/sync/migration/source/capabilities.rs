//! The migration capabilities of the source, and the ones the target must enable too: what
//! KubeVirt's options turn on (libvirt's `qemuMigrationParamsApply` sets each one it knows on
//! every migration), the post-copy + multifd pair an older QEMU cannot run, and `dirty-bitmaps`
//! when a block node has a persistent dirty bitmap (a checkpoint of changed block tracking):
//! KubeVirt v1.9's libvirt 11.10.0-12 always migrates them, also to a target whose CBT overlay
//! is new (RWO backend storage); on a shared overlay the bitmaps arrive with their counts too
//! (QEMU 7.2, checked with two QEMUs on one overlay).

use crate::qmp::migration::{Capability, CapabilityState, MigrateSetCapabilities};
use crate::qmp::QmpClient;
use crate::sync::migration::protocol::RunningDomain;
use crate::sync::migration::{MigrationError, MigrationOptions};

/// The capabilities the source enables for `options` (besides `events`, `return-path` and
/// `pause-before-switchover`, always on; [`super::run_source`] drops the last when no disk is copied),
/// with the names the target must enable too.
pub fn capabilities(options: &MigrationOptions) -> (Vec<Capability>, Vec<String>) {
    let mut caps = vec![
        Capability::Events,
        Capability::ReturnPath,
        Capability::PauseBeforeSwitchover,
    ];
    let mut shared = Vec::new();
    if options.allow_auto_converge {
        caps.push(Capability::AutoConverge);
    }
    if options.allow_post_copy {
        caps.push(Capability::PostcopyRam);
        shared.push("postcopy-ram".to_owned());
    }
    if options.parallel_migration_threads.is_some_and(|n| n > 0) {
        caps.push(Capability::Multifd);
        shared.push("multifd".to_owned());
    }
    (caps, shared)
}

/// `migrate-set-capabilities` with every capability a migration of ours may turn on: those in
/// `on` on, the others off. A QEMU keeps its capabilities from one migration to the next, and a
/// migrated domain's QEMU still has those it had as the target (`postcopy-ram`, `multifd`,
/// `late-block-activate`) or from an earlier failed attempt: a source that still announces
/// post-copy makes a target without it fail the incoming stream. libvirt likewise sets each
/// capability it knows on every migration (`qemuMigrationParamsApply`).
pub fn set_capabilities(on: &[Capability]) -> MigrateSetCapabilities {
    const MANAGED: [Capability; 8] = [
        Capability::Events,
        Capability::ReturnPath,
        Capability::PauseBeforeSwitchover,
        Capability::AutoConverge,
        Capability::PostcopyRam,
        Capability::Multifd,
        Capability::LateBlockActivate,
        Capability::DirtyBitmaps,
    ];
    MigrateSetCapabilities {
        capabilities: MANAGED
            .iter()
            .map(|&capability| CapabilityState {
                capability,
                state: on.contains(&capability),
            })
            .collect(),
    }
}

/// Sets the source's capabilities for `options` on the QEMU behind `qmp` and records in `domain`
/// those the target must enable too and its `multifd_channels`: without copied disks no
/// `pause-before-switchover`, and post-copy with multifd on one channel where QEMU is older than
/// 10.0 or refuses the pair (see [`super::run_source_with`]). With `stream_bitmaps` (a qlauncher
/// target) every persistent dirty bitmap goes in the stream, paired by node name; without (a
/// stock target, which agrees on bitmaps in its cookie, [`crate::sync::migration::bitmap_cookie`])
/// none yet. Returns the capabilities set.
pub(super) async fn negotiate(
    qmp: &QmpClient,
    options: &MigrationOptions,
    domain: &mut RunningDomain,
    stream_bitmaps: bool,
) -> Result<Vec<Capability>, MigrationError> {
    let (mut caps, mut shared) = capabilities(options);
    if domain.copied_disks.is_empty() {
        // The pause before the switchover exists to complete the disk mirrors with the vCPUs
        // stopped; without mirrors it would only add a QMP round trip to the downtime.
        caps.retain(|&c| c != Capability::PauseBeforeSwitchover);
    }
    if stream_bitmaps {
        if let Some(nodes) = persistent_bitmaps(qmp).await {
            unmap_by_node_name(qmp, nodes).await?;
            caps.push(Capability::DirtyBitmaps);
            shared.push("dirty-bitmaps".to_owned());
        }
    }
    domain.multifd_channels = options.parallel_migration_threads.filter(|&n| n > 0);
    let both = caps.contains(&Capability::PostcopyRam) && caps.contains(&Capability::Multifd);
    let mut one_channel = |caps: &mut Vec<Capability>, domain: &mut RunningDomain| {
        caps.retain(|&c| c != Capability::Multifd);
        shared.retain(|c| c != "multifd");
        domain.multifd_channels = None;
    };
    if both && qmp.greeting().version < (10, 0, 0) {
        one_channel(&mut caps, domain);
    }

    if let Err(e) = qmp.run(&set_capabilities(&caps)).await {
        if !caps.contains(&Capability::Multifd) || !caps.contains(&Capability::PostcopyRam) {
            return Err(e.into());
        }
        one_channel(&mut caps, domain);
        qmp.run(&set_capabilities(&caps)).await?;
    }
    domain.capabilities = shared;
    Ok(caps)
}

/// The block nodes carrying a persistent dirty bitmap (a CBT checkpoint), with those bitmaps'
/// names; `None` when there is none. A failed query counts as none (the migration then goes on
/// without the bitmaps, as upstream libvirt's does for shared disks).
async fn persistent_bitmaps(qmp: &QmpClient) -> Option<Vec<(String, Vec<String>)>> {
    match qmp.run(&crate::qmp::commands::QueryNamedBlockNodes).await {
        Ok(nodes) => {
            let with: Vec<(String, Vec<String>)> = nodes
                .iter()
                .map(|n| {
                    let names = n
                        .dirty_bitmaps
                        .iter()
                        .filter(|b| b.persistent)
                        .map(|b| b.name.clone())
                        .collect::<Vec<_>>();
                    (n.node_name.clone(), names)
                })
                .filter(|(node, names)| !node.is_empty() && !names.is_empty())
                .collect();
            (!with.is_empty()).then_some(with)
        }
        Err(e) => {
            tracing::warn!(error = %e, "query-named-block-nodes failed: no dirty bitmaps migrate");
            None
        }
    }
}

/// Undoes a `block-bitmap-mapping` an earlier migration to a stock target left on this QEMU
/// (QEMU keeps a mapping until another replaces it, and a qlauncher target pairs bitmaps by node
/// name): the mapping becomes the identity of `nodes` and their bitmaps. Nothing is sent when no
/// mapping was ever set.
async fn unmap_by_node_name(
    qmp: &QmpClient,
    nodes: Vec<(String, Vec<String>)>,
) -> Result<(), MigrationError> {
    use crate::qmp::migration::{
        BitmapMigrationBitmapAlias, BitmapMigrationNodeAlias, MigrateSetParameters,
        QueryMigrateParameters,
    };
    let set = match qmp.run(&QueryMigrateParameters).await {
        Ok(p) => p.block_bitmap_mapping.is_some(),
        Err(e) => {
            tracing::warn!(error = %e, "query-migrate-parameters failed: the bitmap mapping is left as it is");
            false
        }
    };
    if !set {
        return Ok(());
    }
    let identity = nodes
        .into_iter()
        .map(|(node, names)| BitmapMigrationNodeAlias {
            alias: node.clone(),
            node_name: node,
            bitmaps: names
                .into_iter()
                .map(|n| BitmapMigrationBitmapAlias {
                    alias: n.clone(),
                    name: n,
                })
                .collect(),
        })
        .collect();
    qmp.run(&MigrateSetParameters {
        block_bitmap_mapping: Some(identity),
        ..Default::default()
    })
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_left_from_an_earlier_migration_are_turned_off() {
        let set = set_capabilities(&[Capability::Events, Capability::ReturnPath]);
        let state = |c| {
            set.capabilities
                .iter()
                .find(|s| s.capability == c)
                .map(|s| s.state)
        };
        assert_eq!(state(Capability::Events), Some(true));
        assert_eq!(state(Capability::ReturnPath), Some(true));
        // A QEMU that was the target of a post-copy migration with multifd still has them.
        assert_eq!(state(Capability::PostcopyRam), Some(false));
        assert_eq!(state(Capability::Multifd), Some(false));
        assert_eq!(state(Capability::LateBlockActivate), Some(false));
        assert_eq!(state(Capability::AutoConverge), Some(false));
        assert_eq!(state(Capability::PauseBeforeSwitchover), Some(false));
        assert_eq!(state(Capability::DirtyBitmaps), Some(false));
    }
}

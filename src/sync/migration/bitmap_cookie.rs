//! Dirty bitmaps (changed block tracking's checkpoints) between qlauncher and a stock libvirt
//! peer, as libvirt's own peers agree on them in the migration cookie (`src/qemu/
//! qemu_migration.c`, `qemu_migration_cookie.c`):
//!
//! - the source offers, in its cookie, the bitmaps of each disk it copies over NBD
//!   (`qemuMigrationSrcBeginPhaseBlockDirtyBitmaps`: only with storage migration, only the copied
//!   disks): `<blockDirtyBitmaps><disk target='vda'><bitmap name='c1'
//!   alias='libvirt-vda-c1'/></disk></blockDirtyBitmaps>`;
//! - the target keeps those it can take (a qcow2 disk it has, a bitmap it does not have yet;
//!   `qemuMigrationDstPrepareAnyBlockDirtyBitmaps`), sets QEMU's `block-bitmap-mapping` for them
//!   (node alias the disk's target, bitmap alias the cookie's) with the `dirty-bitmaps`
//!   capability, and answers with the list it kept;
//! - the source maps its own nodes the same way for the bitmaps the target kept and turns the
//!   capability on (`qemuMigrationCookieBlockDirtyBitmapsToParams`).
//!
//! Bitmaps of disks that are not copied (a CBT overlay on shared storage) are not offered: the
//! source's QEMU stores them into the image when it hands the disk over, and the target's QEMU
//! reads them back from it (QEMU's rules, `kubevirt-backup.md` §4.8). On a fresh, unshared overlay
//! they are lost as with upstream libvirt, and KubeVirt's redefinition then reports the
//! checkpoint invalid, so the next backup is full.
//!
//! The peer's cookie is untrusted: it is parsed bounded ([`parse`]), names and aliases are
//! checked against QEMU's limits, and only what this side offered or has is ever mapped.

use qlauncher_libvirt_xml::golden::Node;

use crate::qmp::migration::{BitmapMigrationBitmapAlias, BitmapMigrationNodeAlias};

/// The longest node or bitmap alias QEMU's stream carries (a one-byte length,
/// `migration/block-dirty-bitmap.c`).
pub const MAX_ALIAS_BYTES: usize = 255;
/// The longest bitmap name QEMU accepts (`BDRV_BITMAP_MAX_NAME_SIZE`).
pub const MAX_NAME_BYTES: usize = 1023;
/// The most bitmaps one cookie may carry, over all disks (a VM with 1,000 backups has 1,000 per
/// CBT disk; a cookie beyond this is refused rather than mapped).
pub const MAX_BITMAPS: usize = 16_384;

/// One disk's bitmaps in a cookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskBitmaps {
    /// The disk's target device (`vda`): the node's alias in the stream.
    pub target: String,
    /// Its bitmaps, in the cookie's order.
    pub bitmaps: Vec<BitmapAlias>,
}

/// One bitmap of a disk in a cookie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BitmapAlias {
    /// The bitmap's name on both sides (a checkpoint's name).
    pub name: String,
    /// Its name in the stream.
    pub alias: String,
}

/// libvirt's stream name of bitmap `name` of disk `target`: `libvirt-<target>-<name>`
/// (`qemuMigrationSrcBeginPhaseBlockDirtyBitmaps`).
pub fn alias(target: &str, name: &str) -> String {
    ["libvirt", target, name].join("-")
}

/// Whether `s` can be a bitmap's name or a stream alias: not empty, at most `max` bytes, no
/// control character.
fn well_formed(s: &str, max: usize) -> bool {
    !s.is_empty() && s.len() <= max && !s.chars().any(char::is_control)
}

fn child<'a>(n: &'a Node, name: &'a str) -> impl Iterator<Item = &'a Node> + 'a {
    n.children.iter().filter(move |c| c.name == name)
}

/// The `<blockDirtyBitmaps>` of a `<qemu-migration>` cookie (NUL-terminated or not): empty when
/// the cookie has none.
///
/// # Errors
/// A message naming the element for a cookie that is not bounded, well-formed XML (the limits
/// of `qlauncher_libvirt_xml::hooks::parse_root`), a disk without a target or twice, a bitmap name
/// or alias that is empty, too long for QEMU ([`MAX_NAME_BYTES`], [`MAX_ALIAS_BYTES`]) or holds a
/// control character, a bitmap twice on a disk, or more than [`MAX_BITMAPS`] bitmaps.
pub fn parse(cookie: &[u8]) -> Result<Vec<DiskBitmaps>, String> {
    let end = cookie.iter().position(|&b| b == 0).unwrap_or(cookie.len());
    let text = std::str::from_utf8(&cookie[..end])
        .map_err(|_| "the migration cookie is not UTF-8".to_owned())?;
    if !text.contains("blockDirtyBitmaps") {
        return Ok(Vec::new());
    }
    let tree = qlauncher_libvirt_xml::hooks::parse_root(text, "qemu-migration")
        .map_err(|e| format!("the migration cookie: {}", e.reason))?;
    let mut out: Vec<DiskBitmaps> = Vec::new();
    let mut count = 0usize;
    for list in child(&tree, "blockDirtyBitmaps") {
        for disk in child(list, "disk") {
            let target = disk.attrs.get("target").cloned().unwrap_or_default();
            let at = format!("qemu-migration/blockDirtyBitmaps/disk[{target}]");
            if !well_formed(&target, MAX_ALIAS_BYTES) {
                return Err(format!("{at}@target: not a disk target"));
            }
            if out.iter().any(|d| d.target == target) {
                return Err(format!("{at}: the disk is listed twice"));
            }
            let mut bitmaps: Vec<BitmapAlias> = Vec::new();
            for b in child(disk, "bitmap") {
                let name = b.attrs.get("name").cloned().unwrap_or_default();
                let alias = b.attrs.get("alias").cloned().unwrap_or_default();
                if !well_formed(&name, MAX_NAME_BYTES) {
                    return Err(format!("{at}/bitmap@name: {name:?} is no bitmap name"));
                }
                if !well_formed(&alias, MAX_ALIAS_BYTES) {
                    return Err(format!(
                        "{at}/bitmap[{name}]@alias: {alias:?} is not a stream alias of at most \
                         {MAX_ALIAS_BYTES} bytes"
                    ));
                }
                if bitmaps.iter().any(|x| x.name == name || x.alias == alias) {
                    return Err(format!("{at}/bitmap[{name}]: listed twice"));
                }
                count += 1;
                if count > MAX_BITMAPS {
                    return Err(format!(
                        "qemu-migration/blockDirtyBitmaps: more than {MAX_BITMAPS} bitmaps"
                    ));
                }
                bitmaps.push(BitmapAlias { name, alias });
            }
            if !bitmaps.is_empty() {
                out.push(DiskBitmaps { target, bitmaps });
            }
        }
    }
    Ok(out)
}

/// The `<blockDirtyBitmaps>` element for `disks` (indented for a cookie's child, one line per
/// element, `qemuMigrationCookieBlockDirtyBitmapsFormat`); empty for no bitmap.
pub fn element(disks: &[DiskBitmaps]) -> String {
    let esc = |s: &str| quick_xml::escape::escape(s).into_owned();
    let disks: Vec<&DiskBitmaps> = disks.iter().filter(|d| !d.bitmaps.is_empty()).collect();
    if disks.is_empty() {
        return String::new();
    }
    let mut out = String::from("  <blockDirtyBitmaps>\n");
    for d in disks {
        out.push_str(&format!("    <disk target='{}'>\n", esc(&d.target)));
        for b in &d.bitmaps {
            out.push_str(&format!(
                "      <bitmap name='{}' alias='{}'/>\n",
                esc(&b.name),
                esc(&b.alias)
            ));
        }
        out.push_str("    </disk>\n");
    }
    out.push_str("  </blockDirtyBitmaps>\n");
    out
}

/// The bitmaps of `theirs` (a peer's cookie) that are also in `ours` (what this side offered,
/// or has room for), by disk target and bitmap name, with `ours`'s alias: what the peer names
/// beyond that is dropped.
pub fn agreed(theirs: &[DiskBitmaps], ours: &[DiskBitmaps]) -> Vec<DiskBitmaps> {
    theirs
        .iter()
        .filter_map(|t| {
            let o = ours.iter().find(|o| o.target == t.target)?;
            let bitmaps: Vec<BitmapAlias> = t
                .bitmaps
                .iter()
                .filter(|b| {
                    o.bitmaps
                        .iter()
                        .any(|x| x.name == b.name && x.alias == b.alias)
                })
                .cloned()
                .collect();
            (!bitmaps.is_empty()).then(|| DiskBitmaps {
                target: t.target.clone(),
                bitmaps,
            })
        })
        .collect()
}

/// QEMU's `block-bitmap-mapping` for `disks`, each disk's node on this side from `node_of` (its
/// target device to its format node); a disk without a node is left out.
pub fn mapping(
    disks: &[DiskBitmaps],
    node_of: impl Fn(&str) -> Option<String>,
) -> Vec<BitmapMigrationNodeAlias> {
    disks
        .iter()
        .filter_map(|d| {
            Some(BitmapMigrationNodeAlias {
                node_name: node_of(&d.target)?,
                alias: d.target.clone(),
                bitmaps: d
                    .bitmaps
                    .iter()
                    .map(|b| BitmapMigrationBitmapAlias {
                        name: b.name.clone(),
                        alias: b.alias.clone(),
                    })
                    .collect(),
            })
        })
        .filter(|m| !m.bitmaps.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(target: &str, names: &[&str]) -> DiskBitmaps {
        DiskBitmaps {
            target: target.into(),
            bitmaps: names
                .iter()
                .map(|n| BitmapAlias {
                    name: (*n).into(),
                    alias: alias(target, n),
                })
                .collect(),
        }
    }

    /// libvirt's element round-trips, inside a whole cookie, NUL-terminated.
    #[test]
    fn the_cookie_element_is_libvirts_and_reads_back() {
        let disks = vec![disk("vda", &["c1", "c2"]), disk("vdb", &["c1"])];
        let el = element(&disks);
        assert!(
            el.contains("<disk target='vda'>\n      <bitmap name='c1' alias='libvirt-vda-c1'/>"),
            "{el}"
        );
        let cookie = format!(
            "<qemu-migration>\n  <name>default_hv</name>\n  <nbd port='0'/>\n{el}</qemu-migration>\n\0"
        );
        assert_eq!(parse(cookie.as_bytes()).unwrap(), disks);
        assert_eq!(
            parse(b"<qemu-migration><name>x</name></qemu-migration>\0").unwrap(),
            vec![]
        );
        assert_eq!(element(&[disk("vda", &[])]), "");
    }

    /// A hostile cookie is refused naming the element, never mapped.
    #[test]
    fn a_bad_cookie_is_refused_naming_the_element() {
        let wrap = |inner: &str| {
            format!(
                "<qemu-migration><blockDirtyBitmaps>{inner}</blockDirtyBitmaps></qemu-migration>"
            )
        };
        let long = "a".repeat(256);
        for (inner, want) in [
            ("<disk><bitmap name='a' alias='b'/></disk>", "@target"),
            ("<disk target='vda'><bitmap alias='b'/></disk>", "bitmap@name"),
            (
                &format!("<disk target='vda'><bitmap name='a' alias='{long}'/></disk>") as &str,
                "@alias",
            ),
            (
                "<disk target='vda'><bitmap name='a&#10;b' alias='x'/></disk>",
                "bitmap@name",
            ),
            (
                "<disk target='vda'><bitmap name='a' alias='x'/><bitmap name='a' alias='y'/></disk>",
                "twice",
            ),
            (
                "<disk target='vda'><bitmap name='a' alias='x'/></disk><disk target='vda'/>",
                "twice",
            ),
        ] {
            let e = parse(wrap(inner).as_bytes()).unwrap_err();
            assert!(e.contains(want), "{inner}: {e}");
        }
        assert!(parse(b"<qemu-migration><blockDirtyBitmaps>").is_err());
        assert!(parse(&[0xff, b'b', b'l']).is_err());
        let many: String = (0..=MAX_BITMAPS)
            .map(|i| format!("<bitmap name='b{i}' alias='a{i}'/>"))
            .collect();
        let e = parse(wrap(&format!("<disk target='vda'>{many}</disk>")).as_bytes());
        assert!(e.is_err());
    }

    /// Only what both sides name is agreed, and mapped onto this side's nodes.
    #[test]
    fn the_agreed_bitmaps_map_onto_this_sides_nodes() {
        let ours = vec![disk("vda", &["c1", "c2"]), disk("vdb", &["c1"])];
        let mut theirs = vec![disk("vda", &["c2", "c9"]), disk("vdc", &["c1"])];
        theirs[0].bitmaps.push(BitmapAlias {
            name: "c1".into(),
            alias: "another".into(),
        });
        let agreed = agreed(&theirs, &ours);
        assert_eq!(agreed, vec![disk("vda", &["c2"])]);
        let m = mapping(&agreed, |t| {
            (t == "vda").then(|| "libvirt-1-format".to_owned())
        });
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            serde_json::json!([{"node-name": "libvirt-1-format", "alias": "vda",
                "bitmaps": [{"name": "c2", "alias": "libvirt-vda-c2"}]}])
        );
        assert!(mapping(&agreed, |_| None).is_empty());
    }
}

//! The domain XML a hook sidecar's `OnDefineDomain` sees and what its answer may change.
//!
//! KubeVirt sends `xml.MarshalIndent(api.DomainSpec, "", "\t")` (`pkg/hooks/manager.go`,
//! `onDefineDomainCallback`, v1.9.0): Go's `encoding/xml` text form, which scripts that `sed` the
//! XML depend on. [`go_xml`] prints the exporter's model that way: tab indent, no declaration,
//! empty elements as a start/end pair (`<baseBoard></baseBoard>`), attributes in the schema's
//! (Go struct) order, and Go's escaping (`"` as `&#34;`, `'` as `&#39;`, tab/LF/CR as character
//! references). [`kubevirt_input`] adds the empty `<bios>`, `<baseBoard>` and `<chassis>` KubeVirt
//! always writes.
//!
//! The answer is untrusted: [`diff_answer`] parses it namespace-aware ([`parse`]: size and depth
//! bounded, prefixes resolved, so ElementTree's `ns0:commandline` is `qemu:commandline`; an
//! unbound `qemu:` prefix, as Go `api.DomainSpec` hooks write it, is read as libvirt's QEMU
//! namespace), compares it with what was sent, and turns each difference into a typed
//! [`HookEdit`] or a [`Refusal`] naming the element path and both values. Tier 1 of the mapping
//! (`../shared/reference/kubevirt-hook-sidecars.md` §4.5): `qemu:commandline` args and env,
//! SMBIOS `sysinfo` types 0, 1, 2, 3, 11, `os/smbios@mode` `sysinfo`/`emulate`; of tier 2, a
//! disk's driver, serial, `<iotune>` and `<wwn>` ([`DiskEdit`]), an interface's model, MTU,
//! queue sizes and ROM ([`NicEdit`]), `<features>` that are `-cpu` flags ([`FeatureEdit`]),
//! `<clock>` offset and timers ([`ClockEdit`]).
//! Everything else that differs is refused.

use std::collections::BTreeMap;

use qlauncher_core::cmdline::plan::SmbiosTable;
use qlauncher_core::cmdline::DomainPlan;
use quick_xml::events::{BytesStart, Event};
use quick_xml::name::ResolveResult;
use quick_xml::{NsReader, Reader};

use crate::golden::{diff, Node};
use crate::schema::{Device, DiskSource, Domain, Entries};
use crate::CompatError;

/// libvirt's QEMU namespace (`<qemu:commandline>`).
pub const QEMU_NS: &str = "http://libvirt.org/schemas/domain/qemu/1.0";
/// KubeVirt's metadata namespace (`<metadata><kubevirt xmlns=..>`).
pub const KUBEVIRT_NS: &str = "http://kubevirt.io";
/// Largest hook answer read (bytes); a domain XML is tens of KiB.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;
/// Deepest element nesting read (a domain XML nests 7 levels).
pub const MAX_DEPTH: usize = 32;
/// Most elements read from one answer.
pub const MAX_ELEMENTS: usize = 100_000;
/// Longest SMBIOS string accepted from a hook (QEMU's SMBIOS strings are bytes up to 255 in a
/// table's string area).
pub const MAX_SMBIOS_TEXT: usize = 255;

mod answer;
mod edits;
mod hooked;
mod input;

pub use answer::*;
pub use edits::*;
pub use hooked::*;
pub use input::*;

#[cfg(test)]
mod tests {
    use super::*;

    const SENT: &str = "<domain type=\"kvm\" xmlns:qemu=\"http://libvirt.org/schemas/domain/qemu/1.0\">\n\t<name>ns_vm</name>\n\t<os>\n\t\t<type arch=\"x86_64\" machine=\"q35\">hvm</type>\n\t\t<smbios mode=\"sysinfo\"></smbios>\n\t</os>\n\t<sysinfo type=\"smbios\">\n\t\t<system>\n\t\t\t<entry name=\"uuid\">u-1</entry>\n\t\t\t<entry name=\"manufacturer\"></entry>\n\t\t</system>\n\t\t<bios></bios>\n\t\t<baseBoard></baseBoard>\n\t\t<chassis></chassis>\n\t</sysinfo>\n\t<devices>\n\t\t<disk device=\"disk\" type=\"file\">\n\t\t\t<driver cache=\"none\" name=\"qemu\"></driver>\n\t\t\t<alias name=\"ua-root\"></alias>\n\t\t</disk>\n\t</devices>\n</domain>";

    #[test]
    fn a_sed_on_base_board_is_an_smbios_edit() {
        let answer = SENT.replace(
            "<baseBoard></baseBoard>",
            "<baseBoard><entry name=\"manufacturer\">Radical Edward</entry></baseBoard>",
        );
        let edits = diff_answer(SENT, &answer).unwrap();
        assert_eq!(
            edits,
            vec![HookEdit::Smbios {
                table: 2,
                fields: vec![("manufacturer", "Radical Edward".into())]
            }]
        );
    }

    #[test]
    fn no_op_rewrites_are_no_change() {
        // ElementTree's form: own prefix, self-closing, no indent.
        let et = "<domain xmlns:ns0=\"http://libvirt.org/schemas/domain/qemu/1.0\" type=\"kvm\"><name>ns_vm</name><os><type arch=\"x86_64\" machine=\"q35\">hvm</type><smbios mode=\"sysinfo\"/></os><sysinfo type=\"smbios\"><system><entry name=\"uuid\">u-1</entry><entry name=\"manufacturer\"/></system><bios/><baseBoard/><chassis/></sysinfo><devices><disk type=\"file\" device=\"disk\"><driver name=\"qemu\" cache=\"none\"/><alias name=\"ua-root\"/></disk></devices></domain>";
        assert_eq!(diff_answer(SENT, et).unwrap(), vec![]);
        assert_eq!(diff_answer(SENT, SENT).unwrap(), vec![]);
    }

    /// Only the listed meaningless forms are one: an empty interface `<source>` may go, a
    /// `<readonly/>` may not; `slots="0"` may go, `slots="1"` may not.
    #[test]
    fn only_meaningless_differences_are_normalized() {
        let sent = "<domain type=\"kvm\"><maxMemory slots=\"0\">1</maxMemory><devices><interface type=\"ethernet\"><source></source><alias name=\"ua-a\"></alias></interface><disk device=\"cdrom\" type=\"file\"><readonly></readonly><alias name=\"ua-c\"></alias></disk></devices></domain>";
        let same = "<domain type=\"kvm\"><maxMemory>1</maxMemory><devices><interface type=\"ethernet\"><alias name=\"ua-a\"/></interface><disk device=\"cdrom\" type=\"file\"><readonly/><alias name=\"ua-c\"/></disk></devices></domain>";
        assert_eq!(diff_answer(sent, same).unwrap(), vec![]);
        let writable = same.replace("<readonly/>", "");
        assert!(diff_answer(sent, &writable).is_err());
        let slots = same.replace("<maxMemory>", "<maxMemory slots=\"1\">");
        assert_eq!(
            diff_answer(sent, &slots).unwrap_err().path,
            "domain/maxMemory@slots"
        );
    }

    #[test]
    fn commandline_args_are_words_and_prefixes_resolve() {
        let answer = SENT.replace(
            "</devices>",
            "</devices><ns0:commandline xmlns:ns0=\"http://libvirt.org/schemas/domain/qemu/1.0\"><ns0:arg value=\"-device\"/><ns0:arg value=\"pvpanic,ioport=1285\"/><ns0:env name=\"FOO\" value=\"a b\"/></ns0:commandline>",
        );
        let edits = diff_answer(SENT, &answer).unwrap();
        assert_eq!(
            edits,
            vec![
                HookEdit::Args(vec!["-device".into(), "pvpanic,ioport=1285".into()]),
                HookEdit::Env(vec![("FOO".into(), "a b".into())]),
            ]
        );
        // Go api.DomainSpec hooks drop xmlns:qemu: the bare prefix still means QEMU's.
        let bare = "<domain type=\"kvm\"><name>ns_vm</name><os><type arch=\"x86_64\" machine=\"q35\">hvm</type><smbios mode=\"sysinfo\"/></os><sysinfo type=\"smbios\"><system><entry name=\"uuid\">u-1</entry></system></sysinfo><devices><disk type=\"file\" device=\"disk\"><driver name=\"qemu\" cache=\"none\"/><alias name=\"ua-root\"/></disk></devices><qemu:commandline><qemu:arg value=\"-S\"/></qemu:commandline></domain>";
        assert_eq!(
            diff_answer(SENT, bare).unwrap(),
            vec![HookEdit::Args(vec!["-S".into()])]
        );
    }

    #[test]
    fn refusals_name_the_path_and_both_values() {
        // A cache mode is an edit (tier 2); one libvirt does not have is refused.
        let answer = SENT.replace("cache=\"none\"", "cache=\"writeback\"");
        assert_eq!(
            diff_answer(SENT, &answer).unwrap(),
            vec![HookEdit::Disk {
                alias: "ua-root".into(),
                edit: DiskEdit::Cache(CacheMode::Writeback)
            }]
        );
        let answer = SENT.replace("cache=\"none\"", "cache=\"fast\"");
        let r = diff_answer(SENT, &answer).unwrap_err();
        assert_eq!(r.path, "domain/devices/disk[ua-root]/driver@cache");
        assert_eq!((r.sent.as_str(), r.answered.as_str()), ("none", "fast"));
        let answer = SENT.replace(
            "</devices>",
            "</devices><qemu:commandline><qemu:arg value=\"-incoming\"/></qemu:commandline>",
        );
        let r = diff_answer(SENT, &answer).unwrap_err();
        assert!(r.path.contains("qemu:arg[0]"), "{r}");
        let answer = SENT.replace("u-1", "u-2");
        let r = diff_answer(SENT, &answer).unwrap_err();
        assert_eq!(r.path, "domain/sysinfo/system/entry[uuid]#text");
        let answer = SENT.replace("<bios></bios>", "<bios><entry name=\"x\">1</entry></bios>");
        assert!(diff_answer(SENT, &answer).is_err());
        let answer = SENT.replace("mode=\"sysinfo\"", "mode=\"host\"");
        assert_eq!(
            diff_answer(SENT, &answer).unwrap_err().path,
            "domain/os/smbios@mode"
        );
    }

    #[test]
    fn hostile_answers_are_refused_not_crashed() {
        let deep = format!("{}{}", "<a>".repeat(10_000), "</a>".repeat(10_000));
        assert!(diff_answer(SENT, &deep).is_err());
        let huge = format!("<domain>{}</domain>", "x".repeat(MAX_ANSWER_BYTES + 1));
        assert!(diff_answer(SENT, &huge).is_err());
        for bad in [
            "",
            "<domain>",
            "<domain></other>",
            "<!DOCTYPE d [<!ENTITY x \"y\">]><domain>&x;</domain>",
            "<domain>&x;</domain>",
            "<domain/><domain/>",
            "<x:domain/>",
            "\u{0}",
        ] {
            assert!(diff_answer(SENT, bad).is_err(), "{bad:?}");
        }
        let ctl = SENT.replace(
            "<baseBoard></baseBoard>",
            "<baseBoard><entry name=\"serial\">a&#xA;b</entry></baseBoard>",
        );
        assert!(diff_answer(SENT, &ctl).is_err());
    }

    #[test]
    fn go_escaping_and_empty_pairs() {
        let mut s = String::new();
        go_escape(&mut s, "a\"b'c&<>\t\n\r\u{1}");
        assert_eq!(s, "a&#34;b&#39;c&amp;&lt;&gt;&#x9;&#xA;&#xD;\u{FFFD}");
        let p = go_print("<a x=\"1\"><b/><c>t</c><d><e/></d></a>");
        assert_eq!(
            p,
            "<a x=\"1\">\n\t<b></b>\n\t<c>t</c>\n\t<d>\n\t\t<e></e>\n\t</d>\n</a>"
        );
    }
}

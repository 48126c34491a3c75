//! Hostile VMI field values: QEMU keyval separators (`,` `=`), option injection (`,id=`, a
//! leading `-`), quotes, a newline, path traversal and JSON. Every VMI string that reaches QEMU
//! must either be rejected with its field path or arrive whole (`tests/cmdline_hostile.rs` checks
//! the rendered argv, `tests/harden_hostile_fields.rs` what QEMU parsed).

/// The values, none empty.
pub const VALUES: &[&str] = &[
    "a,b",
    ",id=evil,x=y",
    "a=b",
    "q\"u'o`te",
    "new\nline",
    "../../etc/passwd",
    "{\"driver\":\"x\"}",
    "-device",
];

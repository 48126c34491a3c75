//! The one writer for QEMU's `key=value,...` switches (`-machine`, `-smp`, `-chardev`, `-mon`, `-vnc`,
//! `-smbios`, `-global`, `-rtc`, `-numa`, ...).
//!
//! QEMU's option parser (`util/qemu-option.c`, `get_opt_value`) ends a value at the first single
//! comma and reads `,,` as a literal comma. Doubling every comma in every value is therefore enough
//! to keep a value inside its key: `=` and quotes have no meaning inside a value, and the argv
//! vector never meets a shell. Keys are always constants of this crate.

/// Builds one `key=value,...` argument.
///
/// ```
/// use qlauncher_core::cmdline::qemu::KeyVal;
/// let arg = KeyVal::with_head("socket").kv("id", "charserial0").kv("path", "/a,b").finish();
/// assert_eq!(arg, "socket,id=charserial0,path=/a,,b");
/// ```
#[derive(Debug, Clone, Default)]
pub struct KeyVal {
    out: String,
}

/// Doubles every comma of `value` so QEMU's option parser reads it as one value.
pub fn escape_value(value: &str) -> String {
    value.replace(',', ",,")
}

impl KeyVal {
    /// An empty argument.
    pub fn new() -> Self {
        KeyVal::default()
    }

    /// An argument starting with an implied value (QEMU's "implied key": `-chardev socket`,
    /// `-smp 4`, `-machine q35`); the head is escaped like any value.
    pub fn with_head(head: &str) -> Self {
        KeyVal {
            out: escape_value(head),
        }
    }

    /// Appends `key=value` (value escaped).
    pub fn kv(mut self, key: &str, value: impl AsRef<str>) -> Self {
        if !self.out.is_empty() {
            self.out.push(',');
        }
        self.out.push_str(key);
        self.out.push('=');
        self.out.push_str(&escape_value(value.as_ref()));
        self
    }

    /// Appends `key=value` when `value` is `Some`.
    pub fn opt(self, key: &str, value: Option<impl AsRef<str>>) -> Self {
        match value {
            Some(v) => self.kv(key, v),
            None => self,
        }
    }

    /// Appends `key=on` or `key=off`.
    pub fn on_off(self, key: &str, on: bool) -> Self {
        self.kv(key, if on { "on" } else { "off" })
    }

    /// The finished argument.
    pub fn finish(self) -> String {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commas_are_doubled_in_values_only() {
        let arg = KeyVal::with_head("socket")
            .kv("id", "a,b")
            .kv("path", "/x=y,z\"q")
            .on_off("server", true)
            .finish();
        assert_eq!(arg, "socket,id=a,,b,path=/x=y,,z\"q,server=on");
    }

    #[test]
    fn empty_head_starts_with_first_key() {
        assert_eq!(KeyVal::new().kv("type", "1").finish(), "type=1");
    }
}

//! libvirt's x86 CPU map, loaded as data: `cpu_map/index.xml` and the `x86_*.xml` files its
//! `<arch name='x86'>` includes (libvirt `src/cpu_map/`, read by `cpu_x86.c` `virCPUx86LoadMap`).
//!
//! The map names every CPU feature libvirt knows with its CPUID or MSR bits, the vendors with their
//! CPUID vendor strings, and the CPU models with their features, vendor and family/model
//! signatures. The node labeller decodes QEMU's host CPU against it, so that labels carry libvirt's
//! names (`pclmuldq`, `lahf_lm`) and libvirt's model choice. The map is data the image ships
//! (`/usr/share/qlauncher/cpu_map`, copied from the distribution's libvirt package when the image is
//! built), so the names follow that libvirt release, not this code.
//!
//! [`CpuData`] is the bit set everything works on: CPUID leaves (`eax_in`, `ecx_in`) with their four
//! registers and MSRs with `eax`/`edx`, kept sorted as libvirt sorts them.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::xml::{self, Element};

/// Where a [`CpuData`] item lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DataKey {
    /// A CPUID leaf and subleaf (`eax_in`, `ecx_in`).
    Cpuid {
        /// `eax_in`.
        leaf: u32,
        /// `ecx_in`.
        subleaf: u32,
    },
    /// A model-specific register (its `eax` and `edx` halves).
    Msr {
        /// MSR index.
        index: u32,
    },
}

/// Register bits of one item: `[eax, ebx, ecx, edx]` for CPUID, `[eax, edx, 0, 0]` for an MSR.
pub type Regs = [u32; 4];

/// A set of CPUID and MSR bits (libvirt's `virCPUx86Data`). All-zero items count as absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuData {
    items: BTreeMap<DataKey, Regs>,
}

impl CpuData {
    /// Sets the bits `regs` of item `key` (OR with what is there).
    pub fn set(&mut self, key: DataKey, regs: Regs) {
        let item = self.items.entry(key).or_insert([0; 4]);
        for (r, m) in item.iter_mut().zip(regs) {
            *r |= m;
        }
    }

    /// The bits of item `key` (zero when absent).
    pub fn get(&self, key: DataKey) -> Regs {
        self.items.get(&key).copied().unwrap_or([0; 4])
    }

    /// `self |= other` (`x86DataAdd`).
    pub fn add(&mut self, other: &CpuData) {
        for (k, r) in &other.items {
            if *r != [0; 4] {
                self.set(*k, *r);
            }
        }
    }

    /// `self &= !other` (`x86DataSubtract`).
    pub fn subtract(&mut self, other: &CpuData) {
        for (k, r) in self.items.iter_mut() {
            if let Some(m) = other.items.get(k) {
                for (a, b) in r.iter_mut().zip(m) {
                    *a &= !b;
                }
            }
        }
    }

    /// `self &= other`, items missing from `other` cleared (`x86DataIntersect`).
    pub fn intersect(&mut self, other: &CpuData) {
        for (k, r) in self.items.iter_mut() {
            let m = other.get(*k);
            for (a, b) in r.iter_mut().zip(m) {
                *a &= b;
            }
        }
    }

    /// Whether every bit of `subset` is set here (`x86DataIsSubset`).
    pub fn contains(&self, subset: &CpuData) -> bool {
        subset.items.iter().all(|(k, m)| {
            let r = self.get(*k);
            r.iter().zip(m).all(|(a, b)| a & b == *b)
        })
    }

    /// Whether no bit is set (`x86DataIsEmpty`).
    pub fn is_empty(&self) -> bool {
        self.items.values().all(|r| *r == [0; 4])
    }

    /// The CPU signature in leaf 1 `eax`, reserved bits masked (`x86DataToSignature`).
    pub fn signature(&self) -> u32 {
        self.get(LEAF1)[0] & 0x0fff_3fff
    }

    /// Sets the leaf 1 signature for `family`, `model` and `stepping` (`x86MakeSignature`).
    pub fn set_signature(&mut self, family: u32, model: u32, stepping: u32) {
        self.set(LEAF1, [make_signature(family, model, stepping), 0, 0, 0]);
    }

    /// The CPUID keys that hold bits, in libvirt's order.
    pub fn keys(&self) -> impl Iterator<Item = DataKey> + '_ {
        self.items
            .iter()
            .filter(|(_, r)| **r != [0; 4])
            .map(|(k, _)| *k)
    }
}

/// CPUID leaf 0 (vendor string).
pub const LEAF0: DataKey = DataKey::Cpuid {
    leaf: 0,
    subleaf: 0,
};
/// CPUID leaf 1 (signature, basic features).
pub const LEAF1: DataKey = DataKey::Cpuid {
    leaf: 1,
    subleaf: 0,
};

/// The leaf 1 `eax` signature of a family, model and stepping (`x86MakeSignature`): extended
/// family above 15, extended model in bits 19..16.
pub fn make_signature(family: u32, model: u32, stepping: u32) -> u32 {
    let mut sig = 0;
    let mut family = family;
    if family > 0xf {
        sig |= (family - 0xf) << 20;
        family = 0xf;
    }
    sig |= (model >> 4) << 16;
    sig |= family << 8;
    sig |= (model & 0xf) << 4;
    sig | (stepping & 0xf)
}

/// Family, model and stepping of a leaf 1 signature (`virCPUx86SignatureFromCPUID`).
pub fn split_signature(sig: u32) -> (u32, u32, u32) {
    (
        ((sig >> 20) & 0xff) + ((sig >> 8) & 0xf),
        ((sig >> 12) & 0xf0) + ((sig >> 4) & 0xf),
        sig & 0xf,
    )
}

/// A CPU vendor (`x86_vendors.xml`): its name and the leaf 0 bits of its vendor string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vendor {
    /// libvirt's name (`Intel`, `AMD`, `Hygon`).
    pub name: String,
    /// Leaf 0 `ebx`, `edx`, `ecx` of the 12-byte vendor string.
    pub data: CpuData,
}

/// A feature (`x86_features.xml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Feature {
    /// libvirt's name (`pclmuldq`).
    pub name: String,
    /// Other spellings QEMU uses (`<alias source='qemu'>`): documentation in the map, which
    /// libvirt's loader skips (9.0 to 11.3), and so does [`CpuMap::feature`].
    pub qemu_aliases: Vec<String>,
    /// Whether a migratable CPU may have it (`migratable='no'`: `invtsc`).
    pub migratable: bool,
    /// Its bits.
    pub data: CpuData,
}

/// One `<signature family model [stepping]>` of a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// CPU family.
    pub family: u32,
    /// CPU model number.
    pub model: u32,
    /// Steppings as a bit mask (bit n: stepping n); `None` matches every stepping.
    pub steppings: Option<u16>,
}

/// A CPU model (`x86_<name>.xml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    /// Model name (`EPYC`, `Skylake-Client-IBRS`).
    pub name: String,
    /// Index into [`CpuMap::vendors`], when the model names one.
    pub vendor: Option<usize>,
    /// Family/model signatures it matches.
    pub signatures: Vec<Signature>,
    /// Its features' bits (ancestor's included, removed and `added='yes'` features excluded).
    pub data: CpuData,
    /// Features removed from it (`removed='yes'`), disabled explicitly in guest definitions.
    pub removed: Vec<String>,
    /// `<decode host=..>`: may name a host CPU.
    pub decode_host: bool,
    /// `<decode guest=..>`: may name a guest CPU (host-model).
    pub decode_guest: bool,
}

impl Model {
    /// Whether one of its signatures matches the leaf 1 signature `sig`
    /// (`virCPUx86SignaturesMatch`).
    pub fn matches_signature(&self, sig: u32) -> bool {
        let (family, model, stepping) = split_signature(sig);
        self.signatures.iter().any(|s| {
            s.family == family
                && s.model == model
                && s.steppings.is_none_or(|m| m & (1 << stepping) != 0)
        })
    }
}

/// The x86 part of libvirt's CPU map.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuMap {
    /// Vendors in map order.
    pub vendors: Vec<Vendor>,
    /// Features in map order (the order libvirt lists decoded features in).
    pub features: Vec<Feature>,
    /// Models in map order (decoding walks them newest, i.e. last, first).
    pub models: Vec<Model>,
    feature_index: HashMap<String, usize>,
}

/// Why the map could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CpuMapError {
    /// A file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A file is not well-formed XML.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: xml::ParseError,
    },
    /// A file is well-formed but not what libvirt's loader accepts.
    #[error("{path}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl CpuMap {
    /// Loads `dir/index.xml` and the files its x86 section includes (file names only: an include
    /// with a `/` or `..` is refused). Errors: [`CpuMapError`] naming the file.
    pub fn load(dir: &Path) -> Result<CpuMap, CpuMapError> {
        let index_path = dir.join("index.xml");
        let index = read_xml(&index_path)?;
        let arch = index
            .named("arch")
            .find(|a| a.get("name") == Some("x86"))
            .ok_or_else(|| CpuMapError::Invalid {
                path: index_path.clone(),
                reason: "no <arch name='x86'>".into(),
            })?;
        let mut map = CpuMap::default();
        map.add_document(arch)
            .map_err(|reason| CpuMapError::Invalid {
                path: index_path.clone(),
                reason,
            })?;
        // `include|group[@name]/include`, in document order (libvirt `cpu_map.c` `loadIncludes`).
        let includes = arch.children.iter().flat_map(|c| match c.name.as_str() {
            "include" => vec![c],
            "group" if c.get("name").is_some() => c.named("include").collect(),
            _ => Vec::new(),
        });
        for item in includes {
            let file = item.get("filename").unwrap_or_default();
            if file.is_empty() || file.contains('/') || file == ".." || file == "." {
                return Err(CpuMapError::Invalid {
                    path: index_path.clone(),
                    reason: format!("include {file:?} is not a file name"),
                });
            }
            let path = dir.join(file);
            let doc = read_xml(&path)?;
            map.add_document(&doc)
                .map_err(|reason| CpuMapError::Invalid {
                    path: path.clone(),
                    reason,
                })?;
        }
        Ok(map)
    }

    /// Builds a map from documents already parsed (each a `<cpus>` root), in order: what
    /// [`CpuMap::load`] does after reading the files. Errors: the reason an element is refused.
    pub fn from_documents(docs: &[Element]) -> Result<CpuMap, String> {
        let mut map = CpuMap::default();
        for doc in docs {
            map.add_document(doc)?;
        }
        Ok(map)
    }

    /// The feature called `name` in libvirt's spelling (`x86FeatureFind`).
    pub fn feature(&self, name: &str) -> Option<&Feature> {
        self.feature_index.get(name).map(|&i| &self.features[i])
    }

    /// The model called `name`.
    pub fn model(&self, name: &str) -> Option<&Model> {
        self.models.iter().find(|m| m.name == name)
    }

    /// The vendor called `name`.
    pub fn vendor_index(&self, name: &str) -> Option<usize> {
        self.vendors.iter().position(|v| v.name == name)
    }

    /// The vendor of model `name`, for `<model vendor=..>` in domain capabilities.
    pub fn model_vendor(&self, name: &str) -> Option<&str> {
        let v = self.model(name)?.vendor?;
        Some(self.vendors[v].name.as_str())
    }

    /// The vendors, then the features, then the models of one document (libvirt's `loadData`
    /// per element name).
    fn add_document(&mut self, doc: &Element) -> Result<(), String> {
        for el in doc.named("vendor") {
            self.add_vendor(el)?;
        }
        for el in doc.named("feature") {
            self.add_feature(el)?;
        }
        for el in doc.named("model") {
            self.add_model(el)?;
        }
        Ok(())
    }

    fn add_vendor(&mut self, el: &Element) -> Result<(), String> {
        let name = required(el, "name", "vendor")?;
        let string = required(el, "string", "vendor")?;
        if self.vendor_index(name).is_some() {
            return Err(format!("vendor {name} defined twice"));
        }
        let data = vendor_data(string)
            .ok_or_else(|| format!("vendor {name}: string {string:?} is not 12 characters"))?;
        self.vendors.push(Vendor {
            name: name.to_owned(),
            data,
        });
        Ok(())
    }

    fn add_feature(&mut self, el: &Element) -> Result<(), String> {
        let name = required(el, "name", "feature")?;
        if self.feature_index.contains_key(name) {
            return Err(format!("feature {name} defined twice"));
        }
        let mut data = CpuData::default();
        let mut aliases = Vec::new();
        for c in &el.children {
            match c.name.as_str() {
                "cpuid" => {
                    let leaf = number(c, "eax_in")?.ok_or("cpuid without eax_in")?;
                    let subleaf = number(c, "ecx_in")?.unwrap_or(0);
                    let regs = [
                        number(c, "eax")?.unwrap_or(0),
                        number(c, "ebx")?.unwrap_or(0),
                        number(c, "ecx")?.unwrap_or(0),
                        number(c, "edx")?.unwrap_or(0),
                    ];
                    data.set(DataKey::Cpuid { leaf, subleaf }, regs);
                }
                "msr" => {
                    let index = number(c, "index")?.ok_or("msr without index")?;
                    let eax = number(c, "eax")?.ok_or("msr without eax")?;
                    let edx = number(c, "edx")?.ok_or("msr without edx")?;
                    data.set(DataKey::Msr { index }, [eax, edx, 0, 0]);
                }
                "alias" if c.get("source") == Some("qemu") => {
                    if let Some(a) = c.get("name") {
                        aliases.push(a.to_owned());
                    }
                }
                _ => {}
            }
        }
        if data.is_empty() {
            return Err(format!("feature {name} has no CPUID or MSR bits"));
        }
        let i = self.features.len();
        self.feature_index.insert(name.to_owned(), i);
        self.features.push(Feature {
            name: name.to_owned(),
            qemu_aliases: aliases,
            migratable: el.get("migratable") != Some("no"),
            data,
        });
        Ok(())
    }

    fn add_model(&mut self, el: &Element) -> Result<(), String> {
        let name = required(el, "name", "model")?;
        if self.model(name).is_some() {
            return Err(format!("model {name} defined twice"));
        }
        let decode = el
            .named("decode")
            .next()
            .ok_or_else(|| format!("model {name} has no <decode>"))?;
        let on = |key| match decode.get(key) {
            Some("on") => Ok(true),
            Some("off") => Ok(false),
            other => Err(format!("model {name}: decode {key}={other:?}")),
        };
        let mut model = Model {
            name: name.to_owned(),
            vendor: None,
            signatures: Vec::new(),
            data: CpuData::default(),
            removed: Vec::new(),
            decode_host: on("host")?,
            decode_guest: on("guest")?,
        };
        if let Some(parent) = el.named("model").next() {
            let pname = required(parent, "name", "ancestor model")?;
            let p = self.model(pname).ok_or_else(|| {
                format!("model {name}: ancestor {pname} is not defined before it")
            })?;
            model.vendor = p.vendor;
            model.signatures = p.signatures.clone();
            model.data = p.data.clone();
            // libvirt 11: what the ancestor removed stays out of the descendant.
            for r in &p.removed {
                if let Some(f) = self.feature(r) {
                    let bits = f.data.clone();
                    model.data.subtract(&bits);
                }
            }
        }
        let sigs: Vec<&Element> = el.named("signature").collect();
        if !sigs.is_empty() {
            model.signatures.clear();
            for s in sigs {
                let family = number(s, "family")?.filter(|f| *f != 0);
                let family = family.ok_or_else(|| format!("model {name}: bad signature family"))?;
                let m = number(s, "model")?.ok_or_else(|| format!("model {name}: no model"))?;
                let steppings = match s.get("stepping") {
                    None => None,
                    Some(list) => Some(
                        parse_steppings(list)
                            .ok_or_else(|| format!("model {name}: stepping {list:?}"))?,
                    ),
                };
                model.signatures.push(Signature {
                    family,
                    model: m,
                    steppings,
                });
            }
        }
        if let Some(v) = el.named("vendor").next() {
            let vname = required(v, "name", "model vendor")?;
            model.vendor = Some(
                self.vendor_index(vname)
                    .ok_or_else(|| format!("model {name}: unknown vendor {vname}"))?,
            );
        }
        for f in el.named("feature") {
            let fname = required(f, "name", "model feature")?;
            let feature = self
                .feature(fname)
                .ok_or_else(|| format!("model {name}: unknown feature {fname}"))?;
            if f.get("removed") == Some("yes") {
                model.removed.push(fname.to_owned());
            } else if f.get("added") == Some("yes") {
                // libvirt 11: a feature added to the model in a later release; libvirt leaves it
                // out of the model's bits (it only affects `check='full'`).
            } else {
                let bits = feature.data.clone();
                model.data.add(&bits);
            }
        }
        self.models.push(model);
        Ok(())
    }
}

fn read_xml(path: &Path) -> Result<Element, CpuMapError> {
    let text = std::fs::read_to_string(path).map_err(|source| CpuMapError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    xml::parse(&text).map_err(|source| CpuMapError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

fn required<'a>(el: &'a Element, key: &str, what: &str) -> Result<&'a str, String> {
    el.get(key)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("{what} without {key}"))
}

/// An unsigned attribute in decimal or `0x` hex, as libvirt's `virXMLPropUInt(.., 0, ..)`.
fn number(el: &Element, key: &str) -> Result<Option<u32>, String> {
    let Some(v) = el.get(key) else {
        return Ok(None);
    };
    let parsed = match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => v.parse(),
    };
    parsed
        .map(Some)
        .map_err(|_| format!("<{}> {key}={v:?} is not a number", el.name))
}

/// A stepping list (`0-4`, `5,7`) as a 16-bit mask.
fn parse_steppings(list: &str) -> Option<u16> {
    let mut mask = 0u16;
    for part in list.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim().parse::<u32>().ok()?, b.trim().parse::<u32>().ok()?),
            None => {
                let n = part.trim().parse::<u32>().ok()?;
                (n, n)
            }
        };
        if a > b || b > 15 {
            return None;
        }
        for s in a..=b {
            mask |= 1 << s;
        }
    }
    Some(mask)
}

/// Leaf 0 bits of a 12-byte vendor string (`virCPUx86VendorToData`: `ebx`, `edx`, `ecx` little
/// endian), or `None` when it is not 12 bytes.
pub fn vendor_data(string: &str) -> Option<CpuData> {
    let b = string.as_bytes();
    if b.len() != 12 {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut data = CpuData::default();
    data.set(LEAF0, [0, word(0), word(8), word(4)]);
    Some(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> Element {
        xml::parse(text).unwrap()
    }

    #[test]
    fn features_models_and_ancestors() {
        let map = CpuMap::from_documents(&[
            doc("<cpus><vendor name='AMD' string='AuthenticAMD'/></cpus>"),
            doc("<cpus>\
                <feature name='fpu'><cpuid eax_in='0x01' edx='0x00000001'/></feature>\
                <feature name='pclmuldq'><alias name='pclmulqdq' source='qemu'/>\
                  <cpuid eax_in='0x01' ecx='0x00000002'/></feature>\
                <feature name='invtsc' migratable='no'><cpuid eax_in='0x80000007' edx='0x00000100'/></feature>\
                <feature name='mds-no'><msr index='0x10a' edx='0x00000000' eax='0x00000020'/></feature>\
              </cpus>"),
            doc("<cpus><model name='A'><decode host='on' guest='on'/>\
                <signature family='23' model='1' stepping='0-2,4'/><vendor name='AMD'/>\
                <feature name='fpu'/><feature name='pclmuldq' removed='yes'/></model></cpus>"),
            doc("<cpus><model name='A-v2'><decode host='on' guest='off'/><model name='A'/>\
                <feature name='mds-no'/><feature name='invtsc' added='yes'/></model></cpus>"),
        ])
        .unwrap();
        assert!(map.feature("pclmulqdq").is_none(), "aliases are not names");
        assert_eq!(
            map.feature("pclmuldq").unwrap().qemu_aliases,
            vec!["pclmulqdq"]
        );
        assert!(!map.feature("invtsc").unwrap().migratable);
        let a = map.model("A").unwrap();
        assert_eq!(a.removed, vec!["pclmuldq"]);
        assert!(a.data.contains(&map.feature("fpu").unwrap().data));
        assert!(!a.data.contains(&map.feature("pclmuldq").unwrap().data));
        assert!(a.matches_signature(make_signature(23, 1, 4)));
        assert!(!a.matches_signature(make_signature(23, 1, 3)));
        let v2 = map.model("A-v2").unwrap();
        assert_eq!((v2.vendor, v2.decode_guest), (Some(0), false));
        assert!(v2.data.contains(&a.data));
        assert!(
            !v2.data.contains(&map.feature("invtsc").unwrap().data),
            "added='yes'"
        );
        assert!(v2.matches_signature(make_signature(23, 1, 0)));
        assert_eq!(map.model_vendor("A-v2"), Some("AMD"));
    }

    #[test]
    fn signatures_round_trip() {
        for (f, m, s) in [(6, 94, 3), (25, 17, 1), (15, 6, 0), (23, 49, 0)] {
            assert_eq!(split_signature(make_signature(f, m, s)), (f, m, s));
        }
        // AMD EPYC 7xx3 (family 25 model 1 stepping 1) is 0x00a00f11.
        assert_eq!(make_signature(25, 1, 1), 0x00a0_0f11);
    }

    #[test]
    fn refuses_what_libvirt_refuses() {
        let bad = [
            "<cpus><feature name='x'/></cpus>",
            "<cpus><vendor name='X' string='short'/></cpus>",
            "<cpus><model name='M'><feature name='fpu'/></model></cpus>",
            "<cpus><model name='M'><decode host='on' guest='on'/><feature name='nope'/></model></cpus>",
            "<cpus><model name='M'><decode host='on' guest='on'/><model name='P'/></model></cpus>",
        ];
        for b in bad {
            assert!(CpuMap::from_documents(&[doc(b)]).is_err(), "{b}");
        }
    }

    #[test]
    fn loads_libvirts_files_and_refuses_paths() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("index.xml"),
            "<cpus><arch name='x86'><include filename='x86_f.xml'/>\
             <group name='g'><include filename='x86_m.xml'/></group></arch>\
             <arch name='arm'><include filename='../etc/passwd'/></arch></cpus>",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("x86_m.xml"),
            "<cpus><model name='M'><decode host='on' guest='on'/><feature name='fpu'/></model></cpus>",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("x86_f.xml"),
            "<cpus><feature name='fpu'><cpuid eax_in='1' edx='1'/></feature></cpus>",
        )
        .unwrap();
        let map = CpuMap::load(dir.path()).unwrap();
        assert_eq!(
            (map.features.len(), map.models.len()),
            (1, 1),
            "a group's includes count"
        );
        std::fs::write(
            dir.path().join("index.xml"),
            "<cpus><arch name='x86'><include filename='../x'/></arch></cpus>",
        )
        .unwrap();
        assert!(CpuMap::load(dir.path()).is_err());
    }
}

//! The validated in-memory catalog, laid out for the Registry queries.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::blob::{BlobReader, BlobRef, BlobWriter, Blobs};
use crate::csv::{self, CsvMetadata, Icon, RelatedImage, StubInputs};
use crate::error::{LoadError, Location, Rule};
use crate::gojson;
use crate::load::{self, Content};

/// A group/version/kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gvk {
    /// API group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
}

/// Bundle content shared by every channel that lists the bundle.
#[derive(Debug)]
pub struct BundleData {
    /// CSV name.
    pub name: String,
    /// Package name.
    pub package: String,
    /// Bundle image (`bundlePath`), may be empty.
    pub image: String,
    /// Version string from the `olm.package` property.
    pub version: String,
    /// `olm.gvk` properties.
    pub provided: Vec<Gvk>,
    /// `olm.gvk.required` properties.
    pub required: Vec<Gvk>,
    /// (type, value) dependencies.
    pub dependencies: Vec<(String, String)>,
    /// (type, value) properties, without `olm.bundle.object` and `olm.csv.metadata`.
    pub properties: Vec<(String, String)>,
    /// CSV JSON (from a CSV object or the metadata stub), may be empty;
    /// shared with the matching `objects` entry.
    pub csv_json: Text,
    /// Manifests as JSON.
    pub objects: Vec<Text>,
    /// Deprecation message.
    pub deprecation: Option<String>,
}

/// A served JSON text: one range of the catalog's compressed [`Blobs`],
/// with shared pieces put in at byte offsets of it (a package's icon or
/// description member, which every stub CSV of the package repeats).
#[derive(Debug, Clone, Default)]
pub struct Text {
    body: BlobRef,
    inserts: Box<[(u32, Arc<str>)]>,
}

impl Text {
    fn blob(body: BlobRef) -> Self {
        Text {
            body,
            inserts: Box::default(),
        }
    }

    /// The whole text.
    pub fn render(&self, blobs: &mut BlobReader<'_>) -> String {
        let mut body = String::new();
        blobs.append(self.body, &mut body);
        if self.inserts.is_empty() {
            return body;
        }
        let mut s = String::with_capacity(self.len());
        let mut at = 0;
        for (offset, piece) in &self.inserts {
            let offset = *offset as usize;
            s.push_str(body.get(at..offset).unwrap_or_default());
            s.push_str(piece);
            at = offset;
        }
        s.push_str(body.get(at..).unwrap_or_default());
        s
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.body.len() + self.inserts.iter().map(|(_, p)| p.len()).sum::<usize>()
    }

    /// True when there is no text.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One bundle's place in one channel.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Bundle name.
    pub name: String,
    /// Replaced bundle ("" for none).
    pub replaces: String,
    /// Skipped bundles.
    pub skips: Vec<String>,
    /// Skip range ("" for none).
    pub skip_range: String,
}

/// A channel with its computed head.
#[derive(Debug, Clone)]
pub struct Channel {
    /// Name.
    pub name: String,
    /// The head bundle.
    pub head: String,
    /// Deprecation message.
    pub deprecation: Option<String>,
    /// Entries by bundle name.
    pub entries: BTreeMap<String, Entry>,
}

/// A package.
#[derive(Debug)]
pub struct Package {
    /// Name.
    pub name: String,
    /// Default channel.
    pub default_channel: String,
    /// Deprecation message.
    pub deprecation: Option<String>,
    /// Channels by name.
    pub channels: BTreeMap<String, Channel>,
    /// Bundles by name.
    pub bundles: BTreeMap<String, Arc<BundleData>>,
}

/// A loaded, validated catalog.
#[derive(Debug, Default)]
pub struct Catalog {
    /// Packages by name.
    pub packages: BTreeMap<String, Package>,
    /// The compressed CSV and manifest texts the bundles' [`Text`]s point into.
    pub blobs: Blobs,
}

impl Catalog {
    /// Loads and validates the catalog directory.
    pub fn load_dir(root: &Path) -> Result<Catalog, LoadError> {
        if !root.is_dir() {
            return Err(LoadError::new(
                &Location {
                    file: root.to_path_buf(),
                    doc: 0,
                },
                Rule::Read,
                "not a directory",
            ));
        }
        build(root)
    }

    /// Every channel entry whose bundle provides `gvk`, in package, channel,
    /// bundle name order. A scan (as opm's own query does) rather than an
    /// index: an index by GVK would cost more memory than the bundles' GVK
    /// lists themselves, for a query that is rare and cheap.
    pub fn providers<'a>(
        &'a self,
        gvk: &'a Gvk,
    ) -> impl Iterator<Item = (&'a Package, &'a Channel, &'a Entry)> + 'a {
        self.packages.values().flat_map(move |p| {
            p.channels.values().flat_map(move |c| {
                c.entries.values().filter_map(move |e| {
                    p.bundles
                        .get(&e.name)
                        .is_some_and(|b| b.provided.contains(gvk))
                        .then_some((p, c, e))
                })
            })
        })
    }

    /// Number of distinct bundles over all packages.
    pub fn bundle_count(&self) -> usize {
        self.packages.values().map(|p| p.bundles.len()).sum()
    }
}

#[derive(Deserialize)]
struct PackageDoc {
    #[serde(default)]
    name: String,
    #[serde(default, rename = "defaultChannel")]
    default_channel: String,
    #[serde(default)]
    icon: Option<IconDoc>,
    #[serde(default)]
    description: String,
}

#[derive(Deserialize)]
struct IconDoc {
    #[serde(default)]
    base64data: String,
    #[serde(default)]
    mediatype: String,
}

#[derive(Deserialize)]
struct ChannelDoc {
    #[serde(default)]
    package: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    entries: Vec<EntryDoc>,
}

#[derive(Deserialize)]
struct EntryDoc {
    #[serde(default)]
    name: String,
    #[serde(default)]
    replaces: String,
    #[serde(default)]
    skips: Vec<String>,
    #[serde(default, rename = "skipRange")]
    skip_range: String,
}

#[derive(Deserialize)]
struct BundleDoc {
    #[serde(default)]
    package: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    image: String,
    #[serde(default)]
    properties: Vec<PropertyDoc>,
    #[serde(default, rename = "relatedImages")]
    related_images: Vec<RelatedImageDoc>,
}

/// `olm.bundle` read straight from a JSON document's text: property values
/// stay slices of the text until the property is interpreted.
#[derive(Deserialize)]
struct RawBundleDoc<'a> {
    #[serde(default)]
    package: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    image: String,
    #[serde(default, borrow)]
    properties: Vec<RawPropertyDoc<'a>>,
    #[serde(default, rename = "relatedImages")]
    related_images: Vec<RelatedImageDoc>,
}

#[derive(Deserialize)]
struct RawPropertyDoc<'a> {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default, borrow)]
    value: Option<&'a RawValue>,
}

/// Just the schema of a raw JSON document.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(default, borrow)]
    schema: Option<&'a RawValue>,
}

/// A property value: decoded (YAML, or the generic path) or raw JSON text.
enum PropValue<'a> {
    Value(Value),
    Raw(&'a str),
}

impl PropValue<'_> {
    fn value(&self) -> Result<std::borrow::Cow<'_, Value>, String> {
        match self {
            PropValue::Value(v) => Ok(std::borrow::Cow::Borrowed(v)),
            PropValue::Raw(t) => serde_json::from_str(t)
                .map(std::borrow::Cow::Owned)
                .map_err(|e| e.to_string()),
        }
    }

    /// Decodes into `T` as the generic path does (from the decoded value),
    /// reading raw text directly when that succeeds.
    fn typed<T: for<'de> Deserialize<'de>>(&self) -> Result<T, String> {
        if let PropValue::Raw(t) = self
            && let Ok(v) = serde_json::from_str::<T>(t)
        {
            return Ok(v);
        }
        let v = self.value()?;
        T::deserialize(v.as_ref()).map_err(|e| e.to_string())
    }
}

/// A bundle document ready to interpret.
struct BundleIn<'a> {
    package: String,
    name: String,
    image: String,
    properties: Vec<(String, PropValue<'a>)>,
    related_images: Vec<RelatedImageDoc>,
}

impl From<BundleDoc> for BundleIn<'_> {
    fn from(b: BundleDoc) -> Self {
        BundleIn {
            package: b.package,
            name: b.name,
            image: b.image,
            properties: b
                .properties
                .into_iter()
                .map(|p| (p.kind, PropValue::Value(p.value)))
                .collect(),
            related_images: b.related_images,
        }
    }
}

impl<'a> From<RawBundleDoc<'a>> for BundleIn<'a> {
    fn from(b: RawBundleDoc<'a>) -> Self {
        BundleIn {
            package: b.package,
            name: b.name,
            image: b.image,
            properties: b
                .properties
                .into_iter()
                .map(|p| {
                    let v = match p.value {
                        Some(r) => PropValue::Raw(r.get()),
                        None => PropValue::Value(Value::Null),
                    };
                    (p.kind, v)
                })
                .collect(),
            related_images: b.related_images,
        }
    }
}

/// A bundle as far as it can be built before its package is known: its stub
/// CSV (if any) has places for the package's icon and description.
struct PreBundle {
    data: BundleData,
    /// The stub without the package's members, and where they go.
    stub: Option<(BlobRef, Vec<(u32, StubPart)>)>,
    /// The stub CSV is also the bundle's only object.
    stub_is_object: bool,
}

#[derive(Clone, Copy)]
enum StubPart {
    Icon,
    Description,
}

/// A bundle read from a document: its identity, and the built bundle or the
/// error that building it gave (reported where the checks of its package
/// reach it, so refusal order does not depend on file order).
struct BundleRead {
    package: String,
    name: String,
    built: Result<PreBundle, LoadError>,
}

#[derive(Deserialize)]
struct PropertyDoc {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    value: Value,
}

#[derive(Deserialize)]
struct RelatedImageDoc {
    #[serde(default)]
    name: String,
    #[serde(default)]
    image: String,
}

#[derive(Deserialize)]
struct DeprecationsDoc {
    #[serde(default)]
    package: String,
    #[serde(default)]
    entries: Vec<DeprecationEntryDoc>,
}

#[derive(Deserialize)]
struct DeprecationEntryDoc {
    reference: ReferenceDoc,
    #[serde(default)]
    message: String,
}

#[derive(Deserialize, PartialEq, Eq, PartialOrd, Ord, Clone)]
struct ReferenceDoc {
    #[serde(default)]
    schema: String,
    #[serde(default)]
    name: String,
}

#[derive(Deserialize)]
struct PackageProp {
    #[serde(default, rename = "packageName")]
    package_name: String,
    #[serde(default)]
    version: String,
}

#[derive(Deserialize)]
struct GvkProp {
    #[serde(default)]
    group: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    kind: String,
}

#[derive(Deserialize)]
struct BundleObjectProp {
    #[serde(default)]
    data: String,
}

fn typed<T: for<'de> Deserialize<'de>>(
    doc: &Loc,
    value: Value,
    what: &str,
) -> Result<T, LoadError> {
    T::deserialize(value).map_err(|e| {
        LoadError::new(
            &doc.location,
            Rule::Shape,
            format!("not a valid {what} document: {e}"),
        )
    })
}

/// Where a document was found (kept after its content is consumed).
struct Loc {
    location: Location,
}

struct PkgBuild {
    loc: Location,
    doc: PackageDoc,
    /// The stub CSV `icon` member.
    icon: Option<Arc<str>>,
    /// The stub CSV `description` member (for metadata without one).
    description: Option<Arc<str>>,
    channels: BTreeMap<String, (Location, ChannelDoc)>,
    bundles: BTreeMap<String, (Location, Result<PreBundle, LoadError>)>,
    deprecations: Option<(Location, DeprecationsDoc)>,
}

fn build(root: &Path) -> Result<Catalog, LoadError> {
    let mut pkgs: BTreeMap<String, PkgBuild> = BTreeMap::new();
    let mut channels = Vec::new();
    let mut bundles = Vec::new();
    let mut deprecations = Vec::new();
    let mut blobs = BlobWriter::default();
    let mut scratch = Scratch::default();
    // Documents are consumed one by one as their file is read: a bundle is
    // built (its texts compressed) straight from its document's text, so
    // neither decoded documents nor their uncompressed texts pile up.
    load::for_each_doc(root, |location, content| {
        let doc = Loc { location };
        let value = match content {
            Content::Json(text) => {
                if let Some(b) = raw_bundle(text) {
                    let read = read_bundle(&doc.location, b.into(), &mut blobs, &mut scratch);
                    bundles.push((doc, read));
                    return Ok(());
                }
                serde_json::from_str::<Value>(text).map_err(|e| {
                    LoadError::new(&doc.location, Rule::Syntax, format!("invalid JSON: {e}"))
                })?
            }
            Content::Value(v) => v,
        };
        let schema = match value.get("schema") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            _ => {
                return Err(LoadError::new(
                    &doc.location,
                    Rule::MissingSchema,
                    "document has no \"schema\" string",
                ));
            }
        };
        match schema.as_str() {
            "olm.package" => {
                let mut p: PackageDoc = typed(&doc, value, "olm.package")?;
                if p.name.is_empty() {
                    return Err(LoadError::new(
                        &doc.location,
                        Rule::RequiredField,
                        "olm.package has no name",
                    ));
                }
                if let Some(prev) = pkgs.get(&p.name) {
                    return Err(LoadError::new(
                        &doc.location,
                        Rule::DuplicatePackage,
                        format!("package {:?} is already defined at {}", p.name, prev.loc),
                    ));
                }
                // The stub CSV members are made now and the document's copies
                // dropped (icons are large).
                let icon = match p.icon.take() {
                    None => None,
                    Some(i) => {
                        let data = decode_b64(&i.base64data).map_err(|e| {
                            LoadError::new(
                                &doc.location,
                                Rule::Icon,
                                format!("package {:?} icon: bad base64: {e}", p.name),
                            )
                        })?;
                        Some(icon_member(&Icon {
                            base64data: base64::engine::general_purpose::STANDARD.encode(data),
                            mediatype: i.mediatype,
                        }))
                    }
                };
                let description = description_member(&std::mem::take(&mut p.description));
                pkgs.insert(
                    p.name.clone(),
                    PkgBuild {
                        loc: doc.location.clone(),
                        doc: p,
                        icon,
                        description,
                        channels: BTreeMap::new(),
                        bundles: BTreeMap::new(),
                        deprecations: None,
                    },
                );
            }
            "olm.channel" => {
                let c: ChannelDoc = typed(&doc, value, "olm.channel")?;
                channels.push((doc, c));
            }
            "olm.bundle" => {
                let b: BundleDoc = typed(&doc, value, "olm.bundle")?;
                let read = read_bundle(&doc.location, b.into(), &mut blobs, &mut scratch);
                bundles.push((doc, read));
            }
            "olm.deprecations" => {
                let d: DeprecationsDoc = typed(&doc, value, "olm.deprecations")?;
                deprecations.push((doc, d));
            }
            // Other schemas are kept by opm for the experimental API only.
            _ => {}
        }
        Ok(())
    })?;
    // The working buffers go before the catalog is assembled, so what it
    // allocates next can reuse their space.
    drop(scratch);
    let blobs = blobs.finish();
    for (doc, c) in channels {
        if c.name.is_empty() {
            return Err(LoadError::new(
                &doc.location,
                Rule::RequiredField,
                "olm.channel has no name",
            ));
        }
        let Some(p) = pkgs.get_mut(&c.package) else {
            return Err(LoadError::new(
                &doc.location,
                Rule::UnknownPackage,
                format!(
                    "channel {:?} names package {:?}, which has no olm.package document",
                    c.name, c.package
                ),
            ));
        };
        if let Some((prev, _)) = p.channels.get(&c.name) {
            return Err(LoadError::new(
                &doc.location,
                Rule::DuplicateChannel,
                format!(
                    "package {:?} channel {:?} is already defined at {prev}",
                    c.package, c.name
                ),
            ));
        }
        p.channels.insert(c.name.clone(), (doc.location.clone(), c));
    }
    for (doc, b) in bundles {
        let BundleRead {
            package,
            name,
            built,
        } = b;
        if name.is_empty() {
            return Err(LoadError::new(
                &doc.location,
                Rule::RequiredField,
                "olm.bundle has no name",
            ));
        }
        let Some(p) = pkgs.get_mut(&package) else {
            return Err(LoadError::new(
                &doc.location,
                Rule::UnknownPackage,
                format!(
                    "bundle {:?} names package {:?}, which has no olm.package document",
                    name, package
                ),
            ));
        };
        if let Some((prev, _)) = p.bundles.get(&name) {
            return Err(LoadError::new(
                &doc.location,
                Rule::DuplicateBundle,
                format!(
                    "package {:?} bundle {:?} is already defined at {prev}",
                    package, name
                ),
            ));
        }
        p.bundles.insert(name, (doc.location.clone(), built));
    }
    for (doc, d) in deprecations {
        let Some(p) = pkgs.get_mut(&d.package) else {
            return Err(LoadError::new(
                &doc.location,
                Rule::UnknownPackage,
                format!(
                    "deprecations name package {:?}, which has no olm.package document",
                    d.package
                ),
            ));
        };
        if let Some((prev, _)) = &p.deprecations {
            return Err(LoadError::new(
                &doc.location,
                Rule::Deprecation,
                format!(
                    "package {:?} already has an olm.deprecations document at {prev}",
                    d.package
                ),
            ));
        }
        p.deprecations = Some((doc.location.clone(), d));
    }
    if pkgs.is_empty() {
        return Err(LoadError::new(
            &Location {
                file: ".".into(),
                doc: 0,
            },
            Rule::Empty,
            "the catalog has no olm.package documents",
        ));
    }
    let mut catalog = Catalog {
        blobs,
        ..Catalog::default()
    };
    for (name, p) in pkgs {
        let pkg = build_package(p)?;
        catalog.packages.insert(name, pkg);
    }
    Ok(catalog)
}

fn build_package(p: PkgBuild) -> Result<Package, LoadError> {
    let pname = p.doc.name.clone();
    if p.channels.is_empty() {
        return Err(LoadError::new(
            &p.loc,
            Rule::DefaultChannel,
            format!("package {pname:?} has no olm.channel documents"),
        ));
    }
    if !p.channels.contains_key(&p.doc.default_channel) {
        return Err(LoadError::new(
            &p.loc,
            Rule::DefaultChannel,
            format!(
                "package {pname:?} default channel {:?} is not one of its channels",
                p.doc.default_channel
            ),
        ));
    }
    // Channels and their graphs.
    // (The documents are consumed: their strings move into the entries.)
    let mut channels = BTreeMap::new();
    for (cname, (loc, c)) in p.channels {
        let loc = &loc;
        if c.entries.is_empty() {
            return Err(LoadError::new(
                loc,
                Rule::EmptyChannel,
                format!("package {pname:?} channel {cname:?} has no entries"),
            ));
        }
        let mut entries = BTreeMap::new();
        for e in c.entries {
            if e.name.is_empty() {
                return Err(LoadError::new(
                    loc,
                    Rule::RequiredField,
                    format!("package {pname:?} channel {cname:?} has an entry with no name"),
                ));
            }
            if !p.bundles.contains_key(&e.name) {
                return Err(LoadError::new(
                    loc,
                    Rule::MissingBundle,
                    format!(
                        "package {pname:?} channel {cname:?} entry {:?} names a bundle that does not exist",
                        e.name
                    ),
                ));
            }
            if !e.skip_range.is_empty() {
                check_range(&e.skip_range).map_err(|m| {
                    LoadError::new(
                        loc,
                        Rule::SkipRange,
                        format!(
                            "package {pname:?} channel {cname:?} entry {:?} skipRange {:?}: {m}",
                            e.name, e.skip_range
                        ),
                    )
                })?;
            }
            if entries.contains_key(&e.name) {
                return Err(LoadError::new(
                    loc,
                    Rule::DuplicateEntry,
                    format!(
                        "package {pname:?} channel {cname:?} lists bundle {:?} twice",
                        e.name
                    ),
                ));
            }
            entries.insert(
                e.name.clone(),
                Entry {
                    name: e.name,
                    replaces: e.replaces,
                    skips: e.skips,
                    skip_range: e.skip_range,
                },
            );
        }
        let head = channel_head(&entries).map_err(|m| {
            LoadError::new(
                loc,
                Rule::ChannelGraph,
                format!("package {pname:?} channel {cname:?}: {m}"),
            )
        })?;
        channels.insert(
            cname.clone(),
            Channel {
                name: cname,
                head,
                deprecation: None,
                entries,
            },
        );
    }
    let in_channel: BTreeSet<&str> = channels
        .values()
        .flat_map(|c: &Channel| c.entries.keys().map(String::as_str))
        .collect();
    // Bundles. The stub CSVs' icon and description members are held once
    // per package and shared.
    let icon = p.icon;
    let description = p.description;
    let mut bundles = BTreeMap::new();
    for (bname, (loc, b)) in p.bundles {
        if !in_channel.contains(bname.as_str()) {
            return Err(LoadError::new(
                &loc,
                Rule::BundleNotInChannel,
                format!("package {pname:?} bundle {bname:?} is not an entry of any channel"),
            ));
        }
        let data = finish_bundle(b?, icon.as_ref(), description.as_ref());
        bundles.insert(bname, data);
    }
    let mut pkg = Package {
        name: pname.clone(),
        default_channel: p.doc.default_channel.clone(),
        deprecation: None,
        channels,
        bundles: BTreeMap::new(),
    };
    // Deprecations.
    if let Some((loc, d)) = &p.deprecations {
        let mut seen = BTreeSet::new();
        for e in &d.entries {
            if !seen.insert(e.reference.clone()) {
                return Err(LoadError::new(
                    loc,
                    Rule::Deprecation,
                    format!(
                        "package {pname:?}: duplicate deprecation of {} {:?}",
                        e.reference.schema, e.reference.name
                    ),
                ));
            }
            match e.reference.schema.as_str() {
                "olm.package" => {
                    if !e.reference.name.is_empty() {
                        return Err(LoadError::new(
                            loc,
                            Rule::Deprecation,
                            format!(
                                "package {pname:?}: an olm.package reference must have no name (got {:?})",
                                e.reference.name
                            ),
                        ));
                    }
                    pkg.deprecation = Some(e.message.clone());
                }
                "olm.channel" => match pkg.channels.get_mut(&e.reference.name) {
                    Some(c) => c.deprecation = Some(e.message.clone()),
                    None => {
                        return Err(LoadError::new(
                            loc,
                            Rule::Deprecation,
                            format!(
                                "package {pname:?}: cannot deprecate channel {:?}: no such channel",
                                e.reference.name
                            ),
                        ));
                    }
                },
                "olm.bundle" => match bundles.get_mut(&e.reference.name) {
                    Some(b) => b.deprecation = Some(e.message.clone()),
                    None => {
                        return Err(LoadError::new(
                            loc,
                            Rule::Deprecation,
                            format!(
                                "package {pname:?}: cannot deprecate bundle {:?}: no such bundle",
                                e.reference.name
                            ),
                        ));
                    }
                },
                other => {
                    return Err(LoadError::new(
                        loc,
                        Rule::Deprecation,
                        format!(
                            "package {pname:?}: cannot deprecate an object of schema {other:?}"
                        ),
                    ));
                }
            }
        }
    }
    pkg.bundles = bundles.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
    Ok(pkg)
}

/// The single bundle of a channel that no other entry replaces or skips.
fn channel_head(entries: &BTreeMap<String, Entry>) -> Result<String, String> {
    let mut incoming: BTreeSet<&str> = BTreeSet::new();
    for e in entries.values() {
        if entries.contains_key(&e.replaces) {
            incoming.insert(&e.replaces);
        }
        for s in &e.skips {
            if entries.contains_key(s) {
                incoming.insert(s);
            }
        }
    }
    let heads: Vec<&String> = entries
        .keys()
        .filter(|k| !incoming.contains(k.as_str()))
        .collect();
    let head = match heads.as_slice() {
        [] => return Err("no channel head: every entry is replaced or skipped by another".into()),
        [h] => (*h).clone(),
        many => {
            return Err(format!(
                "multiple channel heads {:?}: exactly one entry may be left un-replaced",
                many
            ));
        }
    };
    // Walk the replaces chain from the head, stopping at a bundle some entry
    // skips. Every entry must be on that walk or skipped by some entry of the
    // channel (opm refuses "stranded" bundles).
    let skipped: BTreeSet<&str> = entries
        .values()
        .flat_map(|e| e.skips.iter().map(String::as_str))
        .collect();
    let mut seen: BTreeSet<&str> = BTreeSet::new();
    let mut cur = Some(head.as_str());
    while let Some(name) = cur {
        if skipped.contains(name) {
            break;
        }
        if !seen.insert(name) {
            return Err(format!("cycle in the replaces chain at {name:?}"));
        }
        cur = entries
            .get(name)
            .map(|e| e.replaces.as_str())
            .filter(|r| entries.contains_key(*r));
    }
    let stranded: Vec<&String> = entries
        .keys()
        .filter(|k| !seen.contains(k.as_str()) && !skipped.contains(k.as_str()))
        .collect();
    if !stranded.is_empty() {
        return Err(format!(
            "stranded bundles (neither on the replaces chain from head {head:?} nor skipped): {stranded:?}"
        ));
    }
    Ok(head)
}

fn decode_b64(s: &str) -> Result<Vec<u8>, base64::DecodeError> {
    let cleaned: String = s.chars().filter(|c| *c != '\n' && *c != '\r').collect();
    base64::engine::general_purpose::STANDARD.decode(cleaned)
}

/// The bundle in a raw JSON document, if the document is an `olm.bundle`
/// that decodes directly; anything else goes the generic way (which also
/// words any error).
fn raw_bundle(text: &str) -> Option<RawBundleDoc<'_>> {
    let head: Head<'_> = serde_json::from_str(text).ok()?;
    if head.schema?.get() != "\"olm.bundle\"" {
        return None;
    }
    serde_json::from_str(text).ok()
}

fn read_bundle(
    loc: &Location,
    b: BundleIn<'_>,
    blobs: &mut BlobWriter,
    scratch: &mut Scratch,
) -> BundleRead {
    let built = build_bundle(loc, &b, blobs, scratch);
    BundleRead {
        package: b.package,
        name: b.name,
        built,
    }
}

/// The stub CSV member for a package icon: `,"icon":[{...}]`.
fn icon_member(icon: &Icon) -> Arc<str> {
    let member = serde_json::to_string(icon).unwrap_or_default();
    Arc::from(gojson::escape_html_text(&format!(",\"icon\":[{member}]")))
}

/// The stub CSV member for a package description, if it has one.
fn description_member(description: &str) -> Option<Arc<str>> {
    (!description.is_empty()).then(|| {
        let text = serde_json::to_string(description).unwrap_or_default();
        Arc::from(gojson::escape_html_text(&format!(
            ",\"description\":{text}"
        )))
    })
}

/// Puts the package's shared members into a bundle's stub CSV.
fn finish_bundle(
    pre: PreBundle,
    icon: Option<&Arc<str>>,
    description: Option<&Arc<str>>,
) -> BundleData {
    let mut data = pre.data;
    if let Some((body, slots)) = pre.stub {
        let text = Text {
            body,
            inserts: slots
                .into_iter()
                .filter_map(|(at, slot)| {
                    let piece = match slot {
                        StubPart::Icon => icon,
                        StubPart::Description => description,
                    };
                    piece.map(|p| (at, Arc::clone(p)))
                })
                .collect(),
        };
        if pre.stub_is_object {
            data.objects = vec![text.clone()];
        }
        data.csv_json = text;
    }
    data
}

/// Marker the stub CSV is first written with where the package's icon and
/// description go (as it appears in the JSON text).
const MARK: &str = "\u{1}hcp-olm\u{1}";
const MARK_TEXT: &str = "\\u0001hcp-olm\\u0001";

/// Working buffers reused from bundle to bundle (no large chunk is freed and
/// allocated again per bundle, which would leave holes in the heap).
#[derive(Default)]
struct Scratch {
    json: Vec<u8>,
    text: String,
    body: String,
}

fn build_bundle(
    loc: &Location,
    b: &BundleIn<'_>,
    blobs: &mut BlobWriter,
    scratch: &mut Scratch,
) -> Result<PreBundle, LoadError> {
    let pname = &b.package;
    let bname = &b.name;
    let perr = |i: usize, t: &str, m: String| {
        LoadError::new(
            loc,
            Rule::Property,
            format!("package {pname:?} bundle {bname:?} property {i} ({t}): {m}"),
        )
    };
    let mut versions = Vec::new();
    let mut provided = Vec::new();
    let mut required = Vec::new();
    let mut dependencies = Vec::new();
    let mut properties = Vec::new();
    let mut objects = Vec::new();
    let mut object_texts: Vec<(BlobRef, bool)> = Vec::new();
    let mut metas = Vec::new();
    for (i, (kind, value)) in b.properties.iter().enumerate() {
        match kind.as_str() {
            "olm.package" => {
                let v: PackageProp = value.typed().map_err(|e| perr(i, kind, e))?;
                versions.push(v);
            }
            "olm.gvk" | "olm.gvk.required" => {
                let g: GvkProp = value.typed().map_err(|e| perr(i, kind, e))?;
                let gvk = Gvk {
                    group: g.group,
                    version: g.version,
                    kind: g.kind,
                };
                if kind == "olm.gvk" {
                    provided.push(gvk);
                } else {
                    let dep = format!(
                        "{{\"group\":{},\"kind\":{},\"version\":{}}}",
                        gojson::encode(&Value::String(gvk.group.clone()), false),
                        gojson::encode(&Value::String(gvk.kind.clone()), false),
                        gojson::encode(&Value::String(gvk.version.clone()), false)
                    );
                    required.push(gvk);
                    dependencies.push(("olm.gvk".to_string(), dep));
                }
            }
            "olm.package.required" => {
                #[derive(Deserialize)]
                struct Req {
                    #[serde(default, rename = "packageName")]
                    package_name: String,
                    #[serde(default, rename = "versionRange")]
                    version_range: String,
                }
                let r: Req = value.typed().map_err(|e| perr(i, kind, e))?;
                // Served in the legacy dependency shape {packageName, version}.
                let dep = format!(
                    "{{\"packageName\":{},\"version\":{}}}",
                    gojson::encode(&Value::String(r.package_name), false),
                    gojson::encode(&Value::String(r.version_range), false)
                );
                dependencies.push(("olm.package".to_string(), dep));
                let text =
                    gojson::encode(value.value().map_err(|e| perr(i, kind, e))?.as_ref(), false);
                properties.push((kind.clone(), text));
                continue;
            }
            "olm.bundle.object" => {
                let o: BundleObjectProp = value.typed().map_err(|e| perr(i, kind, e))?;
                let raw = decode_b64(&o.data).map_err(|e| {
                    LoadError::new(
                        loc,
                        Rule::BundleObject,
                        format!("package {pname:?} bundle {bname:?} property {i} (olm.bundle.object): data is not valid base64: {e}"),
                    )
                })?;
                let json = manifest_to_json(&raw).map_err(|e| {
                    LoadError::new(
                        loc,
                        Rule::BundleObject,
                        format!("package {pname:?} bundle {bname:?} property {i} (olm.bundle.object): data is not a JSON or YAML manifest: {e}"),
                    )
                })?;
                object_texts.push((blobs.push(&json), is_csv(&json)));
                continue;
            }
            "olm.csv.metadata" => {
                let m: CsvMetadata = value.typed().map_err(|e| perr(i, kind, e))?;
                metas.push(m);
                continue;
            }
            _ => {}
        }
        let text = gojson::encode(value.value().map_err(|e| perr(i, kind, e))?.as_ref(), false);
        properties.push((kind.clone(), text));
    }
    for (r, _) in &object_texts {
        objects.push(Text::blob(*r));
    }
    let pkg_prop = match versions.as_slice() {
        [one] => one,
        [] => {
            return Err(LoadError::new(
                loc,
                Rule::PackageProperty,
                format!("package {pname:?} bundle {bname:?} has no olm.package property"),
            ));
        }
        _ => {
            return Err(LoadError::new(
                loc,
                Rule::PackageProperty,
                format!(
                    "package {pname:?} bundle {bname:?} has {} olm.package properties; exactly one is required",
                    versions.len()
                ),
            ));
        }
    };
    if pkg_prop.package_name != *pname {
        return Err(LoadError::new(
            loc,
            Rule::PackageProperty,
            format!(
                "package {pname:?} bundle {bname:?} has an olm.package property naming package {:?}",
                pkg_prop.package_name
            ),
        ));
    }
    let semver = semver::Version::parse(&pkg_prop.version).map_err(|e| {
        LoadError::new(
            loc,
            Rule::Version,
            format!(
                "package {pname:?} bundle {bname:?} version {:?} is not semver: {e}",
                pkg_prop.version
            ),
        )
    })?;
    if b.image.is_empty() && objects.is_empty() {
        return Err(LoadError::new(
            loc,
            Rule::BundleImage,
            format!(
                "package {pname:?} bundle {bname:?} has no image and no olm.bundle.object property"
            ),
        ));
    }
    let csv_json = object_texts
        .iter()
        .zip(&objects)
        .find(|((_, csv), _)| *csv)
        .map(|(_, t)| t.clone())
        .unwrap_or_default();
    let mut stub = None;
    let mut stub_is_object = false;
    if csv_json.is_empty()
        && let [meta] = metas.as_slice()
    {
        let related: Vec<RelatedImage> = b
            .related_images
            .iter()
            .map(|r| RelatedImage {
                name: r.name.clone(),
                image: r.image.clone(),
            })
            .collect();
        // Written with markers where the package's description (when the
        // metadata has none) and icon go; they are put in when the package
        // is known.
        let Scratch { json, text, body } = scratch;
        csv::write_stub_csv_json(
            meta,
            StubInputs {
                name: bname,
                version: &semver.to_string(),
                icon: Some(Icon {
                    base64data: MARK.to_string(),
                    mediatype: MARK.to_string(),
                }),
                related_images: &related,
                package_description: MARK,
            },
            json,
            text,
        );
        let desc_member = format!(",\"description\":\"{MARK_TEXT}\"");
        let icon_member =
            format!(",\"icon\":[{{\"base64data\":\"{MARK_TEXT}\",\"mediatype\":\"{MARK_TEXT}\"}}]");
        body.clear();
        let mut slots = Vec::with_capacity(2);
        let mut rest = text.as_str();
        for (member, slot) in [
            (desc_member.as_str(), StubPart::Description),
            (icon_member.as_str(), StubPart::Icon),
        ] {
            if let Some((head, tail)) = rest.split_once(member) {
                body.push_str(head);
                slots.push((u32::try_from(body.len()).unwrap_or(u32::MAX), slot));
                rest = tail;
            }
        }
        body.push_str(rest);
        stub = Some((blobs.push(body.as_str()), slots));
        stub_is_object = objects.is_empty();
    }
    Ok(PreBundle {
        data: BundleData {
            name: bname.clone(),
            package: pname.clone(),
            image: b.image.clone(),
            version: pkg_prop.version.clone(),
            provided,
            required,
            dependencies,
            properties,
            csv_json,
            objects,
            deprecation: None,
        },
        stub,
        stub_is_object,
    })
}

fn is_csv(json: &str) -> bool {
    #[derive(Deserialize)]
    struct Kind {
        #[serde(default)]
        kind: String,
    }
    serde_json::from_str::<Kind>(json).is_ok_and(|k| k.kind == "ClusterServiceVersion")
}

/// Converts a manifest (JSON or YAML) to JSON text as sigs.k8s.io/yaml does.
fn manifest_to_json(raw: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(raw).map_err(|e| e.to_string())?;
    let v: Value = serde_yaml_ng::from_str(text).map_err(|e| e.to_string())?;
    if !v.is_object() {
        return Err("manifest is not an object".into());
    }
    Ok(gojson::encode(&v, true))
}

/// Checks a skipRange the way blang/semver `ParseRange` accepts it.
fn check_range(s: &str) -> Result<(), String> {
    for alt in s.split("||") {
        let mut tokens: Vec<String> = Vec::new();
        let mut pending = String::new();
        for t in alt.split_whitespace() {
            if t.chars().all(|c| "<>=!".contains(c)) {
                pending.push_str(t);
                continue;
            }
            tokens.push(format!("{pending}{t}"));
            pending.clear();
        }
        if !pending.is_empty() || tokens.is_empty() {
            return Err("empty or dangling comparison".into());
        }
        for t in tokens {
            let v = t.trim_start_matches(['<', '>', '=', '!']);
            let op = &t[..t.len() - v.len()];
            if !matches!(op, "" | "<" | "<=" | ">" | ">=" | "=" | "==" | "!" | "!=") {
                return Err(format!("unknown operator {op:?}"));
            }
            let wild = v.split('.').any(|p| matches!(p, "x" | "X" | "*"));
            if wild {
                let parts: Vec<&str> = v.split('.').collect();
                if parts.len() > 3
                    || parts
                        .iter()
                        .any(|p| !matches!(*p, "x" | "X" | "*") && p.parse::<u64>().is_err())
                {
                    return Err(format!("bad version {v:?}"));
                }
            } else {
                semver::Version::parse(v).map_err(|e| format!("bad version {v:?}: {e}"))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert!(check_range(">=4.2.0 <4.17.1-rhodf").is_ok());
        assert!(check_range(">= 1.0.0 < 2.0.0 || 3.x").is_ok());
        assert!(check_range("<3.14.1").is_ok());
        assert!(check_range(">=1.0").is_err());
        assert!(check_range("~>1.0.0").is_err());
        assert!(check_range("").is_err());
    }
}

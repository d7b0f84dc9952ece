//! Load errors: every refusal names the file, the document and the rule.

use std::fmt;
use std::path::PathBuf;

/// Where in the catalog a problem was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file, relative to the catalog root.
    pub file: PathBuf,
    /// 1-based index of the document within the file (0 when the whole file is meant).
    pub doc: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.doc == 0 {
            write!(f, "{}", self.file.display())
        } else {
            write!(f, "{}: document {}", self.file.display(), self.doc)
        }
    }
}

/// The validation rules a catalog must pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The catalog directory or a file could not be read.
    Read,
    /// A document is not valid JSON or YAML.
    Syntax,
    /// A document has no `schema`.
    MissingSchema,
    /// A document does not have the shape its schema requires.
    Shape,
    /// A required field is empty.
    RequiredField,
    /// Two `olm.package` documents share a name.
    DuplicatePackage,
    /// A channel, bundle or deprecation names a package that has no `olm.package`.
    UnknownPackage,
    /// Two channels of one package share a name.
    DuplicateChannel,
    /// Two bundles of one package share a name.
    DuplicateBundle,
    /// A channel lists a bundle twice.
    DuplicateEntry,
    /// A channel entry names a bundle that does not exist.
    MissingBundle,
    /// A channel has no entries.
    EmptyChannel,
    /// A channel has zero or several heads, or its replaces chain loops.
    ChannelGraph,
    /// A package has no channels, or its default channel does not exist.
    DefaultChannel,
    /// A bundle has zero or several `olm.package` properties, or one naming another package.
    PackageProperty,
    /// A bundle is in no channel.
    BundleNotInChannel,
    /// A property value does not have the shape its type requires.
    Property,
    /// A bundle version is not semver.
    Version,
    /// A `skipRange` cannot be parsed.
    SkipRange,
    /// An `olm.bundle.object` is not base64 of a JSON or YAML manifest.
    BundleObject,
    /// A bundle has no image and no `olm.bundle.object`.
    BundleImage,
    /// A package icon is not valid base64.
    Icon,
    /// An `olm.deprecations` document is inconsistent.
    Deprecation,
    /// The catalog has no packages.
    Empty,
}

impl Rule {
    /// Short stable name of the rule, used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Rule::Read => "read",
            Rule::Syntax => "syntax",
            Rule::MissingSchema => "missing-schema",
            Rule::Shape => "shape",
            Rule::RequiredField => "required-field",
            Rule::DuplicatePackage => "duplicate-package",
            Rule::UnknownPackage => "unknown-package",
            Rule::DuplicateChannel => "duplicate-channel",
            Rule::DuplicateBundle => "duplicate-bundle",
            Rule::DuplicateEntry => "duplicate-channel-entry",
            Rule::MissingBundle => "channel-entry-missing-bundle",
            Rule::EmptyChannel => "empty-channel",
            Rule::ChannelGraph => "channel-graph",
            Rule::DefaultChannel => "default-channel",
            Rule::PackageProperty => "bundle-package-property",
            Rule::BundleNotInChannel => "bundle-not-in-channel",
            Rule::Property => "property",
            Rule::Version => "bundle-version",
            Rule::SkipRange => "skip-range",
            Rule::BundleObject => "bundle-object",
            Rule::BundleImage => "bundle-image",
            Rule::Icon => "package-icon",
            Rule::Deprecation => "deprecation",
            Rule::Empty => "empty-catalog",
        }
    }
}

/// A catalog that cannot be served.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid catalog: {location}: rule {}: {message}", rule.name())]
pub struct LoadError {
    /// Where.
    pub location: Location,
    /// Which rule.
    pub rule: Rule,
    /// What exactly.
    pub message: String,
}

impl LoadError {
    pub(crate) fn new(location: &Location, rule: Rule, message: impl Into<String>) -> Self {
        LoadError {
            location: location.clone(),
            rule,
            message: message.into(),
        }
    }
}

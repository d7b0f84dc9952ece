//! Reading a file-based catalog directory into documents (no interpretation).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::error::{LoadError, Location, Rule};

/// One catalog document, decoded into a JSON value.
#[derive(Debug, Clone)]
pub struct Document {
    /// File and index.
    pub location: Location,
    /// The content.
    pub value: Value,
}

/// A document's content as read: JSON documents stay raw text (borrowed from
/// the file) so the interpreter can decode them straight into its own types;
/// YAML documents are decoded into a JSON value.
#[derive(Debug, Clone)]
pub enum Content<'a> {
    /// One JSON document's text.
    Json(&'a str),
    /// A YAML document as a JSON value.
    Value(Value),
}

impl Content<'_> {
    /// The content as a JSON value.
    pub fn into_value(self) -> Result<Value, serde_json::Error> {
        match self {
            Content::Json(text) => serde_json::from_str(text),
            Content::Value(v) => Ok(v),
        }
    }
}

/// Reads every `.json`, `.yaml` and `.yml` file under `root` (recursively,
/// skipping hidden entries) in path order and splits each into documents.
pub fn read_dir(root: &Path) -> Result<Vec<Document>, LoadError> {
    let mut docs = Vec::new();
    for_each_doc(root, |location, content| {
        let value = content
            .into_value()
            .map_err(|e| LoadError::new(&location, Rule::Syntax, format!("invalid JSON: {e}")))?;
        docs.push(Document { location, value });
        Ok(())
    })?;
    Ok(docs)
}

/// Like [`read_dir`], handing each document to `f` as soon as it is split
/// off its file: only one file's text (and one document's decoded form) is
/// held at a time.
pub fn for_each_doc(
    root: &Path,
    mut f: impl FnMut(Location, Content<'_>) -> Result<(), LoadError>,
) -> Result<(), LoadError> {
    let mut files = Vec::new();
    collect(root, &mut files)?;
    files.sort();
    // One buffer for every file, so file texts do not leave holes in the heap.
    let mut text = String::new();
    for rel in files {
        let full = root.join(&rel);
        text.clear();
        std::fs::File::open(&full)
            .and_then(|mut file| {
                // Exactly the file's size (growth by doubling would hold up
                // to twice the largest file).
                let size = file.metadata().map(|m| m.len()).unwrap_or(0);
                text.reserve_exact(usize::try_from(size).unwrap_or(0));
                std::io::Read::read_to_string(&mut file, &mut text)
            })
            .map_err(|e| {
                LoadError::new(
                    &Location {
                        file: rel.clone(),
                        doc: 0,
                    },
                    Rule::Read,
                    e.to_string(),
                )
            })?;
        parse_file(&rel, &text, &mut f)?;
    }
    Ok(())
}

/// Every catalog file under `root`, relative to it. Symlinks are followed (kubelet volume layouts
/// use them) with walkdir's loop detection: a link back to an ancestor is a read error naming it,
/// never an unbounded walk. Hidden entries (kubelet's `..data` and the like) are skipped.
fn collect(root: &Path, out: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).to_path_buf();
    let walk = walkdir::WalkDir::new(root)
        .follow_links(true)
        .into_iter()
        .filter_entry(|e| e.depth() == 0 || !e.file_name().to_string_lossy().starts_with('.'));
    for entry in walk {
        let entry = entry.map_err(|e| {
            let file = e.path().map(rel).unwrap_or_else(|| PathBuf::from("."));
            let msg = match e.loop_ancestor() {
                Some(a) => format!("symlink loop: it leads back to {}", rel(a).display()),
                None => e.to_string(),
            };
            LoadError::new(&Location { file, doc: 0 }, Rule::Read, msg)
        })?;
        if entry.file_type().is_file() && format_of(entry.path()).is_some() {
            out.push(rel(entry.path()));
        }
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Json,
    Yaml,
}

fn format_of(path: &Path) -> Option<Format> {
    match path.extension()?.to_str()? {
        "json" => Some(Format::Json),
        "yaml" | "yml" => Some(Format::Yaml),
        _ => None,
    }
}

/// Splits one file's text into documents, handing each to `f`.
pub fn parse_file(
    rel: &Path,
    text: &str,
    f: &mut impl FnMut(Location, Content<'_>) -> Result<(), LoadError>,
) -> Result<(), LoadError> {
    let loc = |doc: usize| Location {
        file: rel.to_path_buf(),
        doc,
    };
    match format_of(rel).unwrap_or(Format::Yaml) {
        Format::Json => {
            // The whole file is split first (slices of `text`, no copies), so
            // a syntax error anywhere in it is reported before its content.
            let stream = serde_json::Deserializer::from_str(text)
                .into_iter::<&serde_json::value::RawValue>();
            let mut docs = Vec::new();
            for (i, v) in stream.enumerate() {
                let v = v.map_err(|e| {
                    LoadError::new(&loc(i + 1), Rule::Syntax, format!("invalid JSON: {e}"))
                })?;
                docs.push(v.get());
            }
            for (i, v) in docs.into_iter().enumerate() {
                f(loc(i + 1), Content::Json(v))?;
            }
        }
        Format::Yaml => {
            let mut docs = Vec::new();
            for (i, de) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
                let v = Value::deserialize(de).map_err(|e| {
                    LoadError::new(&loc(i + 1), Rule::Syntax, format!("invalid YAML: {e}"))
                })?;
                if v.is_null() {
                    continue;
                }
                docs.push((i + 1, v));
            }
            for (i, v) in docs {
                f(loc(i), Content::Value(v))?;
            }
        }
    }
    Ok(())
}

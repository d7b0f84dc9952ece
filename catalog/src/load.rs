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

/// Reads every `.json`, `.yaml` and `.yml` file under `root` (recursively,
/// skipping hidden entries) in path order and splits each into documents.
pub fn read_dir(root: &Path) -> Result<Vec<Document>, LoadError> {
    let mut docs = Vec::new();
    for_each_doc(root, |d| {
        docs.push(d);
        Ok(())
    })?;
    Ok(docs)
}

/// Like [`read_dir`], handing each document to `f` as soon as its file is
/// parsed, so only one file's documents are held at a time.
pub fn for_each_doc(
    root: &Path,
    mut f: impl FnMut(Document) -> Result<(), LoadError>,
) -> Result<(), LoadError> {
    let mut files = Vec::new();
    collect(root, root, &mut files)?;
    files.sort();
    for rel in files {
        let full = root.join(&rel);
        let text = std::fs::read_to_string(&full).map_err(|e| {
            LoadError::new(
                &Location {
                    file: rel.clone(),
                    doc: 0,
                },
                Rule::Read,
                e.to_string(),
            )
        })?;
        let mut docs = Vec::new();
        parse_file(&rel, &text, &mut docs)?;
        drop(text);
        for d in docs {
            f(d)?;
        }
    }
    Ok(())
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), LoadError> {
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).to_path_buf();
    let entries = std::fs::read_dir(dir).map_err(|e| {
        LoadError::new(
            &Location {
                file: dir.to_path_buf(),
                doc: 0,
            },
            Rule::Read,
            e.to_string(),
        )
    })?;
    for entry in entries {
        let entry = entry.map_err(|e| {
            LoadError::new(
                &Location {
                    file: rel(dir),
                    doc: 0,
                },
                Rule::Read,
                e.to_string(),
            )
        })?;
        let path = entry.path();
        let name = entry.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        // Follow symlinks (kubelet volume layouts use them).
        let meta = std::fs::metadata(&path).map_err(|e| {
            LoadError::new(
                &Location {
                    file: rel(&path),
                    doc: 0,
                },
                Rule::Read,
                e.to_string(),
            )
        })?;
        if meta.is_dir() {
            collect(root, &path, out)?;
        } else if meta.is_file() && format_of(&path).is_some() {
            out.push(rel(&path));
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

/// Splits one file's text into documents.
pub fn parse_file(rel: &Path, text: &str, docs: &mut Vec<Document>) -> Result<(), LoadError> {
    let loc = |doc: usize| Location {
        file: rel.to_path_buf(),
        doc,
    };
    match format_of(rel).unwrap_or(Format::Yaml) {
        Format::Json => {
            let stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
            for (i, v) in stream.enumerate() {
                let v = v.map_err(|e| {
                    LoadError::new(&loc(i + 1), Rule::Syntax, format!("invalid JSON: {e}"))
                })?;
                docs.push(Document {
                    location: loc(i + 1),
                    value: v,
                });
            }
        }
        Format::Yaml => {
            for (i, de) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
                let v = Value::deserialize(de).map_err(|e| {
                    LoadError::new(&loc(i + 1), Rule::Syntax, format!("invalid YAML: {e}"))
                })?;
                if v.is_null() {
                    continue;
                }
                docs.push(Document {
                    location: loc(i + 1),
                    value: v,
                });
            }
        }
    }
    Ok(())
}

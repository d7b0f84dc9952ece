//! Compressed storage for the large JSON texts a catalog serves (stub CSVs
//! and bundle manifests).
//!
//! Texts are appended, in load order, to blocks of about [`BLOCK`] bytes that
//! are deflate-compressed once full. Consecutive versions of an operator sit
//! next to each other in its catalog file and differ in a few fields, so a
//! block of several of them compresses about tenfold. Serving a text inflates
//! its block (at most a few hundred KiB).

use std::fmt;

use miniz_oxide::deflate::compress_to_vec;
use miniz_oxide::inflate::decompress_to_vec_with_limit;

/// Uncompressed size a block is closed at (a larger single text gets a block
/// of its own).
pub const BLOCK: usize = 128 * 1024;

/// Deflate level: 6 is zlib's default; higher levels gain little here.
const LEVEL: u8 = 6;

/// Where a text is: its block and its byte range in the inflated block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobRef {
    block: u32,
    start: u32,
    len: u32,
}

impl BlobRef {
    /// Uncompressed length in bytes.
    pub fn len(self) -> usize {
        self.len as usize
    }

    /// True for an empty text.
    pub fn is_empty(self) -> bool {
        self.len == 0
    }
}

struct Block {
    deflated: Box<[u8]>,
    raw_len: u32,
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Block({} -> {} bytes)",
            self.raw_len,
            self.deflated.len()
        )
    }
}

/// Collects texts while a catalog loads.
#[derive(Debug, Default)]
pub struct BlobWriter {
    blocks: Vec<Block>,
    open: String,
}

impl BlobWriter {
    /// Stores `text` and returns where it is.
    pub fn push(&mut self, text: &str) -> BlobRef {
        if !self.open.is_empty() && self.open.len() + text.len() > BLOCK {
            self.close_block();
        }
        if self.open.capacity() == 0 {
            self.open.reserve(BLOCK.max(text.len()));
        }
        let r = BlobRef {
            block: u32::try_from(self.blocks.len()).unwrap_or(u32::MAX),
            start: u32::try_from(self.open.len()).unwrap_or(u32::MAX),
            len: u32::try_from(text.len()).unwrap_or(u32::MAX),
        };
        self.open.push_str(text);
        r
    }

    fn close_block(&mut self) {
        if self.open.is_empty() {
            return;
        }
        let deflated = compress_to_vec(self.open.as_bytes(), LEVEL).into_boxed_slice();
        self.blocks.push(Block {
            deflated,
            raw_len: u32::try_from(self.open.len()).unwrap_or(u32::MAX),
        });
        // Keep the buffer: the next block reuses it.
        self.open.clear();
    }

    /// Closes the last block.
    pub fn finish(mut self) -> Blobs {
        self.close_block();
        Blobs {
            blocks: self.blocks.into_boxed_slice(),
        }
    }
}

/// The compressed texts of a loaded catalog.
#[derive(Debug, Default)]
pub struct Blobs {
    blocks: Box<[Block]>,
}

impl Blobs {
    /// Compressed bytes held.
    pub fn deflated_bytes(&self) -> usize {
        self.blocks.iter().map(|b| b.deflated.len()).sum()
    }

    /// Uncompressed bytes held.
    pub fn raw_bytes(&self) -> usize {
        self.blocks.iter().map(|b| b.raw_len as usize).sum()
    }

    /// A reader that keeps the last inflated block, for several texts of one
    /// answer.
    pub fn reader(&self) -> BlobReader<'_> {
        BlobReader {
            blobs: self,
            last: None,
        }
    }
}

/// Reads texts, inflating each block once while it is the current one.
pub struct BlobReader<'a> {
    blobs: &'a Blobs,
    last: Option<(u32, Vec<u8>)>,
}

impl BlobReader<'_> {
    /// Appends the text at `r` to `out`.
    pub fn append(&mut self, r: BlobRef, out: &mut String) {
        if r.len == 0 {
            return;
        }
        if self.last.as_ref().is_none_or(|(b, _)| *b != r.block) {
            let Some(block) = self.blobs.blocks.get(r.block as usize) else {
                return;
            };
            let raw = decompress_to_vec_with_limit(&block.deflated, block.raw_len as usize)
                .unwrap_or_default();
            self.last = Some((r.block, raw));
        }
        if let Some((_, raw)) = &self.last {
            let (s, e) = (r.start as usize, r.start as usize + r.len as usize);
            // Blocks hold whole texts pushed as &str, so the range is UTF-8.
            if let Some(text) = raw.get(s..e).and_then(|b| std::str::from_utf8(b).ok()) {
                out.push_str(text);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_come_back_across_blocks() {
        let mut w = BlobWriter::default();
        let texts: Vec<String> = (0..200)
            .map(|i| format!("{{\"n\":{i},\"pad\":\"{}\"}}", "é".repeat(i * 17)))
            .collect();
        let refs: Vec<BlobRef> = texts.iter().map(|t| w.push(t)).collect();
        let big = "x".repeat(BLOCK * 2);
        let big_ref = w.push(&big);
        let empty = w.push("");
        let blobs = w.finish();
        assert!(blobs.blocks.len() > 2);
        let mut r = blobs.reader();
        for (t, at) in texts.iter().zip(&refs).rev() {
            let mut out = String::new();
            r.append(*at, &mut out);
            assert_eq!(&out, t);
        }
        let mut out = String::new();
        r.append(big_ref, &mut out);
        assert_eq!(out, big);
        out.clear();
        r.append(empty, &mut out);
        assert!(out.is_empty() && empty.is_empty());
        assert!(blobs.deflated_bytes() < blobs.raw_bytes());
    }
}

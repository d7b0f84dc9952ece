//! Compressed storage for the large JSON texts a catalog serves (stub CSVs
//! and bundle manifests).
//!
//! Texts are appended, in load order, to blocks of about [`BLOCK`] bytes that
//! are deflate-compressed once full. Consecutive versions of an operator sit
//! next to each other in its catalog file and differ in a few fields, so a
//! block of several of them compresses about tenfold. Serving a text inflates
//! its block (at most a few hundred KiB).

use std::fmt;

use miniz_oxide::deflate::core::{
    CompressorOxide, TDEFLFlush, TDEFLStatus, compress, create_comp_flags_from_zip_params,
};
use miniz_oxide::inflate::core::{DecompressorOxide, decompress, inflate_flags};

/// Uncompressed size a block is closed at (a larger single text gets a block
/// of its own).
pub const BLOCK: usize = 64 * 1024;

/// Deflate level: 6 is zlib's default; higher levels gain little here.
const LEVEL: u8 = 6;

/// Where a text is: its block and its byte range in the inflated block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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

/// Collects texts while a catalog loads. Its working buffers (the open
/// block, the compressor and its output) are made once and reused for every
/// block, so loading does not leave large freed chunks between long-lived
/// data.
#[derive(Default)]
pub struct BlobWriter {
    blocks: Vec<Block>,
    open: String,
    compressor: Option<Box<CompressorOxide>>,
    out: Vec<u8>,
}

impl fmt::Debug for BlobWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlobWriter({} blocks)", self.blocks.len())
    }
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
        let compressor = self.compressor.get_or_insert_with(|| {
            Box::new(CompressorOxide::new(create_comp_flags_from_zip_params(
                LEVEL.into(),
                0,
                0,
            )))
        });
        compressor.reset();
        if self.out.len() < BLOCK {
            self.out.resize(BLOCK, 0);
        }
        let mut input = self.open.as_bytes();
        let mut written = 0;
        loop {
            let (status, read, wrote) = compress(
                compressor,
                input,
                &mut self.out[written..],
                TDEFLFlush::Finish,
            );
            written += wrote;
            input = input.get(read..).unwrap_or_default();
            match status {
                TDEFLStatus::Done => break,
                TDEFLStatus::Okay => {
                    if self.out.len() - written < 64 {
                        self.out.resize(self.out.len() * 2, 0);
                    }
                }
                // Only for bad parameters or a bug in the compressor.
                other => panic!("deflate failed: {other:?}"),
            }
        }
        let deflated = Box::<[u8]>::from(self.out.get(..written).unwrap_or_default());
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

/// Inflates the first `end` bytes of a block (no further: a text near the
/// start of its block costs little to read).
fn inflate_prefix(deflated: &[u8], end: usize) -> Vec<u8> {
    let mut out = vec![0u8; end];
    let mut state = Box::<DecompressorOxide>::default();
    let (_, _, written) = decompress(
        &mut state,
        deflated,
        &mut out,
        0,
        inflate_flags::TINFL_FLAG_USING_NON_WRAPPING_OUTPUT_BUF,
    );
    out.truncate(written);
    out
}

/// Reads texts, keeping the last inflated block prefix for the next text.
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
        let (s, e) = (r.start as usize, r.start as usize + r.len as usize);
        if self
            .last
            .as_ref()
            .is_none_or(|(b, raw)| *b != r.block || raw.len() < e)
        {
            let Some(block) = self.blobs.blocks.get(r.block as usize) else {
                return;
            };
            let raw = inflate_prefix(&block.deflated, e.min(block.raw_len as usize));
            self.last = Some((r.block, raw));
        }
        if let Some((_, raw)) = &self.last {
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

//! Checks that an encoded PNG or JPEG is complete before it is decoded.
//!
//! # Why
//! The decoders `image` uses are forgiving on purpose: zune-jpeg (run by
//! `image` with strict mode off) fills the missing part of a JPEG cut
//! mid-scan with grey or with the last decoded blocks, and the png crate
//! stops reading after the image data, so a PNG without its trailing chunks
//! decodes as if nothing were wrong. For training data a half-written or
//! half-downloaded file must be an error, not a plausible picture, so
//! `image_decode` walks the container structure first:
//!
//! * JPEG: every marker segment fits in the value, every scan's entropy-coded
//!   data is followed by a marker, and the end-of-image marker (`FFD9`) comes
//!   after the last scan. Bytes after `FFD9` are ignored (some cameras append
//!   data there).
//! * PNG: every chunk fits in the value, its CRC matches, and the stream ends
//!   with `IEND`. The png crate also checks the CRC of the chunks it reads;
//!   the walk covers the ones it never reads (after the image data).
//!
//! The walk is one pass over the bytes, no allocation: a JPEG costs a byte
//! scan for `FF`, a PNG a CRC-32 (crc32fast, SIMD) over the file.
//!
//! # What it does not catch
//! Damage that keeps the structure intact (a flipped bit inside a JPEG scan)
//! decodes to wrong pixels: JPEG has no checksum. PNG's CRCs catch it.

/// A JPEG's end-of-image marker.
const EOI: u8 = 0xD9;
/// A JPEG's start-of-scan marker: entropy-coded data follows its header.
const SOS: u8 = 0xDA;
/// The PNG signature.
const PNG_SIGNATURE: &[u8; 8] = b"\x89PNG\r\n\x1a\n";

/// The hint appended to every "incomplete" reason.
const PARTIAL_HINT: &str = "pass 'partial' as the third argument of image_decode to \
                            accept what the decoder fills in";

/// Whether `image_decode` requires complete files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Completeness {
    /// A truncated or structurally damaged file is an error (the default).
    #[default]
    Required,
    /// Decode whatever the decoder can make of a truncated file; only
    /// errors the decoder itself raises (including PNG CRC mismatches in the
    /// chunks it reads) remain errors.
    AllowPartial,
}

/// Checks the structure of `bytes` (a PNG or JPEG, by signature); other
/// formats pass unchecked, the decoder refuses them.
pub fn check_complete(bytes: &[u8]) -> Result<(), String> {
    if bytes.starts_with(PNG_SIGNATURE) {
        check_png(bytes)
    } else if bytes.starts_with(&[0xFF, 0xD8]) {
        check_jpeg(bytes)
    } else {
        Ok(())
    }
}

/// Reads a big-endian u16 at `at`, if the value has it.
fn be16(bytes: &[u8], at: usize) -> Option<usize> {
    let pair = bytes.get(at..at.checked_add(2)?)?;
    Some(usize::from(u16::from_be_bytes([pair[0], pair[1]])))
}

/// Walks a JPEG's markers from SOI to EOI; see the module docs.
fn check_jpeg(bytes: &[u8]) -> Result<(), String> {
    let len = bytes.len();
    let truncated = |what: String| {
        Err(format!(
            "the JPEG is truncated: {what}, {len} bytes in all, and no end-of-image \
             marker (FFD9) follows; {PARTIAL_HINT}"
        ))
    };
    let mut pos = 2;
    let mut scans = 0usize;
    loop {
        // Markers may be preceded by fill bytes (FF) and, in files that
        // decoders accept, by stray bytes: skip to the next FF.
        let Some(ff) = bytes[pos..].iter().position(|&b| b == 0xFF) else {
            return truncated(format!("it ends at byte {len} between segments"));
        };
        pos += ff;
        while bytes.get(pos + 1) == Some(&0xFF) {
            pos += 1;
        }
        let Some(&marker) = bytes.get(pos + 1) else {
            return truncated(format!("it ends at byte {len} inside a marker"));
        };
        match marker {
            EOI if scans > 0 => return Ok(()),
            EOI => {
                return Err(format!(
                    "the JPEG has no image data: its end-of-image marker at byte {pos} \
                     comes before any scan"
                ));
            }
            // Stand-alone markers: TEM, RST0-7 (no length field).
            0x01 | 0xD0..=0xD7 => pos += 2,
            _ => {
                let Some(length) = be16(bytes, pos + 2) else {
                    return truncated(format!(
                        "it ends at byte {len} inside the header of segment FF{marker:02X}"
                    ));
                };
                let end = pos + 2 + length;
                if length < 2 || end > len {
                    return truncated(format!(
                        "segment FF{marker:02X} at byte {pos} declares {length} bytes, \
                         {} remain",
                        len - pos - 2
                    ));
                }
                pos = end;
                if marker == SOS {
                    scans += 1;
                    pos = match end_of_scan(bytes, pos) {
                        Some(next) => next,
                        None => {
                            return truncated(format!(
                                "it ends at byte {len} inside the image data of scan \
                                 {scans}"
                            ));
                        }
                    };
                }
            }
        }
    }
}

/// The position of the marker that ends the entropy-coded data starting at
/// `pos`: an FF followed by anything but a stuffed 00 or a restart marker.
fn end_of_scan(bytes: &[u8], mut pos: usize) -> Option<usize> {
    loop {
        pos += bytes.get(pos..)?.iter().position(|&b| b == 0xFF)?;
        match bytes.get(pos + 1)? {
            0x00 | 0xD0..=0xD7 | 0xFF => pos += 1,
            _ => return Some(pos),
        }
    }
}

/// Walks a PNG's chunks to IEND, checking each CRC; see the module docs.
fn check_png(bytes: &[u8]) -> Result<(), String> {
    let len = bytes.len();
    let mut pos = PNG_SIGNATURE.len();
    loop {
        let header = bytes.get(pos..pos + 8).ok_or_else(|| {
            format!(
                "the PNG is truncated: it ends at byte {len} with no IEND chunk; \
                 {PARTIAL_HINT}"
            )
        })?;
        let length = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let kind = String::from_utf8_lossy(&header[4..8]).into_owned();
        let data_end = usize::try_from(length)
            .ok()
            .and_then(|n| (pos + 8).checked_add(n));
        let Some(stored) = data_end.and_then(|end| bytes.get(end..end + 4)) else {
            return Err(format!(
                "the PNG is truncated: its {kind} chunk at byte {pos} declares {length} \
                 bytes of data, {} remain, {len} bytes in all; {PARTIAL_HINT}",
                len.saturating_sub(pos + 12)
            ));
        };
        let stored = u32::from_be_bytes([stored[0], stored[1], stored[2], stored[3]]);
        let end = pos + 8 + length as usize;
        let computed = crc32fast::hash(&bytes[pos + 4..end]);
        if stored != computed {
            return Err(format!(
                "the PNG is damaged: its {kind} chunk at byte {pos} has CRC {stored:08x}, \
                 its data gives {computed:08x}"
            ));
        }
        if &header[4..8] == b"IEND" {
            return Ok(());
        }
        pos = end + 4;
    }
}

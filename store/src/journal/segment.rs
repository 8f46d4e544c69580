//! The journal's on-disk form: segment files of framed records, and the scan that reads them back.
//!
//! A segment (`journal/<16 hex digits>.seg`) starts with [`MAGIC`] and holds records appended one
//! after another. A record is a header of [`HEADER`] bytes, then its payload:
//!
//! ```text
//! sync "\xC7jR\x01" | len u32 | crc u32 | kind u8 | conversation u64 | id u64 | payload (len bytes)
//! ```
//!
//! integers little-endian, `crc` the CRC-32 of everything after it (kind, conversation, id, payload)
//! and of `len`. The conversation and id stand in the header so that a scan learns which records a
//! segment holds without decompressing them. A damaged byte fails one record's CRC; the scan then
//! looks for the next sync marker whose record checks, so damage costs the records it sits in and
//! nothing after them.

use std::path::{Path, PathBuf};

/// The first bytes of every segment.
pub const MAGIC: &[u8; 8] = b"CTXJRNL1";
/// The first bytes of every record.
pub const SYNC: [u8; 4] = [0xC7, b'j', b'R', 0x01];
/// Bytes before a record's payload.
pub const HEADER: usize = 4 + 4 + 4 + 1 + 8 + 8;
/// A payload longer than this is damage, not a record (a turn's draft is capped well below it).
pub const MAX_PAYLOAD: usize = 1 << 30;

/// What a record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A committed turn: its record, its conversation as it stood after it, its new messages and the
    /// prefix points it recorded (`id` is the turn's).
    Turn = 1,
    /// A stored finding (`id` is the finding's).
    Finding = 2,
    /// A conversation removed on purpose (deleted or expired): replaying the journal leaves it out.
    Deleted = 3,
}

impl Kind {
    fn from_byte(byte: u8) -> Option<Kind> {
        match byte {
            1 => Some(Kind::Turn),
            2 => Some(Kind::Finding),
            3 => Some(Kind::Deleted),
            _ => None,
        }
    }
}

/// A record's frame: header and payload, ready to append.
pub fn frame(kind: Kind, conversation: u64, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&SYNC);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(kind as u8);
    out.extend_from_slice(&conversation.to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(payload);
    let crc = checksum(&out);
    out[8..12].copy_from_slice(&crc.to_le_bytes());
    out
}

fn checksum(record: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&record[4..8]);
    hasher.update(&record[12..]);
    hasher.finalize()
}

/// One record found by a scan: where it is and what its header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Located {
    pub segment: u64,
    /// Offset of the payload in the segment file.
    pub offset: u64,
    pub len: u32,
    pub kind: Kind,
    pub conversation: u64,
    pub id: u64,
}

/// Bytes of a segment that hold no record that checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DamagedSpan {
    pub segment: u64,
    pub start: u64,
    pub end: u64,
}

/// What one segment holds.
#[derive(Debug, Default)]
pub struct SegmentScan {
    pub records: Vec<Located>,
    pub damaged: Vec<DamagedSpan>,
    /// The end of the last record that checks: where appending may resume.
    pub valid_end: u64,
    /// The segment's length on disk.
    pub len: u64,
}

/// Reads a segment's records, skipping damaged bytes to the next record that checks. A segment
/// whose first bytes are not [`MAGIC`] is damaged from its start up to its first good record.
pub fn scan_bytes(segment: u64, bytes: &[u8]) -> SegmentScan {
    let mut scan = SegmentScan { len: bytes.len() as u64, ..SegmentScan::default() };
    let mut at = if bytes.starts_with(MAGIC) { MAGIC.len() } else { 0 };
    scan.valid_end = at as u64;
    let mut damage_from: Option<usize> = (at == 0 && !bytes.is_empty()).then_some(0);
    while at < bytes.len() {
        match record_at(bytes, at) {
            Some((kind, len, conversation, id)) => {
                if let Some(start) = damage_from.take() {
                    scan.damaged.push(DamagedSpan { segment, start: start as u64, end: at as u64 });
                }
                let offset = (at + HEADER) as u64;
                scan.records.push(Located { segment, offset, len, kind, conversation, id });
                at += HEADER + len as usize;
                scan.valid_end = at as u64;
            }
            None => {
                damage_from.get_or_insert(at);
                at = next_sync(bytes, at + 1);
            }
        }
    }
    if let Some(start) = damage_from {
        scan.damaged.push(DamagedSpan { segment, start: start as u64, end: bytes.len() as u64 });
    }
    scan
}

/// The record starting at `at`, if its sync marker, length and checksum hold.
fn record_at(bytes: &[u8], at: usize) -> Option<(Kind, u32, u64, u64)> {
    let header = bytes.get(at..at + HEADER)?;
    if header[..4] != SYNC {
        return None;
    }
    let len = u32::from_le_bytes(header[4..8].try_into().ok()?);
    if len as usize > MAX_PAYLOAD {
        return None;
    }
    let record = bytes.get(at..at + HEADER + len as usize)?;
    let crc = u32::from_le_bytes(header[8..12].try_into().ok()?);
    if checksum(record) != crc {
        return None;
    }
    let kind = Kind::from_byte(header[12])?;
    let conversation = u64::from_le_bytes(header[13..21].try_into().ok()?);
    let id = u64::from_le_bytes(header[21..29].try_into().ok()?);
    Some((kind, len, conversation, id))
}

/// The next offset at or after `from` where a sync marker starts (or the end).
fn next_sync(bytes: &[u8], from: usize) -> usize {
    bytes.get(from..).and_then(|rest| rest.windows(SYNC.len()).position(|w| w == SYNC)).map_or(bytes.len(), |i| from + i)
}

/// A segment's file name.
pub fn file_name(segment: u64) -> String {
    format!("{segment:016x}.seg")
}

/// The segments in a journal directory, oldest first (a missing directory has none).
pub fn list(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut segments = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".seg")) else { continue };
        if let Ok(number) = u64::from_str_radix(stem, 16) {
            segments.push((number, entry.path()));
        }
    }
    segments.sort();
    Ok(segments)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(records: &[(Kind, u64, u64, &[u8])]) -> Vec<u8> {
        let mut bytes = MAGIC.to_vec();
        for (kind, conversation, id, payload) in records {
            bytes.extend(frame(*kind, *conversation, *id, payload));
        }
        bytes
    }

    #[test]
    fn records_read_back_with_their_headers() {
        let bytes = segment(&[(Kind::Turn, 1, 1, b"one"), (Kind::Finding, 1, 7, b"two"), (Kind::Deleted, 1, 0, b"")]);
        let scan = scan_bytes(3, &bytes);
        assert!(scan.damaged.is_empty());
        assert_eq!(scan.valid_end, bytes.len() as u64);
        let kinds: Vec<_> = scan.records.iter().map(|r| (r.kind, r.conversation, r.id, r.len)).collect();
        assert_eq!(kinds, vec![(Kind::Turn, 1, 1, 3), (Kind::Finding, 1, 7, 3), (Kind::Deleted, 1, 0, 0)]);
        let first = scan.records[0];
        assert_eq!(&bytes[first.offset as usize..][..3], b"one");
    }

    #[test]
    fn a_flipped_byte_costs_the_record_it_sits_in_and_nothing_after() {
        let payloads: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i; 40]).collect();
        let records: Vec<_> = payloads.iter().enumerate().map(|(i, p)| (Kind::Turn, i as u64, i as u64, p.as_slice())).collect();
        let clean = segment(&records);
        for position in MAGIC.len()..clean.len() {
            let mut bytes = clean.clone();
            bytes[position] ^= 0x5A;
            let scan = scan_bytes(0, &bytes);
            let kept: Vec<u64> = scan.records.iter().map(|r| r.id).collect();
            let hit = (position - MAGIC.len()) / (HEADER + 40);
            let expected: Vec<u64> = (0..10).filter(|&i| i != hit as u64).collect();
            assert_eq!(kept, expected, "flip at {position}");
            assert_eq!(scan.damaged.len(), 1, "flip at {position}");
        }
    }

    #[test]
    fn a_torn_tail_is_damage_and_appending_resumes_before_it() {
        let mut bytes = segment(&[(Kind::Turn, 1, 1, b"whole")]);
        let whole = bytes.len() as u64;
        bytes.extend_from_slice(&frame(Kind::Turn, 1, 2, b"cut short")[..20]);
        let scan = scan_bytes(0, &bytes);
        assert_eq!(scan.records.len(), 1);
        assert_eq!(scan.valid_end, whole);
        assert_eq!(scan.damaged, vec![DamagedSpan { segment: 0, start: whole, end: bytes.len() as u64 }]);
    }
}

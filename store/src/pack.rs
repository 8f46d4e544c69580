//! A turn's pack: the canonical JSON of the messages the turn added (its request past its base, then
//! its reply) in one record, each entry its length (LEB128) then its bytes; an empty entry is a
//! message stored on its own in `messages`. Packs of [`COMPRESS_FROM`] bytes or more are stored
//! LZ4-compressed ([`FRAME_PACK_LZ4`]) when that saves at least an eighth: sled keeps recently
//! written values in memory and rewrites them as it consolidates, so every byte not written is
//! memory and disk not spent (a conversation's messages repeat roles, keys and phrasing).

use crate::codec::{self, trees, FRAME_V1};
use crate::StoreError;

/// The first byte of a compressed pack: CRC32 (of key and payload, as every frame), then the
/// uncompressed size (4 bytes, little-endian) and the LZ4 block.
pub const FRAME_PACK_LZ4: u8 = 0x04;
/// Smaller packs are stored as they are (compression would save a few bytes at best).
pub const COMPRESS_FROM: usize = 512;
/// An LZ4 block expands at most about 255-fold; a size claimed beyond that is damage, not a reason
/// to allocate.
const MAX_RATIO: usize = 255;

/// A pack read back: its entries in order (`None`: stored in `messages`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pack {
    bytes: Vec<u8>,
    spans: Vec<Option<(usize, usize)>>,
}

impl Pack {
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    pub fn entries(&self) -> impl ExactSizeIterator<Item = Option<&[u8]>> + '_ {
        self.spans.iter().map(|span| span.map(|(at, len)| &self.bytes[at..at + len]))
    }
}

/// A turn's pack for storage under `key`.
pub fn encode_pack(key: &[u8], entries: &[Option<&[u8]>]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(entries.iter().map(|e| e.map_or(1, |b| b.len() + 3)).sum());
    for entry in entries {
        let bytes = entry.unwrap_or_default();
        let mut n = bytes.len();
        while n >= 0x80 {
            payload.push((n as u8) | 0x80);
            n >>= 7;
        }
        payload.push(n as u8);
        payload.extend_from_slice(bytes);
    }
    if payload.len() >= COMPRESS_FROM {
        let compressed = lz4_flex::block::compress_prepend_size(&payload);
        if compressed.len() <= payload.len() - payload.len() / 8 {
            return codec::frame_as(FRAME_PACK_LZ4, key, &compressed);
        }
    }
    codec::frame(key, &payload)
}

/// A pack read under `key`: checksum verified, decompressed, its entries delimited.
pub fn decode_pack(key: &[u8], bytes: &[u8]) -> Result<Pack, StoreError> {
    let bad = |detail: &str| codec::damaged(trees::PACKS, key, detail.into());
    let bytes = match bytes.first() {
        Some(&FRAME_V1) => codec::checked(trees::PACKS, key, bytes)?.to_vec(),
        Some(&FRAME_PACK_LZ4) => {
            let payload = codec::checked(trees::PACKS, key, bytes)?;
            let size = payload.get(..4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
            if size.is_none_or(|size| size > MAX_RATIO * payload.len() + 64) {
                return Err(bad("compressed pack claims an impossible size"));
            }
            lz4_flex::block::decompress_size_prepended(payload).map_err(|e| bad(&format!("compressed pack does not decompress: {e}")))?
        }
        _ => return Err(bad("not a framed pack")),
    };
    let mut spans = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let (mut n, mut shift) = (0usize, 0);
        loop {
            let Some(&b) = bytes.get(at) else { return Err(bad("entry length cut short")) };
            at += 1;
            n |= usize::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 || shift > 35 {
                break;
            }
        }
        if bytes.len() - at < n {
            return Err(bad("entry cut short"));
        }
        spans.push((n > 0).then_some((at, n)));
        at += n;
    }
    Ok(Pack { bytes, spans })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{frame, id_key};

    fn round_trip(entries: &[Option<&[u8]>]) -> Vec<u8> {
        let value = encode_pack(&id_key(3), entries);
        let pack = decode_pack(&id_key(3), &value).unwrap();
        assert_eq!(pack.entries().collect::<Vec<_>>(), entries);
        value
    }

    #[test]
    fn a_pack_round_trips_its_entries_compressed_or_not() {
        let long = vec![b'x'; 300];
        let small = round_trip(&[Some(&b"{\"a\":1}"[..]), None, Some(long.as_slice())]);
        assert_eq!(small[0], FRAME_V1, "under COMPRESS_FROM bytes: stored as it is");
        assert!(round_trip(&[]).len() < 8);
        let messages: Vec<Vec<u8>> =
            (0..200).map(|i| format!(r#"{{"role":"user","content":"request 0 message {i}"}}"#).into_bytes()).collect();
        let entries: Vec<Option<&[u8]>> = messages.iter().map(|m| Some(m.as_slice())).chain([None]).collect();
        let value = round_trip(&entries);
        let raw: usize = messages.iter().map(|m| m.len() + 1).sum();
        assert_eq!(value[0], FRAME_PACK_LZ4);
        assert!(value.len() * 3 < raw, "{} bytes packed from {raw}", value.len());
        // Bytes that do not compress are stored as they are.
        let mut seed = 7u64;
        let noise: Vec<u8> = (0..4000)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                b'a' + (seed >> 59) as u8
            })
            .collect();
        assert_eq!(round_trip(&[Some(noise.as_slice())])[0], FRAME_V1);
    }

    #[test]
    fn damage_is_reported_not_panicked_on() {
        let messages: Vec<u8> = b"{\"role\":\"user\",\"content\":\"same again\"}".repeat(100);
        let value = encode_pack(&id_key(3), &[Some(messages.as_slice())]);
        assert_eq!(value[0], FRAME_PACK_LZ4);
        for at in [1, 6, value.len() / 2, value.len() - 1] {
            let mut bad = value.clone();
            bad[at] ^= 1;
            assert!(matches!(decode_pack(&id_key(3), &bad), Err(StoreError::Damaged { tree: "packs", .. })), "byte {at}");
        }
        // A length that runs past the end; a claimed size no block could have; a block that does not
        // decompress (checksums right, so only the decoder can tell).
        assert!(decode_pack(&id_key(3), &frame(&id_key(3), &[0x05, b'a'])).is_err());
        let huge = codec::frame_as(FRAME_PACK_LZ4, &id_key(3), &[0xff, 0xff, 0xff, 0x7f, 0x10, b'a']);
        assert!(decode_pack(&id_key(3), &huge).unwrap_err().to_string().contains("impossible size"));
        let garbage = codec::frame_as(FRAME_PACK_LZ4, &id_key(3), &[40, 0, 0, 0, 0xf0, 0xff, 0xff]);
        assert!(decode_pack(&id_key(3), &garbage).is_err());
        assert!(decode_pack(&id_key(3), &value[..3]).is_err());
    }
}

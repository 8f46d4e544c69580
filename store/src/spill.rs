//! Large values kept out of sled. sled 0.34 keeps every value it writes in memory until its cache
//! evicts the page, and it evicts only when a page's shard has seen enough accesses: a proxy that
//! captured 48 requests of 100,000 messages held each turn's 600 KB pack for good (resident memory
//! grew with every batch, whatever `cache_capacity` said; BENCHMARKS.md, "Memory and store size").
//! A pack or message of [`SPILL_FROM`] bytes or more is written to its own file under
//! `spill/<tree>/<key in hex>` (written, synced and renamed into place before the sled record that
//! names it), and sled holds a small marker: format [`FRAME_SPILLED`], checksummed like every
//! record, whose payload is the file's length and CRC32. The file holds the value exactly as sled
//! would have (its own frame and checksum), so every reader decodes it as before.
//!
//! A file is written before its marker and removed after it: a crash in between leaves a file no
//! marker names, which opening the store removes ([`Spill::sweep`]); never a marker without its file,
//! except by damage, which reads report as such.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use sled::IVec;

use crate::codec::{self, hex_key};
use crate::StoreError;

/// Values this long or longer are spilled (a turn's pack of about a thousand short messages).
pub const SPILL_FROM: usize = 64 << 10;
/// The first byte of a spilled value's marker: CRC32 (of key and payload), then the file's length
/// (8 bytes) and CRC32 (4 bytes), big-endian.
pub const FRAME_SPILLED: u8 = 0x05;
/// The directory under the store's, and the suffix of a file being written.
const DIR: &str = "spill";
const PARTIAL: &str = ".partial";

/// Whether a stored value is a marker for a spilled one.
pub fn is_spilled(value: &[u8]) -> bool {
    value.first() == Some(&FRAME_SPILLED)
}

/// The spilled values of one store.
#[derive(Debug, Clone)]
pub(crate) struct Spill {
    dir: PathBuf,
}

impl Spill {
    pub fn new(store_dir: &Path) -> Spill {
        Spill { dir: store_dir.join(DIR) }
    }

    fn file(&self, tree: &str, key: &[u8]) -> PathBuf {
        self.dir.join(tree).join(hex_key(key))
    }

    fn io_error(&self, path: &Path, source: std::io::Error) -> StoreError {
        StoreError::Spill { path: path.to_path_buf(), source }
    }

    /// The value to put in sled for `value` under `tree`/`key`: `value` itself when short, else a
    /// marker, once the value is durably in its file.
    pub fn put(&self, tree: &'static str, key: &[u8], value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        if value.len() < SPILL_FROM || is_spilled(&value) {
            return Ok(value);
        }
        let path = self.file(tree, key);
        let folder = path.parent().expect("a spill file has a folder");
        std::fs::create_dir_all(folder).map_err(|e| self.io_error(folder, e))?;
        // A name of its own per write: two writers of one content-addressed message (capture and
        // an import) must not interleave in one partial file.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let partial = path.with_extension(format!("{}-{n}{PARTIAL}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut file = File::create(&partial)?;
            file.write_all(&value)?;
            file.sync_all()?;
            std::fs::rename(&partial, &path)?;
            File::open(folder)?.sync_all()
        };
        if let Err(source) = write() {
            let _ = std::fs::remove_file(&partial);
            return Err(self.io_error(&path, source));
        }
        let mut payload = Vec::with_capacity(12);
        payload.extend_from_slice(&(value.len() as u64).to_be_bytes());
        payload.extend_from_slice(&crc32fast::hash(&value).to_be_bytes());
        Ok(codec::frame_as(FRAME_SPILLED, key, &payload))
    }

    /// A value read from sled under `tree`/`key`, with a marker replaced by its file's bytes (length
    /// and checksum verified: a missing or altered file is damage to the record).
    pub fn load(&self, tree: &'static str, key: &[u8], value: IVec) -> Result<Value, StoreError> {
        if !is_spilled(&value) {
            return Ok(Value::Stored(value));
        }
        let (len, crc) = marker(tree, key, &value)?;
        let path = self.file(tree, key);
        let bytes = std::fs::read(&path)
            .map_err(|e| codec::damaged(tree, key, format!("its spilled value {} cannot be read: {e}", path.display())))?;
        if bytes.len() as u64 != len || crc32fast::hash(&bytes) != crc {
            return Err(codec::damaged(tree, key, format!("its spilled value {} is not the one written", path.display())));
        }
        Ok(Value::Spilled(bytes))
    }

    /// Removes the file of a value whose record was removed (`marker`: the value the record held).
    pub fn remove(&self, tree: &str, key: &[u8], marker: &[u8]) {
        if is_spilled(marker) {
            self.discard(tree, key);
        }
    }

    /// Removes the file of `tree`/`key` if there is one (its record is gone).
    pub fn discard(&self, tree: &str, key: &[u8]) {
        let path = self.file(tree, key);
        if let Err(error) = std::fs::remove_file(&path) {
            if error.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(path = %path.display(), %error, "could not remove a spilled value; the next open removes it");
            }
        }
    }

    /// Removes files no record names (a crash between a file and its marker, or between a record's
    /// removal and its file's) and unfinished writes; returns how many went. Run on open, before any
    /// write.
    pub fn sweep(&self, tree: &'static str, records: &sled::Tree) -> Result<usize, StoreError> {
        let folder = self.dir.join(tree);
        let entries = match std::fs::read_dir(&folder) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(error) => return Err(self.io_error(&folder, error)),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|e| self.io_error(&folder, e))?;
            let name = entry.file_name();
            let named = name.to_str().and_then(codec::key_from_hex).map(|key| records.get(key)).transpose()?.flatten();
            if !named.is_some_and(|value| is_spilled(&value)) {
                std::fs::remove_file(entry.path()).map_err(|e| self.io_error(&entry.path(), e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Bytes in spill files (the store's size on disk counts them).
    pub fn bytes(&self) -> u64 {
        fn walk(dir: &Path) -> u64 {
            let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
            entries.flatten().map(|e| if e.path().is_dir() { walk(&e.path()) } else { e.metadata().map_or(0, |m| m.len()) }).sum()
        }
        walk(&self.dir)
    }
}

/// The length of the value a stored one stands for: a spilled value's file length (from its marker),
/// else its own.
pub fn value_len(tree: &'static str, key: &[u8], value: &[u8]) -> Result<u64, StoreError> {
    match is_spilled(value) {
        true => marker(tree, key, value).map(|(len, _)| len),
        false => Ok(value.len() as u64),
    }
}

/// A marker's file length and CRC32, its own checksum verified.
fn marker(tree: &'static str, key: &[u8], value: &[u8]) -> Result<(u64, u32), StoreError> {
    let payload = codec::checked(tree, key, value)?;
    payload
        .split_first_chunk::<8>()
        .and_then(|(len, rest)| Some((u64::from_be_bytes(*len), u32::from_be_bytes(*rest.first_chunk::<4>()?))))
        .ok_or_else(|| codec::damaged(tree, key, "spill marker cut short".into()))
}

/// A value as written: sled's own bytes, or a spilled value's file read whole (not copied again).
pub enum Value {
    Stored(IVec),
    Spilled(Vec<u8>),
}

impl std::ops::Deref for Value {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Value::Stored(bytes) => bytes,
            Value::Spilled(bytes) => bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_values_round_trip_through_files_and_damage_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        let tree = db.open_tree("packs").unwrap();
        let spill = Spill::new(dir.path());
        let small = spill.put("packs", b"k1", vec![1; 10]).unwrap();
        assert_eq!(small, vec![1; 10], "short values stay in sled");
        let large: Vec<u8> = (0..SPILL_FROM + 7).map(|i| i as u8).collect();
        let marker = spill.put("packs", b"k2", large.clone()).unwrap();
        assert!(is_spilled(&marker) && marker.len() < 64);
        tree.insert(b"k2", marker.clone()).unwrap();
        assert_eq!(&spill.load("packs", b"k2", IVec::from(marker.clone())).unwrap()[..], &large[..]);
        assert_eq!(value_len("packs", b"k2", &marker).unwrap(), large.len() as u64, "the marker stands for the file's length");
        // A file altered or gone is damage, named by tree and key.
        let file = dir.path().join("spill/packs").join(hex_key(b"k2"));
        std::fs::write(&file, &large[..100]).unwrap();
        assert!(matches!(spill.load("packs", b"k2", IVec::from(marker.clone())), Err(StoreError::Damaged { tree: "packs", .. })));
        std::fs::remove_file(&file).unwrap();
        assert!(matches!(spill.load("packs", b"k2", IVec::from(marker.clone())), Err(StoreError::Damaged { .. })));
        // Files no marker names (and unfinished writes) are swept; named ones stay.
        spill.put("packs", b"k2", large.clone()).unwrap();
        spill.put("packs", b"k3", large.clone()).unwrap();
        std::fs::write(dir.path().join("spill/packs/6b34.partial"), b"x").unwrap();
        assert_eq!(spill.sweep("packs", &tree).unwrap(), 2);
        assert!(file.exists() && !dir.path().join("spill/packs").join(hex_key(b"k3")).exists());
        spill.remove("packs", b"k2", &marker);
        assert!(!file.exists());
    }
}

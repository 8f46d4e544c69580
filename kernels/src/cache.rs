//! Compiled kernel modules kept on disk between runs, so a start after the first skips NVRTC. An entry
//! is named by its key (`entry::Key`: source hash, architecture, compiler version, options), written
//! whole or not at all (a temporary file in the same folder, then a rename), and used only when its
//! header and checksum hold; anything else is compiled again and replaced. The cache sits behind
//! `Store`, so its logic is tested without a GPU or a compiler.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::entry::{decode, encode, Key};

/// Where entries live.
pub trait Store: Sync {
    /// The bytes stored under `name`, `None` if there are none.
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>>;
    /// Replaces what is under `name` by `bytes`, atomically: a reader sees the old bytes or the new.
    fn write(&self, name: &str, bytes: &[u8]) -> io::Result<()>;
}

/// A folder of entry files.
pub struct DirStore {
    dir: PathBuf,
}

impl DirStore {
    pub fn new(dir: impl Into<PathBuf>) -> DirStore {
        DirStore { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Store for DirStore {
    fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
        match std::fs::read(self.dir.join(name)) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn write(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        use std::io::Write;
        static SERIAL: AtomicU64 = AtomicU64::new(0);
        std::fs::create_dir_all(&self.dir)?;
        // Unique per process and write, in the same folder (so the rename stays on one file system).
        let temp = self.dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), SERIAL.fetch_add(1, Ordering::Relaxed)));
        let written = (|| {
            let mut file = std::fs::File::create_new(&temp)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            std::fs::rename(&temp, self.dir.join(name))
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written
    }
}

/// How a module's machine code was had.
#[derive(Debug)]
pub enum Origin {
    /// Built into the binary ahead of time (`build.rs`), its key and checksum verified.
    BuiltIn,
    /// Read from the cache, its key and checksum verified.
    Cached,
    /// Compiled now. `replaced`: why an entry found under its name was not used; `unsaved`: why it
    /// could not be kept (the cache off, or the write failed).
    Compiled { replaced: Option<String>, unsaved: Option<String> },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::BuiltIn => write!(f, "built in"),
            Origin::Cached => write!(f, "cached"),
            Origin::Compiled { replaced, unsaved } => {
                write!(f, "compiled")?;
                if let Some(why) = replaced {
                    write!(f, " (entry rejected: {why})")?;
                }
                match unsaved {
                    Some(why) => write!(f, ", not kept: {why}"),
                    None => write!(f, ", kept"),
                }
            }
        }
    }
}

/// The cache, or none (`store: None`: every module compiled, nothing kept).
pub struct KernelCache<S> {
    store: Option<S>,
}

impl<S: Store> KernelCache<S> {
    pub fn new(store: Option<S>) -> KernelCache<S> {
        KernelCache { store }
    }

    pub fn store(&self) -> Option<&S> {
        self.store.as_ref()
    }

    /// The machine code for `key`: the cached entry when it is whole and was made for `key`, else
    /// `compile()`'s, then kept. `fresh`: ignore what is cached (it failed to load).
    pub fn get_or_compile<E>(&self, key: &Key, fresh: bool, compile: impl FnOnce() -> Result<Vec<u8>, E>) -> Result<(Vec<u8>, Origin), E> {
        let name = key.file_name();
        let mut replaced = None;
        if let (Some(store), false) = (&self.store, fresh) {
            match store.read(&name) {
                Ok(Some(entry)) => match decode(key, &entry) {
                    Ok(payload) => return Ok((payload.to_vec(), Origin::Cached)),
                    Err(reject) => replaced = Some(reject.to_string()),
                },
                Ok(None) => {}
                Err(e) => replaced = Some(format!("unreadable: {e}")),
            }
        } else if fresh {
            replaced = Some("did not load".to_string());
        }
        let payload = compile()?;
        let unsaved = match &self.store {
            None => Some("cache off".to_string()),
            Some(store) => store.write(&name, &encode(key, &payload)).err().map(|e| e.to_string()),
        };
        Ok((payload, Origin::Compiled { replaced, unsaved }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    #[derive(Default)]
    struct MemStore(Mutex<HashMap<String, Vec<u8>>>);

    impl Store for MemStore {
        fn read(&self, name: &str) -> io::Result<Option<Vec<u8>>> {
            Ok(self.0.lock().unwrap().get(name).cloned())
        }
        fn write(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
            self.0.lock().unwrap().insert(name.to_string(), bytes.to_vec());
            Ok(())
        }
    }

    fn key(source: &str) -> Key {
        Key::new("gemv", source, "sm_90", "nvrtc 13.0", &[])
    }

    /// A compiler that counts its calls.
    fn compiler<'a>(calls: &'a Mutex<usize>, out: &'a [u8]) -> impl FnOnce() -> Result<Vec<u8>, String> + 'a {
        move || {
            *calls.lock().unwrap() += 1;
            Ok(out.to_vec())
        }
    }

    #[test]
    fn compiles_once_then_reads_the_entry() {
        let cache = KernelCache::new(Some(MemStore::default()));
        let calls = Mutex::new(0);
        let (code, origin) = cache.get_or_compile(&key("a"), false, compiler(&calls, b"code A")).unwrap();
        assert_eq!(code, b"code A");
        assert!(matches!(origin, Origin::Compiled { replaced: None, unsaved: None }), "{origin}");
        let (code, origin) = cache.get_or_compile(&key("a"), false, compiler(&calls, b"other")).unwrap();
        assert_eq!((code.as_slice(), *calls.lock().unwrap()), (&b"code A"[..], 1));
        assert!(matches!(origin, Origin::Cached));
        // Another source is another entry.
        let (code, _) = cache.get_or_compile(&key("b"), false, compiler(&calls, b"code B")).unwrap();
        assert_eq!((code.as_slice(), *calls.lock().unwrap()), (&b"code B"[..], 2));
    }

    #[test]
    fn a_corrupt_or_foreign_entry_is_rebuilt_and_replaced() {
        let store = MemStore::default();
        let name = key("a").file_name();
        let cases: [(&str, Vec<u8>); 4] = [
            ("checksum", {
                let mut e = encode(&key("a"), b"code A");
                *e.last_mut().unwrap() ^= 1;
                e
            }),
            ("short", encode(&key("a"), b"code A")[..40].to_vec()),
            ("foreign", encode(&key("something else"), b"code X")),
            ("magic", b"garbage, not an entry at all; longer than a header........................".to_vec()),
        ];
        let cache = KernelCache::new(Some(store));
        for (what, bad) in cases {
            cache.store().unwrap().write(&name, &bad).unwrap();
            let calls = Mutex::new(0);
            let (code, origin) = cache.get_or_compile(&key("a"), false, compiler(&calls, b"code A")).unwrap();
            assert_eq!((code.as_slice(), *calls.lock().unwrap()), (&b"code A"[..], 1), "{what}");
            assert!(matches!(&origin, Origin::Compiled { replaced: Some(_), unsaved: None }), "{what}: {origin}");
            // Replaced by a good entry.
            let stored = cache.store().unwrap().read(&name).unwrap().unwrap();
            assert_eq!(decode(&key("a"), &stored), Ok(&b"code A"[..]), "{what}");
        }
    }

    #[test]
    fn fresh_recompiles_and_off_keeps_nothing() {
        let cache = KernelCache::new(Some(MemStore::default()));
        let calls = Mutex::new(0);
        cache.get_or_compile(&key("a"), false, compiler(&calls, b"v1")).unwrap();
        let (code, origin) = cache.get_or_compile(&key("a"), true, compiler(&calls, b"v2")).unwrap();
        assert_eq!((code.as_slice(), *calls.lock().unwrap()), (&b"v2"[..], 2));
        assert!(matches!(origin, Origin::Compiled { replaced: Some(_), unsaved: None }));
        let off: KernelCache<MemStore> = KernelCache::new(None);
        for _ in 0..2 {
            let (_, origin) = off.get_or_compile(&key("a"), false, compiler(&calls, b"v3")).unwrap();
            assert!(matches!(origin, Origin::Compiled { unsaved: Some(_), .. }));
        }
        assert_eq!(*calls.lock().unwrap(), 4);
        // A compile error is passed on and nothing is stored.
        let err: Result<_, String> = cache.get_or_compile(&key("z"), false, || Err("does not compile".to_string()));
        assert_eq!(err.unwrap_err(), "does not compile");
        assert!(cache.store().unwrap().read(&key("z").file_name()).unwrap().is_none());
    }

    /// A unique empty folder under the system's temporary folder.
    fn temp_dir(tag: &str) -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!("ctxscope-kcache-{tag}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn the_folder_store_writes_whole_entries_and_leaves_no_temporaries() {
        let dir = temp_dir("dir");
        let cache = KernelCache::new(Some(DirStore::new(dir.join("nested/kernels"))));
        let calls = Mutex::new(0);
        cache.get_or_compile(&key("a"), false, compiler(&calls, b"code A")).unwrap();
        let (_, origin) = cache.get_or_compile(&key("a"), false, compiler(&calls, b"code A")).unwrap();
        assert!(matches!(origin, Origin::Cached));
        // Damage the file on disk: rebuilt, and the file is whole again.
        let path = dir.join("nested/kernels").join(key("a").file_name());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.truncate(bytes.len() - 3);
        std::fs::write(&path, &bytes).unwrap();
        let (_, origin) = cache.get_or_compile(&key("a"), false, compiler(&calls, b"code A")).unwrap();
        assert!(matches!(origin, Origin::Compiled { replaced: Some(_), unsaved: None }), "{origin}");
        assert_eq!(decode(&key("a"), &std::fs::read(&path).unwrap()), Ok(&b"code A"[..]));
        let names: Vec<_> = std::fs::read_dir(dir.join("nested/kernels")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from(key("a").file_name())]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_writers_leave_one_whole_entry() {
        let dir = temp_dir("race");
        let store = DirStore::new(&dir);
        let entries: Vec<Vec<u8>> = (0..8u8).map(|i| encode(&key("a"), &vec![i; 200_000])).collect();
        std::thread::scope(|s| {
            for entry in &entries {
                let store = &store;
                s.spawn(move || {
                    for _ in 0..5 {
                        store.write("x.cubin", entry).unwrap();
                    }
                });
            }
            // Readers in the meantime never see a partial file.
            for _ in 0..50 {
                if let Some(bytes) = store.read("x.cubin").unwrap() {
                    assert!(decode(&key("a"), &bytes).is_ok());
                }
            }
        });
        let last = store.read("x.cubin").unwrap().unwrap();
        assert!(entries.contains(&last));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "temporary files left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_unwritable_folder_compiles_and_says_why_it_kept_nothing() {
        let dir = temp_dir("file");
        std::fs::create_dir_all(&dir).unwrap();
        // A file where the folder should be.
        std::fs::write(dir.join("kernels"), b"a file").unwrap();
        let cache = KernelCache::new(Some(DirStore::new(dir.join("kernels"))));
        let calls = Mutex::new(0);
        let (code, origin) = cache.get_or_compile(&key("a"), false, compiler(&calls, b"code A")).unwrap();
        assert_eq!(code, b"code A");
        assert!(matches!(origin, Origin::Compiled { unsaved: Some(_), .. }), "{origin}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

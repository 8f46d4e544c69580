//! A small tmpfs for full-disk tests: mounted under a temporary directory (root needed), unmounted
//! when dropped, and filled to its last byte on demand.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs; unmounted (lazily) when dropped, then its mount point removed.
pub struct Tmpfs {
    point: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (as `mount -o size=` takes it, e.g. "4m"). Without the privilege to
    /// mount: `None` when CTXSCOPE_SKIP_PRIVILEGED is set (the test says it skipped), else a panic
    /// that says how to skip.
    pub fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let point = dir.path().join("small");
        std::fs::create_dir(&point).expect("create the mount point");
        let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(&point).status();
        if mounted.is_ok_and(|s| s.success()) {
            return Some(Tmpfs { point, _dir: dir });
        }
        if std::env::var_os("CTXSCOPE_SKIP_PRIVILEGED").is_some() {
            eprintln!("skipped: cannot mount a tmpfs and CTXSCOPE_SKIP_PRIVILEGED is set");
            return None;
        }
        panic!("cannot mount a tmpfs for a full-disk test (needs root); set CTXSCOPE_SKIP_PRIVILEGED=1 to skip");
    }

    pub fn path(&self) -> &Path {
        &self.point
    }

    /// Resizes the mounted tmpfs (e.g. "64m").
    pub fn resize(&self, size: &str) {
        let grown = Command::new("mount").args(["-o", &format!("remount,size={size}")]).arg(&self.point).status().expect("run mount");
        assert!(grown.success(), "cannot resize the tmpfs to {size}");
    }

    /// Fills the filesystem to its last byte with a file named `name`; returns its path (remove it
    /// to give the space back).
    pub fn fill(&self, name: &str) -> PathBuf {
        let filler = self.point.join(name);
        let mut file = std::fs::File::create(&filler).expect("create the filler");
        let block = vec![7u8; 64 << 10];
        while file.write_all(&block).is_ok() {}
        while file.write_all(&block[..512]).is_ok() {}
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.point).status();
    }
}

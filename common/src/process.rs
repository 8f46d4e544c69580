//! What a live Linux process runs, read from `/proc`: its command line, the engine-related part of
//! its environment (secrets redacted), its executable and the shared objects it and its descendants
//! have mapped (each with its GNU build id when the file has one), its start time; and which process
//! listens on a TCP port. The engine fingerprint keeps these beside what the engine says over HTTP.

mod elf;
mod net;
mod stat;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Environment variables kept: those whose name starts with one of these (engine, CUDA, NCCL,
/// PyTorch, ggml, llama.cpp, Ollama, Hugging Face and OpenMP settings).
pub const ENV_PREFIXES: &[&str] = &["SGLANG_", "VLLM_", "CUDA_", "NCCL_", "TORCH_", "GGML_", "LLAMA_", "OLLAMA_", "HF_", "OMP_"];

/// [`ProcessInfo::fields`] keys that change on every restart of the same deployment: they make a new
/// fingerprint but are never a difference between two (`engine_changed` skips them).
pub const VOLATILE_FIELDS: &[&str] = &["process.pid", "process.started_unix_ms"];

/// What the kernel appends to the path of a file mapped or executed since replaced or removed.
const DELETED: &str = " (deleted)";
/// What a secret's value is replaced by.
const REDACTED: &str = "<redacted>";
/// Name parts that mark a variable or flag as a credential (compared in upper case).
const SECRET_WORDS: &[&str] = &["KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH"];
/// Bytes read of `/proc/PID/cmdline`.
const MAX_CMDLINE: u64 = 256 << 10;
/// Bytes read of `/proc/PID/environ`.
const MAX_ENVIRON: u64 = 1 << 20;
/// Bytes read of one `/proc/PID/maps`.
const MAX_MAPS: u64 = 32 << 20;
/// Shared objects kept (the first by name); a Python engine with its extension modules maps a few hundred.
const MAX_LIBS: usize = 1024;

/// A live process, as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    /// The command line; the value after a flag whose name looks secret (`--api-key`, `--hf-token`) is
    /// `<redacted>`, as is `NAME=VALUE` for such a name.
    pub argv: Vec<String>,
    /// The variables named by [`ENV_PREFIXES`], values through [`redact_env`].
    pub env: BTreeMap<String, String>,
    /// The executable's path (`/proc/PID/exe`, without the ` (deleted)` the kernel adds once the file
    /// was replaced: the process still runs what it started with); `None` when it has none (a kernel thread).
    pub exe: Option<String>,
    /// The executable's GNU build id (hex), read from the file the process runs even when the path was
    /// replaced since.
    pub exe_build_id: Option<String>,
    /// File name (`libggml-cpu.so`) -> the shared object mapped by the process or a descendant.
    pub libs: BTreeMap<String, Library>,
    /// Start time in Unix milliseconds (boot time has one-second resolution).
    pub started_unix_ms: Option<u64>,
}

/// One mapped shared object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// The path as mapped (ending in ` (deleted)` when the file was removed or replaced since).
    pub path: String,
    /// Its GNU build id (hex); `None` for a file without one or one that cannot be read (a replaced
    /// file is read through `/proc/PID/map_files`, which takes `CAP_SYS_ADMIN` or
    /// `CAP_CHECKPOINT_RESTORE`).
    pub build_id: Option<String>,
}

/// Why a process could not be read or found.
#[derive(Debug)]
pub enum ProcessError {
    /// No such process (it exited).
    Gone { pid: u32 },
    /// The process is another user's, and this one may not read it (`path` was refused).
    Denied { pid: u32, path: String },
    /// A socket listens on the port, but no process visible here holds it (another PID namespace,
    /// or another user's processes whose descriptors cannot be listed).
    Hidden { port: u16 },
    /// Any other failure to read `path`.
    Io { path: String, source: io::Error },
}

impl fmt::Display for ProcessError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProcessError::Gone { pid } => write!(f, "process {pid} is gone"),
            ProcessError::Denied { pid, path } => write!(f, "process {pid}: reading {path} is not permitted (another user's process?)"),
            ProcessError::Hidden { port } => {
                write!(f, "a socket listens on TCP port {port} but no process visible here holds it (another PID namespace or user)")
            }
            ProcessError::Io { path, source } => write!(f, "{path}: {source}"),
        }
    }
}

impl std::error::Error for ProcessError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ProcessError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl ProcessError {
    fn from_io(pid: u32, path: String, error: io::Error) -> ProcessError {
        const ESRCH: i32 = 3;
        match error.kind() {
            io::ErrorKind::NotFound => ProcessError::Gone { pid },
            _ if error.raw_os_error() == Some(ESRCH) => ProcessError::Gone { pid },
            io::ErrorKind::PermissionDenied => ProcessError::Denied { pid, path },
            _ => ProcessError::Io { path, source: error },
        }
    }
}

/// `value`, or `<redacted>` when `name` looks like a credential's (contains KEY, TOKEN, SECRET,
/// PASSWORD, PASSWD, CREDENTIAL or AUTH, in any case).
pub fn redact_env(name: &str, value: &str) -> String {
    if secret(name) {
        REDACTED.to_string()
    } else {
        value.to_string()
    }
}

fn secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SECRET_WORDS.iter().any(|w| upper.contains(w))
}

/// Reads process `pid`: command line, environment, executable, start time, and the shared objects
/// mapped by it and by its descendants (engines such as SGLang and vLLM load their kernels in worker
/// processes). Needs the right to read the process (same user, or `CAP_SYS_PTRACE`); files are
/// read through `/proc/PID/root`, so a process in another mount namespace (a container sharing
/// this one's process namespace) is read as it sees its files.
pub fn inspect(pid: u32) -> Result<ProcessInfo, ProcessError> {
    let stat_text = read_proc(pid, "stat", 4096)?;
    let stat = stat::parse_stat(&String::from_utf8_lossy(&stat_text)).ok_or_else(|| ProcessError::Io {
        path: format!("/proc/{pid}/stat"),
        source: io::Error::new(io::ErrorKind::InvalidData, "not a stat line"),
    })?;
    let argv = redact_argv(nul_separated(&read_proc(pid, "cmdline", MAX_CMDLINE)?));
    let env = nul_separated(&read_proc(pid, "environ", MAX_ENVIRON)?)
        .into_iter()
        .filter_map(|pair| pair.split_once('=').map(|(n, v)| (n.to_string(), v.to_string())))
        .filter(|(name, _)| ENV_PREFIXES.iter().any(|p| name.starts_with(p)))
        .map(|(name, value)| {
            let value = redact_env(&name, &value);
            (name, value)
        })
        .collect();
    let maps = read_proc(pid, "maps", MAX_MAPS)?;
    let exe_link = format!("/proc/{pid}/exe");
    let exe = std::fs::read_link(&exe_link).ok().map(|p| p.to_string_lossy().trim_end_matches(DELETED).to_string());
    let exe_build_id = exe.as_ref().and_then(|_| elf::build_id(Path::new(&exe_link)).ok().flatten());

    // Shared objects by file name; the same name mapped from two paths keeps the smaller path, so the
    // answer does not depend on which process was read first.
    let mut mapped: BTreeMap<String, (String, u32, String)> = BTreeMap::new();
    let mut add = |owner: u32, maps: &[u8]| {
        for (path, range) in mapped_objects(&String::from_utf8_lossy(maps)) {
            let name = Path::new(path.trim_end_matches(DELETED)).file_name().map(|n| n.to_string_lossy().into_owned());
            let Some(name) = name else { continue };
            match mapped.get(&name) {
                Some((kept, _, _)) if *kept <= path => {}
                _ => {
                    mapped.insert(name, (path, owner, range));
                }
            }
        }
    };
    add(pid, &maps);
    let parents = stat::parents(Path::new("/proc"));
    for child in stat::descendants(pid, &parents) {
        // A worker that exits meanwhile, or that this user may not read, adds nothing.
        if let Ok(maps) = read_proc(child, "maps", MAX_MAPS) {
            add(child, &maps);
        }
    }
    let libs = mapped
        .into_iter()
        .take(MAX_LIBS)
        .map(|(name, (path, owner, range))| {
            // A file replaced since it was mapped is read as mapped, where that is allowed.
            let file = match path.strip_suffix(DELETED) {
                Some(_) => format!("/proc/{owner}/map_files/{range}"),
                None => format!("/proc/{owner}/root{path}"),
            };
            let build_id = elf::build_id(Path::new(&file)).ok().flatten();
            (name, Library { path, build_id })
        })
        .collect();

    let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|t| stat::boot_time(&t));
    let started_unix_ms = boot.map(|secs| secs * 1000 + stat.start_ticks * 1000 / stat::clock_ticks());
    Ok(ProcessInfo { pid, argv, env, exe, exe_build_id, libs, started_unix_ms })
}

/// Whether any socket listens on TCP `port` (IPv4 or IPv6) in this network namespace, whoever holds
/// it (a process of another user or namespace included).
pub fn is_listening(port: u16) -> Result<bool, ProcessError> {
    Ok(!listening_sockets(port)?.is_empty())
}

/// Inodes of the sockets listening on `port`, from `/proc/net/tcp` and `/proc/net/tcp6`.
fn listening_sockets(port: u16) -> Result<BTreeSet<u64>, ProcessError> {
    let mut inodes = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        match std::fs::read_to_string(table) {
            Ok(text) => inodes.extend(net::listening_inodes(&text, port)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {} // no IPv6
            Err(source) => return Err(ProcessError::Io { path: table.to_string(), source }),
        }
    }
    Ok(inodes)
}

/// The process whose socket listens on TCP `port` (IPv4 or IPv6) in this network namespace; `None`
/// when nothing listens there. When several hold the socket (workers forked after `listen`), the one
/// whose parent does not hold it.
pub fn listening_pid(port: u16) -> Result<Option<u32>, ProcessError> {
    let inodes = listening_sockets(port)?;
    if inodes.is_empty() {
        return Ok(None);
    }
    let owners = net::socket_owners(Path::new("/proc"), &inodes).map_err(|source| ProcessError::Io { path: "/proc".into(), source })?;
    let parent = |pid: u32| {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat::parse_stat(&text).map(|s| s.ppid)
    };
    let top = owners.pids.iter().copied().find(|&pid| parent(pid).is_none_or(|p| !owners.pids.contains(&p)));
    match top.or_else(|| owners.pids.first().copied()) {
        Some(pid) => Ok(Some(pid)),
        None => Err(ProcessError::Hidden { port }),
    }
}

impl ProcessInfo {
    /// The process as fingerprint fields: `argv` (joined by single spaces), `exe`, `exe.build_id`,
    /// `env.NAME`, `lib.NAME` (the build id, else the path), `process.pid`, `process.started_unix_ms`
    /// (the last two are [`VOLATILE_FIELDS`]).
    pub fn fields(&self) -> BTreeMap<String, String> {
        let mut fields = BTreeMap::new();
        fields.insert("argv".to_string(), self.argv.join(" "));
        if let Some(exe) = &self.exe {
            fields.insert("exe".to_string(), exe.clone());
        }
        if let Some(id) = &self.exe_build_id {
            fields.insert("exe.build_id".to_string(), id.clone());
        }
        for (name, value) in &self.env {
            fields.insert(format!("env.{name}"), value.clone());
        }
        for (name, lib) in &self.libs {
            fields.insert(format!("lib.{name}"), lib.build_id.clone().unwrap_or_else(|| lib.path.clone()));
        }
        fields.insert("process.pid".to_string(), self.pid.to_string());
        if let Some(ms) = self.started_unix_ms {
            fields.insert("process.started_unix_ms".to_string(), ms.to_string());
        }
        fields
    }
}

/// Reads at most `limit` bytes of `/proc/PID/NAME`.
fn read_proc(pid: u32, name: &str, limit: u64) -> Result<Vec<u8>, ProcessError> {
    let path = format!("/proc/{pid}/{name}");
    let mut bytes = Vec::new();
    match File::open(&path).and_then(|file| file.take(limit).read_to_end(&mut bytes)) {
        Ok(_) => Ok(bytes),
        Err(error) => Err(ProcessError::from_io(pid, path, error)),
    }
}

/// NUL-terminated strings (`cmdline`, `environ`), lossily decoded.
fn nul_separated(bytes: &[u8]) -> Vec<String> {
    let bytes = bytes.strip_suffix(b"\0").unwrap_or(bytes);
    if bytes.is_empty() {
        return Vec::new();
    }
    bytes.split(|&b| b == 0).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
}

/// The file-backed mappings in `/proc/PID/maps` whose file name holds `.so`: path -> the address
/// range (`start-end`, as `/proc/PID/map_files` names it) of its first mapping.
fn mapped_objects(maps: &str) -> BTreeMap<String, String> {
    let mut paths = BTreeMap::new();
    for line in maps.lines() {
        // address perms offset dev inode, then (after padding) the path, which may hold spaces.
        let mut rest = line;
        for _ in 0..5 {
            rest = rest.trim_start();
            rest = rest.find(' ').map_or("", |end| &rest[end..]);
        }
        let path = rest.trim_start();
        let name = path.trim_end_matches(DELETED).rsplit('/').next().unwrap_or("");
        if path.starts_with('/') && name.contains(".so") {
            let range = line.split(' ').next().unwrap_or("");
            paths.entry(path.to_string()).or_insert_with(|| range.to_string());
        }
    }
    paths
}

/// The command line with credential values replaced: the argument after a flag whose name looks
/// secret (unless it is itself a flag), `--flag=VALUE` and `NAME=VALUE` for such names.
fn redact_argv(argv: Vec<String>) -> Vec<String> {
    let mut hide_next = false;
    argv.into_iter()
        .map(|arg| {
            let hide = std::mem::take(&mut hide_next);
            if hide && !arg.starts_with('-') {
                return REDACTED.to_string();
            }
            match arg.split_once('=') {
                Some((name, _)) if !name.contains('/') && secret(name) => format!("{name}={REDACTED}"),
                Some(_) => arg,
                None => {
                    hide_next = arg.starts_with('-') && secret(&arg);
                    arg
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::process::{Child, Command};
    use std::time::{SystemTime, UNIX_EPOCH};

    struct Reap(Child);

    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    fn now_ms() -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
    }

    #[test]
    fn this_process_argv_exe_libc_and_start_time() {
        let me = inspect(std::process::id()).unwrap();
        assert_eq!(me.pid, std::process::id());
        assert_eq!(me.argv, redact_argv(std::env::args().collect()));
        assert_eq!(me.exe.as_deref().map(Path::new), Some(std::env::current_exe().unwrap().as_path()));
        let (name, libc) = me.libs.iter().find(|(name, _)| name.starts_with("libc.so")).expect("libc mapped");
        let id = libc.build_id.as_deref().unwrap_or_else(|| panic!("{name} at {} has no build id", libc.path));
        assert_eq!(id.len(), 40, "{id}");
        assert_eq!(libc.build_id, elf::build_id(Path::new(&libc.path)).unwrap());
        let started = me.started_unix_ms.unwrap();
        // Boot time has one-second resolution: the start lies within a second or so of the truth.
        assert!(started <= now_ms() + 1000, "{started}");
        let fields = me.fields();
        assert_eq!(fields["argv"], me.argv.join(" "));
        assert_eq!(fields["process.pid"], std::process::id().to_string());
        assert_eq!(fields[&format!("lib.{name}")], id);
        assert!(fields.keys().filter(|k| k.starts_with("env.")).all(|k| ENV_PREFIXES.iter().any(|p| k[4..].starts_with(p))));
    }

    #[test]
    fn a_child_environment_is_filtered_and_redacted_and_its_libs_count_for_the_parent() {
        // A library this test binary maps, copied under a name nobody else maps and preloaded into a
        // child: it shows among the child's libraries and among this process's (its descendants').
        let me = inspect(std::process::id()).unwrap();
        let gcc = me.libs.iter().find(|(n, _)| n.starts_with("libgcc_s.so")).map(|(_, l)| l.clone()).expect("libgcc_s mapped");
        let dir = std::env::temp_dir().join(format!("ctxscope-process-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("libctxscope-probe.so");
        std::fs::copy(&gcc.path, &copy).unwrap();
        // The program too is a copy, to be removed while it runs.
        let sleep = dir.join("sleep");
        std::fs::copy("/bin/sleep", &sleep).unwrap();
        let before = now_ms();
        let child = Command::new(&sleep)
            .arg("30")
            .env_clear()
            .env("LD_PRELOAD", &copy)
            .env("OMP_NUM_THREADS", "3")
            .env("HF_TOKEN", "hf_secret")
            .env("CUDA_VISIBLE_DEVICES", "1")
            .env("PATH", "/usr/bin:/bin")
            .spawn()
            .unwrap();
        let child = Reap(child);
        let pid = child.0.id();
        // The preload is mapped once the dynamic loader has run.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let info = loop {
            let info = inspect(pid).unwrap();
            if info.libs.contains_key("libctxscope-probe.so") || std::time::Instant::now() > deadline {
                break info;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        assert_eq!(info.argv, [sleep.to_string_lossy().as_ref(), "30"]);
        assert_eq!(info.exe.as_deref(), sleep.to_str());
        let env: Vec<(&str, &str)> = info.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(env, [("CUDA_VISIBLE_DEVICES", "1"), ("HF_TOKEN", "<redacted>"), ("OMP_NUM_THREADS", "3")]);
        let probe = &info.libs["libctxscope-probe.so"];
        assert_eq!(probe.path, copy.to_string_lossy());
        assert_eq!(probe.build_id, gcc.build_id);
        let started = info.started_unix_ms.unwrap();
        assert!(started + 2000 >= before && started <= now_ms() + 1000, "{before} {started}");
        assert!(info.fields()["env.HF_TOKEN"] == "<redacted>");

        let parent = inspect(std::process::id()).unwrap();
        assert_eq!(parent.libs.get("libctxscope-probe.so"), Some(probe));

        // Both files removed while the child runs them: the executable keeps its path and build id
        // (read from the running file); the library is read as mapped where this user may.
        std::fs::remove_dir_all(&dir).unwrap();
        let after = inspect(pid).unwrap();
        assert_eq!((after.exe.as_deref(), &after.exe_build_id), (sleep.to_str(), &info.exe_build_id));
        let replaced = &after.libs["libctxscope-probe.so"];
        assert_eq!(replaced.path, format!("{} (deleted)", copy.display()));
        let may_read_mapped = std::fs::read_dir("/proc/self/map_files")
            .ok()
            .and_then(|mut entries| entries.next())
            .and_then(Result::ok)
            .is_some_and(|entry| File::open(entry.path()).is_ok());
        assert_eq!(replaced.build_id, if may_read_mapped { gcc.build_id.clone() } else { None });
        drop(child);
        assert!(matches!(inspect(pid), Err(ProcessError::Gone { pid: p }) if p == pid));
    }

    #[test]
    fn the_listener_of_a_port_is_this_process() {
        for addr in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = TcpListener::bind(addr) else { continue }; // no IPv6 here
            let port = listener.local_addr().unwrap().port();
            assert_eq!(listening_pid(port).unwrap(), Some(std::process::id()), "{addr}");
            drop(listener);
            assert_eq!(listening_pid(port).unwrap(), None, "{addr} after close");
        }
        // A connected (not listening) socket is not a listener.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let client_port = client.local_addr().unwrap().port();
        assert_eq!(listening_pid(client_port).unwrap(), None);
    }

    #[test]
    fn secrets_are_redacted_in_env_and_argv() {
        for name in ["HF_TOKEN", "OPENAI_API_KEY", "vllm_api_key", "DB_PASSWORD", "SSH_PASSWD", "AWS_SECRET", "GCP_CREDENTIALS", "HF_AUTH"]
        {
            assert_eq!(redact_env(name, "v"), "<redacted>", "{name}");
        }
        for name in ["CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "LLAMA_ARG_CTX_SIZE"] {
            assert_eq!(redact_env(name, "v"), "v", "{name}");
        }
        let argv: Vec<String> =
            ["vllm", "serve", "m", "--api-key", "sk-1", "--hf-token=hf_2", "HF_TOKEN=hf_3", "--port", "8000", "--ssl-keyfile", "--x"]
                .map(String::from)
                .to_vec();
        assert_eq!(
            redact_argv(argv),
            [
                "vllm",
                "serve",
                "m",
                "--api-key",
                "<redacted>",
                "--hf-token=<redacted>",
                "HF_TOKEN=<redacted>",
                "--port",
                "8000",
                "--ssl-keyfile",
                "--x"
            ]
        );
    }

    #[test]
    fn maps_lines_give_shared_object_paths() {
        let maps = "\
55d0c0a00000-55d0c0a02000 r--p 00000000 08:01 131 /usr/bin/llama-server
7f0000000000-7f0000001000 r-xp 00000000 08:01 77                         /opt/llama/lib/libggml-cpu.so
7f0000002000-7f0000003000 r--p 00000000 08:01 78                         /usr/lib/libc.so.6
7f0000004000-7f0000005000 r--p 00000000 08:01 79                         /opt/my libs/libx.so (deleted)
7f0000006000-7f0000007000 rw-p 00000000 00:00 0                          [heap]
7f0000008000-7f0000009000 rw-s 00000000 00:05 80                         /dev/shm/not-a-lib
7f000000a000-7f000000b000 r--p 00000000 08:01 81                         /usr/lib/python3/m.cpython-311-x86_64-linux-gnu.so
";
        let paths: Vec<(String, String)> = mapped_objects(maps).into_iter().collect();
        let want = [
            ("/opt/llama/lib/libggml-cpu.so", "7f0000000000-7f0000001000"),
            ("/opt/my libs/libx.so (deleted)", "7f0000004000-7f0000005000"),
            ("/usr/lib/libc.so.6", "7f0000002000-7f0000003000"),
            ("/usr/lib/python3/m.cpython-311-x86_64-linux-gnu.so", "7f000000a000-7f000000b000"),
        ];
        assert_eq!(paths, want.map(|(p, r)| (p.to_string(), r.to_string())));
        assert_eq!(nul_separated(b"a\0b c\0\0d\0"), ["a", "b c", "", "d"]);
        assert!(nul_separated(b"").is_empty());
    }
}

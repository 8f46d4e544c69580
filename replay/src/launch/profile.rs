//! Launch profiles: the operator's TOML description of how to start an engine, when it is ready, how
//! to stop it and which named suspects (toggles: extra arguments and/or environment) it can run with.
//! Everything is checked at load: unknown keys, toggles that name nothing, a program that is not
//! there, a port that is neither `{port}` nor fixed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default seconds to wait for readiness (model loads are slow).
const READY_TIMEOUT_S: f64 = 300.0;
/// Default seconds between the stop signal and KILL.
const STOP_GRACE_S: f64 = 20.0;

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("cannot read launch profile {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("launch profile {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("launch profile {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("launch profile {path} has no toggle `{toggle}` (it has: {known})")]
    UnknownToggle { path: PathBuf, toggle: String, known: String },
}

/// The file as written (every key known; anything else is an error).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    command: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    model: Option<String>,
    /// A port the engine always takes (when `{port}` cannot be passed).
    port: Option<u16>,
    parallel: Option<usize>,
    #[serde(default)]
    ready: Ready,
    #[serde(default)]
    stop: Stop,
    #[serde(default)]
    toggles: BTreeMap<String, Toggle>,
}

/// When a launched engine is ready: `GET path` answers 200.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    #[serde(default = "default_ready_path")]
    pub path: String,
    #[serde(default = "default_ready_timeout")]
    pub timeout_s: f64,
}

impl Default for Ready {
    fn default() -> Ready {
        Ready { path: default_ready_path(), timeout_s: READY_TIMEOUT_S }
    }
}

fn default_ready_path() -> String {
    "/health".into()
}

fn default_ready_timeout() -> f64 {
    READY_TIMEOUT_S
}

/// How a launched engine is stopped: `signal` to its process group, KILL after `grace_s`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stop {
    #[serde(default = "default_signal")]
    pub signal: String,
    #[serde(default = "default_grace")]
    pub grace_s: f64,
}

impl Default for Stop {
    fn default() -> Stop {
        Stop { signal: default_signal(), grace_s: STOP_GRACE_S }
    }
}

fn default_signal() -> String {
    "TERM".into()
}

fn default_grace() -> f64 {
    STOP_GRACE_S
}

/// One named suspect.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Toggle {
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// A one-line note shown in reports.
    pub description: Option<String>,
}

/// A loaded, checked profile.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    /// The file it was read from.
    pub path: PathBuf,
    /// The file's stem (`llama-server` for `deploy/profiles/llama-server.toml`): the golden's name.
    pub name: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    pub model: Option<String>,
    pub port: Option<u16>,
    pub parallel: usize,
    pub ready: Ready,
    pub stop: Stop,
    pub toggles: BTreeMap<String, Toggle>,
}

/// What one configuration runs: the profile with its toggles applied and the placeholders filled.
#[derive(Debug, Clone, PartialEq)]
pub struct Configuration {
    pub argv: Vec<String>,
    /// The profile's and the toggles' variables only (the rest is inherited).
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    pub host: String,
    pub port: u16,
}

/// The host every launched engine is reached on.
pub const HOST: &str = "127.0.0.1";

/// The signals a profile may name.
pub const SIGNALS: [(&str, i32); 5] =
    [("TERM", libc::SIGTERM), ("INT", libc::SIGINT), ("HUP", libc::SIGHUP), ("QUIT", libc::SIGQUIT), ("KILL", libc::SIGKILL)];

impl Profile {
    /// Reads and checks a profile. `${NAME}` and `${NAME:-default}` are taken from this process's
    /// environment (an unset one without a default is an error).
    pub fn load(path: &Path) -> Result<Profile, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read { path: path.to_path_buf(), source })?;
        Profile::parse(path, &text, &|name| std::env::var(name).ok())
    }

    /// [`Profile::load`] from text, with `lookup` standing in for the environment.
    pub fn parse(path: &Path, text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Profile, ProfileError> {
        let invalid = |message: String| ProfileError::Invalid { path: path.to_path_buf(), message };
        let file: File = toml::from_str(text).map_err(|e| ProfileError::Parse { path: path.to_path_buf(), message: e.to_string() })?;
        let expand = |value: &str| expand_env(value, lookup).map_err(&invalid);
        let command = file.command.iter().map(|a| expand(a)).collect::<Result<Vec<_>, _>>()?;
        let env = expand_map(&file.env, &expand)?;
        let model = file.model.as_deref().map(expand).transpose()?;
        let cwd = file.cwd.as_ref().map(|c| expand(&c.to_string_lossy()).map(PathBuf::from)).transpose()?;
        let mut toggles = BTreeMap::new();
        for (name, toggle) in &file.toggles {
            if toggle.args.is_empty() && toggle.env.is_empty() {
                return Err(invalid(format!("toggle `{name}` names nothing: give it args = [...] and/or env = {{ ... }}")));
            }
            if !valid_toggle_name(name) {
                return Err(invalid(format!("toggle name `{name}` must be letters, digits, `_`, `-` or `.`")));
            }
            let args = toggle.args.iter().map(|a| expand(a)).collect::<Result<Vec<_>, _>>()?;
            toggles.insert(name.clone(), Toggle { args, env: expand_map(&toggle.env, &expand)?, description: toggle.description.clone() });
        }
        let name = path.file_stem().map_or_else(|| "launch".to_string(), |s| s.to_string_lossy().into_owned());
        let profile = Profile {
            path: path.to_path_buf(),
            name,
            command,
            env,
            cwd,
            model,
            port: file.port,
            parallel: file.parallel.unwrap_or(1),
            ready: file.ready,
            stop: file.stop,
            toggles,
        };
        profile.check().map_err(invalid)?;
        Ok(profile)
    }

    fn check(&self) -> Result<(), String> {
        let Some(program) = self.command.first() else { return Err("`command` is empty: give the argv, program first".into()) };
        if program.is_empty() {
            return Err("`command`'s program is empty".into());
        }
        if self.parallel == 0 {
            return Err("`parallel` must be at least 1".into());
        }
        if !self.ready.path.starts_with('/') {
            return Err(format!("[ready] path `{}` must start with `/`", self.ready.path));
        }
        if !(self.ready.timeout_s.is_finite() && self.ready.timeout_s > 0.0) {
            return Err(format!("[ready] timeout_s must be a positive number of seconds, got {}", self.ready.timeout_s));
        }
        if !(self.stop.grace_s.is_finite() && self.stop.grace_s >= 0.0) {
            return Err(format!("[stop] grace_s must be 0 or more seconds, got {}", self.stop.grace_s));
        }
        signal_number(&self.stop.signal)?;
        let texts = || self.all_texts();
        if texts().any(|t| t.contains("{model}")) && self.model.is_none() {
            return Err("`{model}` is used but the profile has no `model`".into());
        }
        let takes_port = texts().any(|t| t.contains("{port}"));
        match (takes_port, self.port) {
            (false, None) => {
                return Err(
                    "the engine's port is unknown: pass `{port}` in `command` or `env` (ctxscope picks a free one), or set `port = N`"
                        .into(),
                )
            }
            (true, Some(port)) => return Err(format!("give either `{{port}}` or `port = {port}`, not both")),
            _ => {}
        }
        if self.parallel > 1 && self.port.is_some() {
            return Err("`parallel` above 1 needs `{port}`: a fixed port serves one launch at a time".into());
        }
        if let Some(cwd) = &self.cwd {
            if !cwd.is_dir() {
                return Err(format!("`cwd` {} is not a directory", cwd.display()));
            }
        }
        find_program(program, self.cwd.as_deref(), self.env.get("PATH").map(String::as_str))?;
        Ok(())
    }

    /// Every text placeholders may sit in.
    fn all_texts(&self) -> impl Iterator<Item = &String> {
        self.command.iter().chain(self.env.values()).chain(self.toggles.values().flat_map(|t| t.args.iter().chain(t.env.values())))
    }

    /// Checks toggle names against the profile.
    pub fn check_toggles(&self, toggles: &[String]) -> Result<(), ProfileError> {
        for toggle in toggles {
            if !self.toggles.contains_key(toggle) {
                let known = self.toggles.keys().cloned().collect::<Vec<_>>().join(", ");
                return Err(ProfileError::UnknownToggle { path: self.path.clone(), toggle: toggle.clone(), known });
            }
        }
        Ok(())
    }

    /// The configuration with these toggles (checked) on `port`: toggles' args appended in the order
    /// given, their env merged over the profile's.
    pub fn configuration(&self, toggles: &[String], port: u16) -> Result<Configuration, ProfileError> {
        self.check_toggles(toggles)?;
        let mut argv = self.command.clone();
        let mut env = self.env.clone();
        for toggle in toggles.iter().map(|t| &self.toggles[t]) {
            argv.extend(toggle.args.iter().cloned());
            env.extend(toggle.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let port = self.port.unwrap_or(port);
        let fill = |text: &str| fill(text, port, self.model.as_deref());
        Ok(Configuration {
            argv: argv.iter().map(|a| fill(a)).collect(),
            env: env.iter().map(|(k, v)| (k.clone(), fill(v))).collect(),
            cwd: self.cwd.clone(),
            host: HOST.to_string(),
            port,
        })
    }

    pub fn ready_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.ready.timeout_s)
    }

    pub fn stop_grace(&self) -> Duration {
        Duration::from_secs_f64(self.stop.grace_s)
    }

    pub fn stop_signal(&self) -> i32 {
        signal_number(&self.stop.signal).unwrap_or(libc::SIGTERM)
    }
}

fn valid_toggle_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn expand_map(
    map: &BTreeMap<String, String>,
    expand: &dyn Fn(&str) -> Result<String, ProfileError>,
) -> Result<BTreeMap<String, String>, ProfileError> {
    map.iter().map(|(k, v)| Ok((k.clone(), expand(v)?))).collect()
}

/// `{port}`, `{host}` and `{model}` filled in; any other braces are left as written (JSON arguments).
fn fill(text: &str, port: u16, model: Option<&str>) -> String {
    let text = text.replace("{port}", &port.to_string()).replace("{host}", HOST);
    match model {
        Some(model) => text.replace("{model}", model),
        None => text,
    }
}

/// `${NAME}` and `${NAME:-default}` from `lookup`; `$$` is a literal `$`.
fn expand_env(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        let Some(body) = after.strip_prefix('{') else {
            out.push('$');
            rest = after;
            continue;
        };
        let end = body.find('}').ok_or_else(|| format!("`${{` without a closing `}}` in `{text}`"))?;
        let (name, default) = match body[..end].split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (&body[..end], None),
        };
        match (lookup(name).filter(|v| !v.is_empty()), default) {
            (Some(value), _) => out.push_str(&value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => return Err(format!("`${{{name}}}` is used but the environment variable {name} is not set")),
        }
        rest = &body[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn signal_number(name: &str) -> Result<i32, String> {
    let bare = name.trim().trim_start_matches("SIG");
    SIGNALS.iter().find(|(n, _)| n.eq_ignore_ascii_case(bare)).map(|(_, s)| *s).ok_or_else(|| {
        let known = SIGNALS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
        format!("[stop] signal `{name}` is not one of {known}")
    })
}

/// The program as it will be run: a path (relative to `cwd`) that exists and is executable, or a
/// name found on `PATH` (the profile's, else this process's).
fn find_program(program: &str, cwd: Option<&Path>, path_var: Option<&str>) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if program.contains('/') {
        let path = match cwd {
            Some(dir) if !Path::new(program).is_absolute() => dir.join(program),
            _ => PathBuf::from(program),
        };
        return if executable(&path) {
            Ok(path)
        } else if path.exists() {
            Err(format!("the program {} is not executable", path.display()))
        } else {
            Err(format!("the program {} does not exist", path.display()))
        };
    }
    let search = path_var.map(str::to_string).or_else(|| std::env::var("PATH").ok()).unwrap_or_default();
    std::env::split_paths(&search)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
        .ok_or_else(|| format!("the program `{program}` is not on PATH ({search})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
command = ["sh", "-c", "exec sleep 100", "--port", "{port}", "-m", "{model}"]
env = { CUDA_VISIBLE_DEVICES = "0", LISTEN = "{host}:{port}" }
model = "${MODEL_DIR:-/models}/x.gguf"
[ready]
path = "/health"
timeout_s = 30
[stop]
signal = "INT"
grace_s = 2
[toggles.kv_q4]
args = ["-ctk", "q4_0", "-ctv", "q4_0"]
description = "4-bit KV cache"
[toggles.mma]
env = { SGLANG_SM120_MMA_FLASHMLA = "1" }
"#;

    fn parse(text: &str) -> Result<Profile, ProfileError> {
        Profile::parse(Path::new("/p/llama.toml"), text, &|name| (name == "SET").then(|| "value".to_string()))
    }

    #[test]
    fn a_full_profile_loads_and_fills_its_placeholders() {
        let p = parse(GOOD).unwrap();
        assert_eq!(p.name, "llama");
        assert_eq!(p.model.as_deref(), Some("/models/x.gguf"));
        assert_eq!((p.stop_signal(), p.stop_grace()), (libc::SIGINT, Duration::from_secs(2)));
        let c = p.configuration(&["mma".into(), "kv_q4".into()], 4242).unwrap();
        assert_eq!(c.argv[3..], ["--port", "4242", "-m", "/models/x.gguf", "-ctk", "q4_0", "-ctv", "q4_0"]);
        assert_eq!(c.env["LISTEN"], "127.0.0.1:4242");
        assert_eq!(c.env["SGLANG_SM120_MMA_FLASHMLA"], "1");
        assert_eq!(c.env["CUDA_VISIBLE_DEVICES"], "0");
        let golden = p.configuration(&[], 4243).unwrap();
        assert_eq!(golden.argv.len(), 7);
        assert!(!golden.env.contains_key("SGLANG_SM120_MMA_FLASHMLA"));
    }

    #[test]
    fn bad_profiles_are_named_errors() {
        let cases: [(&str, &str); 12] = [
            ("command = [\"sh\", \"{port}\"]\ncolour = 1", "unknown field `colour`"),
            ("command = [\"sh\", \"{port}\"]\n[ready]\npath = \"/h\"\ninterval = 2", "unknown field `interval`"),
            ("command = [\"sh\", \"{port}\"]\n[toggles.empty]\n", "names nothing"),
            ("command = [\"sh\", \"{port}\"]\n[toggles.x]\nflags = [\"-a\"]", "unknown field `flags`"),
            ("command = []", "`command` is empty"),
            ("command = [\"no-such-engine-binary-xyz\", \"{port}\"]", "is not on PATH"),
            ("command = [\"/nonexistent/engine\", \"{port}\"]", "does not exist"),
            ("command = [\"sh\"]", "port is unknown"),
            ("command = [\"sh\", \"{port}\"]\nport = 80", "not both"),
            ("command = [\"sh\", \"{model}\", \"{port}\"]", "has no `model`"),
            ("command = [\"sh\", \"${UNSET_VAR}\", \"{port}\"]", "UNSET_VAR is not set"),
            ("command = [\"sh\", \"{port}\"]\n[stop]\nsignal = \"USR9\"", "is not one of"),
        ];
        for (text, expected) in cases {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(expected), "{text:?}: {e}");
            assert!(e.contains("/p/llama.toml"), "{e}");
        }
        let p = parse(GOOD).unwrap();
        let e = p.configuration(&["kv_q8".into()], 1).unwrap_err().to_string();
        assert!(e.contains("no toggle `kv_q8`") && e.contains("kv_q4, mma"), "{e}");
    }

    #[test]
    fn environment_expansion() {
        let lookup = |name: &str| (name == "A").then(|| "alpha".to_string());
        assert_eq!(expand_env("x${A}y", &lookup).unwrap(), "xalphay");
        assert_eq!(expand_env("${B:-beta}", &lookup).unwrap(), "beta");
        assert_eq!(expand_env("$$A $A {\"json\": 1}", &lookup).unwrap(), "$A $A {\"json\": 1}");
        assert!(expand_env("${B}", &lookup).is_err());
        assert!(expand_env("${A", &lookup).is_err());
        assert_eq!(fill("--json={\"a\":1} {port}", 9, None), "--json={\"a\":1} 9");
    }
}

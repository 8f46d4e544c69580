//! The engine's own store of Responses API responses (`--responses-store DIR`): a sled tree, on disk so
//! that `previous_response_id` works across restarts. Each response id maps to the chat messages a
//! response chained to it stands on: its context (less its `instructions`, which are not carried
//! over), its input and its reply.

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

    /// The messages a response chained to `id` stands on, if `id` was stored.
    pub fn get(&self, id: &str) -> Result<Option<Vec<Value>>, ResponseStoreError> {
        match self.tree.get(id.as_bytes())? {
            Some(bytes) => {
                serde_json::from_slice(&bytes).map(Some).map_err(|source| ResponseStoreError::Decode { id: id.to_string(), source })
            }
            None => Ok(None),
        }
    }

    pub fn put(&self, id: &str, messages: &[Value]) -> Result<(), ResponseStoreError> {
        let bytes = serde_json::to_vec(messages).map_err(|source| ResponseStoreError::Decode { id: id.to_string(), source })?;
        self.tree.insert(id.as_bytes(), bytes)?;
        Ok(())
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

    #[test]
    fn responses_survive_a_reopen() {
        let dir = std::env::temp_dir().join(format!("ctxscope-response-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let messages = vec![json!({"role": "user", "content": "hi"}), json!({"role": "assistant", "content": "hello"})];
        {
            let store = ResponseStore::open(&dir).unwrap();
            store.put("resp_1", &messages).unwrap();
            store.flush();
        }
        let store = ResponseStore::open(&dir).unwrap();
        assert_eq!(store.get("resp_1").unwrap(), Some(messages));
        assert_eq!(store.get("resp_2").unwrap(), None);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

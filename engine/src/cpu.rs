//! The CPU backend: the host forward pass ([`forward_patched`]) behind the [`Backend`] trait, with the
//! host [`KvCache`] as each sequence's cache. It always returns logits (the host samples greedy too),
//! so the scheduler computes exactly what it did before backends existed.

use std::sync::Arc;

use crate::backend::{Backend, BackendError, Output, SequenceKv, Step};
use crate::forward::{forward_patched, Path, Segment};
use crate::kv::KvCache;
use crate::model::Model;
use crate::patch::PatchSet;

/// The model on the host CPU.
pub struct CpuBackend {
    model: Arc<Model>,
}

impl CpuBackend {
    pub fn new(model: Arc<Model>) -> CpuBackend {
        CpuBackend { model }
    }
}

impl SequenceKv for KvCache {
    fn len(&self) -> usize {
        KvCache::len(self)
    }

    fn prefix(&self, len: usize) -> Result<KvCache, BackendError> {
        Ok(KvCache::prefix(self, len))
    }
}

impl Backend for CpuBackend {
    type Kv = KvCache;

    fn name(&self) -> String {
        "cpu".into()
    }

    fn new_kv(&mut self) -> Result<KvCache, BackendError> {
        let c = &self.model.config;
        Ok(KvCache::new(c.n_layers, c.kv_dim()))
    }

    fn forward(&mut self, path: Path, patches: &PatchSet, steps: &mut [Step<'_, KvCache>]) -> Result<Vec<Output>, BackendError> {
        let mut segments: Vec<Segment<'_>> = steps.iter_mut().map(|s| Segment { tokens: s.tokens, kv: &mut *s.kv }).collect();
        Ok(forward_patched(&self.model, path, patches, &mut segments).into_iter().map(Output::Logits).collect())
    }
}

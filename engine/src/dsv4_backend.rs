//! DeepSeek-V4 behind the [`Backend`] trait: the forward pass on the CPU (golden; the fast path's
//! bf16 products computed on the host), or its products on a GPU (f32 golden, bf16 fast;
//! `crate::device::Dsv4Products`). A sequence's cache is its decoding
//! state (each layer's window of raw entries, closed compressed blocks, indexer keys and the rows of
//! the blocks still open), which cannot be cut back to an earlier length (the window has slid,
//! blocks have closed). So a sequence keeps two states the prefix cache can hand on: its whole
//! state, and a copy taken where its prompt ended (before the reply), which the next turn of a
//! conversation extends even when the reply does not re-tokenize to the ids generated or the chat
//! format renders it otherwise (DeepSeek's drops the thinking). A prompt sharing less than either is
//! computed from the start.

use std::sync::Arc;

use crate::backend::{Backend, BackendError, Output, SequenceKv, Step};
use crate::forward::deepseek_v4::{DeepseekV4Model, DeepseekV4State};
use crate::forward::dsv4_products::{Host, HostBf16, Products};
use crate::patch::PatchSet;
use crate::path::Path;

const NAME: &str = "cpu";

/// The DeepSeek-V4 model on the host CPU, or with its products on a GPU.
pub struct DeepseekV4Backend {
    model: Arc<DeepseekV4Model>,
    /// Where the golden path's products are computed.
    golden: Arc<dyn Products>,
    /// The fast path's (bf16 products: on a GPU, or their numbers on the host, which is no faster
    /// than golden there but replays what a bf16 deployment computes).
    fast: Arc<dyn Products>,
    name: &'static str,
}

impl DeepseekV4Backend {
    pub fn new(model: Arc<DeepseekV4Model>) -> DeepseekV4Backend {
        DeepseekV4Backend { model, golden: Arc::new(Host), fast: Arc::new(HostBf16), name: NAME }
    }

    /// The model with its products on GPU `ordinal`: f32 for the golden path, bf16 for the fast one
    /// (`crate::device::Dsv4Products`), every matrix uploaded now in both precisions (a model too
    /// large for the device fails here, not in a request); the rest of each pass on the host.
    #[cfg(feature = "cuda")]
    pub fn on_device(model: Arc<DeepseekV4Model>, ordinal: usize) -> Result<DeepseekV4Backend, BackendError> {
        use crate::device::Dsv4Products;
        let matrices = model.product_matrices();
        let open = |bf16| -> Result<Arc<dyn Products>, BackendError> {
            let products = Dsv4Products::open(ordinal, bf16).map_err(|e| BackendError::new("cuda", format!("GPU {ordinal}: {e}")))?;
            products.prepare(&matrices).map_err(|e| BackendError::new("cuda", e))?;
            Ok(Arc::new(products))
        };
        let (golden, fast) = (open(false)?, open(true)?);
        Ok(DeepseekV4Backend { model, golden, fast, name: "cuda" })
    }
}

/// One sequence's decoding state (made on its first step, under that step's patches) and a copy of
/// it where its last multi-token step (the prompt) ended.
#[derive(Clone, Default)]
pub struct DeepseekV4Kv {
    state: Option<DeepseekV4State>,
    prompt_end: Option<DeepseekV4State>,
}

impl DeepseekV4Kv {
    fn fresh(state: DeepseekV4State) -> DeepseekV4Kv {
        DeepseekV4Kv { state: Some(state), prompt_end: None }
    }
}

impl SequenceKv for DeepseekV4Kv {
    fn len(&self) -> usize {
        self.state.as_ref().map_or(0, DeepseekV4State::len)
    }

    fn reusable(&self, len: usize) -> usize {
        let prompt_end = self.prompt_end.as_ref().map_or(0, DeepseekV4State::len);
        if len >= self.len() {
            self.len()
        } else if len >= prompt_end {
            prompt_end
        } else {
            0
        }
    }

    fn prefix(&self, len: usize) -> Result<DeepseekV4Kv, BackendError> {
        match (len, &self.state, &self.prompt_end) {
            (0, _, _) => Ok(DeepseekV4Kv::default()),
            (n, Some(state), _) if n == state.len() => Ok(DeepseekV4Kv::fresh(state.clone())),
            (n, _, Some(prompt)) if n == prompt.len() => Ok(DeepseekV4Kv::fresh(prompt.clone())),
            (n, _, _) => Err(BackendError::new(NAME, format!("a DeepSeek-V4 state of {} positions cannot be cut back to {n}", self.len()))),
        }
    }
}

impl Backend for DeepseekV4Backend {
    type Kv = DeepseekV4Kv;

    fn name(&self) -> String {
        self.name.into()
    }

    fn new_kv(&mut self) -> Result<DeepseekV4Kv, BackendError> {
        Ok(DeepseekV4Kv::default())
    }

    fn forward(&mut self, path: Path, patches: &PatchSet, steps: &mut [Step<'_, DeepseekV4Kv>]) -> Result<Vec<Output>, BackendError> {
        let products = match path {
            Path::Golden => self.golden.clone(),
            Path::Fast => self.fast.clone(),
        };
        let mut outputs = Vec::with_capacity(steps.len());
        for step in steps.iter_mut() {
            let state = step.kv.state.get_or_insert_with(|| self.model.state_on(patches, products.clone()));
            if state.patches() != patches {
                return Err(BackendError::new(self.name, "a DeepSeek-V4 state is continued only under the patches it was made with"));
            }
            if !Arc::ptr_eq(state.products(), &products) {
                return Err(BackendError::new(self.name, "a DeepSeek-V4 state is continued only on the path it was made on"));
            }
            let vocab = self.model.config.vocab_size;
            if let Some(token) = step.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(BackendError::new(self.name, format!("token {token} is outside the vocabulary of {vocab}")));
            }
            let Some((&last, before)) = step.tokens.split_last() else {
                return Err(BackendError::new(self.name, "a step with no tokens"));
            };
            // Only the last token's logits are returned: the others skip the output head. A device
            // failing mid-pass panics in its executor (`Products` returns numbers only).
            let model = &self.model;
            let logits = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                model.advance(state, before);
                model.step(state, last)
            }))
            .map_err(|panic| {
                let why = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
                step.kv.state = None;
                BackendError::new(self.name, why.unwrap_or_else(|| "the pass failed".into()))
            })?;
            outputs.push(Output::Logits(logits));
            if !before.is_empty() {
                step.kv.prompt_end = step.kv.state.clone();
            }
        }
        Ok(outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Want;
    use crate::forward::testutil::tiny;

    fn forward(backend: &mut DeepseekV4Backend, kv: &mut DeepseekV4Kv, tokens: &[u32], patches: &PatchSet) -> Vec<f32> {
        let mut steps = [Step { tokens, kv, want: Want::Logits }];
        match backend.forward(Path::Golden, patches, &mut steps).unwrap().remove(0) {
            Output::Logits(logits) => logits,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_reused_state_continues_exactly_and_is_never_cut() {
        let model = Arc::new(DeepseekV4Model::load(&tiny::dir()).unwrap());
        let mut backend = DeepseekV4Backend::new(model.clone());
        let tokens: Vec<u32> = (0..40).map(|i| (i * 37 % 256) as u32).collect();
        let golden = PatchSet::default();
        let whole = model.logits(&tokens, &golden);
        // A first request of 30 tokens, then a second extending it: the state is handed on whole.
        let mut kv = backend.new_kv().unwrap();
        forward(&mut backend, &mut kv, &tokens[..30], &golden);
        assert_eq!(kv.reusable(30), 30);
        assert_eq!(kv.reusable(29), 0, "a shorter prefix is not reusable");
        assert!(kv.prefix(29).is_err());
        let mut reused = kv.prefix(30).unwrap();
        let logits = forward(&mut backend, &mut reused, &tokens[30..], &golden);
        assert_eq!(logits, whole[39], "continued state equals the one-pass logits bit for bit");
        // Decoded on past its prompt, the sequence still hands on its prompt's end.
        for pos in 30..34 {
            forward(&mut backend, &mut kv, &tokens[pos..=pos], &golden);
        }
        assert_eq!((kv.len(), kv.reusable(40), kv.reusable(33), kv.reusable(31), kv.reusable(29)), (34, 34, 30, 30, 0));
        let mut from_prompt = kv.prefix(30).unwrap();
        assert_eq!(forward(&mut backend, &mut from_prompt, &tokens[30..], &golden), whole[39]);
        // Another patch set cannot continue a golden state.
        let patched = PatchSet::parse("mhc_bf16").unwrap();
        let mut steps = [Step { tokens: &tokens[..1], kv: &mut kv, want: Want::Logits }];
        assert!(backend.forward(Path::Golden, &patched, &mut steps).is_err());
        // Nor can the fast path (bf16 products, on the host here), which answers a sequence of its own.
        let mut steps = [Step { tokens: &tokens[..1], kv: &mut kv, want: Want::Logits }];
        assert!(backend.forward(Path::Fast, &golden, &mut steps).is_err(), "a golden state continued on the fast path");
        let mut fresh = backend.new_kv().unwrap();
        let mut steps = [Step { tokens: &tokens[..40], kv: &mut fresh, want: Want::Logits }];
        let Output::Logits(fast) = backend.forward(Path::Fast, &golden, &mut steps).unwrap().remove(0) else { panic!("logits asked") };
        assert_eq!(fresh.len(), 40);
        assert_ne!(fast, whole[39], "the fast path computed golden's bits");
        assert!(tiny::rel_l2(&fast, &whole[39]) < 3e-2, "the fast path is {:e} from golden", tiny::rel_l2(&fast, &whole[39]));
    }
}

//! DeepSeek-V4's mixture of experts, golden f32, one token at a time: router scores
//! (`sqrtsoftplus`, `sigmoid` or `softmax` of the gate's logits), the experts picked either by the
//! router's top-k of score plus correction bias (`moe` layers) or by the fixed token-to-experts table
//! (`hash_moe` layers), their weights normalised and scaled, each expert a SwiGLU with clamped
//! pre-activations, plus the shared expert. As transformers' `DeepseekV4SparseMoeBlock` computes it;
//! [`MoeSettings`] carries the `moe_router_bf16` and `moe_topk` patches.

use ctxscope_numerics::round::bf16_slice;
use ctxscope_numerics::{dot, matvec_bf16};

use super::dsv4_products::Products;

/// One SwiGLU expert: `w1` (gate) and `w3` (up) rows of the width, `w2` (down) rows of the expert width.
pub struct Expert<'a> {
    pub w1: &'a [f32],
    pub w2: &'a [f32],
    pub w3: &'a [f32],
}

/// How a layer picks its experts.
pub enum Routing<'a> {
    /// Top-k of score + `bias` (the `moe` layers).
    TopK { bias: &'a [f32] },
    /// The first `top_k` of `table[token * width .. (token + 1) * width]` (the `hash_moe` layers'
    /// `tid2eid`, `width` = the checkpoint's `num_experts_per_tok` experts per token).
    Hash { table: &'a [i64], width: usize },
}

/// The router's scoring function (`scoring_func`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scoring {
    SqrtSoftplus,
    Sigmoid,
    Softmax,
}

impl Scoring {
    pub fn parse(name: &str) -> Option<Scoring> {
        match name {
            "sqrtsoftplus" => Some(Scoring::SqrtSoftplus),
            "sigmoid" => Some(Scoring::Sigmoid),
            "softmax" => Some(Scoring::Softmax),
            _ => None,
        }
    }

    fn scores(self, logits: &[f32]) -> Vec<f32> {
        match self {
            // torch's softplus: log(1 + e^x), and x itself above 20.
            Scoring::SqrtSoftplus => logits.iter().map(|&x| if x > 20.0 { x } else { x.exp().ln_1p() }.sqrt()).collect(),
            Scoring::Sigmoid => logits.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect(),
            Scoring::Softmax => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = logits.iter().map(|x| (x - max).exp()).collect();
                let sum: f32 = exps.iter().sum();
                exps.iter().map(|e| e / sum).collect()
            }
        }
    }
}

/// A MoE layer's weights.
pub struct MoeWeights<'a> {
    /// The router's rows, one per expert, of the width.
    pub gate: &'a [f32],
    pub routing: Routing<'a>,
    pub experts: Vec<Expert<'a>>,
    pub shared: Option<Expert<'a>>,
}

/// A model's MoE settings.
#[derive(Debug, Clone, Copy)]
pub struct MoeSettings {
    /// Experts per token (`num_experts_per_tok`, or `moe_topk`); a hash layer takes at most its width.
    pub top_k: usize,
    pub scoring: Scoring,
    pub routed_scaling: f32,
    /// Gate pre-activations are clamped above at this, up pre-activations to ± it.
    pub swiglu_limit: f32,
    /// `moe_router_bf16`: the input row and the gate rows in bf16, the logits rounded to bf16 before
    /// the scoring function, the scores rounded to bf16 before the top-k and the weights.
    pub router_bf16: bool,
}

/// The experts `x` (token `token`) goes to and their weights.
pub fn route(x: &[f32], token: u32, w: &MoeWeights<'_>, s: MoeSettings) -> Vec<(usize, f32)> {
    let logits: Vec<f32> = if s.router_bf16 { matvec_bf16(w.gate, x) } else { w.gate.chunks(x.len()).map(|row| dot(row, x)).collect() };
    let mut scores = s.scoring.scores(&logits);
    if s.router_bf16 {
        bf16_slice(&mut scores);
    }
    let picked: Vec<usize> = match &w.routing {
        Routing::Hash { table, width } => {
            let start = token as usize * width;
            table[start..start + s.top_k.min(*width)].iter().map(|&e| e as usize).collect()
        }
        Routing::TopK { bias } => {
            let mut order: Vec<usize> = (0..scores.len()).collect();
            // Highest biased score first; ties to the lower index.
            order.sort_by(|&a, &b| (scores[b] + bias[b]).total_cmp(&(scores[a] + bias[a])).then(a.cmp(&b)));
            order.truncate(s.top_k);
            order
        }
    };
    let sum: f32 = picked.iter().map(|&e| scores[e]).sum::<f32>() + 1e-20;
    picked.into_iter().map(|e| (e, scores[e] / sum * s.routed_scaling)).collect()
}

/// SwiGLU experts, each on its own rows (`(expert, rows)`, rows of `width`), pre-activations
/// clamped: every gate and up product in one call to `p`, then every down product in one.
fn experts(p: &dyn Products, jobs: &[(&Expert<'_>, &[f32])], width: usize, limit: f32) -> Vec<Vec<f32>> {
    let ups: Vec<(&[f32], &[f32])> = jobs.iter().flat_map(|(e, xs)| [(e.w1, *xs), (e.w3, *xs)]).collect();
    let products = p.products_each(&ups, width);
    let hidden: Vec<Vec<f32>> = products
        .chunks(2)
        .map(|pair| {
            pair[0]
                .iter()
                .zip(&pair[1])
                .map(|(&gate, &up)| {
                    let (gate, up) = (gate.min(limit), up.clamp(-limit, limit));
                    gate / (1.0 + (-gate).exp()) * up
                })
                .collect()
        })
        .collect();
    let downs: Vec<(&[f32], &[f32])> = jobs.iter().zip(&hidden).map(|((e, _), h)| (e.w2, h.as_slice())).collect();
    let inner = jobs.first().map_or(1, |(e, _)| e.w1.len() / width);
    p.products_each(&downs, inner)
}

/// A row an expert serves and the place of that expert in the row's routing.
type Served = (usize, usize);

/// The MoE block's output for each row of `xs` (token `tokens[i]` for row i): the routed experts'
/// weighted sum plus the shared one. Each expert runs once on all the rows routed to it (the experts
/// together: on the thread pool, or in two trips to a device); every row's sum keeps its routing
/// order, so the rows come out as each would alone.
pub fn moe(p: &dyn Products, xs: &[f32], tokens: &[u32], w: &MoeWeights<'_>, s: MoeSettings) -> Vec<f32> {
    use rayon::prelude::*;
    if tokens.is_empty() {
        return Vec::new();
    }
    let width = xs.len() / tokens.len();
    let routes: Vec<Vec<(usize, f32)>> = xs.par_chunks(width).zip(tokens).map(|(x, &token)| route(x, token, w, s)).collect();
    // Per expert, the (row, place in that row's routing) pairs it serves.
    let mut served: Vec<Vec<Served>> = vec![Vec::new(); w.experts.len()];
    for (row, picked) in routes.iter().enumerate() {
        for (place, &(e, _)) in picked.iter().enumerate() {
            served[e].push((row, place));
        }
    }
    let active: Vec<(usize, Vec<f32>)> = served
        .iter()
        .enumerate()
        .filter(|(_, rows)| !rows.is_empty())
        .map(|(e, rows)| (e, rows.iter().flat_map(|&(row, _)| &xs[row * width..(row + 1) * width]).copied().collect()))
        .collect();
    // The shared expert (on every row) first, then the routed ones.
    let mut jobs: Vec<(&Expert<'_>, &[f32])> = w.shared.iter().map(|shared| (shared, xs)).collect();
    jobs.extend(active.iter().map(|(e, inputs)| (&w.experts[*e], inputs.as_slice())));
    let mut results = experts(p, &jobs, width, s.swiglu_limit).into_iter();
    let mut out = match &w.shared {
        Some(_) => results.next().unwrap_or_default(),
        None => vec![0f32; xs.len()],
    };
    let outputs: Vec<Vec<f32>> = results.collect();
    let mut placed: Vec<Vec<&[f32]>> = routes.iter().map(|picked| vec![&[][..]; picked.len()]).collect();
    for ((e, _), output) in active.iter().zip(&outputs) {
        for (&(row, place), values) in served[*e].iter().zip(output.chunks(width)) {
            placed[row][place] = values;
        }
    }
    for ((o, picked), values) in out.chunks_mut(width).zip(&routes).zip(&placed) {
        let mut routed = vec![0f32; width];
        for ((_, weight), output) in picked.iter().zip(values) {
            for (r, v) in routed.iter_mut().zip(output.iter()) {
                *r += weight * v;
            }
        }
        for (o, r) in o.iter_mut().zip(routed) {
            *o += r;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::dsv4_products::Host;
    use crate::forward::testutil::tiny::{self, floats};

    #[test]
    fn matches_transformers_on_the_tiny_checkpoint() {
        let (fixture, config, st) = (tiny::json("moe.json"), tiny::config(), tiny::tensors());
        let s = MoeSettings {
            top_k: config.experts_per_token,
            scoring: Scoring::parse(&config.scoring_func).unwrap(),
            routed_scaling: config.routed_scaling_factor,
            swiglu_limit: config.swiglu_limit,
            router_bf16: false,
        };
        let x = floats(&fixture["x"]);
        let ids: Vec<u32> = fixture["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        for layer in [0usize, 1] {
            let f = format!("model.layers.{layer}.ffn");
            let t = |name: String| st.f32(&name).unwrap();
            let gate = t(format!("{f}.gate.weight"));
            let (bias, table) = (st.f32(&format!("{f}.gate.bias")).ok(), st.i64(&format!("{f}.gate.tid2eid")).ok());
            let routing = match (&table, &bias) {
                (Some(table), _) => Routing::Hash { table, width: config.experts_per_token },
                (None, Some(bias)) => Routing::TopK { bias },
                (None, None) => panic!("{f}: neither a hash table nor a bias"),
            };
            let owned: Vec<[Vec<f32>; 3]> =
                (0..config.experts).map(|e| ["w1", "w2", "w3"].map(|m| t(format!("{f}.experts.{e}.{m}.weight")))).collect();
            let shared = ["w1", "w2", "w3"].map(|m| t(format!("{f}.shared_experts.{m}.weight")));
            let w = MoeWeights {
                gate: &gate,
                routing,
                experts: owned.iter().map(|[w1, w2, w3]| Expert { w1, w2, w3 }).collect(),
                shared: Some(Expert { w1: &shared[0], w2: &shared[1], w3: &shared[2] }),
            };
            let want = &fixture[format!("layer{layer}")];
            let mut ours = Vec::new();
            for (i, (token_x, &id)) in x.chunks(config.hidden_size).zip(&ids).enumerate() {
                let mut routed: Vec<usize> = route(token_x, id, &w, s).into_iter().map(|(e, _)| e).collect();
                let mut expected: Vec<usize> =
                    want["experts"][i].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
                routed.sort_unstable();
                expected.sort_unstable();
                assert_eq!(routed, expected, "layer {layer} token {i}: experts");
                ours.extend(moe(&Host, token_x, &[id], &w, s));
            }
            // All the rows at once, each expert on the rows routed to it: the same bits.
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&moe(&Host, &x, &ids, &w, s)), bits(&ours), "layer {layer}: the batch moved bits");
            let err = tiny::rel_l2(&ours, &floats(&want["out"]));
            eprintln!("moe layer {layer}: rel L2 {err:.1e} against transformers");
            assert!(err < 1e-5, "layer {layer}: rel L2 {err:e}");
        }
    }
}

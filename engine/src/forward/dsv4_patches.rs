//! The DeepSeek-V4 patches on the `tiny` checkpoint: the empty set keeps golden's bits, a parameter at
//! the config's own value keeps them too, each numerical patch moves the logits by a nonzero amount
//! within a stated bound, and decoding token by token equals one pass under every patch.

use super::deepseek_v4::DeepseekV4Model;
use super::moe::{route, Expert, MoeSettings, MoeWeights, Routing, Scoring};
use super::testutil::tiny;
use crate::patch::PatchSet;

/// FNV-1a (per f32) over the bits of every position's logits, recorded at d7a85ce, before the patches
/// (one pass and token by token gave the same bits).
const GOLDEN_DIGEST: u64 = 0x4818_7d22_2bd4_0db0;

fn digest(rows: &[Vec<f32>]) -> u64 {
    rows.iter().flatten().fold(0xcbf2_9ce4_8422_2325u64, |h, v| (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01b3))
}

/// The tiny model and the reference's 65 tokens (prompt, then the forced decode tokens).
fn case() -> (DeepseekV4Model, Vec<u32>) {
    let reference = tiny::json("reference.json");
    let ids = ["prompt_ids", "decode_ids"]
        .iter()
        .flat_map(|k| reference[*k].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect::<Vec<_>>())
        .collect();
    (DeepseekV4Model::load(&tiny::dir()).unwrap(), ids)
}

fn set(list: &str) -> PatchSet {
    PatchSet::parse(list).unwrap()
}

fn steps(model: &DeepseekV4Model, ids: &[u32], patches: &PatchSet) -> Vec<Vec<f32>> {
    let mut state = model.state(patches);
    ids.iter().map(|&id| model.step(&mut state, id)).collect()
}

/// rel L2 of all positions' logits together.
fn rel_l2(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    tiny::rel_l2(&a.concat(), &b.concat())
}

/// Each numerical patch of DeepSeek-V4 and the rel L2 (all 65 positions' logits) it may move golden by:
/// about twice what it measured (2026-12-02). The tiny model's random weights make it touchy (a
/// flipped expert or indexer pick moves a position's logits by tens of percent), so the roundings
/// that flip picks (kv_fp8, indexer_fp8, moe_router_bf16) and the structural changes are bounded
/// loosely; the ones that cannot flip a pick (mhc_bf16, mhc_sinkhorn_iters) tightly.
const MOVING: &[(&str, f32)] = &[
    ("index_topk=1", 0.5),
    ("index_topk=2", 0.35),
    ("index_topk=8", 0.35),
    ("indexer_fp8", 0.15),
    ("kv_fp8", 0.15),
    ("mhc_bf16", 2e-3),
    ("mhc_sinkhorn_iters=1", 1e-4),
    ("mhc_sinkhorn_iters=3", 1e-6),
    ("moe_router_bf16", 5e-2),
    ("moe_topk=1", 0.35),
    ("moe_topk=3", 0.2),
    ("swa_window=4", 1.0),
    ("swa_window=16", 1.0),
    ("indexer_fp8,kv_fp8,mhc_bf16,moe_router_bf16", 0.2),
];

#[test]
fn the_empty_set_keeps_golden_bits() {
    let (model, ids) = case();
    let empty = PatchSet::default();
    let (pass, step) = (model.logits(&ids, &empty), steps(&model, &ids, &empty));
    eprintln!("DeepSeek-V4 tiny golden digests: pass {:#018x}, step {:#018x}", digest(&pass), digest(&step));
    assert_eq!(digest(&pass), GOLDEN_DIGEST);
    assert_eq!(digest(&step), GOLDEN_DIGEST);
}

#[test]
fn a_parameter_at_the_configs_value_keeps_golden_bits() {
    let (model, ids) = case();
    let c = &model.config;
    let golden = model.logits(&ids, &PatchSet::default());
    let golden_steps = steps(&model, &ids, &PatchSet::default());
    for list in [
        format!("mhc_sinkhorn_iters={}", c.hc_sinkhorn_iters),
        format!("moe_topk={}", c.experts_per_token),
        format!("index_topk={}", c.index_topk),
        format!("swa_window={}", c.sliding_window),
    ] {
        let patches = set(&list);
        assert!(digest(&model.logits(&ids, &patches)) == digest(&golden), "{list}: one pass left golden's bits");
        assert!(digest(&steps(&model, &ids, &patches)) == digest(&golden_steps), "{list}: steps left golden's bits");
    }
}

#[test]
fn each_numerical_patch_moves_the_logits_within_its_bound() {
    let (model, ids) = case();
    let golden = model.logits(&ids, &PatchSet::default());
    for &(list, bound) in MOVING {
        let patched = model.logits(&ids, &set(list));
        let err = rel_l2(&patched, &golden);
        let worst = patched.iter().zip(&golden).map(|(a, b)| tiny::rel_l2(a, b)).fold(0f32, f32::max);
        eprintln!("DeepSeek-V4 tiny {list}: rel L2 {err:.2e} from golden (worst position {worst:.2e}; bound {bound:e})");
        assert!(err > 0.0, "{list} changed nothing");
        assert!(err < bound, "{list}: rel L2 {err:e} from golden, over its bound {bound:e}");
    }
}

#[test]
fn decoding_token_by_token_equals_one_pass_under_each_patch() {
    let (model, ids) = case();
    for &(list, _) in MOVING {
        let patches = set(list);
        let (pass, step) = (model.logits(&ids, &patches), steps(&model, &ids, &patches));
        let worst = pass.iter().zip(&step).map(|(a, b)| tiny::rel_l2(b, a)).fold(0f32, f32::max);
        eprintln!("DeepSeek-V4 tiny {list}: steps against one pass, worst rel L2 {worst:.1e}");
        assert!(worst < 1e-5, "{list}: a step is {worst:e} (rel L2) from the one-pass logits");
    }
}

/// `moe_topk=N` on a hash-routed layer takes the first N of the token's hashed experts (all of them
/// when N is at least the table's width), weighted by their scores normalised over the ones taken.
#[test]
fn moe_topk_on_a_hash_layer_takes_the_first_n_of_the_tokens_experts() {
    let (config, st) = (tiny::config(), tiny::tensors());
    let f = "model.layers.0.ffn";
    let (gate, table) = (st.f32(&format!("{f}.gate.weight")).unwrap(), st.i64(&format!("{f}.gate.tid2eid")).unwrap());
    let owned: Vec<[Vec<f32>; 3]> =
        (0..config.experts).map(|e| ["w1", "w2", "w3"].map(|m| st.f32(&format!("{f}.experts.{e}.{m}.weight")).unwrap())).collect();
    let width = config.experts_per_token;
    let w = MoeWeights {
        gate: &gate,
        routing: Routing::Hash { table: &table, width },
        experts: owned.iter().map(|[w1, w2, w3]| Expert { w1, w2, w3 }).collect(),
        shared: None,
    };
    let settings = |top_k| MoeSettings {
        top_k,
        scoring: Scoring::parse(&config.scoring_func).unwrap(),
        routed_scaling: config.routed_scaling_factor,
        swiglu_limit: config.swiglu_limit,
        router_bf16: false,
    };
    let x: Vec<f32> = (0..config.hidden_size).map(|i| (i as f32 * 0.37).sin()).collect();
    for token in [3u32, 77, 200] {
        let hashed: Vec<usize> = table[token as usize * width..(token as usize + 1) * width].iter().map(|&e| e as usize).collect();
        let one = route(&x, token, &w, settings(1));
        assert_eq!(one, vec![(hashed[0], config.routed_scaling_factor)], "token {token}");
        let config_k = route(&x, token, &w, settings(width));
        assert_eq!(config_k.iter().map(|p| p.0).collect::<Vec<_>>(), hashed);
        assert_eq!(route(&x, token, &w, settings(width + 3)), config_k, "token {token}: more than the table holds");
    }
}

/// `moe_router_bf16` flips a near-tie: two experts whose gate rows differ below bf16's resolution
/// tie once rounded, and the tie goes to the lower index.
#[test]
fn moe_router_bf16_can_flip_a_near_tie() {
    let gate = [1.0, 0.5, 1.0 + 2f32.powi(-10), 0.5, 0.0, 0.0];
    let bias = [0.0; 3];
    let w = MoeWeights { gate: &gate, routing: Routing::TopK { bias: &bias }, experts: Vec::new(), shared: None };
    let settings =
        |router_bf16| MoeSettings { top_k: 1, scoring: Scoring::SqrtSoftplus, routed_scaling: 1.0, swiglu_limit: 10.0, router_bf16 };
    let x = [1.0, 0.25];
    assert_eq!(route(&x, 0, &w, settings(false))[0].0, 1);
    assert_eq!(route(&x, 0, &w, settings(true))[0].0, 0);
}

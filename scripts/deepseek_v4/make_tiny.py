#!/usr/bin/env python3
"""DeepSeek-V4 in small, for the engine's golden path to match (issue 27): a `tiny` configuration with
every block kind (sliding-window, compressed sparse and heavily compressed attention layers with the
lightning indexer, partial RoPE, learned sinks and the grouped low-rank output projection; mHC with
hc_mult 4 and Sinkhorn; hash-routed and top-k routed MoE with a shared expert and clamped SwiGLU),
seeded random weights, and transformers' `DeepseekV4ForCausalLM` logits in fp32 as the reference.

    python3 scripts/deepseek_v4/make_tiny.py OUT_DIR [--seed 0]

Writes OUT_DIR/config.json and OUT_DIR/model.safetensors (fp32, as `save_pretrained` writes them)
and OUT_DIR/reference.json: the prompt's token ids, the 16 teacher-forced decode ids, and the logits
of the prefill's last position and of each decode step (17 rows), plus the versions that made them.
Needs torch and transformers with DeepSeek-V4 (5.17 or later).
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=32,
    partial_rotary_factor=0.25,
    q_lora_rank=32,
    o_groups=2,
    o_lora_rank=16,
    moe_intermediate_size=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    sliding_window=8,
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    layer_types=[
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ],
    mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
    index_n_heads=8,
    index_head_dim=16,
    index_topk=4,
    max_position_embeddings=4096,
    num_nextn_predict_layers=0,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=False,
)
PROMPT_TOKENS = 48
DECODE_STEPS = 16


def randomise_zero_initialised(model, generator):
    """Parameters and buffers the model initialises to constants (zeros, ones) get random values too,
    so that a reader that skipped one (a bias, a sink, a norm weight) cannot match by accident."""
    with torch.no_grad():
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("tid2eid"):
                # The hash layers' token -> experts table: distinct random experts per token.
                experts = model.config.n_routed_experts
                picks = torch.stack([torch.randperm(experts, generator=generator)[: tensor.shape[1]] for _ in range(tensor.shape[0])])
                tensor.copy_(picks)
                continue
            if not tensor.is_floating_point() or tensor.numel() == 0:
                continue
            if torch.all(tensor == tensor.flatten()[0]):
                noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
                if name.endswith("norm.weight") or "norm" in name.split(".")[-2:][0]:
                    tensor.copy_(1.0 + 0.1 * noise)
                else:
                    tensor.copy_(0.1 * noise)


def cached_logits(model, prompt, forced):
    """transformers' logits of the prompt's last position, then of each forced token fed one at a time
    through the cache (rows of floats)."""
    rows = []
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        rows.append(out.logits[0, -1].double().cpu().tolist())
        past = out.past_key_values
        for step in range(forced.shape[1]):
            out = model(input_ids=forced[:, step : step + 1], past_key_values=past, use_cache=True)
            rows.append(out.logits[0, -1].double().cpu().tolist())
            past = out.past_key_values
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    config = DeepseekV4Config(**TINY)
    model = DeepseekV4ForCausalLM(config).to(torch.float32).eval()
    generator = torch.Generator().manual_seed(args.seed + 1)
    randomise_zero_initialised(model, generator)
    ids = torch.randint(2, config.vocab_size, (1, PROMPT_TOKENS + DECODE_STEPS), generator=generator)
    prompt, forced = ids[:, :PROMPT_TOKENS], ids[:, PROMPT_TOKENS:]
    rows = cached_logits(model, prompt, forced)
    with torch.no_grad():
        # The same positions without a cache, as one pass: the cache must not change the numbers.
        whole = model(input_ids=ids, use_cache=False).logits[0, PROMPT_TOKENS - 1 :]
    cached = torch.tensor(rows)
    drift = ((cached - whole).norm() / whole.norm()).item()
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    reference = {
        "made_by": "scripts/deepseek_v4/make_tiny.py",
        "seed": args.seed,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "prompt_ids": prompt[0].tolist(),
        "decode_ids": forced[0].tolist(),
        "logits": rows,
        "cached_vs_uncached_rel_l2": drift,
    }
    (args.out / "reference.json").write_text(json.dumps(reference))
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.out}: {params} parameters; cached vs one-pass logits rel L2 {drift:.2e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""DeepSeek-V4 `small` (issue 27): the real model's shapes scaled down evenly to about 1.1 B parameters
(width, heads, LoRA ranks, experts and their width, the indexer all a quarter; DeepSeek-V4's real
vocabulary, window, compression rates and experts per token kept; 8 layers with the real model's
pattern: heavily compressed first, then alternating, the first MLP hash-routed), seeded random weights,
and transformers' fp32 logits as the reference: a prompt long enough that the window slides, HCA blocks
(128 tokens) close and the CSA indexer must choose (more blocks than its top-k), then 16 cached
teacher-forced decode steps. With --bench, transformers' own batch-1 bf16 decode speed on the device.

    python3 scripts/deepseek_v4/make_small.py OUT_DIR [--seed 0] [--device cuda] [--bench]

Writes OUT_DIR/config.json, the fp32 safetensors and OUT_DIR/reference.json (as make_tiny.py does), and
prints one JSON line of figures last. Needs torch and transformers with DeepSeek-V4 (5.17 or later).
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny import cached_logits, randomise_zero_initialised  # noqa: E402

LAYERS = 8
SMALL = dict(
    vocab_size=129280,
    hidden_size=1024,
    num_hidden_layers=LAYERS,
    num_attention_heads=16,
    num_key_value_heads=1,
    head_dim=128,
    qk_rope_head_dim=16,
    partial_rotary_factor=0.125,
    q_lora_rank=256,
    o_groups=2,
    o_lora_rank=256,
    moe_intermediate_size=512,
    n_routed_experts=64,
    num_experts_per_tok=6,
    n_shared_experts=1,
    routed_scaling_factor=1.5,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    sliding_window=128,
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    layer_types=["heavily_compressed_attention"] * 3
    + ["compressed_sparse_attention", "heavily_compressed_attention"] * 2
    + ["compressed_sparse_attention"],
    mlp_layer_types=["hash_moe"] + ["moe"] * (LAYERS - 1),
    index_n_heads=16,
    index_head_dim=32,
    index_topk=128,
    max_position_embeddings=65536,
    num_nextn_predict_layers=0,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=False,
)
# 600 tokens: the window (128) slides, HCA closes 4 blocks, CSA closes 150 blocks for a top-k of 128.
PROMPT_TOKENS = 600
DECODE_STEPS = 16


def copy_bandwidth(device):
    """Device copy, read + write bytes per second (the figure decode bandwidth is stated against)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        dst.copy_(src)
    torch.cuda.synchronize()
    return 2 * src.numel() * 20 / (time.perf_counter() - start)


def bench(model, config, device, prompt_tokens=512, new_tokens=128):
    bf16 = model.to(torch.bfloat16)
    ids = torch.randint(2, config.vocab_size, (1, prompt_tokens), device=device)
    with torch.no_grad():
        bf16.generate(ids, max_new_tokens=8, do_sample=False, min_new_tokens=8)
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = bf16.generate(ids, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return (out.shape[1] - prompt_tokens) / seconds


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--bench", action="store_true")
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    torch.manual_seed(args.seed)
    config = DeepseekV4Config(**SMALL)
    model = DeepseekV4ForCausalLM(config).to(torch.float32).eval()
    generator = torch.Generator().manual_seed(args.seed + 1)
    randomise_zero_initialised(model, generator)
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(2, config.vocab_size, (1, PROMPT_TOKENS + DECODE_STEPS), generator=generator)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    model = model.to(args.device)
    start = time.perf_counter()
    rows = cached_logits(model, ids[:, :PROMPT_TOKENS].to(args.device), ids[:, PROMPT_TOKENS:].to(args.device))
    figures = {"parameters": params, "reference_seconds": round(time.perf_counter() - start, 2)}
    reference = {
        "made_by": "scripts/deepseek_v4/make_small.py",
        "seed": args.seed,
        "device": args.device,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "prompt_ids": ids[0, :PROMPT_TOKENS].tolist(),
        "decode_ids": ids[0, PROMPT_TOKENS:].tolist(),
        "logits": rows,
    }
    (args.out / "reference.json").write_text(json.dumps(reference))
    if args.bench and args.device.startswith("cuda"):
        # Weights one decode token reads at batch 1: all but the routed experts and the embedding
        # table, plus the experts it is routed to in every layer (num_experts_per_tok each).
        routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
        expert = routed / (config.n_routed_experts * LAYERS)
        active = params - routed + expert * config.num_experts_per_tok * LAYERS - config.vocab_size * config.hidden_size
        tokens_per_s = bench(model, config, args.device)
        bandwidth = copy_bandwidth(args.device)
        figures.update(
            {
                "transformers_bf16_decode_tokens_per_s": round(tokens_per_s, 1),
                "active_parameters_per_token": int(active),
                "weights_read_per_token_gb_bf16": round(active * 2 / 1e9, 3),
                "transformers_read_tb_per_s": round(active * 2 * tokens_per_s / 1e12, 3),
                "copy_bandwidth_tb_per_s": round(bandwidth / 1e12, 3),
                "transformers_fraction_of_copy": round(active * 2 * tokens_per_s / bandwidth, 4),
                "gpu": torch.cuda.get_device_name(),
            }
        )
    print(json.dumps({"small": str(args.out), "transformers": transformers.__version__, **figures}))


if __name__ == "__main__":
    sys.exit(main())

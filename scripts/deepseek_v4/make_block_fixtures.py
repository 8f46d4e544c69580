#!/usr/bin/env python3
"""transformers' DeepSeek-V4 blocks, one at a time, on the tiny checkpoint (tests/fixtures/deepseek_v4/
tiny, reloaded by `from_pretrained`), in fp32, for the engine's blocks to match on their own:

- mhc.json: layer 0's attention hyper-connection (post, comb, collapsed), one residual fold and the
  final hyper-head on 5 tokens of random streams (engine/src/forward/mhc.rs);
- moe.json: layer 0's (hash-routed) and layer 1's (top-k routed) MoE blocks on 6 random tokens, with
  the experts each went to (engine/src/forward/moe.rs);
- attention_sliding.json, attention_hca.json, attention_csa.json: layer 0's sliding-window attention
  on 20 tokens (window 8), layer 2's heavily compressed one on 40 (two blocks of 16), layer 1's
  compressed sparse one on 40 (ten blocks of 4, the indexer keeping 4): each layer's input after
  `input_layernorm` and its `self_attn` output, the model building the masks
  (engine/src/forward/dsv4_attention.rs).

    python3 scripts/deepseek_v4/make_block_fixtures.py tests/fixtures/deepseek_v4/tiny
"""

import json
import sys
from pathlib import Path

import torch
from transformers import DeepseekV4ForCausalLM

MADE_BY = "scripts/deepseek_v4/make_block_fixtures.py"


def flat(t):
    return t.flatten().tolist()


def mhc(model):
    config = model.config
    generator = torch.Generator().manual_seed(7)
    streams = torch.randn(1, 5, config.hc_mult, config.hidden_size, generator=generator)
    block_out = torch.randn(1, 5, config.hidden_size, generator=generator)
    with torch.no_grad():
        post, comb, collapsed = model.model.layers[0].attn_hc(streams)
        updated = post.unsqueeze(-1) * block_out.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), streams)
        head = model.model.hc_head(streams)
    return {"made_by": MADE_BY, "streams": flat(streams[0]), "block_out": flat(block_out[0]), "post": flat(post[0]),
            "comb": flat(comb[0]), "collapsed": flat(collapsed[0]), "updated": flat(updated[0]), "head": flat(head[0])}


def moe(model):
    config = model.config
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(1, 6, config.hidden_size, generator=generator)
    ids = torch.randint(0, config.vocab_size, (1, 6), generator=generator)
    fixture = {"made_by": MADE_BY, "x": flat(x[0]), "ids": ids[0].tolist()}
    with torch.no_grad():
        for layer in (0, 1):
            mlp = model.model.layers[layer].mlp
            out = mlp(x, input_ids=ids)
            _, weights, indices = mlp.gate(x, ids) if mlp.is_hash else mlp.gate(x)
            fixture[f"layer{layer}"] = {"out": flat(out[0]), "experts": indices.tolist(), "weights": weights.tolist()}
    return fixture


def attention(model, index, kind, seq, seed):
    """Layer `index`'s attention on `seq` random rows: its input (after `input_layernorm`) and output.
    The model runs whole so that it builds the masks and position embeddings itself; the layer's
    hyper-connection is stubbed to hand the attention our rows, and what fails after it is moot."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, seq, config.hidden_size, generator=generator)
    layer = model.model.layers[index]
    assert config.layer_types[index] == kind
    captured = {}
    handle = layer.self_attn.register_forward_hook(lambda m, a, k, out: captured.setdefault("out", out[0]), with_kwargs=True)
    original = layer.attn_hc.forward
    layer.attn_hc.forward = lambda streams: (None, None, x)
    try:
        with torch.no_grad():
            try:
                model(input_ids=torch.zeros(1, seq, dtype=torch.long), use_cache=False)
            except Exception:
                pass
    finally:
        layer.attn_hc.forward = original
        handle.remove()
    assert "out" in captured, f"layer {index}'s attention did not run"
    with torch.no_grad():
        normed = layer.input_layernorm(x)
    return {"made_by": MADE_BY, "layer": index, "seq": seq, "x_normed": flat(normed[0]), "out": flat(captured["out"][0])}


def main(argv=None):
    tiny = Path((argv or sys.argv[1:])[0])
    model = DeepseekV4ForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    fixtures = {
        "mhc.json": mhc(model),
        "moe.json": moe(model),
        "attention_sliding.json": attention(model, 0, "sliding_attention", 20, 13),
        "attention_hca.json": attention(model, 2, "heavily_compressed_attention", 40, 17),
        "attention_csa.json": attention(model, 1, "compressed_sparse_attention", 40, 19),
    }
    for name, fixture in fixtures.items():
        (tiny / name).write_text(json.dumps(fixture))


if __name__ == "__main__":
    sys.exit(main())

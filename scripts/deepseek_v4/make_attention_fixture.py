#!/usr/bin/env python3
"""transformers' DeepSeek-V4 attention on the tiny checkpoint (tests/fixtures/deepseek_v4/tiny), no
cache, fp32, for engine/src/forward/dsv4_attention.rs to match: layer 0's sliding-window attention
on 20 tokens of random input (past the window of 8) into attention_sliding.json, layer 2's heavily
compressed attention on 40 (two closed blocks of 16) into attention_hca.json, layer 1's compressed
sparse attention on 40 (ten blocks of 4, the indexer keeping 4) into attention_csa.json.

    python3 scripts/deepseek_v4/make_attention_fixture.py tests/fixtures/deepseek_v4/tiny
"""

import json
import sys
from pathlib import Path

import torch
from transformers import DeepseekV4ForCausalLM


def capture(model, index, kind, seq, seed):
    """Layer `index`'s attention on `seq` random rows: its input (after `input_layernorm`) and output."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, seq, config.hidden_size, generator=generator)
    captured = {}

    def keep(module, args, kwargs, out):
        captured["out"] = out[0]

    layer = model.model.layers[index]
    assert config.layer_types[index] == kind
    # The model builds the attention mask and position embeddings; capture layer 0's attention on
    # our input by running the decoder stack with it as the embedding.
    handle = layer.self_attn.register_forward_hook(keep, with_kwargs=True)
    original = layer.attn_hc.forward
    layer.attn_hc.forward = lambda streams: (None, None, x)  # the block's input is x itself
    try:
        with torch.no_grad():
            try:
                model(input_ids=torch.zeros(1, seq, dtype=torch.long), use_cache=False)
            except Exception:
                pass  # the rest of the layer cannot use the stubbed mix; the attention has run
    finally:
        layer.attn_hc.forward = original
        handle.remove()
    assert "out" in captured, "layer 0's attention did not run"
    # input_layernorm is applied to x before attention: record the attention's real input too.
    with torch.no_grad():
        normed = layer.input_layernorm(x)
    return {
        "made_by": "scripts/deepseek_v4/make_attention_fixture.py",
        "layer": index,
        "x_normed": normed[0].flatten().tolist(),
        "out": captured["out"][0].flatten().tolist(),
        "seq": seq,
    }


def main(argv=None):
    tiny = Path((argv or sys.argv[1:])[0])
    model = DeepseekV4ForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    for name, index, kind, seq, seed in (
        ("attention_sliding.json", 0, "sliding_attention", 20, 13),
        ("attention_hca.json", 2, "heavily_compressed_attention", 40, 17),
        ("attention_csa.json", 1, "compressed_sparse_attention", 40, 19),
    ):
        (tiny / name).write_text(json.dumps(capture(model, index, kind, seq, seed)))


if __name__ == "__main__":
    sys.exit(main())

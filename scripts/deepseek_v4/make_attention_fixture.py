#!/usr/bin/env python3
"""transformers' DeepSeek-V4 sliding-window attention on the tiny checkpoint (layer 0 of
tests/fixtures/deepseek_v4/tiny): `self_attn` on 20 tokens of random input (past the window of 8),
no cache, in fp32, for engine/src/forward/dsv4_attention.rs to match.

    python3 scripts/deepseek_v4/make_attention_fixture.py tests/fixtures/deepseek_v4/tiny
"""

import json
import sys
from pathlib import Path

import torch
from transformers import DeepseekV4ForCausalLM


def main(argv=None):
    tiny = Path((argv or sys.argv[1:])[0])
    model = DeepseekV4ForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    config = model.config
    generator = torch.Generator().manual_seed(13)
    seq = 20
    x = torch.randn(1, seq, config.hidden_size, generator=generator)
    captured = {}

    def keep(module, args, kwargs, out):
        captured["out"] = out[0]

    layer = model.model.layers[0]
    assert config.layer_types[0] == "sliding_attention"
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
    fixture = {
        "made_by": "scripts/deepseek_v4/make_attention_fixture.py",
        "x_normed": normed[0].flatten().tolist(),
        "out": captured["out"][0].flatten().tolist(),
        "seq": seq,
    }
    (tiny / "attention_sliding.json").write_text(json.dumps(fixture))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""transformers' DeepSeek-V4 MoE blocks on the tiny checkpoint (tests/fixtures/deepseek_v4/tiny):
layer 0's (hash-routed) and layer 1's (top-k routed) `mlp` on 6 random tokens, in fp32, with the
experts each token was routed to, for engine/src/forward/moe.rs to match.

    python3 scripts/deepseek_v4/make_moe_fixture.py tests/fixtures/deepseek_v4/tiny
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
    generator = torch.Generator().manual_seed(11)
    x = torch.randn(1, 6, config.hidden_size, generator=generator)
    ids = torch.randint(0, config.vocab_size, (1, 6), generator=generator)
    fixture = {"made_by": "scripts/deepseek_v4/make_moe_fixture.py", "x": x[0].flatten().tolist(), "ids": ids[0].tolist()}
    with torch.no_grad():
        for layer in (0, 1):
            mlp = model.model.layers[layer].mlp
            out = mlp(x, input_ids=ids)
            if mlp.is_hash:
                _, weights, indices = mlp.gate(x, ids)
            else:
                _, weights, indices = mlp.gate(x)
            fixture[f"layer{layer}"] = {
                "out": out[0].flatten().tolist(),
                "experts": indices.tolist(),
                "weights": weights.tolist(),
            }
    (tiny / "moe.json").write_text(json.dumps(fixture))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""DeepSeek-V4 at its real size, without weights: the config.json transformers writes for
`DeepseekV4Config` (its defaults are the released model's shape) with the released YaRN scaling
(`rope_scaling`: yarn, factor 16 over 65,536 positions), and what transformers derives from it, so the
engine's reader is checked on the real shape (tests/fixtures/deepseek_v4/flash).

    python3 scripts/deepseek_v4/make_flash_config.py tests/fixtures/deepseek_v4/flash

Writes DIR/config.json and DIR/expected.json: the parameter count of `DeepseekV4ForCausalLM` built on
the meta device (no memory), the elements of its float buffers that a checkpoint holds (the routers'
score correction bias), its integer buffers (the hash layers' token-to-expert tables),
and the RoPE frequencies and cos/sin scales of both rope types from `DeepseekV4RotaryEmbedding`.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

RELEASED_YARN = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536, "beta_fast": 32, "beta_slow": 1}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    config = DeepseekV4Config(rope_scaling=RELEASED_YARN)
    with torch.device("meta"):
        model = DeepseekV4ForCausalLM(config)
    tables = {name: list(b.shape) for name, b in model.named_buffers() if not b.is_floating_point()}
    # Float buffers the checkpoint holds (the routers' score correction bias), not the RoPE tables.
    weights = [b for name, b in model.named_buffers() if b.is_floating_point() and "rotary_emb" not in name]
    rotary = DeepseekV4RotaryEmbedding(config)
    expected = {
        "made_by": "scripts/deepseek_v4/make_flash_config.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "float_buffers": sum(b.numel() for b in weights),
        "integer_buffers": tables,
        "rope": {
            kind: {
                "inv_freq": getattr(rotary, f"{kind}_inv_freq").double().tolist(),
                "attention_scaling": getattr(rotary, f"{kind}_attention_scaling"),
            }
            for kind in ("main", "compress")
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    config.to_json_file(args.out / "config.json")
    (args.out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")
    print(f"{args.out}: {expected['parameters']:,} parameters, {len(tables)} integer buffers", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

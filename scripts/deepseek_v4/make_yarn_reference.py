#!/usr/bin/env python3
"""The `tiny` checkpoint with YaRN on its compressed layers' RoPE, as DeepSeek-V4 ships it (`compress`:
`rope_type` yarn, factor 16 over 65,536 original positions; here factor 16 over 256, tiny's 4,096
positions), and transformers' logits for it: the reference for the engine's YaRN (issue 27).

    python3 scripts/deepseek_v4/make_yarn_reference.py tests/fixtures/deepseek_v4/tiny

Reads DIR's checkpoint and reference.json (the same prompt and forced tokens), sets
`rope_parameters.compress` to the YaRN parameters below, and writes DIR/reference_yarn.json: those
parameters (`compress`, as config.json would hold them), the 17 rows of logits (the prefill's last
position, then each teacher-forced decode step through transformers' cache), the rows of the plain
checkpoint's reference they differ from (`rel_l2_to_plain`), and the versions that made them.
`attention_factor` is left out, so transformers derives it (0.1 ln(factor) + 1) and the scaling of
cos and sin is exercised too; DeepSeek-V4's own config sets it to 1.0.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import transformers
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny import cached_logits  # noqa: E402

# Tiny's RoPE part is 8 channels (4 pairs) at base 160,000. Over 256 original positions the ramp runs
# from pair 0 to pair 2: pair 0 (the fastest turning) keeps its frequency, pair 1 is half its own and
# half divided by the factor, pairs 2 and 3 are divided by the factor.
YARN = {
    "rope_type": "yarn",
    "factor": 16.0,
    "original_max_position_embeddings": 256,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    raw = json.loads((args.dir / "config.json").read_text())
    compress = {**raw["rope_parameters"]["compress"], **YARN}
    raw["rope_parameters"]["compress"] = compress
    config = DeepseekV4Config.from_dict(raw)
    model = DeepseekV4ForCausalLM.from_pretrained(args.dir, config=config, torch_dtype=torch.float32).eval()
    scaling = model.model.rotary_emb.compress_attention_scaling
    assert abs(scaling - (0.1 * math.log(YARN["factor"]) + 1.0)) < 1e-12, scaling
    reference = json.loads((args.dir / "reference.json").read_text())
    prompt = torch.tensor([reference["prompt_ids"]])
    forced = torch.tensor([reference["decode_ids"]])
    rows = cached_logits(model, prompt, forced)
    plain = torch.tensor(reference["logits"])
    ours = torch.tensor(rows)
    moved = ((ours - plain).norm(dim=1) / plain.norm(dim=1)).tolist()
    out = {
        "made_by": "scripts/deepseek_v4/make_yarn_reference.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "compress": compress,
        "inv_freq": model.model.rotary_emb.compress_inv_freq.double().tolist(),
        "attention_scaling": scaling,
        "logits": rows,
        "rel_l2_to_plain": moved,
    }
    (args.dir / "reference_yarn.json").write_text(json.dumps(out))
    print(f"inv_freq {out['inv_freq']}, scaling {scaling:.6f}; rows moved from the plain reference by "
          f"{min(moved):.2e}..{max(moved):.2e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Recomputes a checkpoint's reference.json logits with the transformers installed here (e.g. the GPU
machine's 5.17 against fixtures made with another version) and prints the rel L2 per step and the worst.

    python3 scripts/deepseek_v4/check_reference.py DIR [--device cuda]
"""

import argparse
import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import DeepseekV4ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny import cached_logits  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    reference = json.loads((args.dir / "reference.json").read_text())
    model = DeepseekV4ForCausalLM.from_pretrained(args.dir, dtype=torch.float32).to(args.device).eval()
    prompt = torch.tensor([reference["prompt_ids"]], device=args.device)
    forced = torch.tensor([reference["decode_ids"]], device=args.device)
    rows = cached_logits(model, prompt, forced)
    worst = 0.0
    for ours, theirs in zip(rows, reference["logits"]):
        ours, theirs = torch.tensor(ours, dtype=torch.float64), torch.tensor(theirs, dtype=torch.float64)
        worst = max(worst, ((ours - theirs).norm() / theirs.norm()).item())
    print(json.dumps({"checked": str(args.dir), "transformers": transformers.__version__, "made_with": reference.get("transformers"),
                      "device": args.device, "steps": len(rows), "worst_rel_l2": worst}))


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Recomputes a checkpoint's reference.json logits with the transformers installed here (e.g. the GPU
machine's 5.17 against fixtures made with another version) and prints the rel L2 per step, the worst,
the median and how many greedy tokens agree. With --bf16 the model runs in bf16 (loaded in fp32, then
cast whole, as make_small.py's speed run; 5.17 loading straight into bf16 fails on a dtype mismatch):
transformers' own bf16 against its fp32, the yardstick for the engine's fast path (measured on `small`
on an H200 with 5.17: median 1.5e-1, worst 3.3e-1, 13/17 greedy; BENCHMARKS.md).

    python3 scripts/deepseek_v4/check_reference.py DIR [--device cuda] [--bf16]
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
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    reference = json.loads((args.dir / "reference.json").read_text())
    model = DeepseekV4ForCausalLM.from_pretrained(args.dir, dtype=torch.float32)
    if args.bf16:
        model = model.to(torch.bfloat16)
    model = model.to(args.device).eval()
    prompt = torch.tensor([reference["prompt_ids"]], device=args.device)
    forced = torch.tensor([reference["decode_ids"]], device=args.device)
    rows = cached_logits(model, prompt, forced)
    errors, agree = [], 0
    for ours, theirs in zip(rows, reference["logits"]):
        ours, theirs = torch.tensor(ours, dtype=torch.float64), torch.tensor(theirs, dtype=torch.float64)
        errors.append(((ours - theirs).norm() / theirs.norm()).item())
        agree += int(ours.argmax() == theirs.argmax())
    print(json.dumps({"checked": str(args.dir), "transformers": transformers.__version__, "made_with": reference.get("transformers"),
                      "device": args.device, "dtype": "bf16" if args.bf16 else "fp32", "steps": len(rows),
                      "rel_l2": [round(e, 8) for e in errors], "worst_rel_l2": max(errors),
                      "median_rel_l2": sorted(errors)[len(errors) // 2], "greedy_agree": agree}))


if __name__ == "__main__":
    sys.exit(main())

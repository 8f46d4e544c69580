#!/usr/bin/env python3
"""transformers' own bf16 against its fp32 on a checkpoint with reference.json (make_small.py,
make_tiny.py): the same prompt and teacher-forced tokens through `DeepseekV4ForCausalLM` in bf16, each
step's rel L2 from the fp32 logits and whether the greedy token agrees: the yardstick for the engine's
bf16 fast path (`deepseek_v4_check DIR --cuda --fast` prints its own rel L2 from the same fp32 rows).

    python3 scripts/deepseek_v4/bf16_yardstick.py DIR [--device cuda]

Prints one JSON line: per-step rel L2, the worst, the median and the greedy agreements. Measured
(BENCHMARKS.md): `small` on an H200 with transformers 5.17, median 1.5e-1, worst 3.3e-1, 13/17 greedy.
"""

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import DeepseekV4ForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tiny import cached_logits  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    reference = json.loads((args.dir / "reference.json").read_text())
    # Loaded in fp32, then cast whole, as make_small.py's speed run does (transformers 5.17 loading
    # straight into bf16 keeps some modules in fp32 and then fails on the dtype mismatch).
    model = DeepseekV4ForCausalLM.from_pretrained(args.dir, dtype=torch.float32).to(torch.bfloat16).to(args.device).eval()
    prompt = torch.tensor([reference["prompt_ids"]], device=args.device)
    forced = torch.tensor([reference["decode_ids"]], device=args.device)
    rows = cached_logits(model, prompt, forced)
    errors, agree = [], 0
    for ours, want in zip(rows, reference["logits"]):
        a, b = torch.tensor(ours, dtype=torch.float64), torch.tensor(want, dtype=torch.float64)
        errors.append(float((a - b).norm() / b.norm()))
        agree += int(a.argmax() == b.argmax())
    ordered = sorted(errors)
    print(json.dumps({"dir": str(args.dir), "steps": len(errors), "rel_l2": [round(e, 5) for e in errors], "worst": max(errors), "median": ordered[len(ordered) // 2], "greedy_agree": agree}))


if __name__ == "__main__":
    sys.exit(main())

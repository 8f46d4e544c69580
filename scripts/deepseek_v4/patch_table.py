#!/usr/bin/env python3
"""The distance-from-golden table by context length, from the logits files of
engine/examples/deepseek_v4_patches.rs (PREFIX.L.bin per length L): per patch set and length, the mean KL(golden || patched) over
the 16 positions after the length (full softmax, float64) and how many of them change the greedy token
(and the first that does).

    python3 scripts/deepseek_v4/patch_table.py VOCAB LENGTHS GOLDEN_PREFIX NAME=PREFIX ...

(NAME may hold "=" itself, as `index_topk=64`: the prefix is what follows the last one.)
"""

import sys

import numpy as np

WINDOW = 16


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def main(argv):
    vocab, lengths, golden, runs = int(argv[0]), [int(x) for x in argv[1].split(",")], argv[2], argv[3:]
    load = lambda prefix, l: np.fromfile(f"{prefix}.{l}.bin", dtype="<f4").astype(np.float64).reshape(WINDOW, vocab)
    print("| patch | " + " | ".join(f"KL at {l} | greedy changed at {l}" for l in lengths) + " |")
    print("|---|" + "---|---|" * len(lengths))
    for run in runs:
        name, path = run.rsplit("=", 1)
        cells = []
        for l in lengths:
            try:
                g, p = load(golden, l), load(path, l)
            except (OSError, ValueError):
                cells += ["—", "—"]
                continue
            lg, lp = log_softmax(g), log_softmax(p)
            kl = (np.exp(lg) * (lg - lp)).sum(axis=-1)
            changed = np.nonzero(g.argmax(-1) != p.argmax(-1))[0]
            first = f", first +{changed[0]}" if len(changed) else ""
            cells += [f"{kl.mean():.2e}", f"{len(changed)}/{WINDOW}{first}"]
        print(f"| `{name}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
# The short final table of the device check (scripts/device/run.sh prints it last): per shape, our CUDA
# backend's correctness against transformers' fp32 and bf16 logits (and against our CPU golden path), then
# its speed beside transformers' and the card's copy bandwidth. Reads $OUT/reference.json (written by
# reference.py) and $OUT/bench_<shape>.json (device_bench); writes the table to stdout and $OUT/table.txt.
# Exit status 1 when a correctness check fails or its numbers are missing.
# Run: `python3 devcheck/table.py [--out DIR] [--steps "name=rc ..."]`.
import argparse
import json
import math
import os
import sys

# Correctness limits (worst rel L2 over the 17 steps); greedy "close" (vLLM's check_logprobs_close) must
# hold at every step of each checked pair.
LIMITS = {
    ("golden", "fp32"): float(os.environ.get("LIMIT_GOLDEN", "1e-4")),
    ("fast", "bf16"): float(os.environ.get("LIMIT_FAST", "3e-2")),
    ("fast", "fp32"): float(os.environ.get("LIMIT_FAST", "3e-2")),
}


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"_load_error": f"{os.path.basename(path)}: {e}"}


def num(v):
    return v if isinstance(v, (int, float)) and not (isinstance(v, float) and math.isnan(v)) else None


def e(v):
    v = num(v)
    return f"{v:.1e}" if v is not None else "—"


def f0(v):
    v = num(v)
    return f"{v:,.0f}" if v is not None else "—"


def ratio(a, b):
    a, b = num(a), num(b)
    return f"{a / b:.2f}x" if a is not None and b else "—"


def row(cells, widths):
    return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/ref"))
    ap.add_argument("--reference", default=None)
    ap.add_argument("--steps", default="", help="step statuses from run.sh, 'name=rc ...'")
    args = ap.parse_args()
    ref = load(args.reference or os.path.join(args.out, "reference.json"))
    lines, failures = [], []
    say = lines.append

    copy = num(ref.get("copy", {}).get("GBps"))
    say(f"device check: {ref.get('device', '?')}; torch {ref.get('torch', '?')}, transformers "
        f"{ref.get('transformers', '?')}; copy bandwidth {f0(copy)} GB/s (read+write)")
    if args.steps:
        say("steps: " + args.steps)
    if "_load_error" in ref:
        failures.append(ref["_load_error"])
    for err in ref.get("errors", []):
        say(f"reference error: {err}")

    shapes = list(ref.get("shapes", {})) or [n[6:-5] for n in sorted(os.listdir(args.out))
                                             if n.startswith("bench_") and n.endswith(".json")]
    for name in shapes:
        r = ref.get("shapes", {}).get(name, {})
        b = load(os.path.join(args.out, f"bench_{name}.json"))
        m = b.get("model", {})
        say("")
        say(f"== {name}: {f0((num(r.get('params')) or 0) / 1e6)} M params, init {r.get('initializer_range', '?')}, "
            f"fp32 mean top1-top2 gap {e(r.get('fp32', {}).get('mean_top1_gap'))}, "
            f"{r.get('fp32', {}).get('distinct_greedy', '?')} distinct greedy; device {b.get('device', '?')}, "
            f"load {e(b.get('load_s'))} s, backend {e(b.get('backend_new_s'))} s")
        if "_load_error" in b:
            failures.append(f"{name}: {b['_load_error']}")
            say(f"  no bench results: {b['_load_error']}")
        for err in b.get("errors", []):
            say(f"  bench error [{err.get('section')}]: {str(err.get('error'))[:300]}")
        if "error" in r:
            say(f"  reference error: {r['error']}")

        w = [31, 11, 11, 7, 7, 6, 8, 5]
        say(row(["correctness (17 steps)", "worst relL2", "mean relL2", "exact", "close", "1st x", "limit", ""], w))
        corr = b.get("correctness", {})

        def pair(label, c, limit=None):
            steps = c.get("steps", 0) if c else 0
            if not c:
                verdict = "FAIL" if limit is not None else ""
                if limit is not None:
                    failures.append(f"{name}: {label}: no numbers")
                say(row([label, "—", "—", "—", "—", "—", e(limit) if limit else "", verdict], w))
                return
            worst = num(c.get("worst_rel_l2"))
            ok = True
            if limit is not None:
                ok = (worst is not None and worst <= limit and c.get("greedy_close") == steps
                      and not c.get("nonfinite"))
                if not ok:
                    failures.append(f"{name}: {label}: worst rel L2 {e(worst)} (limit {e(limit)}), greedy close "
                                    f"{c.get('greedy_close')}/{steps}, nonfinite {c.get('nonfinite', 0)}")
            verdict = ("ok" if ok else "FAIL") if limit is not None else ""
            first = c.get("first_fail")
            say(row([label, e(worst), e(c.get("mean_rel_l2")), f"{c.get('greedy_exact')}/{steps}",
                     f"{c.get('greedy_close')}/{steps}", "—" if first is None else first,
                     e(limit) if limit else "", verdict], w))

        for path in ("golden", "fast"):
            for against in ("fp32", "bf16", "fastsim"):
                c = corr.get(path, {}).get(against)
                if against == "fastsim" and (path != "fast" or c is None):
                    continue
                pair(f"{path} vs HF {against}", c, LIMITS.get((path, against)))
        pair("HF bf16 vs fp32 (yardstick)", r.get("bf16_vs_fp32"))
        if r.get("fastsim_vs_fp32"):
            pair("HF fastsim vs fp32 (yardstick)", r.get("fastsim_vs_fp32"))
        cc = b.get("cuda_vs_cpu_golden", {})
        if cc:
            pair(f"CPU golden vs HF fp32 ({cc.get('decode_steps')} st)", cc.get("cpu_vs_fp32"))
            pair("CUDA golden vs CPU golden", cc.get("cuda_vs_cpu"))
        else:
            say("  (no CPU golden comparison)")

        p, hp = b.get("perf", {}), r.get("perf", {})
        fast, gold = p.get("fast", {}), p.get("golden", {})
        w2 = [31, 10, 10, 12, 12, 12]
        say(row(["speed, batch 1 unless said", "ours fast", "ours gold", "HF eager", "HF graph", "fast/graph"], w2))
        say(row(["prefill 512 tok/s", f0(fast.get("prefill_tok_s")), f0(gold.get("prefill_tok_s")),
                 f0(hp.get("prefill_tok_s")), "", ratio(fast.get("prefill_tok_s"), hp.get("prefill_tok_s"))], w2))
        say(row(["decode tok/s", f0(fast.get("decode_tok_s")), f0(gold.get("decode_tok_s")),
                 f0(hp.get("eager_decode_tok_s")), f0(hp.get("graph_decode_tok_s")),
                 ratio(fast.get("decode_tok_s"), hp.get("graph_decode_tok_s"))], w2))
        for k in ("batch4", "batch8"):
            say(row([f"decode {k[5:]} seqs tok/s (sum)", f0(fast.get(f"{k}_tok_s")), f0(gold.get(f"{k}_tok_s")),
                     "", "", ratio(fast.get(f"{k}_tok_s"), fast.get("decode_tok_s")) + " of b1"], w2))
        for k, label in (("decode", "b1"), ("batch8", "b8")):
            pct = lambda d: f"{100 * num(d.get(f'{k}_GBps')) / copy:.0f}%" if num(d.get(f"{k}_GBps")) and copy else "—"
            say(row([f"decode {label} GB/s (% of copy)", f"{f0(fast.get(f'{k}_GBps'))} {pct(fast)}",
                     f"{f0(gold.get(f'{k}_GBps'))} {pct(gold)}", "", "", ""], w2))
        say(f"  MB read per decode token: fast {f0((num(fast.get('decode_bytes_per_token')) or 0) / 1e6)}, golden "
            f"{f0((num(gold.get('decode_bytes_per_token')) or 0) / 1e6)}; HF eager loop "
            f"{f0(hp.get('eager_loop_decode_tok_s'))} tok/s"
            + (f"; HF graph error: {hp['graph_error'][:200]}" if hp.get("graph_error") else "")
            + (f"; HF perf error: {hp['error'][:200]}" if hp.get("error") else ""))

    say("")
    if failures:
        say(f"RESULT: FAIL ({len(failures)} correctness checks)")
        for f in failures:
            say("  " + f)
    else:
        say("RESULT: PASS (every correctness check within its limit)")
    text = "\n".join(lines)
    print(text)
    try:
        with open(os.path.join(args.out, "table.txt"), "w") as f:
            f.write(text + "\n")
    except OSError:
        pass
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

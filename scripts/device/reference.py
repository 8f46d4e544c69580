#!/usr/bin/env python3
# Runs on the device machine (PyTorch + transformers there), from devcheck/ (scripts/device/prepare.sh
# fills it). For each model shape: a random-weight Llama built by transformers on the GPU, cast to bf16 and
# saved as a Hugging Face directory (/tmp/ref/<shape>: safetensors, config.json, tokenizer files) that our
# engine loads; the reference logits of a fixed 64-token prompt and 16 teacher-forced decode steps in fp32,
# bf16, and fp32 with every Linear's input rounded to bf16 ("fastsim": what our fast path computes)
# (logits_{fp32,bf16,fastsim}.bin, [17][vocab] little-endian f32); transformers' own speed as
# the peer (prefill, eager decode, decode over a static cache replayed as one CUDA graph); the card's copy
# bandwidth. Everything goes to /tmp/ref/summary.json (copied to $OUT/reference.json).
# Run: `python3 devcheck/reference.py [--shapes smollm2_135m,llama_1b] [--skip-perf]`.
import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
import traceback

import numpy as np
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))

SHAPES = {
    "smollm2_135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0),
    "llama_1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0),
    # For a smoke test of this script off the device (REF_DEVICE=cpu --shapes tiny --skip-perf): a
    # vocabulary past the tokenizer's, so the padding is exercised too.
    "tiny": dict(vocab_size=50000, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0),
}
DEV = os.environ.get("REF_DEVICE", "cuda")
COMMON = dict(rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=8192, hidden_act="silu",
              bos_token_id=1, eos_token_id=2)
# Weight std 0.03 at SmolLM2's width, 0.03 * sqrt(576 / hidden) on wider models (the same scale at every
# layer's output), and the tied embedding twice that, so logits are not flat (std about 1.4, greedy tokens
# vary) while bf16 rounding is not amplified past what real checkpoints show. Measured on the CPU with
# transformers 5.17: at 0.08 (the earlier hf_check.py's) these 30 random layers amplify bf16 rounding to
# 1.6e-1 rel L2 from fp32 and even a bf16-GEMM-input path lands at 9e-2; at 0.03 x2 HF bf16 is 1.7e-2
# (1B shape 1.8e-2) and the bf16-GEMM-input simulation 7e-3 (9e-3); at 0.02 greedy collapses onto one token.
BASE_INIT = float(os.environ.get("REF_INIT", "0.03"))
EMB_SCALE = float(os.environ.get("REF_EMB_SCALE", "2"))
BASE_HIDDEN = 576


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def set_exact_fp32():
    """No TF32 anywhere: the fp32 reference must be IEEE fp32."""
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
    except (AttributeError, RuntimeError):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def rope_theta_of(cfg):
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_theta" in rp:
        return float(rp["rope_theta"])
    return float(getattr(cfg, "rope_theta", float("nan")))


def build(name, init):
    kw = dict(SHAPES[name], **COMMON, initializer_range=init)
    cfg = LlamaConfig(**kw)
    theta = rope_theta_of(cfg)
    if theta != kw["rope_theta"]:
        raise RuntimeError(f"LlamaConfig kept rope_theta {theta}, asked {kw['rope_theta']}")
    torch.manual_seed(0)
    with torch.device(DEV):
        model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(EMB_SCALE)
    return cast_params(model.eval(), torch.bfloat16)


def cast_params(model, dtype):
    """Casts parameters only: `model.to(dtype)` would also round the RoPE `inv_freq` buffer, which a
    checkpoint loaded with `dtype=bfloat16` keeps in fp32. Tied weights are one Parameter, cast once."""
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def save(model, name, d, vocab):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    try:
        model.save_pretrained(d, safe_serialization=True)
    except TypeError:
        model.save_pretrained(d)
    cpath = os.path.join(d, "config.json")
    c = json.load(open(cpath))
    c.setdefault("torch_dtype", "bfloat16")
    json.dump(c, open(cpath, "w"), indent=2)
    # What our loader (engine/src/model/hf.rs) needs: LlamaForCausalLM, default RoPE, bf16 safetensors.
    from safetensors import safe_open
    dtypes, has_lm_head = set(), False
    files = sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))
    for f in files:
        with safe_open(os.path.join(d, f), "pt") as st:
            for k in st.keys():
                has_lm_head |= k == "lm_head.weight"
                dtypes.add(str(st.get_slice(k).get_dtype()))
    # Tokenizer: the default model's (49152 tokens); a larger vocabulary gets plain dummy vocab entries up
    # to vocab_size, so token ids and the tokenizer's size agree with config.json.
    tok = json.load(open(os.path.join(HERE, "tokenizer.json")))
    v = tok["model"]["vocab"]
    size = max(max(v.values()), max((a["id"] for a in tok.get("added_tokens", [])), default=-1)) + 1
    padded = 0
    for i in range(size, vocab):
        key = f"<|reserved_{i}|>"
        if key in v:
            raise RuntimeError(f"{key} already in the vocabulary")
        v[key] = i
        padded += 1
    json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
    shutil.copy(os.path.join(HERE, "tokenizer_config.json"), d)
    return dict(files=sorted(os.listdir(d)), safetensors_dtypes=sorted(dtypes), lm_head_saved=has_lm_head,
                tokenizer_padded=padded, config_rope=c.get("rope_parameters", c.get("rope_theta")),
                config_dtype=c.get("torch_dtype"), architectures=c.get("architectures"))


def bf16_gemm_inputs(model):
    """Hooks that round every Linear's input to bf16 (round to nearest even): on fp32 weights that hold
    bf16 values this is what our fast path computes (bf16 GEMM inputs, f32 accumulate, everything else
    f32). Returns the hooks; remove them after."""
    return [m.register_forward_pre_hook(lambda _m, a: (a[0].to(torch.bfloat16).float(),) + tuple(a[1:]))
            for m in model.modules() if isinstance(m, torch.nn.Linear)]


@torch.no_grad()
def teacher_forced(model, prompt, fed, steps, exact=False):
    """Last-position logits of the prompt, then of `steps` single-token steps over the HF (dynamic) cache,
    fed `fed` (or its own greedy tokens when None). Returns ([steps+1][vocab] float32 numpy, fed tokens).
    `exact`: attention through SDPA's math backend (plain fp32 matmuls, no fused kernel's shortcuts)."""
    if exact:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.MATH):
            return teacher_forced(model, prompt, fed, steps)
    out = model(input_ids=torch.tensor([prompt], device=DEV), use_cache=True)
    rows, past, toks = [out.logits[0, -1].float()], out.past_key_values, []
    for s in range(steps):
        t = fed[s] if fed is not None else int(rows[-1].argmax())
        toks.append(t)
        out = model(input_ids=torch.tensor([[t]], device=DEV), past_key_values=past, use_cache=True)
        past = out.past_key_values
        rows.append(out.logits[0, -1].float())
    return torch.stack(rows).cpu().numpy().astype("<f4"), toks


def compare(ref, ours):
    """Per step: rel L2 = |ours-ref|/|ref|, max|Δ|/max|ref|; greedy agreement in vLLM's
    check_logprobs_close sense (argmax equal, or each side's argmax in the other's top-5)."""
    rel, mx, exact, close, first_fail = [], [], 0, 0, None
    for i, (a, b) in enumerate(zip(ref.astype(np.float64), ours.astype(np.float64))):
        rel.append(float(np.linalg.norm(b - a) / np.linalg.norm(a)))
        mx.append(float(np.max(np.abs(b - a)) / np.max(np.abs(a))))
        ta, tb = int(np.argmax(a)), int(np.argmax(b))
        top_a, top_b = set(np.argsort(-a)[:5].tolist()), set(np.argsort(-b)[:5].tolist())
        if ta == tb:
            exact += 1
            close += 1
        elif ta in top_b and tb in top_a:
            close += 1
        elif first_fail is None:
            first_fail = i
    return dict(steps=len(rel), rel_l2=rel, max_abs_rel=mx, worst_rel_l2=max(rel), mean_rel_l2=sum(rel) / len(rel),
                worst_max_abs_rel=max(mx), greedy_exact=exact, greedy_close=close, first_fail=first_fail)


def margins(logits):
    top2 = np.sort(logits, axis=1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    return dict(mean_top1_gap=float(gap.mean()), min_top1_gap=float(gap.min()), logit_std=float(logits.std()),
                distinct_greedy=len(set(np.argmax(logits, axis=1).tolist())))


def timed(fn, reps, warm=1):
    """Median seconds of `reps` calls after `warm`, timed with CUDA events (a host clock off the GPU)."""
    for _ in range(warm):
        fn()
    ts = []
    if DEV != "cuda":
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts), ts
    torch.cuda.synchronize()
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    return statistics.median(ts), ts


def copy_bandwidth():
    n = 2 * 1024 ** 3
    src = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    dst = torch.empty_like(src)
    t, ts = timed(lambda: dst.copy_(src), reps=15, warm=3)
    del src, dst
    torch.cuda.empty_cache()
    return dict(bytes_moved=2 * n, median_s=t, GBps=2 * n / t / 1e9, runs_s=ts)


@torch.no_grad()
def perf(model, vocab, prompt_len, new):
    r = {"prompt_tokens": prompt_len, "new_tokens": new}
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, vocab, (1, prompt_len), generator=g).to(DEV)

    # Prefill: one forward of the prompt, last position's logits only (what a server computes).
    def prefill():
        try:
            return model(input_ids=ids, use_cache=False, logits_to_keep=1)
        except TypeError:
            return model(input_ids=ids, use_cache=False)
    t, ts = timed(prefill, reps=7, warm=2)
    r.update(prefill_s=t, prefill_tok_s=prompt_len / t, prefill_runs_s=ts)

    # Eager decode, model.generate (dynamic cache): time(generate `new`) - time(prefill) over new - 1
    # tokens (the first new token comes from the prefill).
    try:
        gen_tokens = None
        def gen(n):
            nonlocal gen_tokens
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                 min_new_tokens=n, do_sample=False, pad_token_id=0)
            gen_tokens = out[0, prompt_len:].tolist()
        gen(4)
        tg, _ = timed(lambda: gen(new), reps=1, warm=0)
        if len(gen_tokens) != new:
            raise RuntimeError(f"generate gave {len(gen_tokens)} tokens, asked {new}")
        r.update(eager_generate_s=tg, eager_decode_tok_s=(new - 1) / (tg - t))
    except Exception as e:
        r["eager_error"] = f"{type(e).__name__}: {e}"
        log(traceback.format_exc())

    # Eager decode, a plain loop over the dynamic cache (no generate overhead): 32 steps timed.
    try:
        out = model(input_ids=ids, use_cache=True)
        past, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
        def loop():
            nonlocal past, tok
            for _ in range(32):
                o = model(input_ids=tok, past_key_values=past, use_cache=True)
                past, tok = o.past_key_values, o.logits[:, -1:].argmax(-1)
        tl, _ = timed(loop, reps=1, warm=0)
        r.update(eager_loop_decode_tok_s=32 / tl)
        del past
    except Exception as e:
        r["eager_loop_error"] = f"{type(e).__name__}: {e}"
        log(traceback.format_exc())

    # Static cache + one decode step captured in a CUDA graph, replayed `new` times.
    try:
        r.update(graph_decode(model, ids, prompt_len, new, gen_tokens))
    except Exception as e:
        r["graph_error"] = f"{type(e).__name__}: {e}"
        log(traceback.format_exc())
    if DEV == "cuda":
        torch.cuda.synchronize()
    return r


@torch.no_grad()
def graph_decode(model, ids, prompt_len, new, gen_tokens):
    from transformers import StaticCache
    max_len = prompt_len + new + 8
    try:
        cache = StaticCache(config=model.config, max_cache_len=max_len)
    except TypeError:
        cache = StaticCache(config=model.config, max_batch_size=1, max_cache_len=max_len, device=DEV,
                            dtype=torch.bfloat16)
    # Prefill eagerly (also allocates the cache's tensors).
    out = model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(prompt_len, device=DEV),
                use_cache=True)
    first = out.logits[:, -1:].argmax(-1)
    tok = first.clone()
    pos = torch.tensor([prompt_len], device=DEV)
    produced = torch.zeros(new + 8, dtype=torch.long, device=DEV)

    def step():
        logits = model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
        nxt = logits[:, -1:].argmax(-1)
        produced.index_copy_(0, pos - prompt_len, nxt.view(1))
        tok.copy_(nxt)
        pos.add_(1)

    # transformers 5's static layers write at their own device-side counter (cumulative_length), not at
    # cache_position (which places RoPE and the mask): rewind both.
    counters = [l.cumulative_length for l in getattr(cache, "layers", [])
                if isinstance(getattr(l, "cumulative_length", None), torch.Tensor)]

    def reset():
        tok.copy_(first)
        pos.fill_(prompt_len)
        for c in counters:
            c.fill_(prompt_len)

    if DEV == "cuda":
        # Warm up on a side stream (as torch.cuda.graphs asks), then capture one step.
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                reset()
                step()
        torch.cuda.current_stream().wait_stream(s)
        reset()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        torch.cuda.synchronize()
        replay = graph.replay
    else:
        graph, replay = None, step  # off the GPU (a smoke test): the same steps, eagerly

    def run():
        reset()
        for _ in range(new):
            replay()
    t, ts = timed(run, reps=3, warm=1)
    r = dict(graph_decode_tok_s=new / t, graph_decode_s=t, graph_runs_s=ts, graph_cache_counters=len(counters))
    if int(pos) != prompt_len + new or any(int(c) != prompt_len + new for c in counters):
        raise RuntimeError(f"after {new} replays the position is {int(pos)} and the cache counters "
                           f"{sorted({int(c) for c in counters})}, expected {prompt_len + new}")
    if gen_tokens is not None:
        # Graph tokens: first (from the prefill), then one per replay (the replay at position p produces
        # the token after p). generate's tokens are the same sequence; bf16 may diverge late.
        ours = [int(first)] + produced[:new - 1].tolist()
        agree = 0
        for a, b in zip(ours, gen_tokens):
            if a != b:
                break
            agree += 1
        r["graph_tokens_agreeing_with_generate"] = agree
    del graph, cache
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=os.environ.get("REF_SHAPES", "smollm2_135m,llama_1b"))
    ap.add_argument("--out", default=os.environ.get("REF_DIR", "/tmp/ref"))
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--perf-prompt", type=int, default=512)
    ap.add_argument("--perf-new", type=int, default=128)
    ap.add_argument("--skip-perf", action="store_true")
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        sys.exit(f"unknown shapes {unknown}; known: {list(SHAPES)}")
    set_exact_fp32()
    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    summary = dict(torch=torch.__version__, transformers=transformers.__version__,
                   device=torch.cuda.get_device_name(0) if DEV == "cuda" else DEV, prompt_len=args.prompt_len,
                   steps=args.steps, init=BASE_INIT, emb_scale=EMB_SCALE, shapes={}, errors=[],
                   fp32_matmul=str(getattr(torch.backends.cuda.matmul, "fp32_precision", "?")))

    def write():
        summary["wall_s"] = time.time() - started
        path = os.path.join(args.out, "summary.json")
        json.dump(summary, open(path, "w"), indent=1)
        if os.environ.get("OUT"):
            os.makedirs(os.environ["OUT"], exist_ok=True)
            shutil.copy(path, os.path.join(os.environ["OUT"], "reference.json"))

    # Phase 1: build, save, correctness references (every shape first, so a perf failure costs none).
    models = {}
    for name in shapes:
        t0 = time.time()
        s = summary["shapes"][name] = {"dir": os.path.join(args.out, name)}
        try:
            hidden = SHAPES[name]["hidden_size"]
            init = round(BASE_INIT * math.sqrt(BASE_HIDDEN / hidden), 4)
            vocab = SHAPES[name]["vocab_size"]
            model = build(name, init)
            s.update(initializer_range=init, config=dict(SHAPES[name], **COMMON),
                     params=sum(p.numel() for p in model.parameters()),
                     attn_implementation=getattr(model.config, "_attn_implementation", None),
                     buffers={n: str(b.dtype) for n, b in list(model.named_buffers())[:8]})
            s["saved"] = save(model, name, s["dir"], vocab)
            g = torch.Generator().manual_seed(1234)
            prompt = torch.randint(0, vocab, (args.prompt_len,), generator=g).tolist()
            json.dump(prompt, open(os.path.join(s["dir"], "prompt.json"), "w"))
            cast_params(model, torch.float32)
            l32, fed = teacher_forced(model, prompt, None, args.steps, exact=True)
            hooks = bf16_gemm_inputs(model)
            lsim, _ = teacher_forced(model, prompt, fed, args.steps, exact=True)
            for h in hooks:
                h.remove()
            cast_params(model, torch.bfloat16)
            l16, _ = teacher_forced(model, prompt, fed, args.steps)
            l32.tofile(os.path.join(s["dir"], "logits_fp32.bin"))
            l16.tofile(os.path.join(s["dir"], "logits_bf16.bin"))
            lsim.tofile(os.path.join(s["dir"], "logits_fastsim.bin"))
            json.dump(fed, open(os.path.join(s["dir"], "tokens.json"), "w"))
            s.update(vocab=vocab, emb_scale=EMB_SCALE, fed_tokens=fed, fp32=margins(l32),
                     bf16_vs_fp32=compare(l32, l16), fastsim_vs_fp32=compare(l32, lsim),
                     fastsim_vs_bf16=compare(l16, lsim))
            if s["fp32"]["distinct_greedy"] < 4 or s["fp32"]["mean_top1_gap"] < 0.05:
                s.setdefault("warnings", []).append("degenerate logits: few distinct greedy tokens or tiny top-1 margin")
            models[name] = model
        except Exception as e:
            s["error"] = f"{type(e).__name__}: {e}"
            summary["errors"].append(f"{name}: {s['error']}")
            log(traceback.format_exc())
        s["phase1_s"] = time.time() - t0
        log(f"{name}: phase 1 {s['phase1_s']:.1f} s", {k: s.get(k) for k in ("params", "fp32", "error")})
        write()

    try:
        if DEV == "cuda":
            summary["copy"] = copy_bandwidth()
    except Exception as e:
        summary["errors"].append(f"copy bandwidth: {type(e).__name__}: {e}")
        log(traceback.format_exc())
    write()

    if not args.skip_perf:
        for name, model in models.items():
            t0 = time.time()
            try:
                summary["shapes"][name]["perf"] = perf(model, SHAPES[name]["vocab_size"], args.perf_prompt,
                                                       args.perf_new)
            except Exception as e:
                summary["shapes"][name]["perf"] = {"error": f"{type(e).__name__}: {e}"}
                summary["errors"].append(f"{name} perf: {type(e).__name__}: {e}")
                log(traceback.format_exc())
            summary["shapes"][name]["perf_s"] = time.time() - t0
            write()

    # Compact block.
    print(f"reference: torch {summary['torch']}, transformers {summary['transformers']}, {summary['device']}, "
          f"{summary['wall_s']:.0f} s")
    if "copy" in summary:
        print(f"  copy bandwidth (read+write): {summary['copy']['GBps']:.0f} GB/s")
    for name, s in summary["shapes"].items():
        if "error" in s:
            print(f"  {name}: ERROR {s['error']}")
            continue
        b, m, p = s["bf16_vs_fp32"], s["fp32"], s.get("perf", {})
        print(f"  {name}: {s['params'] / 1e6:.0f} M params, init {s['initializer_range']}; fp32 logits std "
              f"{m['logit_std']:.2f}, mean top1-top2 gap {m['mean_top1_gap']:.3f} (min {m['min_top1_gap']:.3f}), "
              f"{m['distinct_greedy']} distinct greedy of {b['steps']}")
        for label, c in (("bf16 vs fp32", b), ("fastsim vs fp32", s["fastsim_vs_fp32"]),
                         ("fastsim vs bf16", s["fastsim_vs_bf16"])):
            print(f"    {label}: worst rel L2 {c['worst_rel_l2']:.2e}, mean {c['mean_rel_l2']:.2e}, greedy exact "
                  f"{c['greedy_exact']}/{c['steps']}, close {c['greedy_close']}/{c['steps']}")
        fmt = lambda k: f"{p[k]:.0f}" if isinstance(p.get(k), (int, float)) else "n/a"
        print(f"    transformers bf16: prefill {fmt('prefill_tok_s')} tok/s, decode eager generate "
              f"{fmt('eager_decode_tok_s')}, eager loop {fmt('eager_loop_decode_tok_s')}, static+graph "
              f"{fmt('graph_decode_tok_s')} tok/s"
              + (f"; graph error: {p['graph_error']}" if "graph_error" in p else "")
              + (f"; graph tokens agreeing with generate: {p['graph_tokens_agreeing_with_generate']}"
                 if "graph_tokens_agreeing_with_generate" in p else ""))
    for e in summary["errors"]:
        print("  error:", e)
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

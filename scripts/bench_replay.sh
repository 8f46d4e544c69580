#!/usr/bin/env bash
# Replay cost, against baselines measured in the same run (release build, the real model):
#  1. Overhead of replay itself: `ctxscope replay` of the 8-turn fixture conversation
#     (tests/fixtures/replay/) on the golden target alone, against the same 8 requests (same body:
#     greedy, seed 0, max_tokens 24, top-5 logprobs) sent straight to a fresh `ctxscope engine`, at
#     concurrency 1 and 2.
#  2. Bisection cost: `ctxscope bisect --metric probes` over 4 and 8 patches (one context fault among
#     numerical patches), in replays (replays_run against naive_replays) and in wall time against the
#     naive search run for real: golden once, then each patch alone (`replay --resume` of the golden
#     run, which reuses golden's results), and against all single-patch targets in one replay.
# Prints markdown on stdout (progress on stderr); with --write it also replaces the generated block
# between the replay markers in BENCHMARKS.md. Environment: CTXSCOPE_MODEL, BENCH_REPS (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=lib/bench_block.sh
. scripts/lib/bench_block.sh
bench_flags scripts/bench_replay.sh "$@"

bench_model
bench_release_run
{
  bench_header
  echo "Command: \`scripts/bench_replay.sh\`${BENCH_REPS:+ with BENCH_REPS=$BENCH_REPS} (release build; model $(basename "$model"))."
  echo
  python3 - "$bin" "$model" "$PWD/tests/fixtures/replay" "$work" "${BENCH_REPS:-3}" <<'PY'
import json, os, signal, socket, statistics, subprocess, sys, time, urllib.request

sys.path.insert(0, "scripts/lib")
from benchutil import free_port, log, wait_ok  # noqa: E402
from concurrent.futures import ThreadPoolExecutor

BIN, MODEL, FIXTURES, WORK, REPS = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1"
MAX_TOKENS = 24
CTX_SHIFT = 96
DATA = os.path.join(WORK, "data")
PROBES = os.path.join(FIXTURES, "secret_word_probes.json")
ENV = dict(os.environ, CTXSCOPE_LOG="warn")


def http(method, url, body=None, headers=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"content-type": "application/json", **(headers or {})}, method=method)
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def start(args):
    return subprocess.Popen(args, env=ENV, stdout=subprocess.DEVNULL, stderr=open(os.path.join(WORK, "servers.log"), "a"))


def stop(process):
    process.send_signal(signal.SIGTERM)
    if process.wait(timeout=30) != 0:
        raise SystemExit(f"{process.args[:2]} exited with {process.returncode}")


def ctxscope(*args):
    """Runs the CLI; returns (stdout as JSON, wall seconds)."""
    started = time.perf_counter()
    done = subprocess.run([BIN, *map(str, args)], env=ENV, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"ctxscope {' '.join(map(str, args))} failed:\n{done.stderr}")
    return json.loads(done.stdout), wall


def mean_sd(values):
    return (statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0)


def fmt(values):
    m, sd = mean_sd(values)
    return f"{m:.2f} ± {sd:.2f}"


# Capture the fixture conversation through serve, turn by turn.
ports = [free_port() for _ in range(3)]
serve = start([BIN, "serve", "--model", MODEL, "--listen", f"127.0.0.1:{ports[0]}", "--proxy", f"127.0.0.1:{ports[1]}",
               "--admin", f"127.0.0.1:{ports[2]}", "--flush-ms", "50", "--data", DATA])
wait_ok(f"http://127.0.0.1:{ports[0]}/health")
wait_ok(f"http://127.0.0.1:{ports[2]}/healthz")
turns = json.load(open(os.path.join(FIXTURES, "secret_word_turns.json")))
messages, requests = [], []
for user in turns:
    messages.append({"role": "user", "content": user})
    requests.append(list(messages))
    body = {"model": MODEL_NAME, "messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS}
    reply = http("POST", f"http://127.0.0.1:{ports[1]}/v1/chat/completions", body)
    messages.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"]})
deadline = time.time() + 20
while True:
    listing = http("GET", f"http://127.0.0.1:{ports[2]}/api/conversations")
    if sum(c["turns"] for c in listing) >= len(turns) or time.time() > deadline:
        break
    time.sleep(0.05)
stop(serve)
assert len(listing) == 1 and listing[0]["turns"] == len(turns), listing
conversation = listing[0]["id"]
log(f"captured conversation {conversation}: {len(turns)} turns")
common = ["--data", DATA, "--model", MODEL, "--max-tokens", MAX_TOKENS]

# 1. Replay overhead.
# The body replay sends for an engine target (client.rs request_body), with the golden patch header.
bodies = [{"model": MODEL_NAME, "messages": m, "temperature": 0, "seed": 0, "max_tokens": MAX_TOKENS, "stream": False,
           "logprobs": True, "top_logprobs": 5} for m in requests]


def replay_golden(concurrency):
    report, wall = ctxscope("replay", conversation, *common, "--concurrency", concurrency, "--json")
    proper = (report["finished_unix_ms"] - report["started_unix_ms"]) / 1e3
    texts = [r["outcome"]["text"] for r in sorted(report["results"], key=lambda r: r["turn"])]
    return wall, proper, texts


def direct(concurrency):
    port = free_port()
    engine = start([BIN, "engine", "--model", MODEL, "--listen", f"127.0.0.1:{port}"])
    wait_ok(f"http://127.0.0.1:{port}/health")
    send = lambda body: http("POST", f"http://127.0.0.1:{port}/v1/chat/completions", body, {"x-ctxscope-patches": ""})
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        replies = list(pool.map(send, bodies))
    wall = time.perf_counter() - started
    stop(engine)
    usage = [(r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"]) for r in replies]
    return wall, [r["choices"][0]["message"]["content"] for r in replies], usage


timings = {c: {"direct": [], "proper": [], "command": []} for c in (1, 2)}
same = True
for rep in range(REPS):
    for c in (1, 2):
        # Alternate which goes first, so that neither always follows the other.
        if rep % 2 == 0:
            wall, proper, replayed = replay_golden(c)
            direct_wall, texts, usage = direct(c)
        else:
            direct_wall, texts, usage = direct(c)
            wall, proper, replayed = replay_golden(c)
        same &= replayed == texts
        timings[c]["direct"].append(direct_wall)
        timings[c]["proper"].append(proper)
        timings[c]["command"].append(wall)
        log(f"rep {rep} concurrency {c}: direct {direct_wall:.2f} s, replay {proper:.2f} s (command {wall:.2f} s)")
prompt, completion = sum(u[0] for u in usage), sum(u[1] for u in usage)

print(f"### Replay overhead: golden alone against the same requests sent straight to the engine")
print()
print(f"{len(turns)}-turn conversation (fixture `secret_word_turns.json`), {prompt} prompt and {completion} generated tokens over")
print(f"the {len(turns)} requests; max_tokens {MAX_TOKENS}, greedy, top-5 logprobs; {REPS} runs each, alternating which goes first, each on a fresh engine")
print("(cold prefix cache). *Direct*: the same bodies POSTed to `ctxscope engine` (Python, a thread pool of the")
print("given size, turns in order). *Replay*: the report's started→finished (requests, comparison, probes: none here);")
print("*command*: the whole `ctxscope replay` process (model load, store write, JSON output included).")
print(f"Replies identical to the direct ones on every run: {'yes' if same else 'NO'}.")
print()
print("| concurrency | direct s | replay s | replay / direct | command s | command / direct |")
print("|---|---|---|---|---|---|")
for c in (1, 2):
    t = timings[c]
    d, p, w = statistics.mean(t["direct"]), statistics.mean(t["proper"]), statistics.mean(t["command"])
    print(f"| {c} | {fmt(t['direct'])} | {fmt(t['proper'])} | {p / d:.3f} | {fmt(t['command'])} | {w / d:.3f} |")
print()

# 2. Bisection against the naive search.
fault = f"ctx_shift={CTX_SHIFT}"
sets = {
    4: ["rmsnorm_bf16", "rope_bf16", fault, "kv_fp8"],
    8: ["rmsnorm_bf16", "residual_gemm_bf16", "rope_bf16", "attn_splitk_bf16", fault, "kv_fp8", "act_q8", "prefix_cache_off"],
}
probe_args = ["--probes", PROBES, "--concurrency", 2, "--json"]


def failed_probes(report, target):
    return sum(not p["passed"] for r in report["results"] if r["target"] == target for p in r["probes"])


rows = []
for size, patches in sets.items():
    report, bisect_wall = ctxscope("bisect", conversation, *common, "--patches", ",".join(patches), "--metric", "probes",
                                   "--threshold", "0.0", *probe_args)
    b = report["bisect"]
    log(f"bisect {size}: culprit {b['culprit']} in {b['replays_run']} replays, {bisect_wall:.1f} s")
    # Naive, one patch at a time: golden once, then each patch alone resuming that run (golden reused).
    golden, golden_wall = ctxscope("replay", conversation, *common, *probe_args)
    rid = golden["id"]
    _, fixed = ctxscope("replay", conversation, *common, "--resume", rid, *probe_args)
    naive_walls, naive_culprits = [], []
    for patch in patches:
        step, wall = ctxscope("replay", conversation, *common, "--resume", rid, "--target", f"engine:patches={patch}", *probe_args)
        naive_walls.append(wall)
        name = [t["name"] for t in step["targets"] if t["name"] != "golden"][0]
        if failed_probes(step, name) > 0:
            naive_culprits.append(patch)
    naive_wall = golden_wall + sum(naive_walls)
    # Naive, all at once: every single-patch target in one replay.
    targets = [a for p in patches for a in ("--target", f"engine:patches={p}")]
    _, parallel_wall = ctxscope("replay", conversation, *common, *targets, *probe_args)
    log(f"naive {size}: sequential {naive_wall:.1f} s (fixed cost per command {fixed:.2f} s), all at once {parallel_wall:.1f} s")
    rows.append((size, b, bisect_wall, naive_wall, fixed, parallel_wall, naive_culprits))

print("### Bisection against the naive search (metric probes, threshold 0)")
print()
print(f"Same conversation, the 4 recall probes of `secret_word_probes.json`, concurrency 2, one context fault")
print(f"(`{fault}`) among numerical patches. *Bisect*: the whole `ctxscope bisect` command (golden once, then")
print("ddmin's subset replays one after another). *Naive sequential*: golden once, then each patch alone, each")
print("a `ctxscope replay --resume` of the golden run (golden's results reused), summed; every one of these")
print("commands also pays the fixed cost of a process and a model load (measured as a resume with nothing")
print("left to run), so the last-but-one column takes it out. *Naive all at once*: one `ctxscope replay` with")
print("every single-patch target (they batch together in the engine).")
print()
print("| patches | culprit (bisect / naive) | replays: bisect / naive | bisect s | naive sequential s | bisect / naive | naive sequential minus fixed costs s | naive all at once s | bisect / all at once |")
print("|---|---|---|---|---|---|---|---|---|")
for size, b, bw, nw, fixed, pw, naive_culprits in rows:
    extra = len(b["patches"]) * fixed
    culprit = "+".join(b["culprit"]) or "none"
    print(f"| {size} | {culprit} / {'+'.join(naive_culprits) or 'none'} | {b['replays_run']} / {b['naive_replays']} | {bw:.1f} | {nw:.1f} | {bw / nw:.2f} "
          f"| {nw - extra:.1f} (fixed {fixed:.2f} s each) | {pw:.1f} | {bw / pw:.2f} |")
print()
print("Bisection steps (subset: score = fraction of probes failed):")
print()
for size, b, *_ in rows:
    steps = "; ".join(f"{'+'.join(s['patches'])}: {s['score']:.2f}{' (reused)' if s['reused'] else ''}" for s in b["steps"])
    print(f"- {size} patches: {steps}")
PY
  echo
  echo "Load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)."
} > "$out"
cat "$out"

if [ "$write" = 1 ]; then
  replace_block replay scripts/bench_replay.sh "$out"
fi

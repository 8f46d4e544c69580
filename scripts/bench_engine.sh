#!/usr/bin/env bash
# Engine throughput: builds and runs engine/benches/throughput.rs (pp512 / tg128 at batch 1 and 8,
# golden and fast paths, per-matrix matmul timings, fast-vs-golden logit differences) and, when
# llama.cpp's llama-bench is installed (the portable build of scripts/llama_cpp/install.sh),
# runs `llama-bench -m MODEL -t 2 -p 512 -n 128` right before ours and adds ours/llama.cpp ratios.
# Prints markdown; with --write it also replaces the generated block between the engine markers in
# BENCHMARKS.md. Environment passed through: CTXSCOPE_MODEL, LLAMA_BENCH (path to llama-bench),
# BENCH_PATHS, BENCH_REPS, BENCH_SKIP (see the bench's module doc).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=lib/bench_block.sh
. scripts/lib/bench_block.sh
bench_flags scripts/bench_engine.sh "$@"

bench_model
threads="$(nproc)"

# llama-bench from the portable build scripts/llama_cpp/install.sh makes (its --find never builds).
find_llama_bench() {
  if [ -n "${LLAMA_BENCH:-}" ]; then echo "$LLAMA_BENCH"; return; fi
  local dir
  dir="$(bash scripts/llama_cpp/install.sh --find 2>/dev/null || true)"
  if [ -n "$dir" ] && [ -x "$dir/llama-bench" ]; then echo "$dir/llama-bench"; fi
}

cargo bench -p ctxscope-engine --bench throughput --no-run

# Percent of CPU time busy (any process) over the next 5 seconds.
cpu_busy() {
  local a b
  a=$(head -1 /proc/stat)
  sleep 5
  b=$(head -1 /proc/stat)
  awk -v a="$a" -v b="$b" 'BEGIN {
    n = split(a, x, " "); split(b, y, " "); total = 0
    for (i = 2; i <= n; i++) total += y[i] - x[i]
    idle = (y[5] - x[5]) + (y[6] - x[6])
    busy = 0
    if (total > 0) busy = 100 * (total - idle) / total
    printf "%.0f", busy
  }'
}

out=$(mktemp)
trap 'rm -f "$out" "$out.json"' EXIT
{
  bench_header
  echo "Command: \`scripts/bench_engine.sh\`${BENCH_PATHS:+ with BENCH_PATHS=$BENCH_PATHS}${BENCH_REPS:+ with BENCH_REPS=$BENCH_REPS}${BENCH_SKIP:+ with BENCH_SKIP=$BENCH_SKIP}."
  echo
  llama_bench="$(find_llama_bench)"
  if [ -n "$llama_bench" ]; then
    echo "CPU busy before llama-bench: $(cpu_busy)% (5 s sample, all processes)."
    echo
    echo "llama.cpp: \`$(basename "$llama_bench") -m $(basename "$model") -t $threads -p 512 -n 128\` ($({ "$llama_bench" --version 2>&1 || true; } | grep -m1 -i version || echo 'version unknown')):"
    echo
    "$llama_bench" -m "$model" -t "$threads" -p 512 -n 128 -o json > "$out.json"
    eval "$(python3 - "$out.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    if r["n_prompt"] == 512 and r["n_gen"] == 0:
        print(f"export LLAMA_PP512={r['avg_ts']:.2f}; pp_sd={r['stddev_ts']:.2f}")
    if r["n_gen"] == 128 and r["n_prompt"] == 0:
        print(f"export LLAMA_TG128={r['avg_ts']:.2f}; tg_sd={r['stddev_ts']:.2f}")
PY
)"
    echo "| test | llama.cpp t/s |"
    echo "|---|---|"
    echo "| pp512 | ${LLAMA_PP512:-?} ± ${pp_sd:-?} |"
    echo "| tg128 | ${LLAMA_TG128:-?} ± ${tg_sd:-?} |"
    echo
    echo "ctxscope (load average now $(cut -d' ' -f1-3 /proc/loadavg); CPU busy before it: $(cpu_busy)%):"
  else
    echo "llama.cpp's llama-bench is not installed (scripts/llama_cpp/install.sh builds it): no ratio column."
  fi
  echo
  cargo bench -q -p ctxscope-engine --bench throughput
  echo
  echo "Load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)."
} > "$out"
cat "$out"

if [ "$write" = 1 ]; then
  replace_block engine scripts/bench_engine.sh "$out"
fi

#!/usr/bin/env bash
# Builds the release `ctxscope` binary and runs the open-loop proxy latency benchmark
# (proxy/benches/latency.rs) against it. Prints the results in markdown; with --write it also
# replaces the generated block between the latency markers in BENCHMARKS.md.
# Environment passed through: CTXSCOPE_BIN, LATENCY_RATES (e.g. 500,2000), LATENCY_QUICK=1,
# LATENCY_PROXY_ARGS (extra flags for the capturing proxy, e.g. --no-detect), LATENCY_OTLP=1 (the OTLP
# variant: a capturing proxy that also exports every turn with --otlp-endpoint joins the load phases,
# with ratios against the capturing proxy; --write then fills the `otlp` block instead).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=lib/bench_block.sh
. scripts/lib/bench_block.sh
bench_flags scripts/bench.sh "$@"

cargo build --release -p ctxscope
cargo bench -p ctxscope-proxy --bench latency --no-run

out=$(mktemp)
trap 'rm -f "$out"' EXIT
{
  bench_header
  echo "Command: \`scripts/bench.sh\` = \`cargo build --release -p ctxscope && cargo bench -p ctxscope-proxy --bench latency\`${LATENCY_RATES:+ with LATENCY_RATES=$LATENCY_RATES}${LATENCY_QUICK:+ with LATENCY_QUICK=$LATENCY_QUICK}${LATENCY_PROXY_ARGS:+ with LATENCY_PROXY_ARGS=$LATENCY_PROXY_ARGS}${LATENCY_OTLP:+ with LATENCY_OTLP=$LATENCY_OTLP}."
  echo
  cargo bench -q -p ctxscope-proxy --bench latency
} > "$out"
cat "$out"

if [ "$write" = 1 ]; then
  if [ "${LATENCY_OTLP:-}" = 1 ]; then
    replace_block otlp scripts/bench.sh "$out"
  else
    replace_block latency scripts/bench.sh "$out"
  fi
fi

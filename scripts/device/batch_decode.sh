#!/usr/bin/env bash
# Decode speed by batch size, several runs, on the device machine with devcheck/ carried:
# `bash devcheck/batch_decode.sh MODEL_DIR`. Each run is a fresh `device_bench` process (BENCH_BATCHES from
# BATCH_SIZES, default 1,4; no decode variants) per setting in BATCH_SETTINGS (space-separated; `default`, or NAME=VALUE for the
# backend's environment, such as CTXSCOPE_CUDA_GEMV_ROWS=4), BATCH_RUNS (default 3) rounds, settings
# alternating within a round. A model folder without reference logits is fine (the speed sections run).
# Prints, per run, tokens/s (sum over the sequences) and the GPU time per step of the captured graph
# where there is one; JSON per run in $OUT/batch_*.json.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT="${OUT:-/tmp/devcheck_out}"
mkdir -p "$OUT"
bash devcheck/unpack.sh || exit 2
model="${1:?usage: batch_decode.sh MODEL_DIR}"
settings="${BATCH_SETTINGS:-default}"
for round in $(seq 1 "${BATCH_RUNS:-3}"); do
  for setting in $settings; do
    env_args=()
    [ "$setting" = default ] || env_args=("$setting")
    json="$OUT/batch_${round}_${setting//[^A-Za-z0-9]/_}.json"
    env "${env_args[@]}" BENCH_BATCHES="${BATCH_SIZES:-1,4}" BENCH_VARIANTS=none BENCH_JSON="$json" \
      timeout 120 ./devcheck/device_bench "$model" > /dev/null 2>> "$OUT/batch.log"
    python3 - "$json" "$round" "$setting" <<'PY'
import json, sys
f, rnd, setting = sys.argv[1:]
try:
    p = json.load(open(f)).get("perf", {})
except Exception as e:
    print(f"round {rnd} {setting}: no result ({e})"); sys.exit()
for path in ("fast", "golden"):
    q = p.get(path, {})
    cells = []
    for b in (1, 2, 3, 4, 5, 6, 7, 8):
        key = "decode" if b == 1 else f"batch{b}"
        if f"{key}_tok_s" in q:
            g = q.get(f"{key}_graph_replay_s")
            cells.append(f"batch{b} {q[key + '_tok_s']:6.0f} tok/s ({f'{g * 1e6:.0f} us/step' if g else 'no graph'})")
    print(f"round {rnd} {setting:<28} {path:<6} " + "  ".join(cells))
PY
  done
done

#!/usr/bin/env bash
# On the device machine, with devcheck/ carried: the revisions ab_prepare.sh built (devcheck/ab/bench_*)
# timed in turn on the same card in one call — each shape, AB_REPS rounds (default 2), every binary once
# per round so drift hits all alike — then one line per (shape, binary): the batch-1 decode's GPU time
# per step (graph replay) and its serving-path tokens/s, each round's figure and their mean, and each
# round's check of the variant's logits against the fp32 reference ("WRONG": do not trust its speed).
#   AB_SHAPES   shapes to build with reference.py and time (default "llama_1b,smollm2_135m")
#   AB_VARIANT  the device_bench decode variant timed (default the serving default below)
#   AB_ENV      extra environment for every binary, e.g. "CTXSCOPE_CUDA_SPECULATE=0"
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT="${OUT:-/tmp/ab_out}"
mkdir -p "$OUT"
shapes="${AB_SHAPES:-llama_1b,smollm2_135m}"
reps="${AB_REPS:-2}"
variant="${AB_VARIANT:-stream_lane128_qkv128_blocks4_cluster16}"
missing=""
for s in ${shapes//,/ }; do
  [ -f "/tmp/ref/$s/config.json" ] || missing="$missing,$s"
done
if [ -n "$missing" ]; then
  python3 devcheck/reference.py --shapes "${missing#,}" --skip-perf > "$OUT/reference.log" 2>&1 || { tail -5 "$OUT/reference.log"; exit 2; }
fi
bash devcheck/unpack.sh || { echo "unpacking devcheck/ab/*.gz failed"; exit 2; }
binaries=()
for b in devcheck/ab/bench_*; do
  [ -x "$b" ] && [ "${b%.gz}" = "$b" ] && binaries+=("$b")
done
[ "${#binaries[@]}" -gt 0 ] || { echo "no devcheck/ab/bench_*: run scripts/device/ab_prepare.sh here first"; exit 2; }
results="$OUT/ab.tsv"
: > "$results"
for s in ${shapes//,/ }; do
  for round in $(seq 1 "$reps"); do
    for b in "${binaries[@]}"; do
      # shellcheck disable=SC2086 # AB_ENV is a list of NAME=value words
      line=$(env ${AB_ENV:-} BENCH_VARIANTS_ONLY=1 BENCH_VARIANTS="$variant" timeout 150 "$b" "/tmp/ref/$s" 2>&1 >/dev/null | grep "graph replay" | head -1)
      tok=$(echo "$line" | sed -n 's/.*: \([0-9]*\) tok\/s.*/\1/p')
      us=$(echo "$line" | sed -n 's/.*graph replay \([0-9.]*\) us.*/\1/p')
      # The variant's logits against the fp32 reference (device_bench checks them after timing it).
      check=$(echo "$line" | sed -n 's/.*logits vs fp32 worst rel L2 \([^ ]*\) (\([A-Za-z]*\)).*/\2 \1/p')
      [ -n "$check" ] || check=$(echo "$line" | grep -q "logits vs fp32 (error" && echo "error" || echo "unchecked")
      printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$s" "${b##*/bench_}" "$round" "${us:-failed}" "${tok:-failed}" "$check" >> "$results"
    done
  done
done
python3 - "$results" <<'PY'
import collections, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    shape, label, _, us, tok, check = line.rstrip("\n").split("\t")
    rows.setdefault((shape, label), []).append((us, tok, check))
print(f"{'shape':<14} {'binary':<24} {'us per step (graph replay)':<34} {'tok/s (serving path)':<28} logits vs fp32 (worst rel L2)")
for (shape, label), runs in rows.items():
    def cell(k):
        vals = [r[k] for r in runs]
        nums = [float(v) for v in vals if v != "failed"]
        mean = f"mean {sum(nums) / len(nums):.1f}" if nums else "no result"
        return f"{' / '.join(vals)}  {mean}"
    checks = " / ".join(r[2] for r in runs)
    print(f"{shape:<14} {label:<24} {cell(0):<34} {cell(1):<28} {checks}")
PY

#!/usr/bin/env bash
# The whole device check in one call, on the device machine, from the repository root with devcheck/
# carried (scripts/device/prepare.sh fills it): `bash devcheck/run.sh`. Steps, each under its own time
# limit inside one overall budget (RUN_BUDGET seconds, default 560, under the call's 600), none stopping
# the next:
#   1. ./devcheck/kernels_check                      the kernels against CPU references
#   2. python3 devcheck/reference.py                 transformers references and peers -> /tmp/ref/<shape>
#   3. ./devcheck/device_bench /tmp/ref/<shape>      our CUDA backend, per shape -> $OUT/bench_<shape>.json
#   4. python3 devcheck/hf_check.py --device cuda    `ctxscope engine --device cuda` over HTTP vs transformers
#   5. devcheck/tests/* (if prepare.sh put any)      engine test binaries, CTXSCOPE_MODEL=/tmp/ref/smollm2_135m
#   6. python3 devcheck/table.py                     the short table, printed last
# Everything also goes to $OUT/run.log. Exit status: 1 when a correctness check failed (table.py), 2 when
# only a step failed, 0 otherwise. REF_SHAPES=smollm2_135m runs one shape; REUSE_REF=1 keeps the
# references an earlier call left in /tmp/ref on a still-warm machine; RUN_TRACE=1 adds a traced run
# of the 1B decode variants, RUN_AB=1 the A/B of devcheck/ab (below). The binaries travel gzipped
# (unpack.sh unpacks them first).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT="${OUT:-/tmp/devcheck_out}"
mkdir -p "$OUT"
export OUT PYTHONUNBUFFERED=1
shapes="${REF_SHAPES:-smollm2_135m,llama_1b}"
started=$(date +%s)
deadline=$((started + ${RUN_BUDGET:-560}))
statuses=()
exec > >(tee -a "$OUT/run.log") 2>&1

# step NAME CAP_SECONDS COMMAND...: runs COMMAND under min(CAP, time left before the table's reserve).
step() {
  local name="$1" cap="$2"
  shift 2
  local left=$((deadline - $(date +%s) - 20))
  if [ "$left" -le 5 ]; then
    echo "=== $name: skipped, no time left"
    statuses+=("$name=skipped")
    return 0
  fi
  [ "$cap" -lt "$left" ] || cap="$left"
  echo "=== $name (limit ${cap} s): $*"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=10 "$cap" "$@"
  rc=$?
  [ "$rc" -eq 124 ] && echo "=== $name: TIMED OUT after ${cap} s"
  echo "=== $name: rc=$rc, $(($(date +%s) - t0)) s"
  statuses+=("$name=$rc")
}

bash devcheck/unpack.sh || { echo "=== unpacking devcheck/*.gz failed"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv || true
step kernels_check 90 ./devcheck/kernels_check
if [ -n "${REUSE_REF:-}" ] && [ -f /tmp/ref/summary.json ]; then
  # The machine is still the one an earlier call built the references on.
  echo "=== reference: reused /tmp/ref (REUSE_REF)"
  cp /tmp/ref/summary.json "$OUT/reference.json"
else
  step reference 300 python3 devcheck/reference.py --shapes "$shapes"
fi
for s in ${shapes//,/ }; do
  if [ -f "/tmp/ref/$s/logits_fp32.bin" ]; then
    # device_bench rewrites $BENCH_JSON after every section: a timeout still leaves what it measured.
    # shellcheck disable=SC2016 # expanded by the inner bash
    step "bench_$s" 240 env BENCH_JSON="$OUT/bench_$s.json" \
      bash -c 'exec "$0" "$1" > "/tmp/bench_$(basename "$1").stdout.json"' ./devcheck/device_bench "/tmp/ref/$s"
  else
    echo "=== bench_$s: skipped, no reference in /tmp/ref/$s"
    statuses+=("bench_$s=skipped")
  fi
done
# RUN_TRACE=1: the fast path's decode variants again on the 1B shape with the kernels' timeline marks
# compiled in (CTXSCOPE_CUDA_TRACE=1; slower kernels, a second compile): per kernel kind, where a
# step's time goes, printed into run.log.
if [ "${RUN_TRACE:-0}" = 1 ] && [ -f /tmp/ref/llama_1b/config.json ]; then
  step trace_llama_1b 150 env CTXSCOPE_CUDA_TRACE=1 BENCH_VARIANTS_ONLY=1 BENCH_JSON=/tmp/trace_llama_1b.json \
    bash -c 'exec "$0" "$1" > /dev/null' ./devcheck/device_bench /tmp/ref/llama_1b
fi
# The server over HTTP on the GPU against transformers (and prefix reuse reported in usage).
step hf_check_cuda 120 python3 devcheck/hf_check.py --device cuda
if [ -d devcheck/tests ]; then
  for t in devcheck/tests/*; do
    case "$t" in *.gz) continue ;; esac
    [ -x "$t" ] || continue
    # shellcheck disable=SC2016 # expanded by the inner bash
    step "test_$(basename "$t")" 120 env CTXSCOPE_MODEL=/tmp/ref/smollm2_135m \
      bash -c 'echo "--- $0" >> "$OUT/tests.log"; exec "$0" --nocapture >> "$OUT/tests.log" 2>&1' "$t"
    [ -f "$OUT/tests.log" ] && tail -3 "$OUT/tests.log"
  done
fi
# RUN_AB=1: then the same-call A/B of the revisions ab_prepare.sh put in devcheck/ab (the references are
# built by now; AB_REPS, AB_SHAPES as ab_run.sh reads them), so one call checks and compares.
if [ "${RUN_AB:-0}" = 1 ] && [ -f devcheck/ab/ab_run.sh ]; then
  step ab 400 bash devcheck/ab/ab_run.sh
fi
echo "=== total $(($(date +%s) - started)) s"
echo
python3 devcheck/table.py --out "$OUT" --steps "${statuses[*]}"
rc=$?
if [ "$rc" -eq 0 ]; then
  for s in "${statuses[@]}"; do
    [ "${s#*=}" = 0 ] || rc=2
  done
fi
exit "$rc"

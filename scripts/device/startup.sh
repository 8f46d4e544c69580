#!/usr/bin/env bash
# GPU start-up, from process start to the first answered request, on the device machine with devcheck/
# carried (prepare.sh fills it): `bash devcheck/startup.sh`. A fresh machine is emulated per run with an
# empty HOME (no kernel cache under ~/.cache/ctxscope, no JIT cache under ~/.nv/ComputeCache) and
# CUDA_CACHE_DISABLE=1 (the driver's JIT cache off). Runs, each `ctxscope engine --device cuda` on a
# random-weight model of SmolLM2-135M's shape, timed until a 1-token completion comes back:
#   cold        fresh HOME, CUDA_CACHE_DISABLE=1: the kernels built into the binary (prepare.sh builds them in)
#   nvrtc_cold  the same with CTXSCOPE_CUDA_BUILT_IN=0 and an empty kernel cache: NVRTC to CUBIN at start
#   nvrtc_warm  CTXSCOPE_CUDA_BUILT_IN=0 with the kernel cache the nvrtc_cold run left
#   base_cold / base_warm  devcheck/ctxscope_base (an older binary, if carried): a fresh HOME with the
#               JIT cache on (empty, so cold; the run fills it), then the same HOME again (warm)
# STARTUP_RUNS (default 3) runs of each of the first three, STARTUP_BASE_RUNS (default 1) of the base's;
# then, if devcheck/kernels_startup is there, the per-module split (NVRTC to PTX, the JIT at load, NVRTC to
# CUBIN, CUBIN load) with the JIT cache off. Prints a table last; logs go to $OUT/startup.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT="${OUT:-/tmp/devcheck_out}"
mkdir -p "$OUT"
bash devcheck/unpack.sh || exit 2
runs="${STARTUP_RUNS:-3}"
base_runs="${STARTUP_BASE_RUNS:-1}"
port=31888
log="$OUT/startup.log"
: > "$log"

model=/tmp/ref/smollm2_135m
if [ ! -f "$model/config.json" ]; then
  model=/tmp/startup_model
  if [ ! -f "$model/config.json" ]; then
    python3 - "$model" devcheck <<'PY' || exit 2
import os, shutil, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
d, here = sys.argv[1], sys.argv[2]
cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                  rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu", bos_token_id=1, eos_token_id=2)
torch.manual_seed(0)
LlamaForCausalLM(cfg).to(torch.bfloat16).eval().save_pretrained(d, safe_serialization=True)
for f in ["tokenizer.json", "tokenizer_config.json"]:
    shutil.copy(os.path.join(here, f), d)
PY
  fi
fi
# Page the model's files in once, so every run reads them from memory alike.
cat "$model"/* > /dev/null

rows=()
# one NAME BINARY HOME [ENV...]: seconds from process start to the first answered request.
one() {
  local name="$1" bin="$2" home="$3"
  shift 3
  local t0 t1 pid secs=fail
  echo "=== $name: HOME=$home $*" >> "$log"
  t0=$(date +%s%N)
  env HOME="$home" XDG_CACHE_HOME= "$@" "$bin" engine --model "$model" --listen "127.0.0.1:$port" --device cuda \
    >> "$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 3000); do
    if curl -sf --max-time 120 "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
      -d '{"prompt":"Hello","max_tokens":1,"temperature":0}' -o /dev/null 2>/dev/null; then
      t1=$(date +%s%N)
      secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
      break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  echo "=== $name: $secs s" | tee -a "$log"
  rows+=("$name $secs")
}

for i in $(seq 1 "$runs"); do
  one cold devcheck/ctxscope "$(mktemp -d)" CUDA_CACHE_DISABLE=1
done
nvrtc_home=""
for i in $(seq 1 "$runs"); do
  nvrtc_home=$(mktemp -d)
  one nvrtc_cold devcheck/ctxscope "$nvrtc_home" CUDA_CACHE_DISABLE=1 CTXSCOPE_CUDA_BUILT_IN=0
done
ls -la "$nvrtc_home/.cache/ctxscope/kernels" >> "$log" 2>&1
for i in $(seq 1 "$runs"); do
  one nvrtc_warm devcheck/ctxscope "$nvrtc_home" CUDA_CACHE_DISABLE=1 CTXSCOPE_CUDA_BUILT_IN=0
done
if [ -x devcheck/ctxscope_base ]; then
  for i in $(seq 1 "$base_runs"); do
    # A fresh HOME with the JIT cache on (as cold: ~/.nv/ComputeCache starts empty), which this
    # run fills; then the same HOME again, which reads it.
    base_home=$(mktemp -d)
    one base_cold devcheck/ctxscope_base "$base_home"
    one base_warm devcheck/ctxscope_base "$base_home"
  done
fi
# The per-module lines of one run of each kind (the engine logs them at info).
grep -E "^===|kernel module" "$log" | sed -E 's/\x1b\[[0-9;]*m//g' | awk '/^===/ { print; n = 0; next } n++ < 6' | head -80
if [ -x devcheck/kernels_startup ]; then
  echo "=== per module, JIT cache off (kernels_startup)"
  HOME="$(mktemp -d)" CUDA_CACHE_DISABLE=1 timeout 300 ./devcheck/kernels_startup 2>&1 | tee -a "$log"
fi
echo
echo "start to first answered request (s):"
printf '%s\n' "${rows[@]}" | awk '{ v[$1] = v[$1] " " $2 } END { for (k in v) print "  " k ":" v[k] }' | sort

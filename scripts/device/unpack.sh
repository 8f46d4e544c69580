#!/usr/bin/env bash
# On the device machine: unpacks the binaries that prepare.sh and ab_prepare.sh put in devcheck/
# gzip-compressed (they travel ~3x smaller against a call's 64 MiB), each beside its .gz, executable.
# run.sh and ab_run.sh call it first; a binary already unpacked from the same .gz is left as it is.
set -euo pipefail
cd "$(dirname "$0")"
find . -name '*.gz' -print0 | while IFS= read -r -d '' packed; do
  out="${packed%.gz}"
  if [ ! -x "$out" ] || [ "$packed" -nt "$out" ]; then
    gzip -dc "$packed" > "$out.part"
    chmod +x "$out.part"
    mv "$out.part" "$out"
  fi
done

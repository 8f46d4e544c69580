#!/usr/bin/env bash
# Same-call A/B of decode speed between git revisions on the lent GPU: builds each revision's
# `device_bench` (release, CUDA loaded at run time) into devcheck/ab/<label> and copies ab_run.sh
# beside them. Usage, here:
#   bash scripts/device/ab_prepare.sh main exp-warm2 exp-gemv-n1      # labels are the revisions' names
# then on the device machine, carry ["devcheck"]:
#   bash devcheck/ab/ab_run.sh                 # AB_SHAPES, AB_REPS, AB_VARIANT, AB_ENV: see ab_run.sh
# Each revision is built from its own worktree under target/ab-worktrees (the checkout here is left
# alone), all sharing target/ab-build (not prepare.sh's target/devcheck, whose builds of this checkout
# must not meet another revision's artifacts), so only the workspace's own crates rebuild. Needs devcheck/ filled by
# prepare.sh first (reference.py and the tokenizer files travel from there); each binary travels
# gzip-compressed (~2 MB of the call's 64 MiB, ~6.5 MB unpacked there), so one call can carry the
# whole device check and several revisions.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$#" -ge 1 ] || { echo "usage: $0 REV [REV...]" >&2; exit 2; }
[ -f devcheck/reference.py ] || { echo "devcheck/ is empty: run scripts/device/prepare.sh first" >&2; exit 2; }
root=$(pwd)
mkdir -p devcheck/ab target/ab-worktrees
rm -f devcheck/ab/bench_* devcheck/ab/bench_*.gz
built=()
for rev in "$@"; do
  label=$(echo "$rev" | tr -c 'A-Za-z0-9_.\n-' '_')
  commit=$(git rev-parse --verify "$rev^{commit}")
  tree="target/ab-worktrees/$label"
  if [ -d "$tree" ]; then
    git -C "$tree" checkout -q --detach "$commit"
  else
    git worktree add -q --detach "$tree" "$commit"
  fi
  # The worktrees share one target dir, where cargo names a workspace crate's artifacts alike from
  # every checkout and takes them as fresh when they are newer than the sources' modification times:
  # a worktree checked out before the last build would get the previous revision's crates. Touching
  # its files makes them newer, so each revision's own crates are built.
  git -C "$tree" ls-files -z | (cd "$tree" && xargs -0 touch)
  (cd "$tree" && CARGO_PROFILE_RELEASE_DEBUG=false cargo build --release -q -p ctxscope-engine --features cuda \
    --example device_bench --target-dir "$root/target/ab-build")
  cp target/ab-build/release/examples/device_bench "devcheck/ab/bench_$label"
  for other in "${built[@]}"; do
    if cmp -s "devcheck/ab/bench_$other" "devcheck/ab/bench_$label"; then
      echo "note: bench_$label is byte for byte bench_$other (the revisions differ only outside the bench's code?)" >&2
    fi
  done
  built+=("$label")
  echo "devcheck/ab/bench_$label: $rev ($(git log -1 --format='%h %s' "$commit" | cut -c1-80))"
done
# They travel gzip-compressed (~3x smaller); ab_run.sh unpacks them there (unpack.sh).
for label in "${built[@]}"; do
  gzip -9f "devcheck/ab/bench_$label"
done
cp scripts/device/ab_run.sh devcheck/ab/
cp scripts/device/unpack.sh devcheck/
du -sh devcheck | awk '{print "devcheck/ holds " $1 " (a call carries at most 64 MiB)"}'

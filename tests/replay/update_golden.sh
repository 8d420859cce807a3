#!/usr/bin/env bash
# Regenerates tests/replay/golden/*.json from the current pool: run after a deliberate change to
# the pool's layout, then review the diff (peaks and upstream calls should move the way the change
# intends) and commit it with the change.
#
# usage: tests/replay/update_golden.sh [BUILD_DIR]   (default: build; the vramscope executable
#        must be built: ninja -C BUILD_DIR viewer-cli/vramscope)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build}
case "$build" in /*) ;; *) build="$root/$build" ;; esac
exe="$build/viewer-cli/vramscope"
[ -x "$exe" ] || { echo "no executable at $exe: build it first (ninja -C $build viewer-cli/vramscope)" >&2; exit 2; }

# Exact, deterministic figures of the default policy; host time is left out on purpose.
keys=(policy events alloc_events free_events peak_live_bytes peak_requested_bytes
      peak_allocated_bytes peak_reserved_bytes fragmentation_at_peak upstream_calls
      upstream_grow_calls upstream_shrink_calls oom_count)

for trace in "$root"/traces/*.csv.gz; do
  name=$(basename "$trace" .csv.gz)
  out="$root/tests/replay/golden/$name.json"
  json=$("$exe" replay "$trace" --json)
  {
    echo "{"
    n=${#keys[@]}
    for i in "${!keys[@]}"; do
      key=${keys[$i]}
      value=$(printf '%s\n' "$json" | sed -n "s/^ *\"$key\": \(.*[^,]\),\{0,1\}$/\1/p")
      [ -n "$value" ] || { echo "$name: no $key in the output" >&2; exit 1; }
      sep=","; [ "$i" -eq $((n - 1)) ] && sep=""
      echo "  \"$key\": $value$sep"
    done
    echo "}"
  } > "$out"
  echo "wrote $out"
done

#!/usr/bin/env bash
# Two builds of libvramscope.so side by side on alloc_bench (static and shared runtime), alternating
# runs so both see the same moments of this noisy machine; best/median per build and size last.
#   bash tests/gpu/ab_libs.sh BUNDLE LIB_A LIB_B [REPS]
set -uo pipefail
cd "$(dirname "$0")/../.."
bundle=$1
libs=("$2" "$3")
reps=${4:-5}
bin=$(cd "$bundle/bin" && pwd)
bundle_libs="$(cd "$bundle/lib" && pwd)"
logs=${OUT:-/tmp/vramscope-ab}
mkdir -p "$logs"
results="$logs/ab_libs.tsv"
: >"$results"
field() { grep -ho "$2=[0-9.]*" "$1" | cut -d= -f2; }
for rep in $(seq "$reps"); do
  for i in 0 1; do
    lib=${libs[$i]}
    tag=$(basename "$lib" .so)
    for size in 1048576 4096; do
      out="$logs/$tag.$size.$rep.out"
      env LD_PRELOAD="$lib" VRAMSCOPE_SUMMARY=1 "$bin/alloc_bench" 200000 $size 3 >"$out" 2>"$out.err"
      printf '%s driver_pair %s %s\n' "$tag" "$size" "$(field "$out" driver_pair_ns)" | tee -a "$results"
      printf '%s static_cudart_pair %s %s\n' "$tag" "$size" "$(field "$out" malloc_free_ns)" | tee -a "$results"
      grep -h '^vramscope:' "$out.err" | grep -o 'peak_reserved=[0-9]*\|fence_syncs=[0-9]*' | tr '\n' ' '; echo
    done
    out="$logs/$tag.shared.$rep.out"
    env LD_LIBRARY_PATH="$bundle_libs" LD_PRELOAD="$lib" "$bin/alloc_bench_shared" 200000 1048576 3 >"$out" 2>&1
    printf '%s shared_cudart_pair 1048576 %s\n' "$tag" "$(field "$out" malloc_free_ns)" | tee -a "$results"
  done
done
echo "== best / median per build"
awk '{k=$1" "$2" "$3; v[k]=v[k]" "$4} END{for (k in v) print k, v[k]}' "$results" | sort |
  while read -r a b c vals; do
    printf '%-16s %-20s %-8s %s\n' "$a" "$b" "$c" "$(echo $vals | tr ' ' '\n' | sort -g | awk '{x[NR]=$1} END{printf "best %s median %s (n=%d)", x[1], x[int((NR+1)/2)], NR}')"
  done

#!/usr/bin/env bash
# A/B runs for effects smaller than this VM's run-to-run noise, alternating so that every variant
# sees the same moments of the machine:
#   1. alloc_bench's 1 MiB and 4 KiB pairs (static runtime: driver-level hooks) and the shared
#      runtime's 1 MiB pairs (the runtime-level exports) under each variant of AB_VARIANTS:
#      space-separated NAME:VAR=VALUE[,VAR=VALUE...] (default: the fence helper sleeping or
#      watching, "spin0:VRAMSCOPE_FENCE_SPIN_US=0 spin50:VRAMSCOPE_FENCE_SPIN_US=50"; two shim
#      builds: "old:LD_PRELOAD=/path/old.so new:LD_PRELOAD=/path/new.so");
#   2. the thrust sort+reduce loop at THRUST_SIZES keys (empty: skipped), without the shim, under
#      it with each variant (and the shim's count of fence synchronisations), and with the
#      in-program caching allocator (the speed limit).
#   bash tests/gpu/ab_hotpath.sh [BUNDLE] [REPS]
# Prints one line per run and a table of best/median per setting last. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
bundle=${1:-.device-bundle}
reps=${2:-5}
bin=$(cd "$bundle/bin" && pwd)
bundle_libs="$(cd "$bundle/lib" && pwd)"
shim="$bin/libvramscope.so"
logs=${OUT:-/tmp/vramscope-ab}
mkdir -p "$logs"
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
for prog in thrust_loop alloc_bench; do
  [ -x "$bin/$prog" ] || "$nvcc" -O2 -std=c++17 -gencode 'arch=compute_90,code=[sm_90,compute_90]' -o "$bin/$prog" "tests/gpu/$prog.cu"
done
field() { grep -ho "$2=[0-9.]*" "$1" | cut -d= -f2; }
results="$logs/ab.tsv"
: >"$results"
variants=${AB_VARIANTS:-spin0:VRAMSCOPE_FENCE_SPIN_US=0 spin50:VRAMSCOPE_FENCE_SPIN_US=50}
for rep in $(seq "$reps"); do
  for variant in $variants; do
    name=${variant%%:*}
    IFS=, read -r -a settings <<<"${variant#*:}"
    for size in 1048576 4096; do
      out="$logs/alloc.$name.$size.$rep.out"
      env LD_PRELOAD="$shim" "${settings[@]}" "$bin/alloc_bench" 200000 $size 3 >"$out" 2>&1
      printf 'driver_pair %s %s %s\n' "$size" "$name" "$(field "$out" driver_pair_ns)" | tee -a "$results"
      printf 'static_cudart_pair %s %s %s\n' "$size" "$name" "$(field "$out" malloc_free_ns)" | tee -a "$results"
    done
    out="$logs/alloc_shared.$name.$rep.out"
    env LD_LIBRARY_PATH="$bundle_libs" LD_PRELOAD="$shim" "${settings[@]}" "$bin/alloc_bench_shared" 200000 1048576 3 >"$out" 2>&1
    printf 'shared_cudart_pair 1048576 %s %s\n' "$name" "$(field "$out" malloc_free_ns)" | tee -a "$results"
  done
done
for keys in ${THRUST_SIZES-262144 1048576 2097152 4194304}; do
  for rep in 1 2 3; do
    for how in base cached $variants; do
      name=${how%%:*}
      err="$logs/thrust.$keys.$name.$rep.err"
      case $how in
        base) "$bin/thrust_loop" 500 "$keys" >/dev/null 2>"$err" ;;
        cached) "$bin/thrust_loop" --cached 500 "$keys" >/dev/null 2>"$err" ;;
        *)
          IFS=, read -r -a settings <<<"${how#*:}"
          env LD_PRELOAD="$shim" VRAMSCOPE_SUMMARY=1 "${settings[@]}" "$bin/thrust_loop" 500 "$keys" >/dev/null 2>"$err"
          printf 'thrust_fence_syncs %s %s %s\n' "$keys" "$name" "$(field "$err" fence_syncs | head -1)" | tee -a "$results"
          ;;
      esac
      printf 'thrust %s %s %s\n' "$keys" "$name" "$(grep -ho '[0-9.]* ms/iteration' "$err" | cut -d' ' -f1)" | tee -a "$results"
    done
  done
done
echo "== best / median per setting"
sort -k1,3 "$results" | awk '{k=$1" "$2" "$3; v[k]=v[k]" "$4} END{for (k in v) print k, v[k]}' | sort |
  while read -r a b c vals; do
    printf '%-20s %-8s %-8s %s\n' "$a" "$b" "$c" "$(echo $vals | tr ' ' '\n' | sort -g | awk '{x[NR]=$1} END{printf "best %s median %s (n=%d)", x[1], x[int((NR+1)/2)], NR}')"
  done

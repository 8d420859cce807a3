#!/usr/bin/env bash
# The two-GPU checks of vramscope, on a machine with (at least) two NVIDIA GPUs.
#
#   bash tests/gpu/run_x2.sh [BUNDLE]
#
# BUNDLE (default .device-bundle) is what tests/gpu/make_bundle.sh gathered on the build machine:
# bin/ with libvramscope.so, vramscope and the CUDA programs, lib/ with the libraries they need.
# multi_gpu_stress is built here with nvcc when the bundle lacks it. Checks: the two-device stress
# without the shim, under it (pool and passthrough) and under `vramscope run`; a PyTorch DDP step
# on two ranks (torchrun) with PyTorch's own allocator, without the shim and under `vramscope run`
# in passthrough mode (what libraries take from the driver beside PyTorch's allocator), then with
# its caching off under `vramscope run` (pool and passthrough), each rank's peak requested bytes
# in the report against the rank's requested peak plus that library memory (1%), and against its
# max_memory_allocated, as is the report's libc10_cuda entry of peak requested bytes by calling
# library (--stacks; tests/gpu/ddp_ranks.py, by_library.py); the DDP step's time under the
# default reuse rule (GPU-side waits) against the amortised device synchronisation, paired
# (step e). A table comes last, within
# VRAMSCOPE_X2_BUDGET_S seconds (default 500). Logs go to $OUT (or /tmp/vramscope-gpu2). Exit
# status: 0 when every check passed.
set -uo pipefail
# NVLink multicast stays off (NCCL NVLS, PyTorch symmetric memory, NVSHMEM).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/../.." || exit 2
bundle=${1:-.device-bundle}
bin=$(cd "$bundle/bin" && pwd)
# The bundle's libraries are given only to the programs that need them (vramscope), never to
# PyTorch, which carries its own.
bundle_libs="$(cd "$bundle/lib" && pwd)"
shim="$bin/libvramscope.so"
export VRAMSCOPE_SHIM="$shim"
logs=${OUT:-/tmp/vramscope-gpu2}
mkdir -p "$logs"
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
nvflags=(-O2 -std=c++17 -gencode 'arch=compute_90,code=[sm_90,compute_90]')
python=${PYTHON:-python3}
if command -v torchrun >/dev/null; then
  torchrun=(torchrun)
else
  torchrun=("$python" -m torch.distributed.run)
fi
torchrun+=(--standalone --nproc_per_node=2)

rows=()
failed=0
row() {  # check | without shim | with shim | verdict
  rows+=("$(printf '%-34s | %-26s | %-30s | %s' "$1" "$2" "$3" "$4")")
  case "$4" in FAIL*) failed=1 ;; esac
}
# The whole script stays within VRAMSCOPE_X2_BUDGET_S seconds (default 500), so the table still
# comes within one 10-minute device call when a step hangs: each step's limit is cut to what is
# left, and a step with under 15 s left is not started (status 124, as if its limit ended it).
budget_s=${VRAMSCOPE_X2_BUDGET_S:-500}
# run NAME SECONDS CMD...: runs CMD with a time limit; stdout to NAME.out, stderr to NAME.err;
# returns its status (124 when the limit ended it).
run() {
  local name=$1 limit=$2 left=$((budget_s - SECONDS))
  shift 2
  if [ "$left" -lt 15 ]; then
    : >"$logs/$name.out"
    echo "run_x2.sh: not started, ${left}s of the ${budget_s}s budget left" | tee "$logs/$name.err" >&2
    return 124
  fi
  [ "$limit" -le "$left" ] || limit=$left
  timeout -k 10 "$limit" "$@" >"$logs/$name.out" 2>"$logs/$name.err"
}
# A prefix, not a function: `timeout` (in run) can only start programs.
under_shim=(env LD_PRELOAD="$shim" VRAMSCOPE_SUMMARY=1)
# dev_field LOGNAME DEVICE FIELD -> FIELD of "devDEVICE" in the shim's exit summary line, which
# holds one "devN peak_requested=B ... oom=N" group per device used, then "passthrough ...".
dev_field() {
  grep -h '^vramscope: mode=' "$logs/$1.err" | tail -1 | awk -v dev="dev$2" -v key="$3" '{
    in_dev = 0
    for (i = 1; i <= NF; ++i) {
      if ($i ~ /^dev[0-9]+$/ || $i == "passthrough") { in_dev = ($i == dev); continue }
      if (in_dev && index($i, key "=") == 1) { print substr($i, length(key) + 2); exit }
    }
  }'
}
# summary_field LOGNAME FIELD -> first value of FIELD (a whole word) in the exit summary line.
summary_field() {
  grep -h '^vramscope: mode=' "$logs/$1.err" | tail -1 | grep -o "[ ]$2=[0-9./]*" | head -1 | cut -d= -f2
}
ms_of() { grep -ho '[0-9.]* ms' "$logs/$1.err" | tail -1 | cut -d' ' -f1; }
mismatches_of() { grep -ho 'mismatches=[0-9]*' "$logs/$1.out" | tail -1 | cut -d= -f2; }

echo "== devices"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader | tee "$logs/device.txt"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
[ "${ngpu:-0}" -ge 2 ] || row "two GPUs" "-" "found ${ngpu:-0}" "FAIL needs 2"
nvidia-smi topo -m >"$logs/topo.txt" 2>&1

echo "== building multi_gpu_stress if the bundle lacks it"
stress="$bin/multi_gpu_stress"
if [ ! -x "$stress" ]; then
  stress="$logs/multi_gpu_stress"
  "$nvcc" "${nvflags[@]}" -o "$stress" tests/gpu/multi_gpu_stress.cu || { echo "nvcc failed"; failed=1; }
fi

echo "== a. multi_gpu_stress: without the shim, pool, passthrough, vramscope run"
stress_args=(4 300)
run stress.base 120 "$stress" "${stress_args[@]}"
st_base=$?
run stress.pool 120 "${under_shim[@]}" "$stress" "${stress_args[@]}"
st_pool=$?
VRAMSCOPE_MODE=passthrough run stress.passthrough 120 "${under_shim[@]}" "$stress" "${stress_args[@]}"
st_pt=$?
verdict="ok"
[ $st_base -eq 0 ] && [ "$(mismatches_of stress.base)" = 0 ] || verdict="FAIL status $st_base"
row "multi_gpu_stress, no shim" "$(mismatches_of stress.base | sed 's/^/mismatches=/') $(ms_of stress.base) ms" "-" "$verdict"
for mode in pool passthrough; do
  st=$st_pool
  [ $mode = passthrough ] && st=$st_pt
  same=$(cmp -s "$logs/stress.base.out" "$logs/stress.$mode.out" && [ -s "$logs/stress.base.out" ] && echo same || echo DIFFERENT)
  verdict="ok"
  if [ $mode = pool ]; then
    # Both devices in the summary, each with allocations and frees.
    seen="dev0 $(dev_field stress.pool 0 allocs)/$(dev_field stress.pool 0 frees), dev1 $(dev_field stress.pool 1 allocs)/$(dev_field stress.pool 1 frees)"
    for d in 0 1; do
      a=$(dev_field stress.pool $d allocs)
      [ "${a:-0}" -gt 0 ] || verdict="FAIL no dev$d in summary"
    done
  else
    # Passthrough keeps no pool counters per device: its allocations show as the device kind.
    seen="device=$(summary_field stress.passthrough device)"
    k=$(summary_field stress.passthrough device)
    [ "${k##*/}" != "" ] && [ "${k##*/}" -gt 0 ] 2>/dev/null || verdict="FAIL nothing recorded"
  fi
  [ "$same" = same ] || verdict="FAIL output differs"
  [ "$(mismatches_of "stress.$mode")" = 0 ] || verdict="FAIL mismatches=$(mismatches_of "stress.$mode")"
  [ $st -eq 0 ] || verdict="FAIL status $st"
  row "multi_gpu_stress ($mode)" "$(ms_of stress.base) ms" "$(ms_of "stress.$mode") ms, ${seen:0:20}" "$verdict ($same)"
  echo "$mode: $seen"
done
# vramscope run on the stress: one report, with devices 0 and 1.
run stress.vsrun 150 env LD_LIBRARY_PATH="$bundle_libs" "$bin/vramscope" run --json "$logs/stress.report.json" -- "$stress" "${stress_args[@]}"
st=$?
rep=$("$python" - "$logs/stress.report.json" <<'PY' 2>>"$logs/stress.vsrun.err"
import json, sys
doc = json.load(open(sys.argv[1]))
reports = doc.get("reports", [doc])
devs = {}
for r in reports:
    for d in r.get("devices", []):
        o = int(d.get("device", {}).get("ordinal", 0))
        devs[o] = max(devs.get(o, 0), int(d.get("peak_requested_bytes", 0)))
print(" ".join(f"dev{o}={devs[o]}" for o in sorted(devs)))
PY
)
verdict="ok"
case " $rep " in *" dev0="[1-9]*" dev1="[1-9]*) ;; *) verdict="FAIL devices: ${rep:-none}" ;; esac
[ $st -eq 0 ] || verdict="FAIL status $st"
same=$(cmp -s "$logs/stress.base.out" "$logs/stress.vsrun.out" && echo same || echo DIFFERENT)
[ "$same" = same ] || verdict="FAIL output differs"
row "vramscope run multi_gpu_stress" "-" "${rep:0:30}" "$verdict"
echo "report peaks: $rep"

echo "== b. DDP GPT-2 step, 2 ranks, PyTorch's own allocator (three runs: its peak varies, see c/d)"
PYTHONUNBUFFERED=1 run ddp.caching 180 "${torchrun[@]}" tests/gpu/torch_ddp_step.py 4
st=$?
for extra in 2 3; do
  PYTHONUNBUFFERED=1 run ddp.caching$extra 180 "${torchrun[@]}" tests/gpu/torch_ddp_step.py 4
done
own_runs="$logs/ddp.caching.out,$logs/ddp.caching2.out,$logs/ddp.caching3.out"
# rank_field LOGNAME RANK FIELD -> FIELD of that rank's JSON line
rank_field() {
  "$python" - "$logs/$1.out" "$2" "$3" <<'PY'
import json, re, sys
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r'\{"rank".*\}', line)
    if m:
        j = json.loads(m.group(0))
        if j["rank"] == int(sys.argv[2]):
            print(j.get(sys.argv[3], ""))
PY
}
for r in 0 1; do
  m=$(rank_field ddp.caching $r max_memory_allocated)
  verdict="ok"
  [ -n "$m" ] || verdict="FAIL no line"
  [ $st -eq 0 ] || verdict="FAIL status $st"
  ms=$(rank_field ddp.caching $r ms_per_step | cut -c1-6)
  req=$(rank_field ddp.caching $r peak_requested_bytes)
  row "ddp rank $r, own cache" "${m:-?} B, $ms ms" "-" \
    "$verdict (loss $(rank_field ddp.caching $r loss), requested peak ${req:-?} B)"
  echo "rank $r own-cache runs, max_memory_allocated: $(rank_field ddp.caching $r max_memory_allocated) $(rank_field ddp.caching2 $r max_memory_allocated) $(rank_field ddp.caching3 $r max_memory_allocated)"
done

# PyTorch gets the library path this script was given, not the bundle's (vramscope's only).
if [ -n "${LD_LIBRARY_PATH+x}" ]; then
  own_libs=(env LD_LIBRARY_PATH="$LD_LIBRARY_PATH")
else
  own_libs=(env -u LD_LIBRARY_PATH)
fi
# tab_fields FILE RANK: the tab-separated line of RANK that tests/gpu/ddp_ranks.py printed.
tab_fields() { grep "^$2"$'\t' "$1" | head -1; }

# b2: what the libraries take from the driver outside PyTorch's allocator (cuBLAS workspaces,
# NCCL's cuMemCreate buffers), per rank: the same step with PyTorch's own allocator under
# `vramscope run` in passthrough mode (the shim only records), each rank's device peak in its
# report (every driver allocation) less the rank's own max_memory_reserved (tests/gpu/ddp_ranks.py).
echo "== b2. DDP step, PyTorch's own allocator, under vramscope run (passthrough)"
rm -f "$logs/ddp.observe.report.json"
PYTHONUNBUFFERED=1 VRAMSCOPE_MODE=passthrough run ddp.observe 180 \
  env LD_LIBRARY_PATH="$bundle_libs" "$bin/vramscope" run --json "$logs/ddp.observe.report.json" -- \
  "${own_libs[@]}" "${torchrun[@]}" tests/gpu/torch_ddp_step.py 4
st=$?
"$python" tests/gpu/ddp_ranks.py observe "$logs/ddp.observe.out" "$logs/ddp.observe.report.json" \
  >"$logs/ddp.observe.txt" 2>&1
cat "$logs/ddp.observe.txt"
for r in 0 1; do
  IFS=$'\t' read -r _ v d x _ text < <(tab_fields "$logs/ddp.observe.txt" $r)
  verdict="${v:-FAIL} ${text:-no figures}"
  [ $st -eq 0 ] || verdict="FAIL status $st; ${text:-}"
  row "ddp rank $r, own cache, passthrough" "reserved ${x:-?} B" "driver peak ${d:-?} B" "${verdict:0:90}"
done

# c/d: the same with PyTorch's cache off, under `vramscope run`; each rank's report (matched by the
# pid the rank printed, else by the device it used), its device's peak requested bytes P:
# - "rank N peak vs PyTorch+libraries": P against the rank's requested peak in b (memory_stats
#   requested_bytes.all.peak) plus its library memory from b2, within 1%;
# - "ddp rank N peak (MODE)": P against max_memory_allocated of b, "ok" within 1%; a larger gap is
#   reported ("differs"), not failed, when the row above is within 1%: PyTorch's figure leaves
#   out the libraries' memory and counts its rounded, unsplit blocks instead of requested sizes;
# - "rank N libc10_cuda (MODE)": the report's peak requested bytes of the calling library
#   libc10_cuda (PyTorch's allocator; the runs record allocation sites with --stacks) against
#   max_memory_allocated of b, 1%; every library's peak is printed ("rank N by library").
for mode in pool passthrough; do
  step=c
  [ $mode = passthrough ] && step=d
  echo "== $step. DDP step, cache off, under vramscope run ($mode)"
  rm -f "$logs/ddp.$mode.report.json"
  PYTHONUNBUFFERED=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 VRAMSCOPE_MODE=$mode run "ddp.$mode" 240 \
    env LD_LIBRARY_PATH="$bundle_libs" "$bin/vramscope" run --stacks --json "$logs/ddp.$mode.report.json" -- \
    "${own_libs[@]}" "${torchrun[@]}" tests/gpu/torch_ddp_step.py 4
  st=$?
  "$python" tests/gpu/ddp_ranks.py compare "$own_runs" "$logs/ddp.observe.out" \
    "$logs/ddp.observe.report.json" "$logs/ddp.$mode.out" "$logs/ddp.$mode.report.json" \
    >"$logs/ddp.$mode.compare.txt" 2>&1
  cat "$logs/ddp.$mode.compare.txt"
  for r in 0 1; do
    IFS=$'\t' read -r _ ve want peak te vl maxm tl vc c10 tc < <(tab_fields "$logs/ddp.$mode.compare.txt" $r)
    ms=$(rank_field "ddp.$mode" $r ms_per_step | cut -c1-6)
    verdict="${vl:-FAIL} ${tl:-no comparison}"
    [ $st -eq 0 ] || verdict="FAIL status $st; ${tl:-}"
    row "ddp rank $r peak ($mode)" "max_alloc ${maxm:-?} B" "report ${peak:-?} B, $ms ms" "${verdict:0:110}"
    verdict="${ve:-FAIL} ${te:-no comparison}"
    [ $st -eq 0 ] || verdict="FAIL status $st; ${te:-}"
    row "rank $r peak vs PyTorch+libraries" "${want:-?} B" "$mode: ${peak:-?} B" "${verdict:0:110}"
    verdict="${vc:-FAIL} ${tc:-no comparison}"
    [ $st -eq 0 ] || verdict="FAIL status $st; ${tc:-}"
    row "rank $r libc10_cuda ($mode)" "max_alloc ${maxm:-?} B" "libc10_cuda ${c10:-?} B" "${verdict:0:110}"
  done
done

# e: the reuse rule's false dependencies. With GPU-side waits (the default rule) a handed-over
# free makes every stream, NCCL's included, wait on the GPU for the free's event before its next
# work, which may cost the overlap of communication and compute. Each round runs the DDP step
# (cache off, under the shim, X2E_STEPS steps, default 12) with the amortised device
# synchronisation alone (VRAMSCOPE_FENCE_EVENTS=0, the rule before) and with the default, in
# turn; X2E_ROUNDS rounds (default 2). Paired: the median over the rounds of rank 0's ms/step
# over the devsync run's of the same round; goal within 2%. Memory: the largest peak reserved
# over peak requested of any rank (the shim's summary, one line per rank).
echo "== e. DDP step, cache off, under the shim: devsync against the default rule (GPU-side waits)"
x2e_rounds=${X2E_ROUNDS:-2}
x2e_steps=${X2E_STEPS:-12}
max_ratio() {  # max_ratio LOGNAME -> the largest peak_reserved/peak_requested of any devN group
  grep -h '^vramscope: mode=' "$logs/$1.err" | awk '{
    for (i = 1; i <= NF; ++i) {
      if (index($i, "peak_requested=") == 1) q = substr($i, 16)
      if (index($i, "peak_reserved=") == 1 && q > 0) { r = substr($i, 15) / q; if (r > m) m = r }
    }
  } END { if (m > 0) printf "%.3f", m }'
}
for rep in $(seq "$x2e_rounds"); do
  for v in devsync default; do
    envs=()
    [ $v = devsync ] && envs=(VRAMSCOPE_FENCE_EVENTS=0)
    PYTHONUNBUFFERED=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 run "ddp.fence.$v.$rep" 180 \
      env "${envs[@]}" "${under_shim[@]}" "${torchrun[@]}" tests/gpu/torch_ddp_step.py "$x2e_steps"
    echo "ddp $v round $rep: status $?, rank 0 $(rank_field "ddp.fence.$v.$rep" 0 ms_per_step) ms/step, rank 1 $(rank_field "ddp.fence.$v.$rep" 1 ms_per_step), max reserved/requested $(max_ratio "ddp.fence.$v.$rep")x"
  done
done
pairs=$(for rep in $(seq "$x2e_rounds"); do
  awk -v a="$(rank_field "ddp.fence.default.$rep" 0 ms_per_step)" -v b="$(rank_field "ddp.fence.devsync.$rep" 0 ms_per_step)" \
    'BEGIN{if (a>0 && b>0) printf "%.4f\n", a/b}'
done | sort -g | awk '{x[NR]=$1} END{if (NR) printf "%.1f", 100*(((NR%2) ? x[(NR+1)/2] : (x[NR/2]+x[NR/2+1])/2)-1)}')
ratios=$(for rep in $(seq "$x2e_rounds"); do max_ratio "ddp.fence.default.$rep"; echo; done | sort -g | tail -1)
dratios=$(for rep in $(seq "$x2e_rounds"); do max_ratio "ddp.fence.devsync.$rep"; echo; done | sort -g | tail -1)
verdict=$(awk -v p="$pairs" -v r="$ratios" 'BEGIN{
  if (p == "" || r+0 <= 0) {print "FAIL missing runs"; exit}
  printf "%s paired %+.1f%% (goal 2%%), max %.3fx", (p+0 <= 2) ? "ok" : "no", p, r}')
row "ddp no-cache step, fence rules" "devsync max ${dratios:-?}x" "default max ${ratios:-?}x" "$verdict"

echo
echo "== summary (logs in $logs)"
printf '%-34s | %-26s | %-30s | %s\n' "check" "without shim" "with shim" "verdict"
printf '%s\n' "$(printf '%.0s-' {1..120})"
printf '%s\n' "${rows[@]}"
exit $failed

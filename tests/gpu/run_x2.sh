#!/usr/bin/env bash
# The two-GPU checks of vramscope, on a machine with (at least) two NVIDIA GPUs.
#
#   bash tests/gpu/run_x2.sh [BUNDLE]
#
# BUNDLE (default .device-bundle) is what tests/gpu/make_bundle.sh gathered on the build machine:
# bin/ with libvramscope.so, vramscope and the CUDA programs, lib/ with the libraries they need.
# multi_gpu_stress is built here with nvcc when the bundle lacks it. Checks: the two-device stress
# without the shim, under it (pool and passthrough) and under `vramscope run`; a PyTorch DDP step
# on two ranks (torchrun) with PyTorch's own allocator, then with its caching off under
# `vramscope run`, each rank's peak in the report against the rank's own max_memory_allocated.
# A table comes last. Logs go to $OUT (or /tmp/vramscope-gpu2). Exit status: 0 when every check
# passed.
set -uo pipefail
# NVLink multicast stays off (NCCL NVLS, PyTorch symmetric memory, NVSHMEM).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
cd "$(dirname "$0")/../.."
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
# run NAME SECONDS CMD...: runs CMD with a time limit; stdout to NAME.out, stderr to NAME.err;
# returns its status (124 when the limit ended it).
run() {
  local name=$1 limit=$2
  shift 2
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
stress_line() { grep -h '^multi_gpu_stress:' "$logs/$1.out" | tail -1; }
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

echo "== b. DDP GPT-2 step, 2 ranks, PyTorch's own allocator"
PYTHONUNBUFFERED=1 run ddp.caching 180 "${torchrun[@]}" tests/gpu/torch_ddp_step.py 4
st=$?
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
  row "ddp rank $r, own cache" "${m:-?} B, $(rank_field ddp.caching $r ms_per_step | cut -c1-6) ms" "-" "$verdict (loss $(rank_field ddp.caching $r loss))"
done

# c/d: the same with PyTorch's cache off, under `vramscope run`; each rank's report (matched by the
# pid the rank printed, else by the device it used) against max_memory_allocated from b.
# NCCL's own buffers (cuMemCreate: kind vmm) are in the report's requested bytes but not in
# PyTorch's figure: the check also prints the peak less the other kinds' peaks and accepts either.
compare_ranks() {  # compare_ranks LOGNAME REPORT -> lines "rank ok|FAIL torch_bytes report_bytes text"
  "$python" - "$logs/ddp.caching.out" "$logs/$1.out" "$2" <<'PY'
import json, re, sys

def rank_lines(path):
    out = {}
    for line in open(path, errors="replace"):
        m = re.search(r'\{"rank".*\}', line)
        if m:
            j = json.loads(m.group(0))
            out[j["rank"]] = j
    return out

own, traced = rank_lines(sys.argv[1]), rank_lines(sys.argv[2])
try:
    doc = json.load(open(sys.argv[3]))
except (OSError, ValueError) as e:
    for r in (0, 1):
        print(r, "FAIL", own.get(r, {}).get("max_memory_allocated", 0), 0, f"no report ({e.__class__.__name__})")
    sys.exit(0)
reports = doc.get("reports", [doc])
by_pid = {int(r.get("process", {}).get("pid", 0)): r for r in reports}
for r in (0, 1):
    want = int(own.get(r, {}).get("max_memory_allocated", 0))
    pid = traced.get(r, {}).get("pid")
    rep, how = by_pid.get(pid), "pid"
    if rep is None:  # by device: the process whose largest device peak is on ordinal r
        how = "device"
        best = 0
        for cand in reports:
            for d in cand.get("devices", []):
                if int(d.get("device", {}).get("ordinal", 0)) == r and int(d.get("peak_requested_bytes", 0)) > best:
                    best, rep = int(d.get("peak_requested_bytes", 0)), cand
    dev = None
    for d in (rep or {}).get("devices", []):
        if int(d.get("device", {}).get("ordinal", 0)) == r:
            dev = d
    if dev is None and rep is not None and rep.get("devices"):
        dev = max(rep["devices"], key=lambda d: int(d.get("peak_requested_bytes", 0)))
    if want <= 0 or dev is None:
        print(r, "FAIL", want, 0, "missing " + ("max_memory_allocated" if want <= 0 else "report"))
        continue
    peak = int(dev.get("peak_requested_bytes", 0))
    kinds = {k: int(v) for k, v in dev.get("peak_bytes_by_kind", {}).items()}
    # Kinds that count in requested bytes but are not PyTorch's cudaMalloc (host and IPC-imported
    # memory do not count there).
    others = sum(v for k, v in kinds.items()
                 if k not in ("pooled", "driver", "host", "ipc_import", "unspecified"))
    less = peak - others
    apart = abs(peak - want) / want
    apart_less = abs(less - want) / want
    if apart <= 0.01:
        verdict, text = "ok", f"{100 * apart:.2f}% apart"
    elif apart_less <= 0.01:
        verdict, text = "ok", f"{100 * apart_less:.2f}% apart less {others >> 20} MiB non-PyTorch ({100 * apart:.1f}% with)"
    else:
        verdict, text = "FAIL", f"{100 * apart:.2f}% apart ({100 * apart_less:.2f}% less {others >> 20} MiB non-PyTorch)"
    kind_text = ",".join(f"{k}={v}" for k, v in sorted(kinds.items()))
    print(r, verdict, want, peak, f"{text}; by {how} {pid}; kinds {kind_text}")
PY
}
# PyTorch gets the library path this script was given, not the bundle's (vramscope's only).
if [ -n "${LD_LIBRARY_PATH+x}" ]; then
  own_libs=(env LD_LIBRARY_PATH="$LD_LIBRARY_PATH")
else
  own_libs=(env -u LD_LIBRARY_PATH)
fi
for mode in pool passthrough; do
  step=c
  [ $mode = passthrough ] && step=d
  echo "== $step. DDP step, cache off, under vramscope run ($mode)"
  rm -f "$logs/ddp.$mode.report.json"
  PYTHONUNBUFFERED=1 PYTORCH_NO_CUDA_MEMORY_CACHING=1 VRAMSCOPE_MODE=$mode run "ddp.$mode" 240 \
    env LD_LIBRARY_PATH="$bundle_libs" "$bin/vramscope" run --json "$logs/ddp.$mode.report.json" -- \
    "${own_libs[@]}" "${torchrun[@]}" tests/gpu/torch_ddp_step.py 4
  st=$?
  compare_ranks "ddp.$mode" "$logs/ddp.$mode.report.json" >"$logs/ddp.$mode.compare.txt" 2>&1
  cat "$logs/ddp.$mode.compare.txt"
  for r in 0 1; do
    read -r _ v want peak text < <(grep "^$r " "$logs/ddp.$mode.compare.txt" | head -1)
    verdict="${v:-FAIL} ${text:-no comparison}"
    [ $st -eq 0 ] || verdict="FAIL status $st; ${text:-}"
    row "ddp rank $r peak ($mode)" "max_alloc ${want:-?} B" "report ${peak:-?} B, $(rank_field "ddp.$mode" $r ms_per_step | cut -c1-6) ms" "${verdict:0:70}"
  done
done

echo
echo "== summary (logs in $logs)"
printf '%-34s | %-26s | %-30s | %s\n' "check" "without shim" "with shim" "verdict"
printf '%s\n' "$(printf '%.0s-' {1..120})"
printf '%s\n' "${rows[@]}"
exit $failed

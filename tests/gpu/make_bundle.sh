#!/usr/bin/env bash
# Builds, on the build machine, everything tests/gpu/run_all.sh needs and gathers it with the
# shared libraries the GPU machine lacks into .device-bundle/ (bin/, lib/), to carry there.
#   bash tests/gpu/make_bundle.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
[ -f "$build/build.ninja" ] || meson setup "$build" --buildtype=release
targets=(interposer/shim/libvramscope.so viewer-cli/vramscope examples/alloc_churn
         examples/alloc_churn_shared_rt tests/gpu/thrust_loop tests/gpu/stream_stress
         tests/gpu/alloc_bench tests/gpu/alloc_bench_shared tests/gpu/multi_gpu_stress examples/nvtx_phases
         tests/bench/pool_bench tests/gpu/graph_array tests/gpu/ordered_probe
         tests/gpu/ordered_probe_ptds tests/gpu/ipc_multi tests/pipeline/ingest_history_bench)
ninja -C "$build" "${targets[@]}"
rm -rf .device-bundle
files=()
for t in "${targets[@]}"; do files+=("$build/$t"); done
bash tests/gpu/device_bundle.sh .device-bundle "${files[@]}"

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
         tests/gpu/ordered_probe_ptds tests/gpu/ipc_multi tests/gpu/vmm_cost tests/stacks/stack_bench
         collector/vramscope-collector agent/vramscope-agent tests/load/fleet_load
         tests/pipeline/ingest_bench tests/pipeline/ingest_history_bench
         tests/pipeline/collector_core_bench)
ninja -C "$build" "${targets[@]}"
rm -rf .device-bundle
files=()
for t in "${targets[@]}"; do files+=("$build/$t"); done
bash tests/gpu/device_bundle.sh .device-bundle "${files[@]}"
# fleet_load --tls needs a CA and a server certificate for 127.0.0.1; made here, so the GPU
# machine needs no openssl command (run_all.sh section 14 passes --tls-dir=BUNDLE/certs).
certs=.device-bundle/certs
mkdir -p "$certs"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
  -subj /CN=vramscope-load-ca -keyout "$certs/ca.key" -out "$certs/ca.pem" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$certs/server.ext"
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost \
  -keyout "$certs/server.key" -out "$certs/server.csr" 2>/dev/null
openssl x509 -req -days 30 -in "$certs/server.csr" -CA "$certs/ca.pem" -CAkey "$certs/ca.key" \
  -CAcreateserial -out "$certs/server.pem" -extfile "$certs/server.ext" 2>/dev/null
chmod 600 "$certs"/*.key

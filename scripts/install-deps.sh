#!/usr/bin/env bash
# Installs, with apt-get, the Debian packages vramscope needs to build and test, if any is missing.
# The CUDA toolkit is not a Debian package: it is expected under /usr/local/cuda (or
# -Dtoolkit_root=PATH); without it the shim, the fake driver and the examples are skipped.
set -euo pipefail
packages=(
  meson ninja-build pkg-config g++ binutils git
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libabsl-dev
  libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev
  clang-format
  clang-14 libclang-rt-14-dev llvm-14  # tests/fuzz: libFuzzer, its sanitizers, llvm-symbolizer
  chromium  # tests/report: the HTML report rendered by headless Chromium
  libncurses-dev tmux
  prometheus prometheus-cpp-dev  # collector /metrics; tests start a real Prometheus, run promtool
  libsqlite3-dev libpqxx-dev postgresql  # run history: SQLite default, PostgreSQL (tests start one)
  libcli11-dev  # the command-line grammar
  libdw-dev  # stack symbolization
  libjs-d3 libjs-dygraphs  # the HTML report's plots, inlined at build time
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"

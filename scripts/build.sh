#!/usr/bin/env bash
# Configures (once) and builds vramscope into ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=release -Db_ndebug=if-release
fi
ninja -C build

#!/usr/bin/env bash
# The README's second command: installs what is missing, builds, and runs every default test suite
# (unit, integration, preload, golden). The gpu and bench suites run only when asked.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
meson test -C build --print-errorlogs --num-processes 2

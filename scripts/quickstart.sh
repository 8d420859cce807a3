#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs the main job.
# With a GPU: `vramscope run` on an example CUDA program. Without one: `vramscope replay` of a real
# PyTorch training trace bundled in traces/, through the same pool the shim uses.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
echo
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ -x build/examples/alloc_churn ]; then
  echo "== vramscope run -- examples/alloc_churn (a cudaMalloc/cudaFree-heavy program, unmodified)"
  build/viewer-cli/vramscope run -- build/examples/alloc_churn
else
  echo "== vramscope replay traces/gpt2_train.csv.gz (no GPU here: running a program under the shim needs one)"
  build/viewer-cli/vramscope replay traces/gpt2_train.csv.gz
fi

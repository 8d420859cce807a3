#!/usr/bin/env bash
# The README's second command: installs what is missing, then builds and tests three ways:
#   build/       release: every default test suite (unit, integration, preload, golden);
#   build-asan/  g++ with ASan and UBSan: the same suites, any sanitizer finding fails a test;
#   build-fuzz/  clang with libFuzzer, ASan and UBSan: only the fuzz targets (tests/fuzz), each
#                run for FUZZ_SECONDS (default 20) over its seed corpus (suite 'fuzz').
# The gpu and bench suites run only when asked. The closing line counts the tests of all three;
# the exit status is non-zero if any test failed or a build did not build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
status=0
meson test -C build --print-errorlogs --num-processes 2 || status=1

# The sanitizer build leaves out what no default suite runs (nvcc examples, bench programs).
logs=(build/meson-logs/testlog.json)
if [ ! -f build-asan/build.ninja ]; then
  meson setup build-asan -Doptimization=1 -Ddebug=false -Db_ndebug=false \
    -Db_sanitize=address,undefined -Db_lundef=false -Dexamples=disabled -Dbenchmarks=disabled
fi
if ninja -C build-asan; then
  meson test -C build-asan --print-errorlogs --num-processes 2 || status=1
  logs+=(build-asan/meson-logs/testlog.json)
else
  echo "test.sh: the sanitizer build (build-asan) failed" >&2
  status=1
fi

fuzz_targets=(ring_fuzzer trace_fuzzer report_json_fuzzer spool_fuzzer batch_fuzzer
              record_log_fuzzer snapshot_fuzzer)
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang-14 CXX=clang++-14 meson setup build-fuzz -Doptimization=1 -Ddebug=true \
    -Db_sanitize=address,undefined -Db_lundef=false -Dfuzzing=true -Dwith_cuda=disabled \
    -Dexamples=disabled -Dbenchmarks=disabled -Dfuzz_seconds="${FUZZ_SECONDS:-20}"
fi
if ninja -C build-fuzz "${fuzz_targets[@]/#/tests/fuzz/}"; then
  meson test -C build-fuzz --no-rebuild --suite fuzz --print-errorlogs --num-processes 2 ||
    status=1
  logs+=(build-fuzz/meson-logs/testlog.json)
else
  echo "test.sh: the fuzz build (build-fuzz) failed" >&2
  status=1
fi

# One plain closing line, counted from meson's own logs (meson is built on python3).
python3 - "${logs[@]}" <<'PY' || true
import json, sys
counts = {"passed": 0, "failed": 0, "skipped": 0}
for path in sys.argv[1:]:
    for line in open(path):
        result = json.loads(line)["result"]
        if result in ("OK", "EXPECTEDFAIL"):
            counts["passed"] += 1
        elif result == "SKIP":
            counts["skipped"] += 1
        else:
            counts["failed"] += 1
print(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
PY
exit $status

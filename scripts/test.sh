#!/usr/bin/env bash
# The README's second command: installs what is missing, builds, and runs every default test suite
# (unit, integration, preload, golden). The gpu and bench suites run only when asked.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
status=0
meson test -C build --print-errorlogs --num-processes 2 || status=$?
# One plain closing line, counted from meson's own log (meson is built on python3).
python3 - build/meson-logs/testlog.json <<'PY' || true
import json, sys
counts = {"passed": 0, "failed": 0, "skipped": 0}
for line in open(sys.argv[1]):
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

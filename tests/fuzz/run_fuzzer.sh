#!/usr/bin/env bash
# One bounded run of a libFuzzer target over its committed seed corpus, as the 'fuzz' suite runs
# it: run_fuzzer.sh FUZZER CORPUS_DIR SECONDS [libFuzzer flags...]
# New inputs go to a temporary directory (the committed corpus is only read); a crashing or
# contract-violating input is kept as $FUZZ_ARTIFACTS/crash-* (default: the current directory)
# and the run fails. libFuzzer's last lines (executions per second, corpus size) end the log.
set -euo pipefail
fuzzer=$1 corpus=$2 seconds=$3
shift 3
work=$(mktemp -d "${TMPDIR:-/tmp}/vramscope-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
artifacts=${FUZZ_ARTIFACTS:-$PWD}
mkdir -p "$artifacts"
# Any sanitizer finding ends the run as a failure (see README.md for why leaks are on here).
# Later options win: leak detection stays on here whatever the test setup says.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}halt_on_error=1:detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
if [ -z "${ASAN_SYMBOLIZER_PATH:-}" ] && [ -x /usr/bin/llvm-symbolizer-14 ]; then
  export ASAN_SYMBOLIZER_PATH=/usr/bin/llvm-symbolizer-14
fi
mkdir "$work/corpus"
status=0
# libFuzzer's own exit code for a finding is 77, which meson reads as "skipped": make every
# finding (crash, sanitizer report, broken contract, timeout, memory limit) exit 1.
"$fuzzer" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 \
  -error_exitcode=1 -timeout_exitcode=1 \
  -artifact_prefix="$artifacts/$(basename "$fuzzer")-" "$@" "$work/corpus" "$corpus" \
  >"$work/log" 2>&1 || status=$?
# Without the line per new input: the start, any report, and the final statistics.
grep -v -E '^#[0-9]+[[:space:]]+(NEW|REDUCE|pulse)' "$work/log" || true
[ "$status" -eq 77 ] && status=1
exit "$status"

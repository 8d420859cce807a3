#!/usr/bin/env bash
# Golden test for `vramscope replay`: runs the real executable with --json on one trace and checks
# that every field of EXPECTED (a JSON object, one "key": value per line, as update_golden.sh
# writes it) appears in the output with exactly that value. Extra KEY=VALUE arguments check more
# fields (the traces README's peak live, for instance); KEY<VALUE checks a number is below VALUE.
#
# usage: golden_test.sh VRAMSCOPE TRACE (EXPECTED.json | KEY=VALUE | KEY<VALUE)... [-- ARGS...]
set -uo pipefail
exe=${1:?usage: golden_test.sh VRAMSCOPE TRACE (EXPECTED.json | KEY=VALUE)... [-- ARGS...]}
trace=${2:?missing TRACE}
shift 2
checks=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do checks+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift

actual=$("$exe" replay "$trace" --json "$@")
rc=$?
if [ $rc -ne 0 ]; then
  echo "FAIL: '$exe replay $trace --json $*' exited $rc" >&2
  exit 1
fi

# The value of "KEY" in a JSON object printed one field per line.
field() { sed -n "s/^ *\"$1\": \(.*[^,]\),\{0,1\}$/\1/p" | head -n 1; }

failed=0
compare() {
  local key=$1 want=$2 got
  got=$(printf '%s\n' "$actual" | field "$key")
  if [ "$got" != "$want" ]; then
    echo "FAIL: $trace: $key is ${got:-<missing>}, expected $want" >&2
    failed=1
  else
    echo "ok: $key = $got"
  fi
}

for check in "${checks[@]}"; do
  if [ -f "$check" ]; then
    while IFS= read -r key; do
      compare "$key" "$(field "$key" < "$check")"
    done < <(sed -n 's/^ *"\([a-z_]*\)": .*/\1/p' "$check")
  elif [[ "$check" == *"<"* ]]; then
    key=${check%%<*} bound=${check#*<}
    got=$(printf '%s\n' "$actual" | field "$key")
    if [ -n "$got" ] && awk -v a="$got" -v b="$bound" 'BEGIN { exit !(a + 0 < b + 0) }'; then
      echo "ok: $key = $got < $bound"
    else
      echo "FAIL: $trace: $key is ${got:-<missing>}, expected below $bound" >&2
      failed=1
    fi
  elif [[ "$check" == *=* ]]; then
    compare "${check%%=*}" "${check#*=}"
  else
    echo "FAIL: no such expected file: $check" >&2
    failed=1
  fi
done

if [ $failed -ne 0 ]; then
  echo "If the pool changed on purpose, regenerate: tests/replay/update_golden.sh BUILD_DIR" >&2
  echo "full output:" >&2
  printf '%s\n' "$actual" >&2
fi
exit $failed

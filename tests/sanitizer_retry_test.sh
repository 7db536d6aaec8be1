#!/usr/bin/env bash
# Checks tests/sanitizer_retry.sh: it repeats a run only when LeakSanitizer's tracer crashed, once.
set -u
launcher="$(dirname "$0")/sanitizer_retry.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
check() {  # check NAME EXPECTED_RC EXPECTED_RUNS SCRIPT
  local name=$1 want_rc=$2 want_runs=$3 script=$4
  rm -f "$dir/runs"
  printf '%s\n' "$script" > "$dir/cmd.sh"
  "$launcher" bash "$dir/cmd.sh" > "$dir/out" 2>&1
  local rc=$? runs
  runs=$(wc -l < "$dir/runs" 2>/dev/null || echo 0)
  if [ "$rc" -ne "$want_rc" ] || [ "$runs" -ne "$want_runs" ]; then
    echo "FAIL $name: exit $rc after $runs run(s), expected exit $want_rc after $want_runs"; cat "$dir/out"
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}
tracer='echo "Tracer caught signal 11: addr=0x778"; echo "==1==LeakSanitizer has encountered a fatal error." >&2'
check "tracer crash once, then a pass" 0 2 "echo run >> $dir/runs; [ \$(wc -l < $dir/runs) -eq 2 ] && exit 0; $tracer; exit 134"
check "tracer crash twice stands" 134 2 "echo run >> $dir/runs; $tracer; exit 134"
check "a test failure is not repeated" 1 1 "echo run >> $dir/runs; echo '[  FAILED  ] X.Y'; exit 1"
check "a leak report is not repeated" 23 1 "echo run >> $dir/runs; echo 'ERROR: LeakSanitizer: detected memory leaks' >&2; exit 23"
check "a pass runs once" 0 1 "echo run >> $dir/runs; exit 0"
exit $((failures > 0))

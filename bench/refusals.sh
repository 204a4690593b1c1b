#!/bin/sh
# The benchmark programs refuse bad arguments before they start anything: exit 2, with the cause
# and the usage; gear_fabric_bench -h prints the usage and exits 0. Run by ctest (bench.refuses_bad_arguments):
#   refusals.sh <gear_contention> [<gear_fabric_bench>]
contention=$1
fabric=$2
fails=0
# expect <exit status> <text its output must hold> <command...>
expect() {
  want=$1 text=$2
  shift 2
  err=$("$@" 2>&1)
  got=$?
  if [ "$got" -ne "$want" ] || ! printf '%s' "$err" | grep -q -- "$text"; then
    echo "FAILED: $* exited $got (expected $want) with: $err"
    fails=$((fails + 1))
  else
    echo "ok: $* -> $got"
  fi
}
expect 2 "usage: gear_contention" "$contention" bogus
expect 2 "bad arguments" "$contention" 0
expect 2 "bad arguments" "$contention" 2 not-gpu-time
expect 2 "bad arguments" "$contention" 2 gpu-time extra
if [ -n "$fabric" ]; then
  expect 0 "usage: gear_fabric_bench" "$fabric" -h
  expect 2 "usage: gear_fabric_bench" "$fabric" tcp 0.05 0
  expect 2 "argument 2 ('0') is out of range" "$fabric" tcp 0.05 0
  expect 2 "argument 1 ('-1') is out of range" "$fabric" tcp -1
  expect 2 "argument 3 ('1.5') is out of range" "$fabric" tcp 0.05 1 1.5
  expect 2 "argument 3 ('2000') is out of range" "$fabric" tcp 0.05 1 2000
  expect 2 "cannot be opened here" "$fabric" no-such-provider
fi
exit $fails

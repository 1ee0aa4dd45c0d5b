#!/bin/sh
# scripts/gpu-check.sh where there is no GPU: every GPU phase fails at once,
# before it builds or writes anything, with one line on stderr and exit 2 (no
# traceback); --help exits 0; an unknown phase exits 2 with one line.
# Exits 77 (skipped) on a machine with a GPU, where gpu-check.sh runs for real.
#   test_gpu_check_script.sh SOURCE_DIR
set -u
root=$1
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "skipped: this machine has a GPU (the test checks gpu-check.sh where there is none)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

for phases in "" all build test sanitize bench torch 13b "deps test"; do
  # shellcheck disable=SC2086  # the phases are separate words
  env -u OUT ZO_GPUCHECK_BUILD="$tmp/b" bash "$root/scripts/gpu-check.sh" $phases >"$tmp/out" 2>"$tmp/err"
  rc=$?
  what="gpu-check.sh ${phases:-(no phase)}"
  [ $rc = 2 ] || fail "$what: exit $rc, expected 2"
  [ "$(wc -l <"$tmp/err")" = 1 ] || fail "$what: stderr is not one line: $(cat "$tmp/err")"
  grep -q '^gpu-check: no NVIDIA GPU on this machine' "$tmp/err" || fail "$what: message: $(cat "$tmp/err")"
  grep -qi traceback "$tmp/out" "$tmp/err" && fail "$what: a traceback"
  [ -s "$tmp/out" ] && fail "$what: wrote to stdout: $(head -3 "$tmp/out")"
  [ -e "$tmp/b" ] && fail "$what: created $tmp/b"
  echo "ok: $what: exit 2: $(cat "$tmp/err")"
done

bash "$root/scripts/gpu-check.sh" --help >"$tmp/out" 2>&1 || fail "--help: exit $?"
for p in build test sanitize bench torch 13b plan13b; do
  grep -q "^  $p " "$tmp/out" || fail "--help does not name the phase $p"
done
echo "ok: --help"

env -u OUT ZO_GPUCHECK_BUILD="$tmp/b" bash "$root/scripts/gpu-check.sh" nonsense >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc = 2 ] && [ "$(wc -l <"$tmp/err")" = 1 ] && grep -q "unknown phase 'nonsense'" "$tmp/err" ||
  fail "unknown phase: exit $rc: $(cat "$tmp/err")"
echo "ok: unknown phase: exit 2"

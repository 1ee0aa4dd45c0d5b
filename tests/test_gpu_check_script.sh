#!/bin/sh
# scripts/gpu-check.sh where there is no GPU: every command that needs one
# (run1, run2, run3, each GPU step) fails at once, before it builds or
# writes anything, with one line on stderr and exit 2 (no traceback); no
# argument and an unknown one exit 2 with one line; --help names the
# invocations and steps; `summary` prints the table of a results folder's
# rows (exit 1 when one is a FAIL) and leaves them as they are; run1 takes
# test_ops as passed only with its line "backend cuda N runs, 0 failed".
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
# python3 without torch, so that no CUDA device can be found through it
printf '#!/bin/sh\nexec python3 -S -c "import sys; sys.exit(1)"\n' > "$tmp/notorch"
chmod +x "$tmp/notorch"

# one line on stderr, exit 2, nothing on stdout, nothing created
refused() { # WHAT MESSAGE-RE ARGS...
  what=$1 re=$2
  shift 2
  env -u OUT ZO_GPUCHECK_BUILD="$tmp/b" ZO_GPUCHECK_PYTHON="$tmp/notorch" \
    bash "$root/scripts/gpu-check.sh" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  [ $rc = 2 ] || fail "$what: exit $rc, expected 2"
  [ "$(wc -l <"$tmp/err")" = 1 ] || fail "$what: stderr is not one line: $(cat "$tmp/err")"
  grep -qE "$re" "$tmp/err" || fail "$what: message: $(cat "$tmp/err")"
  grep -qi traceback "$tmp/out" "$tmp/err" && fail "$what: a traceback"
  [ -s "$tmp/out" ] && fail "$what: wrote to stdout: $(head -3 "$tmp/out")"
  [ -e "$tmp/b" ] && fail "$what: created $tmp/b"
  echo "ok: $what: exit 2: $(cat "$tmp/err")"
}

for cmd in run1 run2 run3 env build test memcheck bench sanitize 13b torch schedules offload "deps test" \
           "run1 summary" "plan13b run2"; do
  # shellcheck disable=SC2086  # the steps are separate words
  refused "gpu-check.sh $cmd" '^gpu-check: no NVIDIA GPU on this machine' $cmd
done
refused "gpu-check.sh (no argument)" '^gpu-check: name an invocation'
refused "gpu-check.sh nonsense" "unknown invocation or step 'nonsense'" nonsense
refused "gpu-check.sh run1 nonsense" "unknown invocation or step 'nonsense'" run1 nonsense

bash "$root/scripts/gpu-check.sh" --help >"$tmp/out" 2>&1 || fail "--help: exit $?"
for p in run1 run2 run3 env build test memcheck bench sanitize 13b torch schedules offload deps plan13b summary; do
  grep -q "^  $p " "$tmp/out" || fail "--help does not name $p"
done
echo "ok: --help names the invocations and steps"

# summary: the table of the rows in $OUT, last line the counts; exit 1 with a FAIL row
res=$tmp/res
mkdir -p "$res"
printf 'env\tGPU (CUDA runtime)\tok\tNVIDIA H100 80GB HBM3, sm_90\t\n' > "$res/rows.tsv"
printf 'test\ttest_ops\tFAIL\tbackend cuda 887 runs, 2 failed\tbackend cuda N runs, 0 failed\n' >> "$res/rows.tsv"
printf 'bench\tbench_gpu_cuda: pinned copies\tinfo\th2d 53.1 GB/s\t\n' >> "$res/rows.tsv"
cp "$res/rows.tsv" "$tmp/rows.before"
OUT=$res ZO_GPUCHECK_BUILD="$tmp/b2" bash "$root/scripts/gpu-check.sh" summary >"$tmp/out" 2>"$tmp/err"
rc=$?
[ $rc = 1 ] || fail "summary with a FAIL row: exit $rc, expected 1: $(cat "$tmp/err")"
grep -q '^== gpu-check summary: summary' "$tmp/out" || fail "summary: no header: $(cat "$tmp/out")"
grep -q '^   device: NVIDIA H100 80GB HBM3, sm_90' "$tmp/out" || fail "summary: no device line: $(cat "$tmp/out")"
grep -qE '^test +test_ops +FAIL +backend cuda 887 runs, 2 failed +\[goal backend cuda N runs, 0 failed\]' "$tmp/out" ||
  fail "summary: the FAIL row: $(cat "$tmp/out")"
[ "$(tail -1 "$tmp/out")" = "== 1 ok, 1 FAIL, 0 skip, 1 info" ] || fail "summary: last line: $(tail -1 "$tmp/out")"
cmp -s "$res/rows.tsv" "$tmp/rows.before" || fail "summary changed rows.tsv"
grep -v FAIL "$tmp/rows.before" > "$res/rows.tsv"
OUT=$res ZO_GPUCHECK_BUILD="$tmp/b2" bash "$root/scripts/gpu-check.sh" summary >"$tmp/out" 2>&1 ||
  fail "summary without a FAIL row: exit $?"
rm "$res/rows.tsv"
OUT=$res ZO_GPUCHECK_BUILD="$tmp/b2" bash "$root/scripts/gpu-check.sh" summary >"$tmp/out" 2>&1 ||
  fail "summary of no rows: exit $?"
grep -q '^gpu-check: no results recorded in' "$tmp/out" || fail "summary of no rows: $(cat "$tmp/out")"
echo "ok: summary"

# run1's test step: test_ops passes on the GPU only with its line
# "backend cuda N runs, 0 failed", N > 0 (the function, on test_ops's output)
cat > "$tmp/ops.sh" <<'EOS'
ROWS=$1
row() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:-}" >> "$ROWS"; }
eval "$(sed -n '/^ops_cuda_line() {/,/^}/p' "$2")"
cpu='  backend cpu          911 runs, 0 failed'
shim='  backend cuda-shim    911 runs, 0 failed'
ops_cuda_line "$(printf '%s\n%s\n  backend cuda         911 runs, 0 failed\n' "$cpu" "$shim")" || echo "FAIL: a clean cuda line refused"
ops_cuda_line "$(printf '%s\n  backend cuda         911 runs, 3 failed\n' "$cpu")" && echo "FAIL: 3 failed accepted"
ops_cuda_line "$(printf '%s\n%s\n' "$cpu" "$shim")" && echo "FAIL: no cuda line accepted (cuda-shim is not cuda)"
ops_cuda_line "$(printf '  backend cuda           0 runs, 0 failed\n')" && echo "FAIL: 0 runs accepted"
exit 0
EOS
bash "$tmp/ops.sh" "$tmp/ops.rows" "$root/scripts/gpu-check.sh" > "$tmp/out" 2>&1
[ -s "$tmp/out" ] && fail "test_ops's cuda line: $(cat "$tmp/out")"
[ "$(cut -f3 "$tmp/ops.rows" | tr '\n' ' ')" = "ok FAIL FAIL FAIL " ] || fail "test_ops's rows: $(cat "$tmp/ops.rows")"
echo "ok: test_ops's cuda line: present with 0 failed passes; failures, none, 0 runs fail"

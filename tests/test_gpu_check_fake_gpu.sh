#!/usr/bin/env bash
# `scripts/gpu-check.sh run1` end to end on a machine made to look as if it
# had a GPU: stand-ins for nvidia-smi (one "Fake GPU") and compute-sanitizer
# (runs the program, reports 0 errors) come first on PATH, and the build is
# this build tree (configured, up to date: the build step is a no-op). The
# GPU tests skip here, so run1 must report them as FAIL rows and exit 1;
# what is checked is the plumbing the GPU session depends on:
# - every step ran, in run1's order, each leaving rows in $OUT as it went;
#   summary.txt is the table printed last; at most 8 files in $OUT, no folder;
# - the test step's rows: one per GPU test, a skip is a FAIL, test_ops
#   without its `backend cuda` line is a FAIL, test_cuda_module passes;
# - ctest ran from a folder of its own: this build's Testing/ is untouched;
# - killed in the middle of a step (as the device tool does at its limit),
#   run1 leaves the rows and the summary of the steps before it;
# - run2 and run3 (a hardware preset instead of calibrating, setup rates that
#   let train start): their files in $OUT (run3's are 8), their steps in
#   order, the 13B host tier from MemTotal, train --plan --device cuda
#   started and its failure a row, the archive of the plans.
# Exits 77 on a machine with a GPU (gpu-check.sh runs for real there).
#   test_gpu_check_fake_gpu.sh SOURCE_DIR BUILD_DIR
set -u
root=$1
build=$2
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "skipped: this machine has a GPU (the test checks gpu-check.sh with a stand-in for one)"
  exit 77
fi
tmp=$(mktemp -d)
pid=""
trap '[ -n "$pid" ] && kill -KILL -- -"$pid" 2>/dev/null; [ -s "$tmp/hang" ] && kill -KILL "$(cat "$tmp/hang")" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() {
  echo "FAIL: $*"
  [ -f "$tmp/stdout" ] && { echo "--- gpu-check.sh's output:"; cat "$tmp/stdout" "$tmp/stderr" 2>/dev/null; }
  exit 1
}

mkdir -p "$tmp/bin" "$tmp/out"
cat > "$tmp/bin/nvidia-smi" <<'EOF'
#!/bin/sh
# one GPU; --query-gpu=a,b,... answers field by field (nounits: no " MiB")
case "$*" in
  -L) echo "GPU 0: Fake GPU (UUID: GPU-00000000-0000-0000-0000-000000000000)"; exit 0 ;;
  *--query-gpu=*) ;;
  *) echo "stand-in nvidia-smi: one Fake GPU"; exit 0 ;;
esac
nounits=""
case "$*" in *nounits*) nounits=1 ;; esac
out=""
for f in $(echo "$*" | sed 's/.*--query-gpu=\([^ ]*\).*/\1/' | tr ',' ' '); do
  case "$f" in
    index) v=0 ;; name) v="Fake GPU" ;; driver_version) v=999.99 ;;
    memory.total) v="81559 MiB" ;; memory.free) v="81000 MiB" ;; memory.used) v="559 MiB" ;;
    *) v="[N/A]" ;;
  esac
  [ -n "$nounits" ] && v=${v% MiB}
  out="${out:+$out, }$v"
done
echo "$out"
EOF
cat > "$tmp/bin/compute-sanitizer" <<'EOF'
#!/bin/sh
# FAKE_HANG: a run (not --version) says so in that file, then waits to be killed
case "$*" in *--tool*) [ -n "${FAKE_HANG:-}" ] && { echo "$$" > "$FAKE_HANG"; exec sleep 120; } ;; esac
while [ $# -gt 0 ]; do
  case "$1" in
    --tool|--leak-check|--racecheck-report|--target-processes|--error-exitcode) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "stand-in compute-sanitizer"; exit 0; }
[ -n "${ZO_CUDA_GEMM:-}" ] && echo "stand-in: ZO_CUDA_GEMM=$ZO_CUDA_GEMM"
"$@"
rc=$?
echo "========= ERROR SUMMARY: 0 errors"
exit $rc
EOF
chmod +x "$tmp/bin/nvidia-smi" "$tmp/bin/compute-sanitizer"

lasttest=$build/Testing/Temporary/LastTest.log
before=$(cksum "$lasttest" 2>/dev/null)

# ZO_OPS_FILTER: test_ops runs one op (its cases on the CPU and the shim; no cuda line here)
PATH="$tmp/bin:$PATH" OUT="$tmp/out" ZO_GPUCHECK_BUILD="$build" ZO_OPS_FILTER=gpu_scale \
  bash "$root/scripts/gpu-check.sh" run1 >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
[ $rc = 1 ] || fail "run1 with the GPU tests skipping: exit $rc, expected 1"
rows=$tmp/out/rows.tsv

# $OUT: files only, at most 8, the ones run1 writes
n=0
for f in "$tmp/out"/* "$tmp/out"/.[!.]*; do
  [ -e "$f" ] || continue
  [ -f "$f" ] || fail "$f in \$OUT is not a plain file"
  n=$((n + 1))
  case "$(basename "$f")" in
    env.txt|rows.tsv|summary.txt|build.log|test.log|sanitize.log|bench.log) ;;
    *) fail "unexpected file in \$OUT: $(basename "$f")" ;;
  esac
done
[ $n -le 8 ] || fail "$n files in \$OUT (at most 8 come back)"
for f in env.txt rows.tsv summary.txt build.log test.log sanitize.log bench.log; do
  [ -s "$tmp/out/$f" ] || fail "\$OUT/$f missing or empty"
done
echo "ok: \$OUT holds $n files: $(cd "$tmp/out" && echo *)"

# the rows: five fields; the steps in run1's order
awk -F'\t' 'NF != 5 || $3 !~ /^(ok|FAIL|skip|info)$/ {print "bad row " NR ": " $0; bad = 1} END {exit bad}' "$rows" ||
  fail "rows.tsv is malformed"
order=$(cut -f1 "$rows" | awk '!seen[$0]++' | tr '\n' ' ')
[ "$order" = "env build test memcheck bench sanitize " ] || fail "steps in rows.tsv: $order"
want() { # STEP CHECK STATUS FIGURE-RE
  awk -F'\t' -v s="$1" -v c="$2" -v t="$3" -v f="$4" '$1 == s && $2 == c && $3 == t && $4 ~ f {ok = 1} END {exit !ok}' "$rows" ||
    fail "no row '$1 | $2 | $3 | ~$4' in rows.tsv: $(grep "^$1	" "$rows")"
}
want env "GPU (nvidia-smi: name, driver, memory total, free)" info "^Fake GPU, 999.99, 81559 MiB, 81000 MiB"
want env "host" info "^MemTotal [0-9.]+ GiB, MemAvailable [0-9.]+ GiB, [0-9]+ cores"
grep -q "^env	GPU (CUDA runtime)	" "$rows" || fail "no CUDA runtime row"
want build "build 8 targets, -j$(nproc)" ok "zo_cuda test_gpu_parity"
for t in test_gpu_parity test_gpu_parity_model test_offload_cuda; do
  want test "$t" FAIL "^skipped: "
done
[ "$(awk -F'\t' '$1 == "test"' "$rows" | wc -l)" = 8 ] || fail "test rows: $(grep '^test	' "$rows")"
for p in mma tc; do # test_ops with each forced path: no cuda line here
  want test "test_ops attention, ZO_ATTENTION=$p" FAIL "^no 'backend cuda \.\.\. runs' line"
done
grep -q "ZO_ATTENTION=mma ZO_OPS_FILTER=gpu_scale ZO_OPS_BACKENDS=cpu,cuda" "$tmp/out/test.log" ||
  fail "test.log has no forced mma run of test_ops"
grep -q "^test	test_comm_nccl	FAIL	" "$rows" || fail "test_comm_nccl: $(grep test_comm_nccl "$rows")"
want test test_ops FAIL "no 'backend cuda \.\.\. runs' line"
want test test_cuda_module ok "^passed"
want memcheck "memcheck test_gpu_parity" FAIL "^exit 77"
want bench bench_gpu_cuda FAIL "^exit 77"
# test_ops with mma forced failed: the bench keeps the automatic rule
want bench "attention path" info "^the automatic rule"
grep -q 'ZO_ATTENTION=tune' "$tmp/out/bench.log" && fail "bench.log: ZO_ATTENTION=tune without a passing forced-mma row"
want sanitize "memcheck test_ops (ZO_OPS_BACKENDS=cpu,cuda)" ok "^0 errors"
# initcheck with every GEMM on the own kernel: the variable reaches the run, and only that one
want sanitize "initcheck test_gpu_parity (ZO_CUDA_GEMM=tiled)" FAIL "^exit 77"
[ "$(grep -c '^stand-in: ZO_CUDA_GEMM=tiled$' "$tmp/out/sanitize.log")" = 1 ] ||
  fail "ZO_CUDA_GEMM=tiled in sanitize.log: $(grep -c 'ZO_CUDA_GEMM' "$tmp/out/sanitize.log") lines"
echo "ok: rows.tsv: $(wc -l <"$rows") rows, steps $order"

# the summary: printed last, the same as summary.txt, whose counts are the rows'
sed -n '/^== gpu-check summary/,$p' "$tmp/stdout" > "$tmp/printed"
grep -v -e '^== gpu-check summary' -e '^$' "$tmp/out/summary.txt" > "$tmp/saved.body"
grep -v -e '^== gpu-check summary' -e '^$' "$tmp/printed" > "$tmp/printed.body"
cmp -s "$tmp/saved.body" "$tmp/printed.body" || fail "summary.txt is not the printed summary"
fails=$(grep -c '	FAIL	' "$rows")
tail -1 "$tmp/stdout" | grep -qE "^== [0-9]+ ok, $fails FAIL, [0-9]+ skip, [0-9]+ info$" ||
  fail "the last line is not the counts: $(tail -1 "$tmp/stdout")"
echo "ok: summary printed last and in summary.txt"

[ "$(cksum "$lasttest" 2>/dev/null)" = "$before" ] || fail "this build's $lasttest changed"
[ -s "$build/gpucheck/ctest/Testing/Temporary/LastTest.log" ] || fail "no LastTest.log in gpucheck/ctest"
echo "ok: ctest's log went to gpucheck/ctest, not to this build's Testing/"

# killed inside memcheck: what the steps before it recorded is there
rm -rf "$tmp/out" && mkdir "$tmp/out"
PATH="$tmp/bin:$PATH" OUT="$tmp/out" ZO_GPUCHECK_BUILD="$build" ZO_OPS_FILTER=gpu_scale FAKE_HANG="$tmp/hang" \
  setsid bash "$root/scripts/gpu-check.sh" run1 >"$tmp/stdout" 2>"$tmp/stderr" &
pid=$!
disown "$pid" # no job notice when it is killed
i=0
while [ ! -s "$tmp/hang" ] && [ $i -lt 600 ] && kill -0 "$pid" 2>/dev/null; do
  sleep 0.1
  i=$((i + 1))
done
[ -s "$tmp/hang" ] || fail "the memcheck stand-in never started"
kill -KILL -- -"$pid" # the script and its process group, as the device tool ends a command at its limit
while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
pid=""
kill -KILL "$(cat "$tmp/hang")" 2>/dev/null # the stand-in (timeout made a process group of its own)
for s in env build test; do
  grep -q "^$s	" "$tmp/out/rows.tsv" || fail "killed in memcheck: no $s rows"
  grep -q "^$s  " "$tmp/out/summary.txt" || fail "killed in memcheck: $s not in summary.txt"
done
grep -q '^memcheck	' "$tmp/out/rows.tsv" && fail "killed in memcheck: a memcheck row"
echo "ok: killed in memcheck, \$OUT keeps the rows and summary of env, build, test"

# run2 and run3: their files and rows (no calibration: the H100 preset)
check_files() { # WHAT FILE...: $OUT holds exactly these plain files
  what=$1
  shift
  got=$(cd "$tmp/out" && find . -mindepth 1 | sed 's|^\./||' | sort | tr '\n' ' ')
  want=$(printf '%s\n' "$@" | sort | tr '\n' ' ')
  [ "$got" = "$want" ] || fail "$what: \$OUT holds '$got', expected '$want'"
  [ $# -le 8 ] || fail "$what: $# files (at most 8 come back)"
}
for r in run2 run3; do
  rm -rf "$tmp/out" && mkdir "$tmp/out"
  PATH="$tmp/bin:$PATH" OUT="$tmp/out" ZO_GPUCHECK_BUILD="$build" ZO_13B_HW=h100-80gb ZO_SCHED_HW=h100-80gb \
    ZO_13B_INIT_RATE=1e12 ZO_13B_NF4_RATE=1e12 bash "$root/scripts/gpu-check.sh" $r >"$tmp/stdout" 2>"$tmp/stderr"
  rc=$?
  [ $rc = 1 ] || fail "$r without a GPU behind the stand-in: exit $rc, expected 1"
  order=$(cut -f1 "$rows" | awk '!seen[$0]++' | tr '\n' ' ')
  tail -1 "$tmp/stdout" | grep -qE '^== [0-9]+ ok, [0-9]+ FAIL, [0-9]+ skip, [0-9]+ info$' ||
    fail "$r: the last line is not the summary's counts: $(tail -1 "$tmp/stdout")"
  tar -tzf "$tmp/out/artifacts.tar.gz" > "$tmp/archive" || fail "$r: artifacts.tar.gz is not an archive"
  if [ $r = run2 ]; then
    check_files run2 env.txt rows.tsv summary.txt build.log 13b.log artifacts.tar.gz
    [ "$order" = "env build 13b " ] || fail "run2: steps in rows.tsv: $order"
    want build "build 3 targets, -j$(nproc)" ok "zo_cuda train memplan"
    want 13b "host tier of the plans" info "= MemTotal [0-9.]+ GiB - reserve [0-9.]+ GiB"
    want 13b "train --check-plan (QLoRA 13B)" ok "^qlora r 16"
    want 13b "QLoRA 13B: train --plan (cuda)" FAIL "^exit 2 after 0 steps"
    awk -F'\t' '$1 == "13b" {print $2}' "$rows" | sed -n 2p | grep -q '^QLoRA' ||
      fail "run2: QLoRA is not planned first: $(grep '^13b' "$rows")"
    grep -q '^13b/plan13b-qlora.json$' "$tmp/archive" || fail "run2: no QLoRA plan in the archive: $(cat "$tmp/archive")"
  else
    check_files run3 env.txt rows.tsv summary.txt build.log torch.log schedules.log offload.log artifacts.tar.gz
    [ "$order" = "env build torch schedules offload " ] || fail "run3: steps in rows.tsv: $order"
    want build "build 5 targets, -j$(nproc)" ok "bench_offload bench_lora"
    want schedules "host tier of the plans" info "= MemTotal"
    grep -q '^schedules/plan-schedules.json$' "$tmp/archive" || fail "run3: no schedules plan in the archive"
    grep -q '^offload	bench_offload' "$rows" && grep -q '^offload	bench_lora' "$rows" || fail "run3: offload rows"
  fi
  echo "ok: $r: \$OUT holds $(cd "$tmp/out" && echo *); steps $order"
done

# Steps of several invocations named together would leave 10 files: the
# finished steps' logs are packed into logs.tar.gz, whole, as they finish
rm -rf "$tmp/out" && mkdir "$tmp/out"
PATH="$tmp/bin:$PATH" OUT="$tmp/out" ZO_GPUCHECK_BUILD="$build" ZO_13B_HW=h100-80gb ZO_SCHED_HW=h100-80gb \
  ZO_13B_INIT_RATE=1e12 ZO_13B_NF4_RATE=1e12 ZO_13B_RUNS=qlora \
  bash "$root/scripts/gpu-check.sh" bench torch schedules offload 13b >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
[ $rc = 1 ] || fail "steps of three invocations: exit $rc, expected 1"
check_files packed env.txt rows.tsv summary.txt artifacts.tar.gz logs.tar.gz
got=$(tar -tzf "$tmp/out/logs.tar.gz" | grep -v '/$' | sort | tr '\n' ' ')
[ "$got" = "logs/13b.log logs/bench.log logs/build.log logs/offload.log logs/schedules.log logs/torch.log " ] ||
  fail "packed: logs.tar.gz holds '$got'"
tar -xzf "$tmp/out/logs.tar.gz" -C "$tmp" logs/bench.log logs/13b.log || fail "packed: logs.tar.gz does not unpack"
grep -q 'bench_gpu_cuda' "$tmp/logs/bench.log" || fail "packed: bench.log lacks bench_gpu_cuda's run"
grep -q 'plan13b-qlora' "$tmp/logs/13b.log" || fail "packed: 13b.log lacks the QLoRA run"
grep -q 'the finished steps. logs go into logs.tar.gz' "$tmp/stdout" || fail "packed: no line saying so"
echo "ok: steps of three invocations: \$OUT holds $(cd "$tmp/out" && echo *)"

# test, bench and torch in one invocation over a build of stand-ins (a
# configured folder whose test_ops passes with ZO_ATTENTION=mma, and a
# bench that says what it was given): the forced-mma row passed, so the
# bench and torch steps run with ZO_ATTENTION=tune and ZO_ATTENTION_LOG=1,
# and the tuning's lines reach bench.log
fb=$tmp/fakebuild
mkdir -p "$fb/gpu" "$fb/bench"
printf 'CMAKE_GENERATOR:INTERNAL=Unix Makefiles\n' > "$fb/CMakeCache.txt"
cat > "$fb/gpu/test_ops" <<'EOF'
#!/bin/sh
[ "${ZO_ATTENTION:-}" = mma ] && { echo "backend cuda 12 runs, 0 failed"; exit 0; }
echo "backend cuda 12 runs, 1 failed"
exit 1
EOF
cat > "$fb/bench/bench_gpu_cuda" <<'EOF'
#!/bin/sh
echo "stand-in bench: ZO_ATTENTION=${ZO_ATTENTION:-} ZO_ATTENTION_LOG=${ZO_ATTENTION_LOG:-}"
[ "${ZO_ATTENTION:-}" = tune ] && [ "${ZO_ATTENTION_LOG:-}" = 1 ] &&
  echo "ZO_ATTENTION=tune: attention_forward b1 t2048 hq40 hkv40 d128 causal qkv bf16 out bf16: mma 1.0 us, tc 2.0 us, gemm 3.0 us, flash 4.0 us -> mma" >&2
echo "causal_tune     1   2048     40       1.00      100.0       2.00      100.0     3.00     3.00       2.00      100.0  128   40      0     0"
echo "causal_tune     8   1024     12       1.00       90.0       2.00       80.0     3.00     3.00       2.00       70.0   64   12      0     0"
echo "causal_tune     1   4096     32       1.00       95.0       2.00       85.0     3.00     3.00       2.00       75.0  128    8   1024     0"
echo "router            n     e   k     fwd_ms     bwd_ms    copy_ms    fwd_x    bwd_x"
echo "mixtral        4096     8   2      0.020      0.030      0.010     2.00     3.00"
echo "deepseek_v3    4096   256   8      0.500      0.400      0.100     5.00     4.00"
echo "bench_gpu_cuda: gpu_moe_router_forward: a stand-in failure" >&2
echo "gpu_gemm / best cuBLASLt (geo. mean): 1.00"
exit 1
EOF
chmod +x "$fb/gpu/test_ops" "$fb/bench/bench_gpu_cuda"
rm -rf "$tmp/out" && mkdir "$tmp/out"
PATH="$tmp/bin:$PATH" OUT="$tmp/out" ZO_GPUCHECK_BUILD="$fb" \
  bash "$root/scripts/gpu-check.sh" test bench torch >"$tmp/stdout" 2>"$tmp/stderr"
rc=$?
[ $rc = 1 ] || fail "test bench torch over stand-ins: exit $rc, expected 1"
want test "test_ops attention, ZO_ATTENTION=mma" ok "^backend cuda 12 runs, 0 failed"
want test "test_ops attention, ZO_ATTENTION=tc" FAIL "1 failed"
want bench "attention path" info "^ZO_ATTENTION=tune"
want bench "bench_gpu_cuda: attention tuned choice / flash kernel" info "^t=2048 fwd 100.0 TF/s \(3.00x\) bwd 100.0 TF/s \(3.00x\), fp32 grads 100.0 TF/s; t=1024 hq=12 d=64 hkv=12 window=0 cap=0 fwd 90.0 TF/s \(3.00x\) bwd 80.0 TF/s \(3.00x\), fp32 grads 70.0 TF/s; t=4096 hq=32 d=128 hkv=8 window=1024 cap=0 fwd 95.0"
# a router shape that failed after the GEMMs' ratio: the step fails, its rows stay
want bench "bench_gpu_cuda" FAIL "^exit 1$"
want bench "bench_gpu_cuda: MoE router, 4096 tokens (x a copy of the logits)" info "^mixtral e=8 k=2 fwd 0.020 ms \(2.00x\) bwd 0.030 ms \(3.00x\); deepseek_v3 e=256 k=8 fwd 0.500 ms \(5.00x\) bwd 0.400 ms \(4.00x\)$"
want torch "attention path" info "^ZO_ATTENTION=tune"
grep -q '^stand-in bench: ZO_ATTENTION=tune ZO_ATTENTION_LOG=1$' "$tmp/out/bench.log" ||
  fail "bench.log: the bench did not get ZO_ATTENTION=tune ZO_ATTENTION_LOG=1: $(grep stand-in "$tmp/out/bench.log")"
grep -q '^ZO_ATTENTION=tune: attention_forward .* -> mma$' "$tmp/out/bench.log" || fail "bench.log lacks the tuning's line"
echo "ok: test bench torch: a passing forced-mma row puts the bench and torch steps on ZO_ATTENTION=tune"

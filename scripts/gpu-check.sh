#!/usr/bin/env bash
# gpu-check.sh: everything the CUDA path must show on a real GPU (issue 18),
# started at the repository root of a bare GPU machine (an H100 or H200 with
# CUDA, CMake, compute-sanitizer and Python with PyTorch, no package
# registry). docs/gpu-cuda.md ("Running it on a GPU machine") has the exact
# device-tool calls.
#
#   bash scripts/gpu-check.sh [PHASE...]      (default: all)
#
# Phases (each fits one 10-minute command; the build is reused between
# commands while the machine stays warm, and made again when it is not):
#   build     unpack .carry/ (scripts/gpu-carry.sh) into a prefix; configure with
#             CUDA for sm_90 (Release) against it; build with -j$(nproc)
#   test      every ctest test; fails if any fails, or if a GPU test
#             (test_gpu_parity, test_gpu_parity_model, test_offload_cuda) skips
#   sanitize  compute-sanitizer memcheck on those three; then racecheck,
#             synccheck and initcheck on test_gpu_parity while time is left
#   bench     bench_gpu_cuda; bench_offload --device cuda on a 1.3B GPT shape
#             (streamed prefetch 1 and 2 against resident)
#   torch     bench/torch_side_by_side.py: train --device cuda against PyTorch
#   13b       scripts/gpu_13b.py: a LLaMA-2-13B-shaped fine-tune from a memplan plan
#   all       the six above, in that order, inside one deadline
# Phases that need no GPU (for this machine and for checks elsewhere):
#   deps      only unpack .carry/ into the prefix
#   plan13b   the 13B plan for a described machine, checked against the 13B
#             model by `train --check-plan`, and its placement planned for a
#             tiny model and run by `train --plan` on the CPU backend (ZO_13B_*
#             below describe the machine)
#   summary   print the table of what the phases recorded on this machine
#
# Without a GPU the GPU phases fail at once with one line and exit 2. Exit 1
# when a check failed, 0 when all passed. Logs (at most 8 files) go to $OUT
# when it is set, else to build-gpu/gpucheck/logs; the summary table is printed
# last.
#
# Environment: ZO_GPUCHECK_BUILD (build folder, default build-gpu),
# ZO_GPUCHECK_JOBS (default nproc), ZO_GPUCHECK_DEADLINE (seconds this command
# may run, default 570), ZO_GPUCHECK_PYTHON (default python3),
# ZO_NVME_DIR (the 13B run's NVMe folder; default the largest free file
# system among the build folder and /tmp), ZO_13B_* (scripts/gpu_13b.py --help).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
B=${ZO_GPUCHECK_BUILD:-build-gpu}
case "$B" in /*) ;; *) B=$ROOT/$B ;; esac
STATE=$B/gpucheck
JOBS=${ZO_GPUCHECK_JOBS:-$(nproc 2>/dev/null || echo 4)}
DEADLINE=${ZO_GPUCHECK_DEADLINE:-570}
PY=${ZO_GPUCHECK_PYTHON:-python3}
GPU_TESTS=(test_gpu_parity test_gpu_parity_model test_offload_cuda)
ALL_PHASES=(build test sanitize bench torch 13b)
T0=$SECONDS

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

die() { # one line, then exit
  echo "gpu-check: $2" >&2
  exit "$1"
}

# ---- arguments --------------------------------------------------------------
phases=()
for a in "$@"; do
  case "$a" in
    -h|--help|help) usage; exit 0 ;;
    all) phases+=("${ALL_PHASES[@]}") ;;
    build|test|sanitize|bench|torch|13b|deps|plan13b|summary) phases+=("$a") ;;
    *) die 2 "unknown phase '$a' (phases: build test sanitize bench torch 13b all deps plan13b summary; --help)" ;;
  esac
done
[ ${#phases[@]} -gt 0 ] || phases=("${ALL_PHASES[@]}")

needs_gpu=0
gpu_phases=()
for p in "${phases[@]}"; do
  case "$p" in deps|plan13b|summary) ;; *) needs_gpu=1; gpu_phases+=("$p") ;; esac
done

# ---- is there a GPU? (before anything is built or written) ------------------
find_smi() {
  local c
  for c in nvidia-smi /usr/local/nvidia/bin/nvidia-smi /usr/bin/nvidia-smi; do
    if command -v "$c" >/dev/null 2>&1; then echo "$c"; return 0; fi
  done
  return 1
}
gpu_count() { # GPUs nvidia-smi lists; else those torch sees; else 0
  local smi n
  if smi=$(find_smi); then
    n=$("$smi" -L 2>/dev/null | grep -c '^GPU ')
    echo "${n:-0}"
    return
  fi
  n=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) || n=0
  echo "${n:-0}"
}
if [ "$needs_gpu" = 1 ]; then
  n=$(gpu_count)
  if [ "${n:-0}" -lt 1 ]; then
    if find_smi >/dev/null; then why="nvidia-smi lists no GPU"; else why="no nvidia-smi, and no CUDA device through $PY's torch"; fi
    die 2 "no NVIDIA GPU on this machine ($why): the phases ${gpu_phases[*]} need one; run them on a GPU machine (docs/gpu-cuda.md), or 'deps', 'plan13b' here"
  fi
fi

mkdir -p "$STATE"
LOGDIR=${OUT:-$STATE/logs}
mkdir -p "$LOGDIR"
LOGDIR=$(cd "$LOGDIR" && pwd)

# ---- time, rows, logs ---------------------------------------------------------
left() { echo $((DEADLINE - (SECONDS - T0))); }

# row PHASE CHECK STATUS FIGURE GOAL: one line of the summary (STATUS: ok, FAIL, skip, info)
row() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:-}" >> "$STATE/$1.rows"
}

# run_step PHASE LIMIT_S CMD...: CMD's output goes to the phase's log; returns
# its status (124: stopped at its limit, or not started: too little time left).
run_step() {
  local phase=$1 limit=$2
  shift 2
  local l
  l=$(left)
  [ $((l - 15)) -lt "$limit" ] && limit=$((l - 15))
  if [ "$limit" -lt 10 ]; then
    echo "## not started (time): $*" >> "$LOGDIR/$phase.log"
    return 124
  fi
  echo "## $(date +%T) ($limit s at most): $*" >> "$LOGDIR/$phase.log"
  timeout -k 10 "$limit" "$@" >> "$LOGDIR/$phase.log" 2>&1
}

say() { echo "gpu-check: $*"; }

# ---- the carried packages -----------------------------------------------------
DEPS=$B/deps
have_carry() { ls "$ROOT"/.carry/*.deb >/dev/null 2>&1; }

unpack_deps() { # .carry/*.deb -> $DEPS (again when .carry changed)
  if ! have_carry; then
    return 1
  fi
  local stamp=$DEPS/.unpacked
  if [ -f "$stamp" ] && [ -z "$(find "$ROOT/.carry" -newer "$stamp" -name '*.deb' 2>/dev/null)" ]; then
    return 0
  fi
  rm -rf "$DEPS"
  mkdir -p "$DEPS"
  local f
  for f in "$ROOT"/.carry/*.deb; do
    if command -v dpkg >/dev/null 2>&1; then
      dpkg -x "$f" "$DEPS" || return 2
    else # no dpkg: a .deb is an ar archive holding data.tar.* (tar detects its compression)
      local member
      member=$(ar t "$f" | grep '^data\.tar') || return 2
      ar p "$f" "$member" > "$DEPS/.$member" && tar -xf "$DEPS/.$member" -C "$DEPS" || return 2
      rm -f "$DEPS/.$member"
    fi
  done
  touch "$stamp"
}

# What tests and programs outside the build tree need to find the prefix.
export_env() {
  if [ -d "$DEPS/usr" ]; then
    export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
    # LIBDIR, not PATH: test_install sets PKG_CONFIG_PATH for its own .pc
    export PKG_CONFIG_LIBDIR="$B/deps-pkgconfig:/usr/local/lib/x86_64-linux-gnu/pkgconfig:/usr/local/lib/pkgconfig:/usr/local/share/pkgconfig:/usr/lib/x86_64-linux-gnu/pkgconfig:/usr/lib/pkgconfig:/usr/share/pkgconfig"
    command -v pkg-config >/dev/null 2>&1 || export PATH="$DEPS/usr/bin:$PATH"
  fi
  # tests that compare with PyTorch use this machine's python3 (tests/run_with_torch.sh)
  ZO_TORCH_PYTHON=$(command -v "$PY" 2>/dev/null || echo /usr/bin/python3)
  export ZO_TORCH_PYTHON
}

phase_deps() {
  rm -f "$STATE/deps.rows"
  unpack_deps
  case $? in
    0) row deps "unpack .carry (dpkg -x) into the build's deps/" ok "$(ls "$ROOT"/.carry/*.deb | wc -l) packages" ;;
    1) row deps "unpack .carry" info "no .carry/*.deb (bash scripts/gpu-carry.sh makes it): the machine's own packages" ;;
    *) row deps "unpack .carry" FAIL "dpkg -x / ar failed (see deps.log)"; return 1 ;;
  esac
  export_env
}

# ---- build ----------------------------------------------------------------------
cuda_args=(-DCMAKE_BUILD_TYPE=Release -DZO_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)

configure_build() { # PHASE: configure when needed, then build; 0 ok
  local phase=$1 t=$SECONDS gen=()
  phase_deps || return 1
  if [ ! -f "$B/CMakeCache.txt" ]; then
    command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    local dp=()
    [ -d "$DEPS/usr" ] && dp=(-DZO_DEPS_PREFIX="$DEPS")
    if ! run_step "$phase" 300 cmake -S . -B "$B" "${gen[@]}" "${cuda_args[@]}" "${dp[@]}"; then
      row build configure FAIL "cmake failed (build.log)"
      rm -f "$B/CMakeCache.txt" # configure again next time
      return 1
    fi
  fi
  if ! run_step "$phase" 500 cmake --build "$B" -j"$JOBS"; then
    row build "build -j$JOBS" FAIL "failed or out of time ($phase.log)"
    return 1
  fi
  [ "$phase" = build ] && row build "configure + build (CUDA sm_90, Release, -j$JOBS)" ok "$((SECONDS - t)) s$(
    grep -m1 -o 'feature: CUDA backend: found [^ ]*' "$LOGDIR/build.log" 2>/dev/null | sed 's/feature: CUDA backend: found /, CUDA /')"
  return 0
}

phase_build() { configure_build build; }

# Every GPU phase starts from an up-to-date build (a no-op when it is).
ensure_build() {
  configure_build "$1" || { row "$1" "build" FAIL "the build failed; see build.log / $1.log"; return 1; }
}

record_device() {
  local smi line
  smi=$(find_smi) || return 0
  line=$("$smi" --query-gpu=name,memory.total,memory.free,driver_version --format=csv,noheader 2>/dev/null | head -1)
  row device "GPU (nvidia-smi)" info "$line"
}

# ---- test -------------------------------------------------------------------------
phase_test() {
  ensure_build test || return 1
  local log=$LOGDIR/test.log t=$SECONDS
  (cd "$B" && run_step test 500 ctest -j"$((JOBS > 8 ? 8 : JOBS))" --timeout 600 --output-on-failure)
  local rc=$?
  cp "$B/Testing/Temporary/LastTest.log" "$STATE/ctest-LastTest.log" 2>/dev/null
  local summary
  summary=$(grep -E 'tests passed|tests failed' "$log" | tail -1)
  if [ $rc = 124 ]; then
    row test "ctest" FAIL "out of time after $((SECONDS - t)) s"
    return 1
  fi
  # one row per failed or skipped test, with the reason a skipped one gave
  local name status reason bad=0
  while read -r name status; do
    # the last output line that says "skip", else the last one
    reason=$(awk -v n="$name" '$0 ~ "^[0-9]+/[0-9]+ Testing: "n"$" {on=1; next}
                               on && /^Output:/ {getline; out=1; next}
                               on && out && /^<end of output>/ {exit}
                               on && out && NF {last=$0; if (tolower($0) ~ /skip/) sk=$0}
                               END {print (sk != "" ? sk : last)}' "$B/Testing/Temporary/LastTest.log" 2>/dev/null)
    if [ "$status" = Failed ]; then
      row test "$name" FAIL "failed" ; bad=1
    elif printf '%s\n' "${GPU_TESTS[@]}" | grep -qx "$name" || echo "$reason" | grep -qi 'no CUDA'; then
      row test "$name" FAIL "skipped: $reason" "must run on a GPU"; bad=1
    else
      row test "$name" skip "$reason"
    fi
  done < <(grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$log" | sed -E 's/.*#[0-9]+: ([^ ]+) .*(Passed|Failed|Skipped|Not Run|Timeout|Exception).*/\1 \2/' |
           sed -E 's/ (Not Run|Timeout|Exception)$/ Failed/' | grep -E ' (Failed|Skipped)$')
  local g
  for g in "${GPU_TESTS[@]}"; do
    if ! grep -qE "#[0-9]+: $g \.* *Passed" "$log"; then
      grep -qE "#[0-9]+: $g " "$log" || { row test "$g" FAIL "not registered (CUDA not built?)" "must run"; bad=1; }
    else
      row test "$g" ok "passed on the GPU"
    fi
  done
  [ $rc = 0 ] || bad=1
  row test "ctest" "$([ $bad = 0 ] && echo ok || echo FAIL)" "${summary:-no summary} ($((SECONDS - t)) s)" "all pass, no GPU test skipped"
  return $bad
}

# ---- sanitize ------------------------------------------------------------------------
find_sanitizer() {
  local c
  for c in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    if command -v "$c" >/dev/null 2>&1; then echo "$c"; return 0; fi
  done
  return 1
}

phase_sanitize() {
  ensure_build sanitize || return 1
  local cs
  if ! cs=$(find_sanitizer); then
    row sanitize compute-sanitizer FAIL "not found on PATH or under /usr/local/cuda"
    return 1
  fi
  local bad=0 job tool bin limit extra rc errs
  # memcheck first (the goal); the other tools on the op-level test while time is left
  for job in "memcheck gpu/test_gpu_parity 200" "memcheck gpu/test_gpu_parity_model 150" \
             "memcheck offload/test_offload_cuda 200" "racecheck gpu/test_gpu_parity 150" \
             "synccheck gpu/test_gpu_parity 100" "initcheck gpu/test_gpu_parity 150"; do
    read -r tool bin limit <<< "$job"
    extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check full)
    [ "$tool" = racecheck ] && extra=(--racecheck-report all)
    # test_offload_cuda also runs `train --device cuda` as a child process
    [ "$bin" = offload/test_offload_cuda ] && extra+=(--target-processes all)
    local t=$SECONDS
    (cd "$B/$(dirname "$bin")" && run_step sanitize "$limit" "$cs" --error-exitcode 1 --tool "$tool" "${extra[@]}" "./$(basename "$bin")")
    rc=$?
    errs=$(grep -o 'ERROR SUMMARY: [0-9]* error' "$LOGDIR/sanitize.log" | tail -1 | grep -o '[0-9]*')
    if [ $rc = 0 ]; then
      row sanitize "$tool $(basename "$bin")" ok "${errs:-0} errors ($((SECONDS - t)) s)" "0 errors"
    elif [ $rc = 124 ] && [ "$tool" != memcheck ]; then
      row sanitize "$tool $(basename "$bin")" skip "not finished in its time ($((SECONDS - t)) s)"
    else
      row sanitize "$tool $(basename "$bin")" FAIL "exit $rc, ${errs:-?} errors ($((SECONDS - t)) s)" "0 errors"
      bad=1
    fi
  done
  return $bad
}

# ---- bench ---------------------------------------------------------------------------
phase_bench() {
  ensure_build bench || return 1
  local bad=0 out rc
  out=$STATE/bench_gpu_cuda.txt
  run_step bench 200 "$B/bench/bench_gpu_cuda"
  rc=$?
  awk '/^## .*bench_gpu_cuda/ {buf=""} {buf = buf $0 "\n"} END {printf "%s", buf}' "$LOGDIR/bench.log" > "$out"
  if [ $rc = 0 ]; then
    row bench "bench_gpu_cuda: gpu_gemm / best cuBLASLt" ok "$(tail -1 "$out" | sed 's/.*: //')" ">= 0.9"
    local h2d d2h
    h2d=$(awk '$1 == "h2d" && $2 == "pinned" {print $3}' "$out" | tail -1)
    d2h=$(awk '$1 == "d2h" && $2 == "pinned" {print $3}' "$out" | tail -1)
    [ -n "$h2d" ] && echo "$h2d" > "$STATE/pcie_h2d_gbs"
    row bench "bench_gpu_cuda: pinned copies" info "h2d ${h2d:-?} GB/s, d2h ${d2h:-?} GB/s"
  else
    row bench "bench_gpu_cuda" FAIL "exit $rc"
    bad=1
  fi
  # streaming overhead on a 1.3B GPT shape (GPT-3 XL: 24 x 2048, vocab 50257)
  out=$STATE/bench_offload.txt
  run_step bench 360 "$B/bench/bench_offload" --device cuda --layers 24 --hidden 2048 --vocab 50257 \
    --batch 8 --seq 1024
  rc=$?
  awk '/^## .*bench_offload/ {buf=""} {buf = buf $0 "\n"} END {printf "%s", buf}' "$LOGDIR/bench.log" > "$out"
  if [ $rc = 0 ]; then
    local d r f
    for d in 1 2; do
      read -r r f < <(awk -v d="$d" '$0 ~ "^streamed, prefetch "d" " {print $(NF-1), $NF}' "$out")
      if [ -n "$r" ] && awk -v r="$r" 'BEGIN {exit !(r <= 1.10)}'; then
        row bench "bench_offload 1.3B: streamed prefetch $d / resident step" ok "$r (fwd+bwd $f)" "<= 1.10"
      else
        row bench "bench_offload 1.3B: streamed prefetch $d / resident step" FAIL "${r:-?} (fwd+bwd ${f:-?})" "<= 1.10"
        bad=1
      fi
    done
    row bench "bench_offload 1.3B: resident step" info "$(awk '/^resident / {print $2 " s, " $3 " tok/s"}' "$out")"
  else
    row bench "bench_offload --device cuda (1.3B)" FAIL "exit $rc$([ $rc = 124 ] && echo ': out of time')"
    bad=1
  fi
  return $bad
}

# ---- torch, 13b -------------------------------------------------------------------
phase_torch() {
  ensure_build torch || return 1
  local l
  l=$(left)
  PYTHONUNBUFFERED=1 run_step torch "$((l - 15))" "$PY" bench/torch_side_by_side.py \
    --train "$B/examples/train" --memplan "$B/planner/memplan" --device cuda \
    --workdir "$STATE/torch" --rows "$STATE/torch.rows" --time-limit "$((l - 30))"
  local rc=$?
  [ $rc = 124 ] && row torch "side by side" FAIL "out of time"
  return $rc
}

nvme_dir() { # ZO_NVME_DIR, else the emptiest of the build folder's and /tmp's file systems
  if [ -n "${ZO_NVME_DIR:-}" ]; then echo "$ZO_NVME_DIR"; return; fi
  local best="" bestfree=0 d free
  for d in "$B" /tmp /var/tmp; do
    [ -d "$d" ] || continue
    free=$(df -Pk "$d" 2>/dev/null | awk 'NR == 2 {print $4}')
    if [ "${free:-0}" -gt "$bestfree" ]; then best=$d; bestfree=$free; fi
  done
  echo "${best:-/tmp}/zo-nvme"
}

phase_13b() {
  ensure_build 13b || return 1
  local l nv pcie=()
  l=$(left)
  nv=$(nvme_dir)
  [ -f "$STATE/pcie_h2d_gbs" ] && pcie=(--pcie-gbs "$(cat "$STATE/pcie_h2d_gbs")")
  PYTHONUNBUFFERED=1 run_step 13b "$((l - 15))" "$PY" scripts/gpu_13b.py --train "$B/examples/train" \
    --memplan "$B/planner/memplan" --device cuda --workdir "$STATE/13b" --nvme-dir "$nv" \
    --rows "$STATE/13b.rows" --time-limit "$((l - 30))" "${pcie[@]}"
  local rc=$?
  [ $rc = 124 ] && row 13b "13B run" FAIL "out of time"
  return $rc
}

# plan13b: no GPU. Here the build is ./build unless ZO_GPUCHECK_BUILD names one.
phase_plan13b() {
  local bin=${ZO_GPUCHECK_BUILD:-build}
  if [ ! -x "$bin/planner/memplan" ] || [ ! -x "$bin/examples/train" ]; then
    row plan13b "memplan and train" FAIL "not built in $bin/ (cmake --build $bin)"
    return 1
  fi
  "$PY" scripts/gpu_13b.py --train "$bin/examples/train" --memplan "$bin/planner/memplan" --device cpu \
    --workdir "$STATE/plan13b" --nvme-dir "$STATE/plan13b/nvme" --rows "$STATE/plan13b.rows" \
    >> "$LOGDIR/plan13b.log" 2>&1
}

# ---- summary ----------------------------------------------------------------------
print_summary() {
  local f files=()
  for f in device deps build test sanitize bench torch 13b plan13b; do
    [ -s "$STATE/$f.rows" ] && files+=("$STATE/$f.rows")
  done
  [ ${#files[@]} -gt 0 ] || { echo "gpu-check: no results recorded in $STATE"; return; }
  echo
  echo "== gpu-check summary ($(date -u +%FT%TZ); logs: $LOGDIR)"
  echo "   this command: ${phases[*]}; rows of other phases were recorded by earlier commands on this machine"
  cat "${files[@]}" | awk -F'\t' '
    { p[NR]=$1; c[NR]=$2; s[NR]=$3; v[NR]=$4; g[NR]=$5
      if (length($2) > wc) wc = length($2); if (wc > 58) wc = 58 }
    END { for (i = 1; i <= NR; i++)
            printf "%-8s %-" wc "s  %-4s  %s%s\n", p[i], substr(c[i], 1, 58), s[i], v[i],
                   (g[i] != "" ? "   [goal " g[i] "]" : "") }'
}

pack_logs() { # at most 8 files come back: the phase logs, the summary, one archive
  [ -n "${OUT:-}" ] || return 0
  print_summary > "$OUT/summary.txt"
  tar -czf "$OUT/artifacts.tar.gz" -C "$STATE" --exclude=logs --exclude='nvme' --exclude='*.bin' \
      --exclude='zo-nvme' . 2>/dev/null
  local f
  for f in "$OUT"/*.log; do
    [ -f "$f" ] || continue
    if [ "$(stat -c %s "$f")" -gt $((15 << 20)) ]; then
      { head -c $((2 << 20)) "$f"; printf '\n[... cut ...]\n'; tail -c $((12 << 20)) "$f"; } > "$f.cut" && mv "$f.cut" "$f"
    fi
  done
}

# ---- run ------------------------------------------------------------------------------
failed=0
if [ "$needs_gpu" = 1 ]; then
  rm -f "$STATE/device.rows"
  record_device
fi
for p in "${phases[@]}"; do
  [ "$p" = summary ] && continue
  rm -f "$STATE/$p.rows"
  : > "$LOGDIR/$p.log"
  if [ "$(left)" -lt 30 ]; then
    row "$p" "$p" FAIL "not run: this command's ${DEADLINE} s were used up"
    failed=1
    continue
  fi
  say "$p ($(left) s left; log $LOGDIR/$p.log)"
  "phase_$p"
  rc=$?
  if [ $rc != 0 ] && ! grep -q $'\tFAIL\t' "$STATE/$p.rows" 2>/dev/null; then
    row "$p" "$p" FAIL "exit $rc (see $p.log)"
  fi
  grep -q $'\tFAIL\t' "$STATE/$p.rows" 2>/dev/null && failed=1
done
pack_logs
print_summary
exit $failed

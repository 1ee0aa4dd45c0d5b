#!/usr/bin/env bash
# gpu-check.sh: what the CUDA path must show on a real GPU (issue 18), in three
# invocations of one command each (at most 10 minutes, 30 in all), every one
# possibly on a fresh machine: an H100 or H200 with CUDA, CMake,
# compute-sanitizer and Python with PyTorch; no package registry, no MPI.
# Started at the repository root; docs/gpu-cuda.md ("Running it on a GPU
# machine") has the exact device-tool calls.
#
#   bash scripts/gpu-check.sh run1|run2|run3
#   bash scripts/gpu-check.sh STEP...          (env and build come first by themselves)
#   bash scripts/gpu-check.sh deps|plan13b|summary
#
# Invocations, in the order of their value; each unpacks .carry/
# (scripts/gpu-carry.sh), configures (CUDA sm_90, Release) when build-gpu/ has
# no configuration yet and builds only the targets of its own steps:
#   run1   env build test memcheck bench, then sanitize while time is left
#   run2   env build 13b
#   run3   env build torch schedules, then offload while time is left
# Steps:
#   env        nvidia-smi (name, driver, memory), the device as the CUDA runtime
#              reports it (scripts/cuda_info.c: name, sm, total and free memory),
#              /proc/meminfo's head, cores, disks, tool versions: env.txt
#   build      configure; build the command's targets with -j$(nproc), going on
#              past a failed target (a step whose programs built still runs)
#   test       the GPU tests only: test_gpu_parity, test_gpu_parity_model,
#              test_offload_cuda, test_comm_nccl (NCCL, one rank, no MPI), test_ops
#              (and its line `backend cuda N runs, 0 failed`; its CPU and CUDA
#              backends only, ZO_OPS_BACKENDS=cpu,cuda), test_cuda_module;
#              a test that skips, fails or is missing is a FAIL; an info row
#              with test_gpu_parity_model's largest fp32 difference / bound
#              per model (its TF32 error model)
#   memcheck   compute-sanitizer memcheck --leak-check full on test_gpu_parity
#   bench      bench_gpu_cuda: gpu_gemm against cuBLASLt's best (goal >= 0.9),
#              pinned and pageable copies, attention (with ZO_ATTENTION=tune
#              and its choices in bench.log when this invocation's test step
#              passed test_ops with mma forced), the MoE router's kernels
#   sanitize   memcheck of test_ops (CPU and CUDA backends), test_gpu_parity_model,
#              test_offload_cuda;
#              racecheck, synccheck, initcheck (GEMMs on the own kernel:
#              ZO_CUDA_GEMM=tiled) of test_gpu_parity
#   13b        scripts/gpu_13b.py: LLaMA-2-13B QLoRA (train --profile: the op
#              table in 13b.log, the five longest ops in a row), then full
#              fine-tuning with 8-bit AdamW state (no disk share), then with
#              32-bit state (over GPU, CPU and disk), then the full plan
#              under the other optimizer schedules (ZO_13B_RUNS)
#   torch      bench/torch_side_by_side.py: train --device cuda against PyTorch
#              (ZO_ATTENTION=tune as the bench step's)
#   schedules  scripts/gpu_schedules.py: a 1.3B LLaMA's step under the optimizer
#              schedules serial, overlap and dpu against memplan's
#   offload    bench_offload --device cuda (1.3B GPT, streamed / resident step,
#              goal <= 1.10) and bench_lora --device cuda (full, LoRA, QLoRA)
# No GPU needed:
#   deps       only unpack .carry/ into the build's deps/
#   plan13b    the 13B plans (full and QLoRA) for a described machine, checked
#              against the 13B model by `train --check-plan`, each placement and
#              method planned for a tiny model and run by `train --plan` on the
#              CPU backend, the tiny full plan under each optimizer schedule, and
#              gpu_schedules.py on the tiny model (ZO_13B_* describe the machine;
#              the build is ./build unless ZO_GPUCHECK_BUILD names one)
#   summary    print the table of the rows in the results folder
#
# Results go to $OUT when it is set, else to build-gpu/gpucheck/results, all
# of them written as they come so that a command stopped at its limit leaves
# what it measured: rows.tsv (step, check, ok/FAIL/skip/info, figure, goal:
# one row per check, appended when it is made), summary.txt (the table,
# rewritten after every step), env.txt, one log per step (build.log,
# test.log, sanitize.log for memcheck and sanitize, bench.log, 13b.log,
# torch.log, schedules.log, offload.log) and artifacts.tar.gz (plans, stats,
# the hardware profile; after each step that makes them). At most 8 files an
# invocation, none in a folder; a log is cut to its first 2 and last 12 MiB.
# Steps named together that would leave more than 8 files keep the running
# step's log only and pack the finished steps' logs into logs.tar.gz.
# The summary table is printed last.
#
# Time: each command ends by ZO_GPUCHECK_DEADLINE seconds (default 570, for
# the device tool's 600). A step is given what is left less the least the
# later steps of the command need (run1: 150 s after the test step for
# memcheck and bench, 90 s after memcheck for bench; the build keeps only the
# next step's), and at most its cap; a step not started for lack of time is
# a FAIL row (a skip row for a "while time is left" step).
#
# Without a GPU the GPU commands fail at once with one line and exit 2,
# writing nothing. Exit 1 when a check failed, 0 when all passed.
#
# Environment: ZO_GPUCHECK_BUILD (build folder, default build-gpu),
# ZO_GPUCHECK_JOBS (default nproc), ZO_GPUCHECK_DEADLINE,
# ZO_GPUCHECK_PYTHON (default python3), ZO_GPUCHECK_PCIE_GBS (the pinned
# host->device GB/s run1's bench measured, for run2's and run3's plans; on a
# warm machine the bench step's figure is kept), ZO_NVME_DIR (the NVMe tier's
# folder; default the emptiest disk file system of the build folder's, /tmp
# and /var/tmp, never a tmpfs), ZO_13B_* (scripts/gpu_13b.py --help;
# ZO_13B_RUNS, default qlora,full8,full,schedules), ZO_TORCH_MODELS,
# ZO_TORCH_CONTENDERS (bench/torch_side_by_side.py --contenders; e.g. with
# ours-resident-g16, the attention backward at PyTorch's precision).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
B=${ZO_GPUCHECK_BUILD:-build-gpu}
case "$B" in /*) ;; *) B=$ROOT/$B ;; esac
STATE=$B/gpucheck
JOBS=${ZO_GPUCHECK_JOBS:-$(nproc 2>/dev/null || echo 4)}
DEADLINE=${ZO_GPUCHECK_DEADLINE:-570}
PY=${ZO_GPUCHECK_PYTHON:-python3}
MARGIN=20 # seconds kept for the summary and the archive
GPU_TESTS=(test_gpu_parity test_gpu_parity_model test_offload_cuda test_comm_nccl test_ops test_cuda_module)
GPU_STEPS=(env build test memcheck bench sanitize 13b torch schedules offload)
T0=$SECONDS

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

die() { # one line, then exit
  echo "gpu-check: $2" >&2
  exit "$1"
}

# ---- arguments: the steps of this command, in order ---------------------------
# A step marked optional (run1's sanitize, run3's offload) runs while time is
# left and is a skip row, not a FAIL, when there is none.
steps=()
optional=()
add_step() { # STEP [optional]
  local s
  for s in "${steps[@]}"; do [ "$s" = "$1" ] && return; done
  steps+=("$1")
  [ "${2:-}" = optional ] && optional+=("$1")
}
is_optional() { printf '%s\n' "${optional[@]}" | grep -qx "$1"; }
[ $# -gt 0 ] || die 2 "name an invocation (run1, run2, run3), steps or a no-GPU phase (deps, plan13b, summary); --help"
for a in "$@"; do
  case "$a" in
    -h|--help|help) usage; exit 0 ;;
    run1) add_step env; add_step build; add_step test; add_step memcheck; add_step bench; add_step sanitize optional ;;
    run2) add_step env; add_step build; add_step 13b ;;
    run3) add_step env; add_step build; add_step torch; add_step schedules; add_step offload optional ;;
    env|build|test|memcheck|bench|sanitize|13b|torch|schedules|offload|deps|plan13b|summary) add_step "$a" ;;
    *) die 2 "unknown invocation or step '$a' (run1 run2 run3; steps: ${GPU_STEPS[*]}; deps plan13b summary; --help)" ;;
  esac
done

gpu_steps=()
for s in "${steps[@]}"; do
  case "$s" in deps|plan13b|summary) ;; *) gpu_steps+=("$s") ;; esac
done
if [ ${#gpu_steps[@]} -gt 0 ]; then # every GPU command starts with env and build
  rest=("${steps[@]}")
  steps=()
  add_step env
  add_step build
  for s in "${rest[@]}"; do add_step "$s"; done
fi

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
if [ ${#gpu_steps[@]} -gt 0 ]; then
  n=$(gpu_count)
  if [ "${n:-0}" -lt 1 ]; then
    if find_smi >/dev/null; then why="nvidia-smi lists no GPU"; else why="no nvidia-smi, and no CUDA device through $PY's torch"; fi
    die 2 "no NVIDIA GPU on this machine ($why): 'gpu-check.sh $*' needs one; run it on a GPU machine (docs/gpu-cuda.md), or 'deps', 'plan13b' here"
  fi
fi

# ---- the results folder, rows, time -------------------------------------------
RES=${OUT:-$STATE/results}
ROWS=$RES/rows.tsv
mkdir -p "$STATE" "$RES"
RES=$(cd "$RES" && pwd)
ROWS=$RES/rows.tsv
# a command's results are its own: the rows and logs of its steps start empty
# (the device tool's $OUT is empty anyway; the local results folder is not)
if [ "${steps[*]}" != summary ]; then
  : > "$ROWS"
  rm -f "$RES/summary.txt" "$RES/artifacts.tar.gz"
  for s in "${steps[@]}"; do
    case "$s" in summary) ;; env) rm -f "$RES/env.txt" ;; memcheck|sanitize) rm -f "$RES/sanitize.log" ;; *) rm -f "$RES/$s.log" ;; esac
  done
fi

left() { echo $((DEADLINE - (SECONDS - T0))); }

# row STEP CHECK STATUS FIGURE GOAL: one line of the summary (STATUS: ok, FAIL, skip, info)
row() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5:-}" >> "$ROWS"
}

logname() { # the log file a step writes
  case "$1" in
    memcheck|sanitize) echo sanitize.log ;;
    env) echo env.txt ;;
    *) echo "$1.log" ;;
  esac
}

# STEP_END: when the running step must be done (SECONDS). run_step STEP LIMIT
# CMD...: CMD's output goes to the step's log; returns its status (124:
# stopped at its limit, or not started: too little time left in the step).
STEP_END=$((T0 + DEADLINE))
step_left() { echo $((STEP_END - SECONDS)); }
run_step() {
  local step=$1 limit=$2 l
  shift 2
  l=$(step_left)
  [ "$l" -lt "$limit" ] && limit=$l
  if [ "$limit" -lt 10 ]; then
    echo "## not started (time): $*" >> "$RES/$(logname "$step")"
    return 124
  fi
  echo "## $(date +%T) ($limit s at most): $*" >> "$RES/$(logname "$step")"
  timeout -k 10 "$limit" "$@" >> "$RES/$(logname "$step")" 2>&1
}

say() { echo "gpu-check: $*"; }

# At most 8 files come back from the device tool's $OUT. A command whose steps
# would leave more (steps of several invocations named together: env.txt,
# rows.tsv, summary.txt, artifacts.tar.gz and a log a step) keeps only the
# running step's log in the results folder and packs every finished step's
# log into logs.tar.gz (logs/NAME.log) after the step: a command stopped at
# its limit loses nothing but what the device tool never sends.
PACK_LOGS=0
if [ "${steps[*]}" != summary ]; then
  declare -A log_seen=()
  for s in "${steps[@]}"; do
    case "$s" in env|summary) ;; *) log_seen[$(logname "$s")]=1 ;; esac
  done
  if [ $((4 + ${#log_seen[@]})) -gt 8 ]; then
    PACK_LOGS=1
    say "$((4 + ${#log_seen[@]})) files would come back, more than 8: the finished steps' logs go into logs.tar.gz"
  fi
  rm -rf "$STATE/logs" "$RES/logs.tar.gz"
fi

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

deps_rows() { # STEP: unpack, one row; 0 ok
  unpack_deps
  case $? in
    0) row "$1" "unpack .carry into the build's deps/" ok "$(ls "$ROOT"/.carry/*.deb | wc -l) packages" ;;
    1) row "$1" "unpack .carry" info "no .carry/*.deb (bash scripts/gpu-carry.sh makes it): the machine's own packages" ;;
    *) row "$1" "unpack .carry" FAIL "dpkg -x / ar failed"; return 1 ;;
  esac
  export_env
}

step_deps() { deps_rows deps; }

# ---- env ------------------------------------------------------------------------
meminfo_gib() { # FIELD: /proc/meminfo's FIELD in GiB
  awk -v f="$1:" '$1 == f {printf "%.1f", $2 / 1048576}' /proc/meminfo
}

cuda_info() { # the CUDA runtime's view (scripts/cuda_info.c, built with nvcc into the state folder)
  local bin=$STATE/cuda_info nvcc
  if [ ! -x "$bin" ] || [ "$ROOT/scripts/cuda_info.c" -nt "$bin" ]; then
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    timeout 60 "$nvcc" -O2 -o "$bin" "$ROOT/scripts/cuda_info.c" >> "$RES/env.txt" 2>&1 || return 2
  fi
  timeout 60 "$bin"
}

step_env() {
  local smi f=$RES/env.txt q="" info
  echo "== $(date -u +%FT%TZ) $(uname -srm); $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")" >> "$f"
  if smi=$(find_smi); then
    {
      echo "== nvidia-smi"
      timeout 30 "$smi"
      echo "== nvidia-smi --query-gpu"
      timeout 30 "$smi" --query-gpu=index,name,driver_version,memory.total,memory.used,memory.free,pcie.link.gen.max,pcie.link.width.max,power.limit,clocks.max.sm --format=csv ||
        timeout 30 "$smi" --query-gpu=index,name,driver_version,memory.total,memory.free --format=csv
    } >> "$f" 2>&1
    q=$(timeout 30 "$smi" --query-gpu=name,driver_version,memory.total,memory.free --format=csv,noheader 2>/dev/null | head -1)
  fi
  row env "GPU (nvidia-smi: name, driver, memory total, free)" info "${q:-no answer (no nvidia-smi?)}"
  echo "== the CUDA runtime (scripts/cuda_info.c)" >> "$f"
  info=$(cuda_info 2>&1)
  local rc=$?
  echo "$info" >> "$f"
  if [ $rc = 0 ]; then
    row env "GPU (CUDA runtime)" ok "$(echo "$info" | grep -m1 '^cuda device 0:' | sed 's/^cuda device 0: //'); $(echo "$info" | head -1 | sed 's/^cuda: //')"
  else
    row env "GPU (CUDA runtime)" FAIL "$(echo "$info" | tail -1)" "a device"
  fi
  {
    echo "== /proc/meminfo"
    head -n 8 /proc/meminfo
    grep -E '^(HugePages_Total|Hugepagesize)' /proc/meminfo
    echo "== CPU: $(nproc) online; $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
    echo "== ulimit -l (locked memory, KiB): $(ulimit -l); ulimit -n: $(ulimit -n)"
    echo "== disks"
    df -hT "$ROOT" /tmp /var/tmp 2>/dev/null
    echo "== tools"
    cmake --version | head -1
    "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" --version | tail -2
    cc --version | head -1
    command -v ninja >/dev/null && echo "ninja $(ninja --version)"
    local cs
    cs=$(find_sanitizer) && timeout 30 "$cs" --version | head -2
    "$PY" --version
  } >> "$f" 2>&1
  row env "host" info "MemTotal $(meminfo_gib MemTotal) GiB, MemAvailable $(meminfo_gib MemAvailable) GiB, $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
  if printf '%s\n' "${steps[@]}" | grep -qx torch; then # torch's own view, where it is used
    echo "== torch" >> "$f"
    timeout 60 "$PY" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0))' >> "$f" 2>&1
  fi
  return 0
}

# ---- build ----------------------------------------------------------------------
# The targets each step needs (the CUDA module zo_cuda always; train comes
# with test_offload_cuda and test_cuda_module, which depend on it).
targets_of() {
  case "$1" in
    test) echo test_gpu_parity test_gpu_parity_model test_offload_cuda test_comm test_ops test_cuda_module ;;
    memcheck) echo test_gpu_parity ;;
    sanitize) echo test_gpu_parity test_gpu_parity_model test_offload_cuda test_ops ;;
    bench) echo bench_gpu_cuda ;;
    13b|torch|schedules) echo train memplan ;;
    offload) echo bench_offload bench_lora ;;
  esac
}

cuda_args=(-DCMAKE_BUILD_TYPE=Release -DZO_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)

# NCCL: the toolkit's (features.cmake looks there); where the toolkit has none,
# the one of the Python wheels (nvidia-nccl-cu13 and the like, which PyTorch
# installs: nccl.h and libnccl.so.2 somewhere under the nvidia package).
NCCL_ARGS=()
NCCL_FROM=""
nccl_args() {
  local nvcc cu inc d h lib
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  cu=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
  for inc in "$cu/include" "$cu/targets/x86_64-linux/include" /usr/include; do
    [ -f "$inc/nccl.h" ] && { NCCL_FROM="the toolkit ($inc)"; return 0; }
  done
  for d in $(timeout 60 "$PY" -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null); do
    h=$(find "$d" -maxdepth 4 -name nccl.h 2>/dev/null | head -1)
    [ -n "$h" ] || continue
    lib=$(find "$(dirname "$(dirname "$h")")" -maxdepth 3 -name 'libnccl.so*' 2>/dev/null | sort | head -1)
    [ -n "$lib" ] || continue
    NCCL_ARGS=(-DNCCL_INCLUDE_DIR="$(dirname "$h")" -DNCCL_LIBRARY="$lib")
    NCCL_FROM="the Python wheel ($(dirname "$(dirname "$h")"))"
    return 0
  done
}

step_build() {
  local t=$SECONDS log=$RES/build.log targets=(zo_cuda) s x
  deps_rows build || true
  for s in "${steps[@]}"; do
    for x in $(targets_of "$s"); do
      printf '%s\n' "${targets[@]}" | grep -qx "$x" || targets+=("$x")
    done
  done
  if [ -f "$B/CMakeCache.txt" ]; then
    row build "configure" info "configured earlier (a warm machine kept $(basename "$B")/)"
  else
    local gen=() dp=()
    command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
    [ -d "$DEPS/usr" ] && dp=(-DZO_DEPS_PREFIX="$DEPS")
    nccl_args
    if ! run_step build 240 cmake -S . -B "$B" "${gen[@]}" "${cuda_args[@]}" "${dp[@]}" "${NCCL_ARGS[@]}"; then
      row build configure FAIL "cmake failed (build.log)"
      rm -f "$B/CMakeCache.txt" # configure again next time
      return 1
    fi
    local cuda nccl
    cuda=$(grep -m1 -o 'feature: CUDA backend: .*' "$log" | sed 's/feature: CUDA backend: //')
    nccl=$(grep -m1 -o 'feature: NCCL comm backend: .*' "$log" | sed 's/feature: NCCL comm backend: //')
    row build "configure (CUDA sm_90, Release$([ ${#gen[@]} -gt 0 ] && echo ', Ninja'))" ok \
      "$((SECONDS - t)) s; CUDA ${cuda:-?}; NCCL ${nccl:-?}${NCCL_FROM:+ from $NCCL_FROM}"
  fi
  local t1=$SECONDS keep=()
  # go on past a failed target: what did build still runs
  if grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja' "$B/CMakeCache.txt"; then keep=(-- -k 0); else keep=(-- -k); fi
  run_step build 540 cmake --build "$B" -j"$JOBS" --target "${targets[@]}" "${keep[@]}"
  local rc=$?
  if [ $rc = 0 ]; then
    row build "build ${#targets[@]} targets, -j$JOBS" ok "$((SECONDS - t1)) s: ${targets[*]}"
  else
    local why
    why=$(grep -m1 -E 'error:|FAILED:' "$log" | cut -c1-150)
    row build "build ${#targets[@]} targets, -j$JOBS" FAIL "$((SECONDS - t1)) s, $([ $rc = 124 ] && echo 'out of time' || echo "exit $rc"): ${why:-see build.log}"
    return 1
  fi
}

have() { # BIN (relative to the build): built?
  [ -x "$B/$1" ]
}

# ---- test -------------------------------------------------------------------------
# ctest runs from a folder of its own that includes the build's tests, so
# that its LastTest.log is this step's and a ctest already running in the
# build folder (the fake-GPU test of the script) keeps its own.
ctest_log() { # ctest's log of the step (LastTest.log.tmp where ctest was stopped before renaming it)
  local d=$STATE/ctest/Testing/Temporary
  if [ -f "$d/LastTest.log" ]; then echo "$d/LastTest.log"; else echo "$d/LastTest.log.tmp"; fi
}

test_output() { # NAME: the test's output in ctest's log
  awk -v n="$1" '$0 ~ "^[0-9]+/[0-9]+ Testing: "n"$" {on=1; next}
                 on && /^Output:/ {getline; out=1; next}
                 on && out && /^<end of output>/ {exit}
                 on && out {print}' "$(ctest_log)" 2>/dev/null
}

step_test() {
  local log=$RES/test.log t=$SECONDS re
  mkdir -p "$STATE/ctest"
  rm -rf "$STATE/ctest/Testing"
  printf 'subdirs("%s")\n' "$B" > "$STATE/ctest/CTestTestfile.cmake"
  re="^($(IFS='|'; echo "${GPU_TESTS[*]}"))\$"
  # test_ops on the CPU backend and the device only: its host-shim backends
  # (the same kernels on the host, which CI runs) took 90 of its 100 s here
  (cd "$STATE/ctest" && ZO_OPS_BACKENDS=cpu,cuda run_step test 300 ctest -R "$re" --output-on-failure)
  local rc=$?
  { echo "## ctest's LastTest.log (every test's output)"; cat "$(ctest_log)"; } >> "$log" 2>/dev/null
  local name line status secs reason out bad=0
  for name in "${GPU_TESTS[@]}"; do
    line=$(grep -E "Test +#[0-9]+: $name \.+" "$log" | tail -1)
    status=$(echo "$line" | sed -E 's/.*: [^ ]+ \.+ *(\*\*\*)?([A-Za-z]+( Run)?).*/\2/')
    secs=$(echo "$line" | grep -oE '[0-9.]+ sec' | tail -1)
    out=$(test_output "$name")
    reason=$(echo "$out" | grep -i skip | tail -1)
    [ -n "$reason" ] || reason=$(echo "$out" | grep -v '^ *$' | tail -1)
    reason=$(echo "$reason" | sed 's/^ *//' | cut -c1-150)
    if [ -z "$line" ]; then
      if [ $rc = 124 ]; then
        row test "$name" FAIL "not run: ctest stopped at its limit after $((SECONDS - t)) s" "passes on the GPU"
      elif [ "$name" = test_comm_nccl ]; then
        row test "$name" FAIL "not registered: NCCL not found at configure ($(grep -m1 -o 'NCCL comm backend: .*' "$RES/build.log" 2>/dev/null || echo 'see build.log'))" "passes on the GPU"
      else
        row test "$name" FAIL "not registered or not built (build.log)" "passes on the GPU"
      fi
      bad=1
    elif [ "$status" = Passed ]; then
      if [ "$name" = test_ops ] && ! ops_cuda_line "$out"; then
        bad=1
      else
        row test "$name" ok "passed ($secs)"
      fi
    elif [ "$status" = Skipped ] || [ "$status" = "Not Run" ]; then
      row test "$name" FAIL "skipped: ${reason:-no reason given}" "runs on the GPU"; bad=1
    else
      # test_ops: its cuda line says how many cases failed there
      [ "$name" = test_ops ] && [ -n "$(echo "$out" | awk '$1 == "backend" && $2 == "cuda"')" ] &&
        reason="$(echo "$out" | awk '$1 == "backend" && $2 == "cuda" {$1 = $1; print}' | tail -1); $reason"
      row test "$name" FAIL "${status:-?} ($secs): ${reason:-see test.log}" "passes on the GPU"; bad=1
    fi
  done
  ops_attention_paths || bad=1
  tf32_model_row
  return $bad
}

# test_ops' attention again with the fused kernels forced (ZO_ATTENTION=mma,
# the automatic choice's first wherever it covers a shape, whose passing row
# lets the bench and torch steps tune; then tc, which the automatic choice
# takes only for ALiBi; the shapes they do not cover fall back to it), the
# CUDA backend against the double loops: a row each
# from its `backend cuda N runs, M failed` line. ZO_OPS_FILTER (default
# attention) narrows the ops. Returns 1 when one failed.
ops_attention_paths() {
  local p from l n f bad=0 log=$RES/test.log
  for p in mma tc; do
    from=$(($(stat -c %s "$log" 2>/dev/null || echo 0) + 1))
    run_step test 150 env ZO_ATTENTION=$p ZO_OPS_FILTER="${ZO_OPS_FILTER:-attention}" ZO_OPS_BACKENDS=cpu,cuda \
      "$B/gpu/test_ops"
    l=$(tail -c +"$from" "$log" | awk '$1 == "backend" && $2 == "cuda"' | tail -1)
    n=$(echo "$l" | awk '{print $3}')
    f=$(echo "$l" | awk '{print $5}')
    if [ -z "$l" ]; then
      row test "test_ops attention, ZO_ATTENTION=$p" FAIL "no 'backend cuda ... runs' line (test.log)" "backend cuda N runs, 0 failed"
      bad=1
    elif [ "${n:-0}" -gt 0 ] && [ "$f" = 0 ]; then
      row test "test_ops attention, ZO_ATTENTION=$p" ok "backend cuda $n runs, 0 failed"
    else
      row test "test_ops attention, ZO_ATTENTION=$p" FAIL "backend cuda $n runs, $f failed (test.log)" "backend cuda N runs, 0 failed"
      bad=1
    fi
  done
  return $bad
}

# test_gpu_parity_model's fp32 lines ("<model> fp32 on cuda: ... the largest
# difference X of its bound, ..."): one info row with each model's X, the
# room the TF32 error model left on this device (docs/testing.md, "fp32
# against TF32"). No row when the test printed none (it did not run).
tf32_model_row() {
  local fr
  fr=$(test_output test_gpu_parity_model |
       awk '$2 == "fp32" && $3 == "on" && $4 == "cuda:" {
              for (i = 5; i < NF; i++) if ($i == "difference") v = $(i + 1)
              printf "%s%s %s", sep, $1, v; sep = ", "}')
  [ -z "$fr" ] || row test "test_gpu_parity_model fp32: difference / TF32-model bound" info "$fr" "below 1 (0.63 at most on the CPU proxy)"
}

# test_ops's own line for the CUDA backend: "backend cuda N runs, M failed",
# present (it runs where a GPU is) and M = 0. A row either way; 0 when good.
ops_cuda_line() {
  local l n f
  l=$(echo "$1" | awk '$1 == "backend" && $2 == "cuda"' | tail -1)
  if [ -z "$l" ]; then
    row test test_ops FAIL "passed, but no 'backend cuda ... runs' line: the CUDA backend did not run" "backend cuda N runs, 0 failed"
    return 1
  fi
  n=$(echo "$l" | awk '{print $3}')
  f=$(echo "$l" | awk '{print $5}')
  if [ "${n:-0}" -gt 0 ] && [ "$f" = 0 ]; then
    row test test_ops ok "passed; backend cuda $n runs, 0 failed"
    return 0
  fi
  row test test_ops FAIL "backend cuda $n runs, $f failed" "backend cuda N runs, 0 failed"
  return 1
}

# ---- memcheck, sanitize ----------------------------------------------------------------
find_sanitizer() {
  local c
  for c in compute-sanitizer /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    if command -v "$c" >/dev/null 2>&1; then echo "$c"; return 0; fi
  done
  return 1
}

# sanitize_one STEP TOOL BIN LIMIT OPTIONAL [ENV]: one compute-sanitizer run, one row; 0 when
# clean. ENV (NAME=VALUE) is set for the run and named in the row.
sanitize_one() {
  local step=$1 tool=$2 bin=$3 limit=$4 opt=$5 env=${6:-} cs extra=() rc errs t=$SECONDS name
  name="$tool $(basename "$bin")${env:+ ($env)}"
  if ! cs=$(find_sanitizer); then
    row "$step" "$name" FAIL "compute-sanitizer not found on PATH or under /usr/local/cuda"
    return 1
  fi
  if ! have "$bin"; then
    row "$step" "$name" FAIL "$bin not built (build.log)"
    return 1
  fi
  [ "$tool" = memcheck ] && extra=(--leak-check full)
  [ "$tool" = racecheck ] && extra=(--racecheck-report all)
  # test_offload_cuda also runs `train --device cuda` as a child process
  [ "$bin" = offload/test_offload_cuda ] && extra+=(--target-processes all)
  local from
  from=$(($(stat -c %s "$RES/sanitize.log" 2>/dev/null || echo 0) + 1))
  (cd "$B/$(dirname "$bin")" && { [ -z "$env" ] || export "${env?}"; } &&
     run_step "$step" "$limit" "$cs" --error-exitcode 1 --tool "$tool" "${extra[@]}" "./$(basename "$bin")")
  rc=$?
  # this run's own count (the log holds the earlier runs too)
  errs=$(tail -c +"$from" "$RES/sanitize.log" | grep -o 'ERROR SUMMARY: [0-9]* error' | tail -1 | grep -o '[0-9]*')
  # the run's last line, for a failure's reason ("Device not supported", a test's message),
  # and the reports it made (each starts "========= Invalid ...", "Leaked ...", "Program hit ...")
  local last reports
  last=$(tail -c +"$from" "$RES/sanitize.log" | grep -v -e '^ *$' -e 'ERROR SUMMARY' | tail -1 | sed 's/^=* *//' | cut -c1-120)
  reports=$(tail -c +"$from" "$RES/sanitize.log" | grep -E '^========= [A-Z]' |
            grep -cv -e 'COMPUTE-SANITIZER' -e 'ERROR SUMMARY' -e 'Target application returned')
  if [ $rc = 0 ]; then
    row "$step" "$name" ok "${errs:-0} errors ($((SECONDS - t)) s)" "0 errors"
  elif [ $rc = 124 ] && [ "$opt" = optional ] && [ "$reports" = 0 ]; then
    row "$step" "$name" skip "not finished in the time left ($((SECONDS - t)) s), no report so far"
    return 0
  elif [ $rc = 124 ]; then
    row "$step" "$name" FAIL "not finished in its $((SECONDS - t)) s; $reports reports so far (sanitize.log)" "0 errors"
  else
    row "$step" "$name" FAIL "exit $rc, ${errs:-?} errors ($((SECONDS - t)) s)$([ $rc = 77 ] && echo ', the test skipped'): $last" "0 errors"
  fi
  [ $rc = 0 ]
}

step_memcheck() { sanitize_one memcheck memcheck gpu/test_gpu_parity 600 required; }

# The other tools and binaries, each while the step's time lasts: test_ops
# first (every op on a grid of shapes that crosses the kernels' boundaries).
# initcheck runs with every GEMM on the project's own kernel (ZO_CUDA_GEMM=
# tiled): on the H200 it reported each read of a cuBLASLt GEMM's output as
# uninitialized (262,144 reports, one per element of the GEMM's C, while the
# values were right), since it does not see those kernels' writes.
step_sanitize() {
  local bad=0 job tool bin env opt=required
  is_optional sanitize && opt=optional
  for job in "memcheck gpu/test_ops ZO_OPS_BACKENDS=cpu,cuda" "memcheck gpu/test_gpu_parity_model" "memcheck offload/test_offload_cuda" \
             "racecheck gpu/test_gpu_parity" "synccheck gpu/test_gpu_parity" \
             "initcheck gpu/test_gpu_parity ZO_CUDA_GEMM=tiled"; do
    read -r tool bin env <<< "$job"
    if [ "$(step_left)" -lt 20 ]; then
      row sanitize "$tool $(basename "$bin")" "$([ $opt = optional ] && echo skip || echo FAIL)" "not started: no time left"
      [ $opt = optional ] || bad=1
      continue
    fi
    sanitize_one sanitize "$tool" "$bin" 600 "$opt" "$env" || bad=1
  done
  return $bad
}

# ---- bench ---------------------------------------------------------------------------
# the step's output (since its last '## ' header for PROG) into FILE
last_output() { # LOG PROG FILE
  awk -v p="$2" '$0 ~ "^## .*"p {buf=""} {buf = buf $0 "\n"} END {printf "%s", buf}' "$1" > "$3"
}

# ZO_ATTENTION of the bench and torch steps: tune (the backend times every
# attention path that covers a shape on its first call and keeps the
# fastest; ZO_ATTENTION_LOG=1 puts one line a shape in the step's log) once
# this invocation's test step passed test_ops with the mma.sync kernels
# forced (tuning may choose them), else the automatic rule. attn_env STEP:
# ATTN_ENV (env's arguments) and an info row saying which.
attn_env() {
  ATTN_ENV=()
  if awk -F'\t' '$1 == "test" && $2 == "test_ops attention, ZO_ATTENTION=mma" && $3 == "ok" {f = 1} END {exit !f}' "$ROWS"; then
    ATTN_ENV=(ZO_ATTENTION=tune ZO_ATTENTION_LOG=1)
    row "$1" "attention path" info "ZO_ATTENTION=tune (test_ops passed with mma forced; choices in $(logname "$1"))"
  else
    row "$1" "attention path" info "the automatic rule (no passing forced-mma test_ops row in this invocation)"
  fi
}

step_bench() {
  local out=$STATE/bench_gpu_cuda.txt rc
  have bench/bench_gpu_cuda || { row bench bench_gpu_cuda FAIL "not built (build.log)"; return 1; }
  attn_env bench
  run_step bench 300 env "${ATTN_ENV[@]}" "$B/bench/bench_gpu_cuda"
  rc=$?
  last_output "$RES/bench.log" bench_gpu_cuda "$out"
  local r h2d d2h bad=0
  if [ $rc != 0 ]; then
    row bench "bench_gpu_cuda" FAIL "exit $rc$([ $rc = 124 ] && echo ': out of time')"
    # a run that still printed its last line (the GEMMs' ratio: the router's
    # rows failed after it) keeps the rows of what it measured
    tail -1 "$out" | grep -q '^gpu_gemm / best cuBLASLt' || return 1
    bad=1
  fi
  r=$(tail -1 "$out" | sed 's/.*: //')
  if awk -v r="$r" 'BEGIN {exit !(r + 0 >= 0.9)}'; then
    row bench "bench_gpu_cuda: gpu_gemm / best cuBLASLt (geo. mean)" ok "$r" ">= 0.9"
  else
    row bench "bench_gpu_cuda: gpu_gemm / best cuBLASLt (geo. mean)" FAIL "${r:-?}" ">= 0.9"; bad=1
  fi
  h2d=$(awk '$1 == "h2d" && $2 == "pinned" {print $3}' "$out" | tail -1)
  d2h=$(awk '$1 == "d2h" && $2 == "pinned" {print $3}' "$out" | tail -1)
  [ -n "$h2d" ] && echo "$h2d" > "$STATE/pcie_h2d_gbs"
  row bench "bench_gpu_cuda: pinned copies" info "h2d ${h2d:-?} GB/s, d2h ${d2h:-?} GB/s (ZO_GPUCHECK_PCIE_GBS=${h2d:-?} for run2, run3)"
  # each row's shape: t, and past the 13B layer's heads (columns 13-16) the
  # query heads, head dim, kv heads, window and soft cap
  local shape='function shape() { s = "t=" $3; if ($13 != "" && ($4 != 40 || $13 != 128 || $14 != 40 || $15 != 0 || $16 != 0)) s = s " hq=" $4 " d=" $13 " hkv=" $14 " window=" $15 " cap=" $16; return s }'
  row bench "bench_gpu_cuda: attention (bf16, causal)" info "$(awk "$shape"' $1 == "causal" {printf "%s%s fwd %s TF/s bwd %s TF/s", sep, shape(), $6, $8; sep = "; "}' "$out")"
  # the GEMM path (tensor cores), its speedup over the flash kernel in the same run,
  # and its backward with fp32 gradients (the transformer's call)
  row bench "bench_gpu_cuda: attention GEMM path / flash kernel" info "$(awk "$shape"' $1 == "causal_gemm" {printf "%s%s fwd %s TF/s (%sx) bwd %s TF/s (%sx), fp32 grads %s TF/s", sep, shape(), $6, $9, $8, $10, $12; sep = "; "}' "$out")"
  # the fused tensor-core kernels (ZO_ATTENTION=tc), the same columns
  row bench "bench_gpu_cuda: attention tensor-core kernels / flash kernel" info "$(awk "$shape"' $1 == "causal_tc" {printf "%s%s fwd %s TF/s (%sx) bwd %s TF/s (%sx), fp32 grads %s TF/s", sep, shape(), $6, $9, $8, $10, $12; sep = "; "}' "$out")"
  # the mma.sync kernels (ZO_ATTENTION=mma), the same columns
  row bench "bench_gpu_cuda: attention mma.sync kernels / flash kernel" info "$(awk "$shape"' $1 == "causal_mma" {printf "%s%s fwd %s TF/s (%sx) bwd %s TF/s (%sx), fp32 grads %s TF/s", sep, shape(), $6, $9, $8, $10, $12; sep = "; "}' "$out")"
  # their backward with grads16 (FlashAttention-2's precision, ZO_ATTENTION_GRADS=16bit)
  row bench "bench_gpu_cuda: attention mma.sync backward, grads16" info "$(awk "$shape"' $1 == "causal_mma16" {printf "%s%s bwd %s TF/s (%sx), fp32 grads %s TF/s", sep, shape(), $8, $10, $12; sep = "; "}' "$out")"
  # the MoE router (forward with its statistics, backward) at 4096 tokens,
  # each over a device copy of its logits in the same rounds
  row bench "bench_gpu_cuda: MoE router, 4096 tokens (x a copy of the logits)" info "$(awk '$1 ~ /^(mixtral|qwen3_moe|deepseek_v3|qwen3_next)$/ && NF == 9 {printf "%s%s e=%s k=%s fwd %s ms (%sx) bwd %s ms (%sx)", sep, $1, $3, $4, $5, $8, $6, $9; sep = "; "}' "$out")"
  # the tuned choice (ZO_ATTENTION=tune), the same columns; what it chose: bench.log
  [ ${#ATTN_ENV[@]} -gt 0 ] &&
    row bench "bench_gpu_cuda: attention tuned choice / flash kernel" info "$(awk "$shape"' $1 == "causal_tune" {printf "%s%s fwd %s TF/s (%sx) bwd %s TF/s (%sx), fp32 grads %s TF/s", sep, shape(), $6, $9, $8, $10, $12; sep = "; "}' "$out")"
  return $bad
}

# PCIE: --pcie-gbs for the hardware profile gpu_schedules.py and gpu_13b.py plan
# with: ZO_GPUCHECK_PCIE_GBS, else the pinned host->device rate the bench step
# measured on this machine
pcie_args() {
  PCIE=()
  if [ -n "${ZO_GPUCHECK_PCIE_GBS:-}" ]; then
    PCIE=(--pcie-gbs "$ZO_GPUCHECK_PCIE_GBS")
  elif [ -f "$STATE/pcie_h2d_gbs" ]; then
    PCIE=(--pcie-gbs "$(cat "$STATE/pcie_h2d_gbs")")
  fi
  return 0
}

nvme_dir() { # ZO_NVME_DIR, else the emptiest disk (not tmpfs) of the build folder's, /tmp's, /var/tmp's
  if [ -n "${ZO_NVME_DIR:-}" ]; then echo "$ZO_NVME_DIR"; return; fi
  local best="" bestfree=0 d free
  for d in "$B" /tmp /var/tmp; do
    [ -d "$d" ] || continue
    case "$(stat -f -c %T "$d" 2>/dev/null)" in tmpfs|ramfs) continue ;; esac
    free=$(df -Pk "$d" 2>/dev/null | awk 'NR == 2 {print $4}')
    if [ "${free:-0}" -gt "$bestfree" ]; then best=$d; bestfree=$free; fi
  done
  echo "${best:-$B}/zo-nvme"
}

have_planning() { # STEP: train and memplan built, else a FAIL row
  have examples/train && have planner/memplan && return 0
  row "$1" "train and memplan" FAIL "not built (build.log)"
  return 1
}

# ---- 13b, torch, schedules, offload -----------------------------------------------
step_13b() {
  have_planning 13b || return 1
  pcie_args
  local l=$(($(step_left) - 10))
  PYTHONUNBUFFERED=1 run_step 13b "$l" "$PY" scripts/gpu_13b.py --train "$B/examples/train" \
    --memplan "$B/planner/memplan" --device cuda --workdir "$STATE/13b" --nvme-dir "$(nvme_dir)" \
    --hw-cache "$STATE/hw.json" --rows "$ROWS" --phase 13b --time-limit "$((l - 15))" \
    --runs "${ZO_13B_RUNS:-qlora,full8,full,schedules}" "${PCIE[@]}"
  local rc=$?
  [ $rc = 124 ] && row 13b "13B runs" FAIL "stopped at the step's limit"
  return $rc
}

step_torch() {
  attn_env torch
  have_planning torch || return 1
  local l=$(($(step_left) - 10))
  PYTHONUNBUFFERED=1 run_step torch "$l" env "${ATTN_ENV[@]}" "$PY" bench/torch_side_by_side.py \
    --train "$B/examples/train" --memplan "$B/planner/memplan" --device cuda \
    --workdir "$STATE/torch" --rows "$ROWS" --time-limit "$((l - 15))" \
    ${ZO_TORCH_CONTENDERS:+--contenders "$ZO_TORCH_CONTENDERS"}
  local rc=$?
  [ $rc = 124 ] && row torch "side by side" FAIL "stopped at the step's limit"
  return $rc
}

# the optimizer schedules on the 1.3B LLaMA, weights on the GPU, the optimizer
# on the CPU (issue 14); it calibrates the profile the 13b step reuses on a warm machine
step_schedules() {
  have_planning schedules || return 1
  pcie_args
  local l=$(($(step_left) - 10))
  PYTHONUNBUFFERED=1 run_step schedules "$l" "$PY" scripts/gpu_schedules.py --train "$B/examples/train" \
    --memplan "$B/planner/memplan" --device cuda --workdir "$STATE/schedules" --nvme-dir "$(nvme_dir)" \
    --hw-cache "$STATE/hw.json" --rows "$ROWS" --phase schedules --time-limit "$((l - 15))" "${PCIE[@]}"
  local rc=$?
  [ $rc = 124 ] && row schedules "gpu_schedules.py (1.3B)" FAIL "stopped at the step's limit"
  return $rc
}

step_offload() {
  local bad=0 out rc opt=FAIL
  is_optional offload && opt=skip
  # streaming overhead on a 1.3B GPT shape (GPT-3 XL: 24 x 2048, vocab 50257)
  out=$STATE/bench_offload.txt
  if ! have bench/bench_offload; then
    row offload bench_offload FAIL "not built (build.log)"; bad=1
  else
    run_step offload 360 "$B/bench/bench_offload" --device cuda --layers 24 --hidden 2048 --vocab 50257 \
      --batch 8 --seq 1024
    rc=$?
    last_output "$RES/offload.log" bench_offload "$out"
    if [ $rc = 0 ]; then
      local d r f
      for d in 1 2; do
        read -r r f < <(awk -v d="$d" '$0 ~ "^streamed, prefetch "d" " {print $(NF-1), $NF}' "$out")
        if [ -n "$r" ] && awk -v r="$r" 'BEGIN {exit !(r <= 1.10)}'; then
          row offload "bench_offload 1.3B: streamed prefetch $d / resident step" ok "$r (fwd+bwd $f)" "<= 1.10"
        else
          row offload "bench_offload 1.3B: streamed prefetch $d / resident step" FAIL "${r:-?} (fwd+bwd ${f:-?})" "<= 1.10"
          bad=1
        fi
      done
      row offload "bench_offload 1.3B: resident step" info "$(awk '/^resident / {print $2 " s, " $3 " tok/s"}' "$out")"
    elif [ $rc = 124 ]; then
      row offload "bench_offload --device cuda (1.3B)" "$opt" "not finished in the time left"
      [ $opt = skip ] || bad=1
    else
      row offload "bench_offload --device cuda (1.3B)" FAIL "exit $rc"; bad=1
    fi
  fi
  # full fine-tuning against LoRA and QLoRA (r 16, every linear layer) on a 1.3B LLaMA shape (issue 15)
  out=$STATE/bench_lora.txt
  if ! have bench/bench_lora; then
    row offload bench_lora FAIL "not built (build.log)"; return 1
  fi
  run_step offload 150 "$B/bench/bench_lora" --device cuda --layers 24 --hidden 2048 --seq 1024 --batch 4 --rounds 2
  rc=$?
  last_output "$RES/offload.log" bench_lora "$out"
  if [ $rc = 0 ]; then
    local k
    for k in lora qlora; do
      row offload "bench_lora 1.3B: $k step / full fine-tuning step" info \
        "$(awk -F': ' -v k="$k" '$1 == k " step / full fine-tuning step" {print $2}' "$out")$(
          awk -v k="$k" '$1 == k && $2 == "step" && $4 == "s" {print " (" $3 " s vs full " f " s)"} $1 == "full" {f = $4}' "$out")"
    done
  elif [ $rc = 124 ]; then
    row offload "bench_lora --device cuda (1.3B)" "$opt" "not finished in the time left"
    [ $opt = skip ] || bad=1
  else
    row offload "bench_lora --device cuda (1.3B)" FAIL "exit $rc"; bad=1
  fi
  return $bad
}

# ---- plan13b: no GPU. Here the build is ./build unless ZO_GPUCHECK_BUILD names one.
step_plan13b() {
  local bin=${ZO_GPUCHECK_BUILD:-build}
  if [ ! -x "$bin/planner/memplan" ] || [ ! -x "$bin/examples/train" ]; then
    row plan13b "memplan and train" FAIL "not built in $bin/ (cmake --build $bin)"
    return 1
  fi
  local rc=0 want
  "$PY" scripts/gpu_13b.py --train "$bin/examples/train" --memplan "$bin/planner/memplan" --device cpu \
    --workdir "$STATE/plan13b" --nvme-dir "$STATE/plan13b/nvme" --rows "$ROWS" \
    >> "$RES/plan13b.log" 2>&1 || rc=1
  "$PY" scripts/gpu_schedules.py --train "$bin/examples/train" --memplan "$bin/planner/memplan" --device cpu \
    --model tests/fixtures/gpu/tiny_llama.json --seq 16 --micro-batch 1 --label "tiny, CPU optimizer" \
    --workdir "$STATE/plan13b/schedules" --nvme-dir "$STATE/plan13b/nvme" --rows "$ROWS" \
    --phase plan13b >> "$RES/plan13b.log" 2>&1 || rc=1
  # what the GPU runs rest on, each checked here (a row missing is a check that did not run)
  for want in "train --check-plan (13B)" "train --plan ran it (tiny LLaMA, full, CPU backend)" \
              "train --check-plan (QLoRA 13B)" "train --plan ran it (tiny LLaMA, qlora, CPU backend)" \
              "train --check-plan (13B 8-bit AdamW)" "train --plan ran it (tiny LLaMA, full8, CPU backend)" \
              "tiny LLaMA, qlora: where the step goes (train --profile)" \
              "tiny LLaMA schedule overlap ran (CPU backend)" \
              "tiny, CPU optimizer schedule dpu ran (CPU backend)"; do
    grep -qF "$(printf 'plan13b\t%s\tok\t' "$want")" "$ROWS" ||
      { row plan13b "$want" FAIL "no ok row (see plan13b.log)"; rc=1; }
  done
  return $rc
}

# ---- summary, archive ----------------------------------------------------------------
print_summary() {
  [ -s "$ROWS" ] || { echo "gpu-check: no results recorded in $RES"; return; }
  local gpu
  gpu=$(awk -F'\t' '$1 == "env" && $2 == "GPU (CUDA runtime)" && $3 == "ok" {print $4; exit}' "$ROWS")
  [ -n "$gpu" ] || gpu=$(awk -F'\t' '$1 == "env" && $2 ~ /^GPU \(nvidia-smi/ {print $4; exit}' "$ROWS")
  echo
  echo "== gpu-check summary: ${steps[*]} ($(date -u +%FT%TZ), $((SECONDS - T0)) s; results: $RES)"
  [ -n "$gpu" ] && echo "   device: $gpu"
  awk -F'\t' '
    { p[NR]=$1; c[NR]=$2; s[NR]=$3; v[NR]=$4; g[NR]=$5; n[$3]++
      if (length($2) > wc) wc = length($2); if (wc > 58) wc = 58 }
    END { for (i = 1; i <= NR; i++)
            printf "%-9s %-" wc "s  %-4s  %s%s\n", p[i], substr(c[i], 1, 58), s[i], v[i],
                   (g[i] != "" ? "   [goal " g[i] "]" : "")
          printf "== %d ok, %d FAIL, %d skip, %d info\n", n["ok"], n["FAIL"], n["skip"], n["info"] }' "$ROWS"
}

# After each step: the summary so far, logs cut to size, the archive of the
# work folders of this command's steps (plans, stats, bench outputs; no token
# or NVMe files; not what an earlier command left on a warm machine).
checkpoint() {
  print_summary > "$RES/summary.txt"
  local f
  for f in "$RES"/*.log; do
    [ -f "$f" ] || continue
    if [ "$(stat -c %s "$f")" -gt $((15 << 20)) ]; then
      { head -c $((2 << 20)) "$f"; printf '\n[... cut ...]\n'; tail -c $((12 << 20)) "$f"; } > "$f.cut" && mv "$f.cut" "$f"
    fi
  done
  if [ "$PACK_LOGS" = 1 ]; then
    # a log leaves the results folder only once the archive holds it
    local packed=()
    mkdir -p "$STATE/logs"
    for f in "$RES"/*.log; do
      [ -f "$f" ] || continue
      cat "$f" >> "$STATE/logs/${f##*/}" && packed+=("$f")
    done
    if tar -czf "$RES/logs.tar.gz.new" -C "$STATE" logs && mv "$RES/logs.tar.gz.new" "$RES/logs.tar.gz"; then
      rm -f "${packed[@]}"
    else
      rm -f "$RES/logs.tar.gz.new"
      say "packing the logs into logs.tar.gz failed: the logs stay in $RES as they are"
      PACK_LOGS=0
    fi
  fi
  case "$1" in 13b|torch|schedules|offload) ;; *) return 0 ;; esac
  local have=() s
  for s in "${steps[@]}"; do
    case "$s" in
      13b|schedules) for f in "$s" hw.json; do [ -e "$STATE/$f" ] && have+=("$f"); done ;;
      torch) [ -e "$STATE/torch" ] && have+=(torch) ;;
      offload) for f in bench_offload.txt bench_lora.txt; do [ -e "$STATE/$f" ] && have+=("$f"); done ;;
    esac
  done
  [ ${#have[@]} -gt 0 ] && tar -czf "$RES/artifacts.tar.gz" -C "$STATE" --exclude='*.bin' \
    --exclude='nvme' --exclude='zo-nvme' --exclude='run' "${have[@]}" 2>/dev/null
  return 0
}

# ---- run ------------------------------------------------------------------------------
if [ "${steps[*]}" = summary ]; then
  print_summary
  grep -q $'\tFAIL\t' "$ROWS" 2>/dev/null && exit 1
  exit 0
fi

# How long a step may run: what is left less what the later required steps
# need at least, and at most its own cap; env (seconds) keeps nothing, the
# build, which they all wait for, only the next step's. min_s: the least
# time a step is worth.
min_s() {
  case "$1" in
    env) echo 10 ;; build) echo 60 ;; test) echo 60 ;; memcheck) echo 60 ;; bench) echo 90 ;;
    13b|torch) echo 120 ;; schedules) echo 120 ;; *) echo 20 ;;
  esac
}
cap_s() {
  case "$1" in
    env) echo 90 ;; build) echo 540 ;; test) echo 300 ;; memcheck) echo 300 ;; bench) echo 300 ;; schedules) echo 300 ;;
    *) echo 100000 ;;
  esac
}
reserve_after() { # INDEX: seconds the required steps after steps[INDEX] keep
  local i=$1 j sum=0
  [ "${steps[$i]}" = env ] && { echo 0; return; }
  for ((j = i + 1; j < ${#steps[@]}; j++)); do
    is_optional "${steps[$j]}" && continue
    sum=$((sum + $(min_s "${steps[$j]}")))
    [ "${steps[$i]}" = build ] && break
  done
  echo $sum
}

failed=0
for ((i = 0; i < ${#steps[@]}; i++)); do
  p=${steps[$i]}
  [ "$p" = summary ] && continue
  limit=$(($(left) - MARGIN - $(reserve_after "$i")))
  cap=$(cap_s "$p")
  [ "$limit" -gt "$cap" ] && limit=$cap
  if [ "$limit" -lt 20 ]; then
    if is_optional "$p"; then
      row "$p" "$p" skip "not started: $(left) s left of this command's ${DEADLINE} s"
    else
      row "$p" "$p" FAIL "not started: $(left) s left of this command's ${DEADLINE} s"
    fi
    checkpoint "$p"
    continue
  fi
  STEP_END=$((SECONDS + limit))
  say "$p ($limit s at most, $(left) s left; log $RES/$(logname "$p"))"
  "step_$p"
  rc=$?
  if [ $rc != 0 ] && ! awk -F'\t' -v p="$p" '$1 == p && $3 == "FAIL" {f=1} END {exit !f}' "$ROWS"; then
    row "$p" "$p" FAIL "exit $rc (see $(logname "$p"))"
  fi
  checkpoint "$p"
done
print_summary
grep -q $'\tFAIL\t' "$ROWS" && failed=1
exit $failed

#!/usr/bin/env bash
# Set up, build, and run every test (ctest). Tests that need what this machine
# lacks (a GPU, MPI, an optional tool) are reported as skipped.
# Then the suite in a sanitizer build (ASan + UBSan, CPU code:
# -DZO_SANITIZE=ON -DZO_CUDA=OFF, build-asan/; docs/testing.md has the
# minutes each part takes on 2 cores), less the tests labelled repeat (below).
# ZO_SKIP_SANITIZE=1 leaves that pass out; ZO_SANITIZE_ALL=1 runs every test
# in it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
jobs=$(nproc 2>/dev/null || echo 2)
# ctest -j runs tests side by side on few cores: OpenMP's threads sleep at a
# barrier instead of spinning on a core another test needs (a spinning team
# made test_transformer 7x slower beside one busy core: 9.1 s against 1.2 s
# alone, 1.6 s passive). The programs' own default (spinning) is unchanged.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# test_ops leaves to the sanitizer pass the host shim's cases it runs there
# (the same checks, under ASan and UBSan too; tests/test_ops.c,
# ZO_OPS_SHIM_SPLIT): all but those its ZO_OPS_SHIM_LEAN leaves out, which
# run here. Without that pass, every case runs here.
split=1
[ "${ZO_SKIP_SANITIZE:-0}" = 1 ] && split=0
# The plain pass's scratch files (tests/support/scratch.h; Python's tempfile,
# mktemp and OpenMPI's session folders read TMPDIR too) go to a folder on
# /dev/shm when TMPDIR is unset and /dev/shm is a tmpfs with 1 GiB free (the
# pass used 230 MiB at most there): the runtime tests' NVMe tier there does
# not wait on the disk (O_DIRECT works on tmpfs; docs/testing.md has what it
# saves).
# The sanitizer pass keeps the disk, where transfers complete late and a
# missing wait shows. A TMPDIR of your own serves both passes.
scratch=
if [ -z "${TMPDIR:-}" ] && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] &&
   [ "$(df -Pk /dev/shm | awk 'NR == 2 {print $4}')" -ge $((1 << 20)) ]; then
  scratch=$(mktemp -d /dev/shm/zo.XXXXXX)
  # open to every user, sticky, as /tmp is (test_common's lock test runs a
  # child as another user in a folder made there)
  chmod 1777 "$scratch"
  trap 'rm -rf "$scratch"' EXIT
  echo "scripts/test.sh: the plain pass's scratch files in $scratch (tmpfs)"
fi
(cd build && env ${scratch:+TMPDIR="$scratch"} ZO_OPS_SHIM_SPLIT=$split ctest --output-on-failure -j"$jobs" --timeout 600)
if [ "${ZO_SKIP_SANITIZE:-0}" = 1 ]; then
  exit 0
fi
cmake -S . -B build-asan ${ZO_CMAKE_ARGS:-} -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZO_SANITIZE=ON \
      -DZO_CUDA=OFF -DZO_BUILD_BENCH=OFF > /dev/null
cmake --build build-asan -j"$jobs"
cd build-asan
# label buildsystem (test_configure, test_install): cmake and the installed
# package, the same in both builds; the plain pass ran them. Label repeat:
# tests that repeat other tests' code paths at more families, shapes or
# ranks (cmake/test_costs.cmake says which and why), left out here to keep
# both passes near the 15 minutes on 2 cores; ZO_SANITIZE_ALL=1 runs them too.
skip='buildsystem|repeat'
if [ "${ZO_SANITIZE_ALL:-0}" = 1 ]; then
  skip='buildsystem'
fi
# One test more than the cores: this pass's scratch is on the disk and its
# tests wait on it (2.4% iowait and 5.6% idle at -j2 on 2 cores); alternated
# on 2 cores, -j3 took 372 and 382 s against -j2's 408 and 417 s. (The plain
# pass, on a tmpfs, gained nothing: 548 against 551 s.)
ctest --output-on-failure -j"$((jobs + 1))" --timeout 1200 -LE "$skip"

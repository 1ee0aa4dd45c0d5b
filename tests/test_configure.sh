#!/bin/sh
# Configurations other than the default configure: without the tests and
# benchmarks (-DZO_BUILD_TESTS=OFF failed: properties were set on tests that
# did not exist), and with the sanitizers. Configure only (seconds).
# usage: test_configure.sh SOURCE_DIR
set -e
src="$1"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/zo_test_configure.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
for flags in "-DZO_BUILD_TESTS=OFF -DZO_BUILD_BENCH=OFF" "-DZO_BUILD_TESTS=OFF" "-DZO_SANITIZE=ON"; do
  rm -rf "$tmp/b"
  # shellcheck disable=SC2086
  if ! cmake -S "$src" -B "$tmp/b" -DZO_CUDA=OFF -DZO_MPI=OFF $flags > "$tmp/log" 2>&1; then
    echo "configure $flags failed:"
    cat "$tmp/log"
    exit 1
  fi
  echo "configure $flags: ok"
done

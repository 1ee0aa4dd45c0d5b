#!/usr/bin/env bash
# Set up, build, and run every test (ctest). Tests that need what this machine
# lacks (a GPU, MPI, an optional tool) are reported as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd build
ctest --output-on-failure -j"$(nproc 2>/dev/null || echo 2)" --timeout 600

#!/usr/bin/env bash
# Install what the build and tests need on a Debian machine (run as root;
# OpenBLAS's OpenMP build is the CPU backend's GEMM where it is faster;
# python3-torch and, through node, Hugging Face's JavaScript tokenizers are
# the independent references some tests compare against), then configure and
# build into ./build. Packages already present are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake pkg-config libcmocka-dev libcjson-dev liburing-dev
      libxxhash-dev libopenmpi-dev openmpi-bin fio python3-torch librsvg2-bin
      libopenblas-openmp-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm: Debian's, unless some node is there already (e.g. NodeSource's,
# which brings its own npm)
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The tokenizer tests' reference (tests/js: pinned by package-lock.json) into
# tests/js/node_modules; without it test_tokenizer_js is skipped.
if command -v npm >/dev/null 2>&1 && [ ! -d tests/js/node_modules/@huggingface/tokenizers ]; then
  echo "setup: npm ci in tests/js (the tokenizer tests' reference)"
  npm ci --prefix tests/js --no-audit --no-fund --loglevel=error >/dev/null ||
    echo "setup: npm ci failed; test_tokenizer_js will be skipped"
fi

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${ZO_CMAKE_ARGS:-}
cmake --build build -j"$jobs"

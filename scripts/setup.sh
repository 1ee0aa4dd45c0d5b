#!/usr/bin/env bash
# Install what the build and tests need on a Debian machine (run as root;
# python3-torch is the independent reference some tests compare against),
# then configure and build into ./build. Packages already present are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(build-essential cmake pkg-config libcmocka-dev libcjson-dev liburing-dev
      libxxhash-dev libopenmpi-dev openmpi-bin fio python3-torch librsvg2-bin)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${ZO_CMAKE_ARGS:-}
cmake --build build -j"$jobs"

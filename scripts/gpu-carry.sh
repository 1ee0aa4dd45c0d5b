#!/usr/bin/env bash
# Fill .carry/ (ignored by git) with the Debian packages the build needs that
# the GPU machine lacks: that machine has CUDA, CMake, a C compiler and
# Python with PyTorch, but no package registry, so these travel with the
# working tree (the device tool's `carry: [".carry"]`) and
# scripts/gpu-check.sh unpacks them there with `dpkg -x` into a prefix that
# CMake is pointed at (-DZO_DEPS_PREFIX). Run here, where apt works:
#
#     bash scripts/gpu-carry.sh          # then see docs/gpu-cuda.md for the runs
#
# Packages: cJSON, liburing, xxHash, cmocka (-dev and runtime) and pkgconf
# (used there only when the machine has no pkg-config): every library the
# build finds with pkg-config; the binaries find them through their RPATH.
# Not carried, because that machine has them or the build does without:
# CUDA's runtime and cuBLASLt (the CUDA module links the toolkit's), NCCL
# (the toolkit's, else the one of the Python wheels that PyTorch brings:
# gpu-check.sh points CMake at it), MPI (optional: without it the NCCL
# backend runs one rank as a plain process, which is what test_comm_nccl
# checks there), librsvg2-bin (test_planner_svg skips without rsvg-convert,
# and the GPU commands do not run it), python3-torch (that machine's python3
# has torch). Checked here: a configure that sees only this prefix through
# pkg-config (PKG_CONFIG_LIBDIR empty, -DZO_MPI=OFF) resolves all four into
# it, and test_comm and test_cuda_module link and load them from it. About
# 450 KiB: the tree that travels stays near 7 MB, under the 64 MiB limit.
# Always amd64: that machine is x86-64 whatever this one is.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(libcjson-dev libcjson1 liburing-dev liburing2 libxxhash-dev libxxhash0
      libcmocka-dev libcmocka0 pkgconf pkgconf-bin libpkgconf3)
dir=.carry

if ! command -v apt-get >/dev/null 2>&1; then
  echo "gpu-carry: apt-get not found: run this on a Debian machine" >&2
  exit 2
fi
apt_opts=()
if [ "$(dpkg --print-architecture 2>/dev/null)" != amd64 ]; then
  # another architecture here: a lists folder of its own for amd64
  apt_opts=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64-lists)
  mkdir -p /tmp/amd64-lists/partial
  apt-get "${apt_opts[@]}" update -qq
fi

rm -rf "$dir.new"
mkdir -p "$dir.new"
download() { (cd "$dir.new" && apt-get "${apt_opts[@]}" download "${pkgs[@]}") 2>&1 | grep -v '^W: Download is performed unsandboxed'; }
if ! download >/dev/null; then
  apt-get "${apt_opts[@]}" update -qq # stale lists: refresh once
  download
fi
for p in "${pkgs[@]}"; do
  if ! ls "$dir.new/${p}_"*.deb >/dev/null 2>&1; then
    echo "gpu-carry: $p was not downloaded" >&2
    exit 1
  fi
done
(cd "$dir.new" && for f in *.deb; do
   printf '%s %s %s\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" "$(sha256sum "$f" | cut -c1-16)"
 done) > "$dir.new/MANIFEST"
rm -rf "$dir"
mv "$dir.new" "$dir"
kib=$(du -sk "$dir" | cut -f1)
echo "gpu-carry: ${#pkgs[@]} packages in $dir/ (${kib} KiB); carry it: \"carry\": [\"$dir\"]"

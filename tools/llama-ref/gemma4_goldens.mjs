// Golden next-token distributions of Gemma 4 fixture GGUFs, computed by llama.cpp (node-llama-cpp,
// CPU). For every input position: the top-N log-softmax values of llama.cpp's raw logits (which
// already include the final softcap), computed here in double precision.
//
// usage: node gemma4_goldens.mjs OUT.json MODEL.gguf [--top 20] [--seq NAME=2,818,...]...
// Default sequences: "seed" (BOS + the seed parity prompt) and "long" (41 tokens, longer than the
// fixtures' sliding windows). The sequences are written into the golden so tests read them back.
import fs from "node:fs";
import path from "node:path";
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

// A fixed pseudo-random token sequence (LCG), so the golden does not depend on any tokenizer.
function longSequence(n) {
    const out = [2];
    let x = 12345;
    while (out.length < n) {
        x = (x * 1103515245 + 12345) % 2147483648;
        out.push(300 + (x % 30000));
    }
    return out;
}

const args = process.argv.slice(2);
if (args.length < 2) {
    console.error("usage: node gemma4_goldens.mjs OUT.json MODEL.gguf [--top N] [--seq NAME=ids]...");
    process.exit(2);
}
const [outPath, modelPath] = args;
let top = 20;
const sequences = {};
for (let i = 2; i < args.length; i++) {
    if (args[i] === "--top") top = Number(args[++i]);
    else if (args[i] === "--seq") {
        const [name, ids] = args[++i].split("=");
        sequences[name] = ids.split(",").map(Number);
    } else throw new Error(`unknown argument ${args[i]}`);
}
if (Object.keys(sequences).length === 0) {
    sequences.seed = [2, 818, 5279, 529, 7001, 563];
    sequences.long = longSequence(41);
}

const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.error});
const model = await llama.loadModel({modelPath});
const result = {
    model: path.basename(modelPath),
    reference: "llama.cpp via node-llama-cpp 3.22.1 (CPU), log-softmax of raw logits in double",
    top,
    sequences: {},
};
for (const [name, tokens] of Object.entries(sequences)) {
    const context = await model.createContext({contextSize: 256, batchSize: 256, sequences: 1,
                                               threads: 2, swaFullCache: true, flashAttention: false,
                                               // F32 cache: the default F16 cache would round K and V.
                                               experimentalKvCacheKeyType: "F32",
                                               experimentalKvCacheValueType: "F32"});
    const sequence = context.getSequence();
    const input = tokens.map((t) => [t, {generateNext: {logits: true}}]);
    const outputs = await sequence.controlledEvaluate(input);
    const positions = [];
    for (let i = 0; i < tokens.length; i++) {
        const logits = outputs[i]?.next?.logits;
        if (!logits) throw new Error(`no logits at position ${i}`);
        let max = -Infinity;
        for (const v of logits.values()) max = Math.max(max, v);
        let sum = 0;
        for (const v of logits.values()) sum += Math.exp(v - max);
        const lse = max + Math.log(sum);
        const ranked = [...logits.entries()].sort((a, b) => b[1] - a[1] || a[0] - b[0]).slice(0, top);
        positions.push({pos: i, top: ranked.map(([id, v]) => [id, Number((v - lse).toFixed(6))])});
    }
    result.sequences[name] = {tokens, positions};
    await context.dispose();
}
fs.writeFileSync(outPath, JSON.stringify(result) + "\n");
await model.dispose();
console.log(`wrote ${outPath}`);

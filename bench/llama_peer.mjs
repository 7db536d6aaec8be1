// The peer of `specula bench`: llama.cpp (node-llama-cpp 3.22.1, CPU) on the same GGUF, the same
// synthetic prompt and the same pp/tg procedure (one forward over the prompt; then greedy single-token
// steps), each repetition on a fresh context after an untimed warm-up. Prints one JSON object.
//
// usage: node bench/llama_peer.mjs MODEL.gguf [--prompt-tokens 512] [--gen-tokens 128]
//                                  [--repetitions 3] [--threads N] [--gpu vulkan]
// --gpu vulkan: llama.cpp's Vulkan build (npm @node-llama-cpp/linux-x64-vulkan@3.22.1), every layer on the GPU.
// Needs `npm install --ignore-scripts --omit=optional` in tools/llama-ref (bench/compare_llama.sh does it).
import path from "node:path";
import {createRequire} from "node:module";
import {fileURLToPath} from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(here, "../tools/llama-ref/package.json"));
const {getLlama, LlamaLogLevel} = await import(require.resolve("node-llama-cpp"));

const args = process.argv.slice(2);
const opt = {"prompt-tokens": 512, "gen-tokens": 128, repetitions: 3, threads: 0};
let modelPath = null, gpu = false;
for (let i = 0; i < args.length; i++) {
    const key = args[i].replace(/^--/, "");
    if (args[i] === "--gpu" && args[i + 1] === "vulkan") gpu = args[++i];
    else if (args[i].startsWith("--") && key in opt) opt[key] = Number(args[++i]);
    else if (!modelPath && !args[i].startsWith("--")) modelPath = args[i];
    else {
        console.error(`llama_peer.mjs: unknown argument '${args[i]}'`);
        process.exit(2);
    }
}
if (!modelPath) {
    console.error("usage: node bench/llama_peer.mjs MODEL.gguf [--prompt-tokens N] [--gen-tokens N] " +
                  "[--repetitions N] [--threads N]");
    process.exit(2);
}

// The same LCG prompt as specula bench (apps/specula/cmd_bench.cpp).
function syntheticPrompt(n) {
    const out = [2];
    let x = 12345;
    while (out.length < n) {
        x = (x * 1103515245 + 12345) % 2147483648;
        out.push(300 + (x % 30000));
    }
    return out.slice(0, n);
}

const threads = opt.threads > 0 ? opt.threads : undefined;
const llama = await getLlama({gpu, logLevel: LlamaLogLevel.error});
const t0 = performance.now();
const model = await llama.loadModel({modelPath, gpuLayers: gpu ? "max" : 0});
const loadSeconds = (performance.now() - t0) / 1000;
const prompt = syntheticPrompt(opt["prompt-tokens"]);

async function run(gen) {
    const context = await model.createContext({contextSize: prompt.length + gen + 8, batchSize: prompt.length,
                                               sequences: 1, threads, flashAttention: false});
    const sequence = context.getSequence();
    let t = performance.now();
    // The prompt in one go; its last row yields the first generated token, as in specula bench.
    const it = sequence.evaluate(prompt, {temperature: 0, yieldEogToken: true});
    await it.next();
    const pp = (performance.now() - t) / 1000;
    t = performance.now();
    for (let i = 1; i < gen; i++) await it.next();
    // The generator evaluates a yielded token when asked for the next one: one more step closes gen forwards.
    await it.next();
    const tg = (performance.now() - t) / 1000;
    await it.return();
    await context.dispose();
    return {pp, tg};
}

function median(v) {
    const s = [...v].sort((a, b) => a - b);
    return {median: s[Math.floor(s.length / 2)], min: s[0], max: s[s.length - 1]};
}

await run(Math.min(opt["gen-tokens"], 4));
const pp = [], tg = [];
for (let r = 0; r < opt.repetitions; r++) {
    const {pp: p, tg: g} = await run(opt["gen-tokens"]);
    pp.push(prompt.length / p);
    tg.push(opt["gen-tokens"] / g);
}
const P = median(pp), G = median(tg);
console.log(JSON.stringify({
    engine: `llama.cpp (node-llama-cpp 3.22.1, ${gpu ? "Vulkan" : "CPU"})`, model: modelPath, threads: opt.threads,
    gpu_devices: gpu ? await llama.getGpuDeviceNames() : [],
    prompt_tokens: prompt.length, gen_tokens: opt["gen-tokens"], repetitions: opt.repetitions,
    load_seconds: loadSeconds, pp_tokens_per_second: P.median, pp_min: P.min, pp_max: P.max,
    tg_tokens_per_second: G.median, tg_min: G.min, tg_max: G.max,
    peak_rss_mib: process.resourceUsage().maxRSS / 1024,
}, null, 2));
await model.dispose();

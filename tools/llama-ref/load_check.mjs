// Loads a GGUF with llama.cpp (node-llama-cpp, CPU) and reports whether the model and all of its
// tensors loaded: llama.cpp checks the architecture's hparams and every tensor's name and shape at
// load time, so a clean load means the file is in a layout llama.cpp accepts.
//
// usage: node load_check.mjs MODEL.gguf
// Prints the architecture, tensor count, size and llama.cpp's type description; exits 1 if the load fails.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

const modelPath = process.argv[2];
if (!modelPath) {
    console.error("usage: node load_check.mjs MODEL.gguf");
    process.exit(2);
}

const llama = await getLlama({gpu: false, logLevel: LlamaLogLevel.warn});
let model;
try {
    model = await llama.loadModel({modelPath, gpuLayers: 0});
} catch (err) {
    console.error(`load FAILED: ${modelPath}: ${err && err.message ? err.message : err}`);
    process.exit(1);
}
const meta = model.fileInfo.metadata;
const arch = meta?.general?.architecture;
console.log(`path: ${modelPath}`);
console.log(`architecture: ${arch}`);
console.log(`tensors: ${model.fileInfo.tensorInfo?.length ?? "?"}`);
console.log(`size: ${model.size} bytes, type: ${model.typeDescription}`);
console.log(`train context: ${model.trainContextSize}, embedding size: ${model.embeddingVectorSize}`);
console.log("load OK");
await model.dispose();
await llama.dispose();

// The Gemma 4 text model (gemma4-text-spec.md): every forward pass is one Graph run by the
// ComputeBackend; the KV cache lives in persistent backend tensors written with WriteRows.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "config.hpp"
#include "specula/model.hpp"
#include "specula/options.hpp"
#include "weights.hpp"

namespace specula::gemma4 {

// Loader options (the pipeline's target section, all optional):
//   prefill_chunk: tokens per graph run (default 256); also the deepest rollback a sliding-window
//                  cache allows, since its ring keeps window - 1 + prefill_chunk slots
//   kv_cache_type: "F32" (default), "F16" or "BF16"
//   embedding_scale: "auto" (default: sqrt(hidden) rounded to the embedding table's dtype for
//                  safetensors/MLX as transformers does, exact for GGUF as llama.cpp does),
//                  "exact" or "bf16"
// `parts.lm_head` computes the logits (the tied embedding, with the final softcap).
std::shared_ptr<Model> load_model(std::shared_ptr<const ModelFile> file, std::shared_ptr<ComputeBackend> backend,
                                  const nlohmann::json& options, const ModelParts& parts = {});

// What load_model checks, without loading a weight (ModelLoader::check): the configuration, every
// tensor's presence and shape, the options, the KV cache dtype against the backend. Returns the
// ModelInfo the model will report.
ModelInfo check(const ModelFile& file, const ComputeBackend& backend, const nlohmann::json& options);

// The options load_model takes, for the host's check and `specula plugins --options gemma4`.
const OptionSchema& option_schema();

// True when `file` holds a Gemma 4 text model (GGUF arch gemma4, or a gemma4 config.json).
bool is_gemma4(const ModelFile& file);

// sqrt(n) as the reference computes it for a table stored as `type`.
float embedding_scale(int64_t n, DType type, const std::string& mode);

}  // namespace specula::gemma4

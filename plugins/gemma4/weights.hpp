// The tensors of a Gemma 4 text model, looked up under the names each format uses (GGUF, Hugging Face
// safetensors, MLX), shape-checked against the Config, and handed to the backend once.
#pragma once

#include <string>
#include <vector>

#include "config.hpp"
#include "specula/compute.hpp"
#include "specula/model_file.hpp"

namespace specula::gemma4 {

struct LayerWeights {
  BackendTensorPtr attn_norm, q, k, v, o, q_norm, k_norm, post_attn_norm;
  BackendTensorPtr ffn_norm, gate, up, down, post_ffw_norm, layer_scalar;
  BackendTensorPtr ple_gate, ple_proj, ple_post_norm;                        // per-layer embeddings
  BackendTensorPtr router, router_scale, expert_scale;                       // MoE
  BackendTensorPtr gate_up_exps, gate_exps, up_exps, down_exps;              // fused or split gate/up
  BackendTensorPtr pre_ffw_norm_2, post_ffw_norm_1, post_ffw_norm_2;
};

struct Weights {
  BackendTensorPtr embed, output_norm;
  BackendTensorPtr ple_embed, ple_model_proj, ple_proj_norm;
  DType embed_type = DType::F32;  // the table's storage type (decides how the embedding scale is rounded)
  std::vector<LayerWeights> layers;
};

// Loads every tensor `config` needs from `file` into `backend`. Throws specula::Error naming the file,
// the tensor and the expected shape when one is missing or misshaped. Unused K/V tensors of KV-shared
// layers are skipped with a debug message.
Weights load_weights(const ModelFile& file, const Config& config, ComputeBackend& backend);
// The same checks without loading anything: the tensors stay null, embed_type is set.
Weights check_weights(const ModelFile& file, const Config& config);

}  // namespace specula::gemma4

// Gemma 4 text hyper-parameters, read from a GGUF file's gemma4.* keys or from a Hugging Face / MLX
// config.json (nested text_config or flat gemma4_text), with the transformers defaults for absent keys.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rope.hpp"
#include "specula/model_file.hpp"

namespace specula::gemma4 {

struct LayerConfig {
  bool full = false;        // full attention (else sliding window)
  int64_t head_dim = 0;
  int64_t kv_heads = 0;
  int64_t ffn = 0;          // dense MLP width (doubled on KV-shared layers with use_double_wide_mlp)
  int producer = -1;        // KV-shared layers: the layer whose K/V they read; else -1
};

struct Config {
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t head_dim_sliding = 0;
  int64_t head_dim_full = 0;
  int64_t window = 0;
  int64_t context = 0;
  std::string context_key;    // where `context` was read, for messages ("gemma4.context_length")
  int64_t ple = 0;            // hidden_size_per_layer_input (0 = no per-layer embeddings)
  int64_t shared_kv_layers = 0;
  int64_t experts = 0;        // 0 = no MoE block
  int64_t experts_used = 0;
  int64_t expert_ffn = 0;
  bool k_eq_v = false;        // full layers may lack V and use the raw K projection
  float eps = 1e-6f;
  float softcap = 0.0f;       // final logit softcap, 0 = none
  RopeConfig rope_sliding, rope_full;
  std::vector<LayerConfig> layers;
  std::vector<int32_t> eos;   // end-of-generation ids the file states

  int64_t first_shared() const { return static_cast<int64_t>(layers.size()) - shared_kv_layers; }
  nlohmann::json to_json() const;
};

// From a GGUF file (metadata keys plus the rope_freqs tensor). Throws naming the file and key.
Config config_from_gguf(const ModelFile& file);
// From safetensors/MLX metadata {"config": config.json, "generation_config": ...}.
Config config_from_hf(const ModelFile& file);

// Fills producers and checks the layer list; shared by both readers.
void finish_layers(Config& c, const std::string& where);

}  // namespace specula::gemma4

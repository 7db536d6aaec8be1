// What the gemma4 and gemma4-assistant converters share: llama.cpp's Gemma 4 key block (Gemma4Model's
// set_gguf_parameters, under either architecture prefix), its tokenizer keys, the generated rope_freqs
// tensor and the per-tensor rules (GGUF name, kept-F32, embedding rows) for tensors taken from the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "specula/convert.hpp"

namespace specula::gemma4 {

// The values of the key block. Optional per-layer arrays are written (replacing the scalar, as
// gguf-py does) only when non-empty.
struct TextKeys {
  int64_t layers = 0, context = 0, hidden = 0, ffn = 0, heads = 0, kv_heads = 0;
  std::vector<int64_t> ffn_per_layer;      // use_double_wide_mlp
  std::vector<int64_t> kv_heads_per_layer; // num_global_key_value_heads set
  float rope_theta = 0, rope_theta_swa = 0, eps = 1e-6f, softcap = 0;
  int64_t experts = 0, experts_used = 0, expert_ffn = 0;
  int64_t head_dim_full = 0, head_dim_swa = 0, window = 0, shared_kv_layers = 0, per_layer_input = 0;
  std::vector<bool> sliding;               // per layer
};
// Writes the block: "{prefix}block_count" ... "{prefix}rope.dimension_count_swa", with general.file_type
// at llama.cpp's place among them.
void add_text_keys(gguf::Metadata& out, const std::string& prefix, const TextKeys& k, DType outtype);

// tokenizer.ggml.* for Gemma 4 (model "gemma4", the tool/channel tokens USER_DEFINED, no space prefix,
// BOS added); returns the token count.
int64_t add_gemma4_tokenizer(const ModelFile& file, gguf::Metadata& out);

// rope_freqs.weight [head_dim_full / 2]: 1.0 for the `rotated` pairs, 1e30 (not rotated) after them.
ConvertTensor rope_freqs(int64_t head_dim_full, int64_t rotated);

// Output tensor `gguf_name` from file tensor `t` (shape kept; 0-d becomes [1]; kept F32 by llama.cpp's
// rules). token_embd keeps only `tokens` rows, as llama.cpp drops rows past the tokenizer's tokens.
ConvertTensor from_file(const ModelFile& file, const TensorInfo& t, const std::string& gguf_name, int64_t tokens);

}  // namespace specula::gemma4

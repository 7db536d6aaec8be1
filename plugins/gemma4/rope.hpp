// Gemma 4 RoPE per attention type, read from a GGUF file's rope.* keys (with llama.cpp's rope_freqs
// encoding of proportional RoPE) or from a Hugging Face config's rope_parameters. One reader for the
// gemma4 model plugin and the gemma4-assistant drafter plugin (both in specula_gemma4_common).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "specula/metadata.hpp"
#include "specula/model_file.hpp"

namespace specula::gemma4 {

// How one attention type rotates: pairs k < rotated_pairs of the NeoX halves turn by
// pos * freq_scale * theta^(-2k / exponent_divisor); the rest pass through (proportional RoPE).
struct RopeConfig {
  float theta = 10000.0f;
  int64_t rotated_pairs = 0;
  float exponent_divisor = 0.0f;
  float freq_scale = 1.0f;
};

struct Ropes {
  RopeConfig sliding, full;
};

// From GGUF keys: sliding layers plain NeoX RoPE (rope.freq_base_swa, rope.dimension_count_swa), full
// layers proportional RoPE, encoded by llama.cpp's converter as rope_freqs = 1.0 for the rotated pairs
// and >= 1e20 (no rotation) for the rest. Throws naming `where` when a dimension count exceeds its head dim.
Ropes rope_from_gguf(const GgufKeys& keys, const ModelFile& file, int64_t head_dim_sliding, int64_t head_dim_full,
                     const std::string& where);

// From a config.json's text config `tc` (its rope_parameters, or transformers' Gemma 4 defaults when
// absent): modeling_rope_utils' "default" and "proportional" rope types. `prefix` is how messages name
// the text config ("text_config." or "").
Ropes rope_from_hf(const nlohmann::json& tc, int64_t head_dim_sliding, int64_t head_dim_full, const std::string& where,
                   std::string_view prefix);

}  // namespace specula::gemma4

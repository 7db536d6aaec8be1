// Gemma 4 tensor names: llama.cpp's GGUF names and the Hugging Face / MLX names they are stored under.
// One table for the loader (GGUF name -> the file's name) and the converter (file name -> GGUF name);
// the gemma4-assistant plugin uses it for its (Q-only) layers too.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "specula/model_file.hpp"

namespace specula::gemma4 {

// GGUF per-layer suffix ("attn_q.weight") -> its names after "layers.N." in Hugging Face checkpoints,
// HF's own first (MLX uses the HF names too, except the experts, which mlx-vlm splits into
// switch_glu.{gate,up,down}_proj).
const std::map<std::string, std::vector<std::string>>& layer_names();
// GGUF global name -> Hugging Face name after the text tower's prefix.
const std::map<std::string, std::string>& global_names();

// The text tower's prefix in a safetensors / MLX checkpoint: "model.language_model." (multimodal HF),
// "language_model.model." (MLX), "model." (text-only exports) or "", found by where embed_tokens.weight is.
std::string text_prefix(const ModelFile& file);

// The GGUF name of a tensor given its name after the text prefix ("layers.3.mlp.up_proj.weight" ->
// "blk.3.ffn_up.weight"); empty when the table has no such name.
std::string gguf_name_of(const std::string& hf_name);

}  // namespace specula::gemma4

#include "convert_common.hpp"

#include "specula/error.hpp"

namespace specula::gemma4 {

void add_text_keys(gguf::Metadata& out, const std::string& A, const TextKeys& k, DType outtype) {
  auto u32 = [&](const std::string& key, int64_t v) { out.set_u32(A + key, static_cast<uint32_t>(v)); };
  // TextModel's keys, then Gemma3Model's and Gemma4Model's; a key set again keeps its first place.
  u32("block_count", k.layers);
  u32("context_length", k.context);
  u32("embedding_length", k.hidden);
  u32("feed_forward_length", k.ffn);
  u32("attention.head_count", k.heads);
  u32("attention.head_count_kv", k.kv_heads);
  out.set_f32(A + "rope.freq_base", k.rope_theta);
  out.set_f32(A + "rope.freq_base_swa", k.rope_theta_swa);
  out.set_f32(A + "attention.layer_norm_rms_epsilon", k.eps);
  if (k.experts > 0) {
    u32("expert_count", k.experts);
    u32("expert_used_count", k.experts_used);
  }
  u32("attention.key_length", k.head_dim_full);
  u32("attention.value_length", k.head_dim_full);
  out.set_u32("general.file_type", llama_file_type(outtype));
  if (k.softcap != 0.0f) out.set_f32(A + "final_logit_softcapping", k.softcap);
  u32("attention.sliding_window", k.window);
  u32("attention.shared_kv_layers", k.shared_kv_layers);
  u32("embedding_length_per_layer_input", k.per_layer_input);
  out.set_array(A + "attention.sliding_window_pattern", gguf::ValueType::BOOL, nlohmann::json(k.sliding));
  u32("attention.key_length_swa", k.head_dim_swa);
  u32("attention.value_length_swa", k.head_dim_swa);
  if (k.expert_ffn > 0) u32("expert_feed_forward_length", k.expert_ffn);
  if (!k.ffn_per_layer.empty())
    out.set_array(A + "feed_forward_length", gguf::ValueType::INT32, nlohmann::json(k.ffn_per_layer));
  if (!k.kv_heads_per_layer.empty())
    out.set_array(A + "attention.head_count_kv", gguf::ValueType::INT32, nlohmann::json(k.kv_heads_per_layer));
  u32("rope.dimension_count", k.head_dim_full);
  u32("rope.dimension_count_swa", k.head_dim_swa);
}

int64_t add_gemma4_tokenizer(const ModelFile& file, gguf::Metadata& out) {
  // Rendered as text so that llama.cpp's chat parser sees them (conversion/gemma.py).
  static const std::vector<std::string> visible = {"<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
                                                   "<|tool_response>", "<tool_response|>", "<|\"|>"};
  const int64_t tokens = add_hf_tokenizer(file, out, "gemma4", visible);
  out.set_bool("tokenizer.ggml.add_space_prefix", false);
  out.set_bool("tokenizer.ggml.add_bos_token", true);
  return tokens;
}

ConvertTensor rope_freqs(int64_t head_dim_full, int64_t rotated) {
  ConvertTensor t{"rope_freqs.weight", {head_dim_full / 2}, {}, 0, true, {}};
  t.transform = [rotated](int64_t, std::span<float> v) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i) < rotated ? 1.0f : 1e30f;
  };
  return t;
}

ConvertTensor from_file(const ModelFile& file, const TensorInfo& t, const std::string& gguf_name, int64_t tokens) {
  ConvertTensor out;
  out.name = gguf_name;
  out.shape = t.shape.empty() ? std::vector<int64_t>{1} : t.shape;
  out.sources = {&t};
  if (gguf_name == "token_embd.weight" && out.shape.size() == 2 && out.shape[0] != tokens) {
    if (out.shape[0] < tokens)
      fail("{}: tensor '{}' has {} rows but the tokenizer has {} tokens; expected one row per token",
           file.path().string(), t.name, out.shape[0], tokens);
    out.shape[0] = tokens;
  }
  out.keep_f32 = llama_keeps_f32(gguf_name, out.shape.size());
  return out;
}

}  // namespace specula::gemma4

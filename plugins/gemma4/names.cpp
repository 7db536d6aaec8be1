#include "names.hpp"

namespace specula::gemma4 {

const std::map<std::string, std::vector<std::string>>& layer_names() {
  static const std::map<std::string, std::vector<std::string>> m = {
      {"attn_norm.weight", {"input_layernorm.weight"}},
      {"attn_q.weight", {"self_attn.q_proj.weight"}},
      {"attn_k.weight", {"self_attn.k_proj.weight"}},
      {"attn_v.weight", {"self_attn.v_proj.weight"}},
      {"attn_output.weight", {"self_attn.o_proj.weight"}},
      {"attn_q_norm.weight", {"self_attn.q_norm.weight"}},
      {"attn_k_norm.weight", {"self_attn.k_norm.weight"}},
      {"post_attention_norm.weight", {"post_attention_layernorm.weight"}},
      {"ffn_norm.weight", {"pre_feedforward_layernorm.weight"}},
      {"ffn_gate.weight", {"mlp.gate_proj.weight"}},
      {"ffn_up.weight", {"mlp.up_proj.weight"}},
      {"ffn_down.weight", {"mlp.down_proj.weight"}},
      {"post_ffw_norm.weight", {"post_feedforward_layernorm.weight"}},
      {"layer_output_scale.weight", {"layer_scalar"}},
      {"inp_gate.weight", {"per_layer_input_gate.weight"}},
      {"proj.weight", {"per_layer_projection.weight"}},
      {"post_norm.weight", {"post_per_layer_input_norm.weight"}},
      {"ffn_gate_inp.weight", {"router.proj.weight"}},
      {"ffn_gate_inp.scale", {"router.scale"}},
      {"ffn_down_exps.scale", {"router.per_expert_scale"}},
      {"ffn_gate_up_exps.weight", {"experts.gate_up_proj"}},
      {"ffn_gate_exps.weight", {"experts.switch_glu.gate_proj.weight", "experts.gate_proj"}},
      {"ffn_up_exps.weight", {"experts.switch_glu.up_proj.weight", "experts.up_proj"}},
      {"ffn_down_exps.weight", {"experts.down_proj", "experts.switch_glu.down_proj.weight"}},
      {"pre_ffw_norm_2.weight", {"pre_feedforward_layernorm_2.weight"}},
      {"post_ffw_norm_1.weight", {"post_feedforward_layernorm_1.weight"}},
      {"post_ffw_norm_2.weight", {"post_feedforward_layernorm_2.weight"}},
  };
  return m;
}

const std::map<std::string, std::string>& global_names() {
  static const std::map<std::string, std::string> m = {
      {"token_embd.weight", "embed_tokens.weight"},
      {"output_norm.weight", "norm.weight"},
      {"per_layer_token_embd.weight", "embed_tokens_per_layer.weight"},
      {"per_layer_model_proj.weight", "per_layer_model_projection.weight"},
      {"per_layer_proj_norm.weight", "per_layer_projection_norm.weight"},
  };
  return m;
}

std::string text_prefix(const ModelFile& file) {
  for (const char* p : {"model.language_model.", "language_model.model.", "model."})
    if (file.find(std::string(p) + "embed_tokens.weight")) return p;
  return "";
}

std::string gguf_name_of(const std::string& hf_name) {
  for (const auto& [gguf, hf] : global_names())
    if (hf == hf_name) return gguf;
  if (hf_name.rfind("layers.", 0) != 0) return "";
  const size_t dot = hf_name.find('.', 7);
  if (dot == std::string::npos) return "";
  const std::string layer = hf_name.substr(7, dot - 7), suffix = hf_name.substr(dot + 1);
  if (layer.empty() || layer.find_first_not_of("0123456789") != std::string::npos) return "";
  for (const auto& [gguf, names] : layer_names())
    for (const std::string& n : names)
      if (n == suffix) return "blk." + layer + "." + gguf;
  return "";
}

}  // namespace specula::gemma4

#include "weights.hpp"

#include "names.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/weight_lookup.hpp"

namespace specula::gemma4 {
namespace {

// The names a GGUF tensor name has in a Hugging Face / MLX checkpoint: global ones from the name table,
// blk.N.suffix -> <prefix>layers.N.<hf suffix> (every spelling the table knows, in order).
WeightLookup::Names file_names(const ModelFile& file) {
  if (file.format() == "gguf") return [](const std::string& n) { return std::vector<std::string>{n}; };
  return [prefix = text_prefix(file)](const std::string& gguf_name) {
    if (auto it = global_names().find(gguf_name); it != global_names().end()) return std::vector<std::string>{prefix + it->second};
    const size_t dot1 = gguf_name.find('.'), dot2 = gguf_name.find('.', dot1 + 1);
    const std::string layer = gguf_name.substr(dot1 + 1, dot2 - dot1 - 1), suffix = gguf_name.substr(dot2 + 1);
    auto it = layer_names().find(suffix);
    if (it == layer_names().end()) return std::vector<std::string>{gguf_name};
    std::vector<std::string> out;
    for (const std::string& n : it->second) out.push_back(prefix + "layers." + layer + "." + n);
    return out;
  };
}

}  // namespace

namespace {
Weights read_weights(const ModelFile& file, const Config& c, ComputeBackend* backend);
}  // namespace

Weights load_weights(const ModelFile& file, const Config& c, ComputeBackend& backend) {
  return read_weights(file, c, &backend);
}

Weights check_weights(const ModelFile& file, const Config& c) { return read_weights(file, c, nullptr); }

namespace {
Weights read_weights(const ModelFile& file, const Config& c, ComputeBackend* backend) {
  WeightLookup ld(file, backend, file_names(file), "model");
  Weights w;
  const int64_t H = c.hidden, L = static_cast<int64_t>(c.layers.size()), P = c.ple;
  w.embed = ld.need("token_embd.weight", {c.vocab, H});
  w.embed_type = ld.find("token_embd.weight")->type;
  if (backend && ld.find("output.weight"))
    log_warn("{}: has an untied 'output.weight'; Gemma 4 ties the LM head to token_embd, which is used",
             file.path().string());
  w.output_norm = ld.need("output_norm.weight", {H});
  if (P > 0) {
    const TensorInfo* t = ld.find("per_layer_token_embd.weight");
    // Some ports keep more PLE rows than the vocabulary; ids never reach them.
    const int64_t rows = t && t->shape.size() == 2 && t->shape[0] >= c.vocab ? t->shape[0] : c.vocab;
    w.ple_embed = ld.need("per_layer_token_embd.weight", {rows, L * P});
    w.ple_model_proj = ld.need("per_layer_model_proj.weight", {L * P, H});
    w.ple_proj_norm = ld.need("per_layer_proj_norm.weight", {P});
  }
  w.layers.resize(L);
  for (int64_t l = 0; l < L; ++l) {
    const LayerConfig& lc = c.layers[l];
    LayerWeights& lw = w.layers[l];
    auto n = [&](const char* s) { return fmt::format("blk.{}.{}", l, s); };
    const int64_t D = lc.head_dim, KV = lc.kv_heads, I = lc.ffn;
    lw.attn_norm = ld.need(n("attn_norm.weight"), {H});
    lw.q = ld.need(n("attn_q.weight"), {c.heads * D, H});
    lw.q_norm = ld.need(n("attn_q_norm.weight"), {D});
    lw.o = ld.need(n("attn_output.weight"), {H, c.heads * D});
    if (lc.producer < 0) {
      lw.k = ld.need(n("attn_k.weight"), {KV * D, H});
      lw.k_norm = ld.need(n("attn_k_norm.weight"), {D});
      lw.v = ld.optional(n("attn_v.weight"), {KV * D, H});
      if (!ld.find(n("attn_v.weight")) && !(lc.full && (c.k_eq_v || file.format() == "gguf"))) {
        std::string shown;
        ld.find(n("attn_v.weight"), &shown);
        fail("{}: tensor '{}' is missing; only full-attention layers of attention_k_eq_v models may omit V",
             file.path().string(), shown);
      }
    } else {
      for (const char* s : {"attn_k.weight", "attn_v.weight", "attn_k_norm.weight"})
        if (std::string shown; ld.find(n(s), &shown))
          log_debug("{}: ignoring '{}': layer {} reads the K/V of layer {}", file.path().string(), shown, l,
                    lc.producer);
    }
    lw.post_attn_norm = ld.need(n("post_attention_norm.weight"), {H});
    lw.ffn_norm = ld.need(n("ffn_norm.weight"), {H});
    lw.gate = ld.need(n("ffn_gate.weight"), {I, H});
    lw.up = ld.need(n("ffn_up.weight"), {I, H});
    lw.down = ld.need(n("ffn_down.weight"), {H, I});
    lw.post_ffw_norm = ld.need(n("post_ffw_norm.weight"), {H});
    lw.layer_scalar = ld.optional(n("layer_output_scale.weight"), {1});
    if (P > 0) {
      lw.ple_gate = ld.need(n("inp_gate.weight"), {P, H});
      lw.ple_proj = ld.need(n("proj.weight"), {H, P});
      lw.ple_post_norm = ld.need(n("post_norm.weight"), {H});
    }
    if (c.experts > 0) {
      const int64_t E = c.experts, Im = c.expert_ffn;
      lw.router = ld.need(n("ffn_gate_inp.weight"), {E, H});
      lw.router_scale = ld.need(n("ffn_gate_inp.scale"), {H});
      lw.expert_scale = ld.need(n("ffn_down_exps.scale"), {E});
      if (ld.find(n("ffn_gate_up_exps.weight"))) {
        lw.gate_up_exps = ld.need(n("ffn_gate_up_exps.weight"), {E, 2 * Im, H});
      } else {
        lw.gate_exps = ld.need(n("ffn_gate_exps.weight"), {E, Im, H});
        lw.up_exps = ld.need(n("ffn_up_exps.weight"), {E, Im, H});
      }
      lw.down_exps = ld.need(n("ffn_down_exps.weight"), {E, H, Im});
      lw.pre_ffw_norm_2 = ld.need(n("pre_ffw_norm_2.weight"), {H});
      lw.post_ffw_norm_1 = ld.need(n("post_ffw_norm_1.weight"), {H});
      lw.post_ffw_norm_2 = ld.need(n("post_ffw_norm_2.weight"), {H});
    } else if (ld.find(n("ffn_gate_inp.weight"))) {
      fail("{}: layer {} has MoE router weights but the configuration has no experts", file.path().string(), l);
    }
  }
  return w;
}
}  // namespace

}  // namespace specula::gemma4

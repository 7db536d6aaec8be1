// The gemma4-assistant converter: a Gemma4AssistantForCausalLM checkpoint (Hugging Face or MLX) to GGUF,
// in one of two layouts (--schema):
//   seed      (default) shared/seeds/gemma4-assistant.md, the fork converter: assist_pre_proj /
//             assist_post_proj, the centroid head kept (assist_embed_centroids, F32; assist_token_ordering,
//             F32 holding the integer ids) and the keys backbone_hidden_size and assistant.*;
//   upstream  llama.cpp's Gemma4AssistantModel: nextn.pre_projection / nextn.post_projection,
//             embedding_length_out, masked_embedding.* dropped (llama.cpp's head is dense).
// Both write the gemma4 key block under "gemma4-assistant." (computed from the drafter's text_config),
// nextn_predict_layers, the Gemma 4 tokenizer and rope_freqs, like the target converter.
#include "converter.hpp"

#include <map>

#include "assistant.hpp"
#include "convert_common.hpp"
#include "names.hpp"
#include "specula/error.hpp"

namespace specula::gemma4_assistant {
namespace {

using json = nlohmann::json;

class AssistantConverter final : public Converter {
 public:
  std::string architecture() const override { return "gemma4-assistant"; }
  std::vector<std::string> schemas() const override { return {"seed", "upstream"}; }
  bool accepts(const ModelFile& file) const override { return file.format() != "gguf" && is_assistant(file); }

  std::vector<ConvertTensor> plan(const ModelFile& file, const ConvertOptions& options, gguf::Metadata& out) const override {
    const std::string where = file.path().string();
    const std::string schema = options.schema.empty() ? "seed" : options.schema;
    if (schema != "seed" && schema != "upstream")
      fail("{}: --schema {} is not a gemma4-assistant layout; expected seed (default) or upstream", where, schema);
    const bool seed = schema == "seed";
    const Config c = read_config(file);
    const json& root = file.metadata()["config"];
    const json& tc = root["text_config"];
    const int64_t L = static_cast<int64_t>(c.layers.size());

    gemma4::TextKeys k;
    k.layers = L;
    k.context = c.context;
    k.hidden = c.hidden;
    k.ffn = tc.value("intermediate_size", int64_t{2048});
    k.heads = c.heads;
    k.kv_heads = tc.value("num_key_value_heads", int64_t{1});
    // 26B-A4B / 31B: the full-attention layer reads the target's global KV heads, so head_count_kv goes per
    // layer as for the target (llama.cpp sizes its views of the target's cache by it).
    const bool global_kv = tc.contains("num_global_key_value_heads") && !tc["num_global_key_value_heads"].is_null();
    for (const Layer& l : c.layers) {
      k.sliding.push_back(!l.full);
      if (global_kv) k.kv_heads_per_layer.push_back(l.full ? tc["num_global_key_value_heads"].get<int64_t>() : k.kv_heads);
    }
    k.head_dim_full = tc.value("global_head_dim", int64_t{512});
    k.head_dim_swa = tc.value("head_dim", int64_t{256});
    k.rope_theta = c.rope_full.theta;
    k.rope_theta_swa = c.rope_sliding.theta;
    k.eps = c.eps;
    k.window = c.window;
    k.shared_kv_layers = tc.value("num_kv_shared_layers", L);  // every drafter layer reads the target's K/V
    k.per_layer_input = 0;

    out.set_string("general.architecture", "gemma4-assistant");
    out.set_string("general.type", "model");
    out.set_string("general.name", default_model_name(file, options));
    const std::string A = "gemma4-assistant.";
    gemma4::add_text_keys(out, A, k, options.outtype);
    if (seed) {
      out.set_u32(A + "nextn_predict_layers", static_cast<uint32_t>(L));
      out.set_u32("general.quantization_version", 2);
      out.set_u32(A + "backbone_hidden_size", static_cast<uint32_t>(c.backbone));
      out.set_u32(A + "assistant.num_centroids", static_cast<uint32_t>(c.centroids));
      out.set_u32(A + "assistant.centroid_intermediate_top_k", static_cast<uint32_t>(c.centroid_top_k));
      out.set_bool(A + "assistant.use_ordered_embeddings", c.use_ordered_embeddings);
    } else {
      out.set_u32(A + "embedding_length_out", static_cast<uint32_t>(c.backbone));
      out.set_u32(A + "nextn_predict_layers", static_cast<uint32_t>(L));
      out.set_u32("general.quantization_version", 2);
    }
    const int64_t tokens = gemma4::add_gemma4_tokenizer(file, out);

    // The tensors the drafter needs (names after an optional "model."), with their shapes; any other
    // tensor is an error (the layers are Q-only).
    std::map<std::string, std::vector<int64_t>> need = {
        {"embed_tokens.weight", {c.vocab, c.hidden}}, {"norm.weight", {c.hidden}},
        {"pre_projection.weight", {c.hidden, 2 * c.backbone}}, {"post_projection.weight", {c.backbone, c.hidden}}};
    if (c.has_centroids) {
      need["masked_embedding.centroids.weight"] = {c.centroids, c.hidden};
      need["masked_embedding.token_ordering"] = {c.vocab};
    }
    for (int64_t l = 0; l < L; ++l) {
      const int64_t D = c.layers[static_cast<size_t>(l)].head_dim, I = c.layers[static_cast<size_t>(l)].ffn;
      auto n = [&](const char* s) { return "layers." + std::to_string(l) + "." + s; };
      for (const char* s : {"input_layernorm.weight", "post_attention_layernorm.weight",
                            "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"})
        need[n(s)] = {c.hidden};
      need[n("self_attn.q_proj.weight")] = {c.heads * D, c.hidden};
      need[n("self_attn.q_norm.weight")] = {D};
      need[n("self_attn.o_proj.weight")] = {c.hidden, c.heads * D};
      need[n("mlp.gate_proj.weight")] = {I, c.hidden};
      need[n("mlp.up_proj.weight")] = {I, c.hidden};
      need[n("mlp.down_proj.weight")] = {c.hidden, I};
      need[n("layer_scalar")] = {1};
    }
    // The drafter-only tensors: (seed name, upstream name; empty = dropped).
    static const std::map<std::string, std::pair<std::string, std::string>> own = {
        {"pre_projection.weight", {"assist_pre_proj.weight", "nextn.pre_projection.weight"}},
        {"post_projection.weight", {"assist_post_proj.weight", "nextn.post_projection.weight"}},
        {"masked_embedding.centroids.weight", {"assist_embed_centroids.weight", ""}},
        {"masked_embedding.token_ordering", {"assist_token_ordering.weight", ""}}};

    std::vector<ConvertTensor> plan{gemma4::rope_freqs(k.head_dim_full, c.rope_full.rotated_pairs)};
    std::map<std::string, bool> found;
    for (const TensorInfo& t : file.tensors()) {
      const std::string hf = t.name.rfind("model.", 0) == 0 ? t.name.substr(6) : t.name;
      if (hf == "lm_head.weight") continue;  // tied to the embedding
      auto shape = need.find(hf);
      if (shape == need.end())
        fail("{}: tensor '{}' is not part of a gemma4-assistant drafter (its layers are Q-only, without K/V "
             "projections; expected embed_tokens, norm, pre/post_projection, masked_embedding.* and per layer "
             "q_proj, q_norm, o_proj, the four layer norms, mlp.* and layer_scalar)", where, t.name);
      const std::vector<int64_t> has = t.shape.empty() ? std::vector<int64_t>{1} : t.shape;
      if (has != shape->second)
        fail("{}: tensor '{}' has shape {}, but the drafter's configuration needs {}", where, t.name, shape_str(has),
             shape_str(shape->second));
      found[hf] = true;
      std::string name;
      if (auto o = own.find(hf); o != own.end()) name = seed ? o->second.first : o->second.second;
      else name = gemma4::gguf_name_of(hf);
      if (name.empty()) continue;  // upstream drops the centroid head
      ConvertTensor out_t = gemma4::from_file(file, t, name, tokens);
      // The centroids stay F32 as in the seed's files: a handful of centroid scores picks the clusters.
      if (name == "assist_embed_centroids.weight") out_t.keep_f32 = true;
      plan.push_back(std::move(out_t));
    }
    for (const auto& [hf, shape] : need)
      if (!found.count(hf) && !hf.ends_with("layer_scalar"))
        fail("{}: tensor '{}{}' is missing; the drafter's configuration needs it with shape {}", where,
             own.count(hf) ? "" : "model.", hf, shape_str(shape));
    return plan;
  }
};

}  // namespace

std::unique_ptr<Converter> make_converter() { return std::make_unique<AssistantConverter>(); }

}  // namespace specula::gemma4_assistant

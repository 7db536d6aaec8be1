// Hyper-parameters of a gemma4-assistant drafter, read the way plugins/gemma4/config.cpp reads a
// target: GGUF keys under "gemma4-assistant." (with llama.cpp's rope_freqs encoding of proportional
// RoPE) or config.json's text_config (rope_parameters per attention type).
#include <cmath>

#include "assistant.hpp"
#include "rope.hpp"
#include "specula/error.hpp"
#include "specula/metadata.hpp"

namespace specula::gemma4_assistant {
namespace {

using json = nlohmann::json;

constexpr const char* kArch = "gemma4-assistant";

void finish(Config& c, const std::string& where) {
  if (c.layers.empty()) fail("{}: the drafter has no layers", where);
  require_range(c.hidden, 1, limits::kWidth, "the hidden size", where);
  require_range(c.backbone, 1, limits::kWidth, "the backbone hidden size", where);
  require_range(c.heads, 1, limits::kHeads, "the attention head count", where);
  require_range(c.vocab, 1, limits::kTokens, "the vocabulary size", where);
  if (c.backbone == c.hidden)
    fail("{}: backbone hidden size {} equals the drafter's hidden size; a gemma4-assistant file states the "
         "target's width (embedding_length_out / backbone_hidden_size)", where, c.backbone);
  for (size_t l = 0; l < c.layers.size(); ++l) {
    require_range(c.layers[l].head_dim, 1, limits::kHeadDim, fmt::format("the head dim of layer {}", l), where);
    require_range(c.layers[l].ffn, 1, limits::kWidth, fmt::format("the feed-forward width of layer {}", l), where);
  }
  bool sliding = false;
  for (const Layer& l : c.layers) sliding = sliding || !l.full;
  if (sliding && c.window <= 0) fail("{}: sliding window is {}, expected > 0", where, c.window);
  if (c.has_centroids) {
    require_positive(c.centroids, "num_centroids", where);
    if (c.vocab % c.centroids != 0)
      fail("{}: vocabulary {} is not a multiple of num_centroids {}", where, c.vocab, c.centroids);
    if (c.centroid_top_k <= 0 || c.centroid_top_k > c.centroids)
      fail("{}: centroid_intermediate_top_k {} must be in [1, num_centroids = {}]", where, c.centroid_top_k,
           c.centroids);
  }
}

Config from_gguf(const ModelFile& file) {
  const std::string where = file.path().string();
  const json& md = file.metadata();
  GgufKeys k(md, where, kArch);
  Config c;
  const int64_t L = k.required_int("block_count", 1, limits::kLayers);
  c.hidden = k.required_int("embedding_length", 1, limits::kWidth);
  // Upstream llama.cpp states the backbone as embedding_length_out, the fork converter (seed) as
  // backbone_hidden_size; either is accepted, both must agree.
  const int64_t out = k.optional_int("embedding_length_out", 0), bb = k.optional_int("backbone_hidden_size", 0);
  if (out == 0 && bb == 0)
    fail("{}: metadata keys '{}.embedding_length_out' and '{}.backbone_hidden_size' are both missing; one "
         "must state the target's hidden size", where, kArch, kArch);
  if (out != 0 && bb != 0 && out != bb)
    fail("{}: '{}.embedding_length_out' = {} but '{}.backbone_hidden_size' = {}", where, kArch, out, kArch, bb);
  c.backbone = out != 0 ? out : bb;
  c.context = k.optional_int("context_length", 131072);
  c.heads = k.required_int("attention.head_count", 1, limits::kHeads);
  const int64_t hd_full = k.required_int("attention.key_length", 1, limits::kHeadDim);
  const int64_t hd_swa = k.required_int("attention.key_length_swa", 1, limits::kHeadDim);
  c.window = k.optional_int("attention.sliding_window", 0, 0, limits::kTokens);
  c.eps = k.optional_float("attention.layer_norm_rms_epsilon", 1e-6f);
  if (const float cap = k.optional_float("final_logit_softcapping", 0.0f); cap != 0.0f)
    fail("{}: '{}.final_logit_softcapping' = {}; Gemma 4 drafters have no logit softcap", where, kArch, cap);
  const auto ffn = k.per_layer("feed_forward_length", static_cast<size_t>(L));
  const json* pattern = k.find("attention.sliding_window_pattern");
  if (!pattern) fail("{}: metadata key '{}.attention.sliding_window_pattern' is missing", where, kArch);
  c.layers.resize(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    bool sliding;
    if (pattern->is_array()) {
      if (pattern->size() != static_cast<size_t>(L))
        fail("{}: attention.sliding_window_pattern has {} entries for {} layers", where, pattern->size(), L);
      const json& e = (*pattern)[static_cast<size_t>(l)];
      sliding = e.is_boolean() ? e.get<bool>() : k.integer(e, "attention.sliding_window_pattern") != 0;
    } else {
      const int64_t period = k.integer(*pattern, "attention.sliding_window_pattern");
      sliding = period <= 0 || (l + 1) % period != 0;
    }
    Layer& ly = c.layers[static_cast<size_t>(l)];
    ly.full = !sliding;
    ly.head_dim = ly.full ? hd_full : hd_swa;
    ly.ffn = ffn[static_cast<size_t>(l)];
  }
  const TensorInfo* embd = file.find("token_embd.weight");
  if (!embd || embd->shape.size() != 2)
    fail("{}: tensor 'token_embd.weight' is missing or not 2-D; the drafter's LM head needs it as [vocab, {}]",
         where, c.hidden);
  c.vocab = embd->shape[0];

  // RoPE exactly as the target reads it (the shared reader of plugins/gemma4/rope.hpp).
  const gemma4::Ropes rope = gemma4::rope_from_gguf(k, file, hd_swa, hd_full, where);
  c.rope_sliding = rope.sliding;
  c.rope_full = rope.full;

  // Centroid head: fork keys (seed) and tensors; ollama files carry only the tensors.
  const TensorInfo* cent = file.find("assist_embed_centroids.weight");
  const bool seed = cent || file.find("assist_pre_proj.weight");
  if (!cent) cent = file.find("masked_embd_centroids.weight");
  c.layout = seed ? "gguf-seed" : file.find("masked_embd_centroids.weight") ? "gguf-ollama" : "gguf";
  c.has_centroids = cent != nullptr;
  if (cent) {
    const int64_t from_tensor = cent->shape.size() == 2 ? cent->shape[0] : 0;
    c.centroids = k.optional_int("assistant.num_centroids", from_tensor);
    c.centroid_top_k = k.optional_int("assistant.centroid_intermediate_top_k", 32);
    c.use_ordered_embeddings = k.optional_bool("assistant.use_ordered_embeddings", true);
  }
  finish(c, where);
  return c;
}

Config from_hf(const ModelFile& file) {
  const std::string where = file.path().string() + "/config.json";
  const json& md = file.metadata();
  auto cit = md.find("config");
  if (cit == md.end() || !cit->is_object()) fail("{}: missing or not a JSON object", where);
  const json& root = *cit;
  if (!root.contains("text_config") || !root["text_config"].is_object())
    fail("{}: text_config is missing; a Gemma4AssistantForCausalLM config nests the decoder there", where);
  const json& tc = root["text_config"];
  const JsonFields top_fields(root, where), text_fields(tc, where, "text_config.");
  auto top = [&](const char* key, auto fallback) { return top_fields.get(key, fallback); };
  auto txt = [&](const char* key, auto fallback) { return text_fields.get(key, fallback); };

  Config c;
  c.layout = "hf";
  c.backbone = top("backbone_hidden_size", int64_t{1536});
  c.use_ordered_embeddings = top("use_ordered_embeddings", false);
  c.centroids = top("num_centroids", int64_t{2048});
  c.centroid_top_k = top("centroid_intermediate_top_k", int64_t{32});
  c.vocab = text_fields.integer("vocab_size", 262144, 1, limits::kTokens);
  c.hidden = text_fields.integer("hidden_size", 256, 1, limits::kWidth);
  const int64_t ffn = text_fields.integer("intermediate_size", 2048, 1, limits::kWidth);
  const int64_t L = text_fields.integer("num_hidden_layers", 4, 1, limits::kLayers);
  c.heads = text_fields.integer("num_attention_heads", 4, 1, limits::kHeads);
  const int64_t hd_swa = text_fields.integer("head_dim", 256, 1, limits::kHeadDim);
  const int64_t hd_full = text_fields.integer("global_head_dim", 512, 1, limits::kHeadDim);
  c.eps = txt("rms_norm_eps", 1e-6f);
  c.window = text_fields.integer("sliding_window", 512, 0, limits::kTokens);
  c.context = txt("max_position_embeddings", int64_t{131072});
  if (const float cap = txt("final_logit_softcapping", 0.0f); cap != 0.0f)
    fail("{}: text_config.final_logit_softcapping = {}; Gemma 4 drafters have no logit softcap", where, cap);
  if (const std::string act = txt("hidden_activation", std::string("gelu_pytorch_tanh")); act != "gelu_pytorch_tanh")
    fail("{}: text_config.hidden_activation '{}' is not supported; Gemma 4 uses gelu_pytorch_tanh", where, act);
  // transformers' validate_architecture: no per-layer inputs, no MoE, no double-wide MLP.
  if (txt("hidden_size_per_layer_input", int64_t{0}) != 0 || txt("enable_moe_block", false) ||
      txt("use_double_wide_mlp", false))
    fail("{}: text_config enables per-layer inputs, MoE or a double-wide MLP; a Gemma 4 assistant has none", where);

  std::vector<std::string> types = txt("layer_types", std::vector<std::string>{});
  if (types.empty())
    for (int64_t l = 0; l < L; ++l) types.push_back(l + 1 == L ? "full_attention" : "sliding_attention");
  if (types.size() != static_cast<size_t>(L))
    fail("{}: text_config.layer_types has {} entries for num_hidden_layers = {}", where, types.size(), L);
  c.layers.resize(static_cast<size_t>(L));
  for (size_t l = 0; l < types.size(); ++l) {
    if (types[l] != "full_attention" && types[l] != "sliding_attention")
      fail("{}: text_config.layer_types[{}] is '{}', expected full_attention or sliding_attention", where, l, types[l]);
    c.layers[l] = {types[l] == "full_attention", types[l] == "full_attention" ? hd_full : hd_swa, ffn};
  }

  // RoPE per attention type, as the target reads it.
  const gemma4::Ropes rope = gemma4::rope_from_hf(tc, hd_swa, hd_full, where, "text_config.");
  c.rope_sliding = rope.sliding;
  c.rope_full = rope.full;

  auto find = [&](const std::string& n) -> const TensorInfo* {
    for (const char* p : {"", "model."})
      if (const TensorInfo* t = file.find(p + n)) return t;
    return nullptr;
  };
  c.has_centroids = find("masked_embedding.centroids.weight") != nullptr;
  finish(c, where);
  return c;
}

}  // namespace

bool is_assistant(const ModelFile& file) {
  return file.architecture() == (file.format() == "gguf" ? kArch : "gemma4_assistant");
}

Config read_config(const ModelFile& file) {
  if (!is_assistant(file))
    fail("gemma4-assistant: {} is not a Gemma 4 assistant drafter (GGUF general.architecture "
         "'gemma4-assistant' or config.json model_type 'gemma4_assistant')", file.path().string());
  return file.format() == "gguf" ? from_gguf(file) : from_hf(file);
}

json Config::to_json() const {
  json ls = json::array();
  for (const Layer& l : layers) ls.push_back({{"type", l.full ? "full" : "sliding"}, {"head_dim", l.head_dim}, {"ffn", l.ffn}});
  return {{"layout", layout}, {"hidden", hidden}, {"backbone", backbone}, {"vocab", vocab}, {"heads", heads},
          {"window", window}, {"layers", ls}, {"centroids", has_centroids ? centroids : 0},
          {"centroid_top_k", centroid_top_k}, {"use_ordered_embeddings", use_ordered_embeddings},
          {"rope_full", {{"theta", rope_full.theta}, {"rotated_pairs", rope_full.rotated_pairs}}},
          {"rope_sliding", {{"theta", rope_sliding.theta}, {"rotated_pairs", rope_sliding.rotated_pairs}}}};
}

Options parse_options(const json& options) {
  Options o;
  if (options.is_null()) return o;
  if (!options.is_object()) fail("gemma4-assistant: drafter options must be a mapping, got {}", json_text(options));
  for (const auto& [key, v] : options.items()) {
    if (key == "head") {
      if (!v.is_string() || (v != "auto" && v != "dense" && v != "centroid"))
        fail("gemma4-assistant: option head = {}; expected auto, dense or centroid", json_text(v));
      o.head = v.get<std::string>();
    } else if (key == "query_position") {
      if (!v.is_string() || (v != "p" && v != "p-1"))
        fail("gemma4-assistant: option query_position = {}; expected \"p\" (HF, llama.cpp) or \"p-1\" (vLLM, sglang)",
             json_text(v));
      o.query_offset = v == "p" ? 0 : 1;
    } else {
      fail("gemma4-assistant: unknown option '{}' (known: head, query_position)", key);
    }
  }
  return o;
}

const OptionSchema& option_schema() {
  static const OptionSchema schema = {
      {"head", OptionType::String, "LM head: auto = centroid when the file has centroids and ordered embeddings",
       "auto", std::nullopt, std::nullopt, {"auto", "dense", "centroid"}},
      {"query_position", OptionType::String, "query RoPE position: p (HF, llama.cpp) or p-1 (vLLM, sglang)", "p",
       std::nullopt, std::nullopt, {"p", "p-1"}},
  };
  return schema;
}

void check_pairing(const Config& c, const Options& o, const ModelInfo& target, const std::string& where) {
  if (target.hidden_size > 0 && target.hidden_size != c.backbone)
    fail("{}: the drafter's backbone hidden size is {} but the target ({}) has hidden size {}; this drafter "
         "belongs to another target", where, c.backbone, target.architecture, target.hidden_size);
  if (target.vocab_size > 0 && target.vocab_size != c.vocab)
    fail("{}: the drafter's vocabulary has {} tokens but the target's has {}", where, c.vocab, target.vocab_size);
  if (o.head == "centroid" && !c.has_centroids)
    fail("{}: option head = centroid, but the file has no centroid tensors (masked_embedding.centroids / "
         "assist_embed_centroids); use head: dense or auto", where);
  // Each drafter layer reads the KV cache of the target's last layer of its attention type.
  const auto layers = target.details.is_object() ? target.details.value("layers", json::array()) : json::array();
  if (!layers.is_array() || layers.empty()) return;
  for (size_t l = 0; l < c.layers.size(); ++l) {
    const std::string type = c.layers[l].full ? "full" : "sliding";
    int64_t head_dim = -1;
    for (const auto& tl : layers) {
      if (tl.is_object() && tl.value("type", "") == type) head_dim = tl.value("head_dim", int64_t{-1});
    }
    if (head_dim < 0)
      fail("{}: drafter layer {} reads the target's {} attention KV cache, but the target ({}) has no {} attention "
           "layer; this drafter belongs to another target", where, l, type, target.architecture, type);
    if (head_dim != c.layers[l].head_dim)
      fail("{}: drafter layer {} has head dim {} but the target's {} attention KV cache has head dim {}; this "
           "drafter belongs to another target", where, l, c.layers[l].head_dim, type, head_dim);
  }
}

void check(const ModelFile& file, const ModelInfo& target, const nlohmann::json& options) {
  check_pairing(read_config(file), parse_options(options), target, file.path().string());
}

}  // namespace specula::gemma4_assistant

#include "config.hpp"

#include <cmath>
#include <limits>

#include "specula/error.hpp"
#include "specula/metadata.hpp"

namespace specula::gemma4 {
namespace {

using json = nlohmann::json;

std::string where_of(const ModelFile& file) { return file.path().string(); }

}  // namespace

void finish_layers(Config& c, const std::string& where) {
  const int64_t L = static_cast<int64_t>(c.layers.size());
  if (L == 0) fail("{}: the model has no layers", where);
  if (!c.layers.back().full)
    fail("{}: the last layer ({}) is sliding; Gemma 4 always ends with a full-attention layer", where, L - 1);
  if (c.shared_kv_layers < 0 || c.shared_kv_layers >= L)
    fail("{}: {} KV-shared layers for {} layers; expected 0 <= shared < layers", where, c.shared_kv_layers, L);
  require_range(c.heads, 1, limits::kHeads, "the attention head count", where);
  for (int64_t l = 0; l < L; ++l) {
    LayerConfig& lc = c.layers[l];
    require_range(lc.head_dim, 1, limits::kHeadDim, fmt::format("the head dim of layer {}", l), where);
    require_range(lc.kv_heads, 1, limits::kHeads, fmt::format("the KV head count of layer {}", l), where);
    require_range(lc.ffn, 1, limits::kWidth, fmt::format("the feed-forward width of layer {}", l), where);
    if (c.heads % lc.kv_heads != 0)
      fail("{}: layer {} has {} query heads, not a multiple of its {} KV heads", where, l, c.heads, lc.kv_heads);
    lc.producer = -1;
    if (c.shared_kv_layers > 0 && l >= c.first_shared()) {
      // The last earlier non-shared layer of the same attention type (transformers' rule).
      for (int64_t p = c.first_shared() - 1; p >= 0; --p)
        if (c.layers[p].full == lc.full) {
          lc.producer = static_cast<int>(p);
          break;
        }
      if (lc.producer < 0)
        fail("{}: KV-shared layer {} ({}) has no earlier non-shared layer of its type to read from", where, l,
             lc.full ? "full" : "sliding");
      const LayerConfig& p = c.layers[lc.producer];
      if (p.head_dim != lc.head_dim || p.kv_heads != lc.kv_heads)
        fail("{}: KV-shared layer {} and its producer {} disagree on head dim or KV heads", where, l, lc.producer);
    }
  }
  if (c.window <= 0) fail("{}: sliding window is {}, expected > 0", where, c.window);
  require_range(c.vocab, 1, limits::kTokens, "the vocabulary size", where);
  require_range(c.hidden, 1, limits::kWidth, "the hidden size", where);
  if (c.experts > 0 && (c.experts_used <= 0 || c.experts_used > c.experts || c.expert_ffn <= 0))
    fail("{}: MoE with {} experts, {} used per token and expert width {} is inconsistent", where, c.experts,
         c.experts_used, c.expert_ffn);
}

Config config_from_gguf(const ModelFile& file) {
  const std::string where = where_of(file);
  const json& md = file.metadata();
  auto arch_it = md.find("general.architecture");
  if (arch_it == md.end() || !arch_it->is_string())
    fail("{}: metadata key 'general.architecture' is missing", where);
  GgufKeys k(md, where, arch_it->get<std::string>());

  Config c;
  const int64_t L = k.required_int("block_count", 1, limits::kLayers);
  c.hidden = k.required_int("embedding_length", 1, limits::kWidth);
  // Any length is read; the context a run asks for is checked against memory when it is created.
  c.context = k.required_int("context_length", 1, std::numeric_limits<int64_t>::max());
  c.context_key = fmt::format("{}.context_length", k.arch());
  c.heads = k.required_int("attention.head_count", 1, limits::kHeads);
  c.head_dim_full = k.required_int("attention.key_length", 1, limits::kHeadDim);
  c.head_dim_sliding = k.required_int("attention.key_length_swa", 1, limits::kHeadDim);
  if (k.optional_int("attention.value_length", c.head_dim_full) != c.head_dim_full ||
      k.optional_int("attention.value_length_swa", c.head_dim_sliding) != c.head_dim_sliding)
    fail("{}: attention.value_length(_swa) differs from key_length(_swa); Gemma 4 uses equal K and V head dims",
         where);
  c.window = k.required_int("attention.sliding_window", 1, limits::kTokens);
  c.eps = k.optional_float("attention.layer_norm_rms_epsilon", 1e-6f);
  c.ple = k.required_int("embedding_length_per_layer_input", 0, limits::kWidth);
  c.shared_kv_layers = k.optional_int("attention.shared_kv_layers", 0);
  c.softcap = k.optional_float("final_logit_softcapping", 0.0f);
  c.experts = k.optional_int("expert_count", 0, 0, limits::kExperts);
  c.experts_used = k.optional_int("expert_used_count", 0);
  c.expert_ffn = k.optional_int("expert_feed_forward_length", 0, 0, limits::kWidth);

  const auto ffn = k.per_layer("feed_forward_length", L, true, 0);
  const auto kv = k.per_layer("attention.head_count_kv", L, false, c.heads);
  const json* pattern = k.find("attention.sliding_window_pattern");
  if (!pattern) fail("{}: metadata key '{}.attention.sliding_window_pattern' is missing", where, k.arch());
  c.layers.resize(L);
  for (int64_t l = 0; l < L; ++l) {
    bool sliding;
    if (pattern->is_array()) {
      if (pattern->size() != static_cast<size_t>(L))
        fail("{}: attention.sliding_window_pattern has {} entries for {} layers", where, pattern->size(), L);
      const json& e = (*pattern)[l];
      sliding = e.is_boolean() ? e.get<bool>() : k.integer(e, "attention.sliding_window_pattern") != 0;
    } else {
      const int64_t period = k.integer(*pattern, "attention.sliding_window_pattern");
      sliding = period <= 0 || (l + 1) % period != 0;
    }
    LayerConfig& lc = c.layers[l];
    lc.full = !sliding;
    lc.head_dim = lc.full ? c.head_dim_full : c.head_dim_sliding;
    lc.kv_heads = kv[l];
    lc.ffn = ffn[l];
  }

  // Token count from the embedding table (GGUF has no vocab_size key).
  const TensorInfo* embd = file.find("token_embd.weight");
  if (!embd || embd->shape.size() != 2) fail("{}: tensor 'token_embd.weight' is missing or not 2-D", where);
  c.vocab = embd->shape[0];

  // Sliding layers: plain NeoX RoPE. Full layers: proportional RoPE (rope_freqs; rope.hpp).
  const Ropes rope = rope_from_gguf(k, file, c.head_dim_sliding, c.head_dim_full, where);
  c.rope_sliding = rope.sliding;
  c.rope_full = rope.full;

  if (auto it = md.find("tokenizer.ggml.eos_token_id"); it != md.end() && it->is_number())
    c.eos.push_back(it->get<int32_t>());
  if (auto it = md.find("tokenizer.ggml.tokens"); it != md.end() && it->is_array()) {
    // llama.cpp's end-of-generation set for gemma4: <eos>, <turn|>, <|tool_response>.
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      if (t.is_string() && (t == "<turn|>" || t == "<|tool_response>" || t == "<eos>")) {
        const int32_t id = static_cast<int32_t>(i);
        if (std::find(c.eos.begin(), c.eos.end(), id) == c.eos.end()) c.eos.push_back(id);
      }
    }
  }
  finish_layers(c, where);
  return c;
}

Config config_from_hf(const ModelFile& file) {
  const std::string where = where_of(file) + "/config.json";
  const json& md = file.metadata();
  auto cit = md.find("config");
  if (cit == md.end() || !cit->is_object()) fail("{}: missing or not a JSON object", where);
  const json& root = *cit;
  const json& tc = root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;
  JsonFields k(tc, where, &tc != &root ? "text_config." : "");

  Config c;
  c.vocab = k.integer("vocab_size", 262144, 1, limits::kTokens);
  c.hidden = k.integer("hidden_size", 2304, 1, limits::kWidth);
  const int64_t ffn = k.integer("intermediate_size", 9216, 1, limits::kWidth);
  const int64_t L = k.integer("num_hidden_layers", 30, 1, limits::kLayers);
  c.heads = k.integer("num_attention_heads", 8, 1, limits::kHeads);
  const int64_t kv = k.integer("num_key_value_heads", 4, 1, limits::kHeads);
  c.head_dim_sliding = k.integer("head_dim", 256, 1, limits::kHeadDim);
  c.head_dim_full = k.integer("global_head_dim", 512, 1, limits::kHeadDim);
  c.k_eq_v = k.get<bool>("attention_k_eq_v", false);
  const int64_t kv_global = c.k_eq_v ? k.get<int64_t>("num_global_key_value_heads", kv) : kv;
  c.eps = k.get<float>("rms_norm_eps", 1e-6f);
  c.window = k.integer("sliding_window", 512, 1, limits::kTokens);
  if (k.get<std::string>("use_bidirectional_attention", "") == "all") c.window = c.window / 2 + 1;
  c.context = k.integer("max_position_embeddings", 131072, 1, std::numeric_limits<int64_t>::max());
  c.context_key = fmt::format("{} {}max_position_embeddings", where, &tc != &root ? "text_config." : "");
  c.softcap = k.get<float>("final_logit_softcapping", 0.0f);
  c.ple = k.integer("hidden_size_per_layer_input", 256, 0, limits::kWidth);  // the default is 256, not 0
  c.shared_kv_layers = k.get<int64_t>("num_kv_shared_layers", 0);
  const bool double_wide = k.get<bool>("use_double_wide_mlp", false);
  if (k.get<bool>("enable_moe_block", false)) {
    c.experts = k.integer("num_experts", 0, 0, limits::kExperts);
    c.experts_used = k.get<int64_t>("top_k_experts", 0);
    c.expert_ffn = k.integer("moe_intermediate_size", 0, 0, limits::kWidth);
  }
  if (const std::string act = k.get<std::string>("hidden_activation", "gelu_pytorch_tanh");
      act != "gelu_pytorch_tanh")
    fail("{}: hidden_activation '{}' is not supported; Gemma 4 uses gelu_pytorch_tanh", where, act);

  std::vector<std::string> types;
  if (auto it = tc.find("layer_types"); it != tc.end() && !it->is_null()) {
    types = k.get<std::vector<std::string>>("layer_types", {});
    if (types.size() != static_cast<size_t>(L))
      fail("{}: layer_types has {} entries for num_hidden_layers = {}", where, types.size(), L);
  } else {
    for (int64_t l = 0; l < L; ++l) types.push_back((l + 1) % 6 == 0 ? "full_attention" : "sliding_attention");
  }
  types.back() = "full_attention";  // transformers forces the last layer to full attention
  c.layers.resize(L);
  for (int64_t l = 0; l < L; ++l) {
    if (types[l] != "full_attention" && types[l] != "sliding_attention")
      fail("{}: layer_types[{}] is '{}', expected full_attention or sliding_attention", where, l, types[l]);
    LayerConfig& lc = c.layers[l];
    lc.full = types[l] == "full_attention";
    lc.head_dim = lc.full ? c.head_dim_full : c.head_dim_sliding;
    lc.kv_heads = lc.full ? kv_global : kv;
    lc.ffn = (double_wide && c.shared_kv_layers > 0 && l >= L - c.shared_kv_layers) ? 2 * ffn : ffn;
  }

  // RoPE per attention type (modeling_rope_utils: "default" and "proportional").
  const Ropes rope = rope_from_hf(tc, c.head_dim_sliding, c.head_dim_full, where, "");
  c.rope_sliding = rope.sliding;
  c.rope_full = rope.full;

  auto add_eos = [&](const json& v) {
    if (v.is_number_integer()) c.eos.push_back(v.get<int32_t>());
    if (v.is_array())
      for (const json& e : v)
        if (e.is_number_integer()) c.eos.push_back(e.get<int32_t>());
  };
  if (auto g = md.find("generation_config"); g != md.end() && g->is_object() && g->contains("eos_token_id"))
    add_eos((*g)["eos_token_id"]);
  else if (root.contains("eos_token_id"))
    add_eos(root["eos_token_id"]);
  else
    add_eos(tc.value("eos_token_id", json(1)));
  finish_layers(c, where);
  return c;
}

nlohmann::json Config::to_json() const {
  json layers_json = json::array();
  for (const LayerConfig& l : layers)
    layers_json.push_back({{"type", l.full ? "full" : "sliding"}, {"head_dim", l.head_dim},
                           {"kv_heads", l.kv_heads}, {"ffn", l.ffn}, {"kv_from", l.producer}});
  return {{"hidden", hidden}, {"heads", heads}, {"vocab", vocab}, {"window", window}, {"context", context},
          {"per_layer_input", ple}, {"shared_kv_layers", shared_kv_layers}, {"experts", experts},
          {"experts_used", experts_used}, {"expert_ffn", expert_ffn}, {"final_logit_softcap", softcap},
          {"rope_sliding", {{"theta", rope_sliding.theta}, {"rotated_pairs", rope_sliding.rotated_pairs}}},
          {"rope_full", {{"theta", rope_full.theta}, {"rotated_pairs", rope_full.rotated_pairs}}},
          {"layers", layers_json}};
}

}  // namespace specula::gemma4

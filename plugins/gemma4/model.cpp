#include "model.hpp"

#include "chat_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "specula/error.hpp"
#include "specula/batched_model.hpp"
#include "specula/log.hpp"
#include "specula/metadata.hpp"
#include "specula/tokenizer.hpp"

namespace specula::gemma4 {
namespace {

// Rounds to `significant` bits of mantissa, ties to even (bf16: 8, f16: 11).
float round_mantissa(float x, int significant) {
  int e = 0;
  const double m = std::frexp(static_cast<double>(x), &e);
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(m, significant)), e - significant));
}

constexpr int64_t kMaxChunk = 65536;  // prefill_chunk: tokens per graph run

// Everything the constructor decides from the metadata and the options, before a weight is loaded.
struct Checked {
  Config cfg;
  int64_t chunk = 256;
  DType cache_type = DType::F32;
  float embed_scale = 1.0f, ple_scale = 1.0f;
  ModelInfo info;
};

Checked check_model(const ModelFile& file, const ComputeBackend& backend, const nlohmann::json& options_in) {
  const nlohmann::json options = options_in.is_object() ? options_in : nlohmann::json::object();
  Checked c;
  const bool gguf = file.format() == "gguf";
  c.cfg = gguf ? config_from_gguf(file) : config_from_hf(file);
  const Weights w = check_weights(file, c.cfg);  // every tensor present and shaped as the config says
  c.chunk = options.value("prefill_chunk", int64_t{256});
  if (c.chunk < 1 || c.chunk > kMaxChunk)
    fail("gemma4: option prefill_chunk = {} must be between 1 and {}", c.chunk, kMaxChunk);
  const std::string cache_type = options.value("kv_cache_type", std::string("F32"));
  auto ct = dtype_from_name(cache_type);
  if (!ct || (*ct != DType::F32 && *ct != DType::F16 && *ct != DType::BF16))
    fail("gemma4: option kv_cache_type = '{}'; expected F32, F16 or BF16", cache_type);
  for (Op op : {Op::WriteRows, Op::Attention}) {
    const Support s = backend.supports(op, *ct);
    if (!s.ok)
      fail("gemma4: option kv_cache_type = '{}': backend '{}' cannot run {} on {}: {}", cache_type, backend.name(),
           op_name(op), cache_type, s.reason);
  }
  c.cache_type = *ct;
  std::string mode = options.value("embedding_scale", std::string("auto"));
  if (mode == "auto") mode = gguf ? "exact" : "dtype";
  if (mode != "exact" && mode != "bf16" && mode != "dtype")
    fail("gemma4: option embedding_scale = '{}'; expected auto, exact, bf16 or dtype", mode);
  c.embed_scale = embedding_scale(c.cfg.hidden, w.embed_type, mode);
  c.ple_scale = c.cfg.ple > 0 ? embedding_scale(c.cfg.ple, w.embed_type, mode) : 1.0f;
  c.info.architecture = "gemma4";
  c.info.vocab_size = c.cfg.vocab;
  c.info.hidden_size = c.cfg.hidden;
  c.info.context_length = c.cfg.context;
  c.info.end_tokens = c.cfg.eos;
  c.info.details = c.cfg.to_json();
  c.info.details["format"] = file.format();
  c.info.details["embedding_scale"] = c.embed_scale;
  return c;
}

class Gemma4Model final : public BatchedModel {
 public:
  Gemma4Model(std::shared_ptr<const ModelFile> file, std::shared_ptr<ComputeBackend> backend,
              const nlohmann::json& options, const ModelParts& parts)
      : BatchedModel("gemma4", backend), file_(std::move(file)), backend_(std::move(backend)) {
    const Checked c = check_model(*file_, *backend_, options);
    cfg_ = c.cfg;
    w_ = load_weights(*file_, cfg_, *backend_);
    head_weights_ = {w_.embed, cfg_.softcap, {}, 0};  // the tied head
    head_ = choose_lm_head(parts.lm_head, head_weights_, "gemma4");
    set_attention(parts.attention);
    chunk_ = c.chunk;
    cache_type_ = c.cache_type;
    embed_scale_ = c.embed_scale;
    ple_scale_ = c.ple_scale;

    if (cfg_.experts > 0) {
      // One-hot rows [E, 1, E]: MatMulId with them picks the router logits of the chosen experts.
      const int64_t E = cfg_.experts;
      onehot_ = backend_->allocate("gemma4.expert_onehot", DType::F32, {E, 1, E});
      std::vector<float> eye(E * E, 0.0f);
      for (int64_t e = 0; e < E; ++e) eye[e * E + e] = 1.0f;
      backend_->write(*onehot_, bytes_of(eye));
    }

    // One cache layer per layer that stores K/V; KV-shared layers read their producer's.
    KvCacheSpec cache;
    cache.name = "gemma4.cache";
    cache.type = cache_type_;
    cache.step_tokens = chunk_;
    cache.hidden_size = cfg_.hidden;
    for (size_t l = 0; l < cfg_.layers.size(); ++l) {
      const LayerConfig& lc = cfg_.layers[l];
      if (lc.producer >= 0) {
        cache_of_.push_back(cache_of_[static_cast<size_t>(lc.producer)]);
        continue;
      }
      cache_of_.push_back(cache.layers.size());
      cache.layers.push_back({lc.kv_heads, lc.head_dim, lc.full ? 0 : cfg_.window, fmt::format("gemma4.cache.{}", l)});
    }
    set_cache(std::move(cache), cfg_.vocab);

    info_ = c.info;
    info_.details["lm_head"] = head_->name();  // the parts it runs with (ModelParts)
    info_.details["attention"] = attention().name();
    try {
      tokenizer_ = make_tokenizer(*file_);
    } catch (const Error& e) {
      log_warn("gemma4: {}: no tokenizer ({}); token ids only", file_->path().string(), e.what());
    }
    if (tokenizer_) {
      try {
        chat_ = std::make_shared<Gemma4ChatFormat>(tokenizer_, Gemma4ChatFormat::options_for(*file_));
      } catch (const Error& e) {
        log_warn("gemma4: {}: no chat format ({})", file_->path().string(), e.what());
      }
    }
    log_info("gemma4: {} layers, hidden {}, vocab {}, window {}, {}{}{} ({})", cfg_.layers.size(), cfg_.hidden,
             cfg_.vocab, cfg_.window, cfg_.ple > 0 ? "per-layer embeddings, " : "",
             cfg_.shared_kv_layers > 0 ? fmt::format("{} KV-shared layers, ", cfg_.shared_kv_layers) : "",
             cfg_.experts > 0 ? fmt::format("{} experts (top {})", cfg_.experts, cfg_.experts_used) : "dense",
             file_->format());
  }

  const ModelInfo& info() const override { return info_; }
  std::shared_ptr<const Tokenizer> tokenizer() const override { return tokenizer_; }
  std::shared_ptr<const ChatFormat> chat_format() const override { return chat_; }
  std::unique_ptr<ModelContext> new_context(const ContextOptions& options) override {
    int64_t cap = options.context_length > 0 ? options.context_length : cfg_.context;
    if (cap > cfg_.context)
      fail("gemma4: context length {} exceeds the model's {} ({})", cap, cfg_.context, file_->path().string());
    check_context_fits(cap, options.context_length > 0);
    return make_context(cap);
  }

  // Before a context allocates its caches: positions are int32, and the persistent tensors must fit the
  // device. The model's own context length (or a hostile one) can ask for far more than either.
  void check_context_fits(int64_t cap, bool asked) const {
    const std::string what = asked ? fmt::format("the context length {} asked for", cap)
                                   : fmt::format("the model's context length ({} = {})", cfg_.context_key, cap);
    const char* fix = "ask for a shorter context with --context-length N (target.context_length in the pipeline)";
    if (cap > limits::kTokens)
      fail("gemma4: {} exceeds the {} positions the model can address ({}); {}", what, limits::kTokens,
           file_->path().string(), fix);
    const double bytes = cache_spec().bytes(cap);  // what the context's KvCache allocates
    const DeviceInfo device = backend_->device();
    if (device.memory_bytes > 0 && bytes > static_cast<double>(device.memory_bytes))
      fail("gemma4: {} needs {:.0f} bytes ({:.1f} GiB) of KV cache, more than the {:.1f} GiB of {} ({}); {}", what,
           bytes, bytes / (1 << 30), static_cast<double>(device.memory_bytes) / (1 << 30), device.name,
           file_->path().string(), fix);
  }

 private:
  Value mlp(Graph& g, const LayerWeights& lw, Value x) const {
    Value gate = g.gelu_tanh(g.matmul(g.constant(lw.gate), x));
    Value up = g.matmul(g.constant(lw.up), x);
    return g.matmul(g.constant(lw.down), g.mul(gate, up));
  }
  Value moe(Graph& g, const LayerWeights& lw, Value r, int64_t T) const;
  // The forward pass of a batch of sequences (BatchedModel): spec §3.
  Value build_forward(BatchGraph& batch, Value ids, std::span<const int64_t> n_logits) const override;
  size_t target_cache_layer(const std::string& attention_type) const override;
  TokenEmbedding target_embedding() const override { return {w_.embed, embed_scale_}; }

  std::shared_ptr<const ModelFile> file_;
  std::shared_ptr<ComputeBackend> backend_;
  Config cfg_;
  Weights w_;
  ModelInfo info_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<const ChatFormat> chat_;
  std::shared_ptr<const LmHead> head_;
  LmHeadWeights head_weights_;
  BackendTensorPtr onehot_;
  float embed_scale_ = 1.0f, ple_scale_ = 1.0f;
  int64_t chunk_ = 256;
  DType cache_type_ = DType::F32;
  std::vector<size_t> cache_of_;  // by layer: the cache layer it writes or reads
};

// The MoE block of 26B-A4B on the post-attention residual r [T, H] (spec 3.8).
Value Gemma4Model::moe(Graph& g, const LayerWeights& lw, Value r, int64_t T) const {
  const int64_t H = cfg_.hidden, E = cfg_.experts, K = cfg_.experts_used, Im = cfg_.expert_ffn;
  Value z = g.rms_norm(r, Value{}, cfg_.eps);
  z = g.scale(g.mul(z, g.constant(lw.router_scale)), 1.0f / std::sqrt(static_cast<float>(H)));
  Value logits = g.matmul(g.constant(lw.router), z);  // [T, E]
  Value idx = g.top_k(logits, K);                     // same order as top-k of the softmax
  // softmax over all experts, top-k, renormalise == softmax over the chosen logits.
  Value chosen = g.matmul_id(g.constant(onehot_), g.reshape(logits, {T, 1, E}), idx);  // [T, K, 1]
  Value wts = g.reshape(g.softmax(g.reshape(chosen, {T, K})), {T, K, 1});
  wts = g.mul(wts, g.get_rows(g.reshape(g.constant(lw.expert_scale), {E, 1}), idx));  // per_expert_scale
  Value xe = g.reshape(g.rms_norm(r, g.constant(lw.pre_ffw_norm_2), cfg_.eps), {T, 1, H});
  Value gate, up;
  if (lw.gate_up_exps) {
    Value gu = g.matmul_id(g.constant(lw.gate_up_exps), xe, idx);  // [T, K, 2 Im]: gate rows, then up rows
    gate = g.slice(gu, 0, Im);
    up = g.slice(gu, Im, Im);
  } else {
    gate = g.matmul_id(g.constant(lw.gate_exps), xe, idx);
    up = g.matmul_id(g.constant(lw.up_exps), xe, idx);
  }
  Value y = g.matmul_id(g.constant(lw.down_exps), g.mul(g.gelu_tanh(gate), up), idx);  // [T, K, H]
  y = g.reshape(g.mul(y, wts), {T, K * H});
  Value sum = g.slice(y, 0, H);
  for (int64_t j = 1; j < K; ++j) sum = g.add(sum, g.slice(y, j * H, H));
  return sum;
}

Value Gemma4Model::build_forward(BatchGraph& batch, Value ids, std::span<const int64_t> n_logits) const {
  Graph& g = batch.graph();
  const Config& c = cfg_;
  const int64_t T = batch.rows(), H = c.hidden, L = static_cast<int64_t>(c.layers.size()), P = c.ple;
  const Value pos = batch.positions();

  Value h = g.scale(g.get_rows(g.constant(w_.embed), ids), embed_scale_);
  Value ple;
  if (P > 0) {
    // Per-layer inputs: token part (x sqrt(P)) plus the normed projection of the scaled embedding.
    Value tok = g.scale(g.get_rows(g.constant(w_.ple_embed), ids), ple_scale_);
    Value proj = g.scale(g.matmul(g.constant(w_.ple_model_proj), h), 1.0f / std::sqrt(static_cast<float>(H)));
    proj = g.rms_norm(g.reshape(proj, {T, L, P}), g.constant(w_.ple_proj_norm), c.eps);
    ple = g.scale(g.add(g.reshape(proj, {T, L * P}), tok), 1.0f / std::sqrt(2.0f));
  }

  for (int64_t l = 0; l < L; ++l) {
    const LayerConfig& lc = c.layers[l];
    const LayerWeights& lw = w_.layers[l];
    const RopeConfig& rope = lc.full ? c.rope_full : c.rope_sliding;
    const int64_t D = lc.head_dim, KVH = lc.kv_heads;
    auto name = [&](Value v, const char* what) { return g.named(v, fmt::format("blk.{}.{}", l, what)); };

    Value x = g.rms_norm(h, g.constant(lw.attn_norm), c.eps);
    Value q = g.reshape(g.matmul(g.constant(lw.q), x), {T, c.heads, D});
    q = g.rms_norm(q, g.constant(lw.q_norm), c.eps);
    q = g.rope(q, pos, rope.rotated_pairs, rope.theta, rope.exponent_divisor, rope.freq_scale);
    Value a;
    if (lc.producer < 0) {
      Value kraw = g.reshape(g.matmul(g.constant(lw.k), x), {T, KVH, D});
      // k_eq_v: V is the raw K projection, before k_norm and RoPE.
      Value v = lw.v ? g.reshape(g.matmul(g.constant(lw.v), x), {T, KVH, D}) : kraw;
      Value k = g.rms_norm(kraw, g.constant(lw.k_norm), c.eps);
      k = g.rope(k, pos, rope.rotated_pairs, rope.theta, rope.exponent_divisor, rope.freq_scale);
      v = g.rms_norm(v, Value{}, c.eps);
      a = batch.attention(cache_of_[l], q, k, v, 1.0f);
    } else {
      a = batch.attention(cache_of_[l], q, Value{}, Value{}, 1.0f);  // over the producer's cache
    }
    a = g.rms_norm(g.matmul(g.constant(lw.o), a), g.constant(lw.post_attn_norm), c.eps);
    h = name(g.add(h, a), "attn_out");

    Value m = mlp(g, lw, g.rms_norm(h, g.constant(lw.ffn_norm), c.eps));
    if (c.experts > 0) {
      m = g.rms_norm(m, g.constant(lw.post_ffw_norm_1), c.eps);
      Value e = g.rms_norm(moe(g, lw, h, T), g.constant(lw.post_ffw_norm_2), c.eps);
      m = g.add(m, e);
    }
    h = g.add(h, g.rms_norm(m, g.constant(lw.post_ffw_norm), c.eps));

    if (P > 0) {
      Value gate = g.gelu_tanh(g.matmul(g.constant(lw.ple_gate), h));
      gate = g.mul(gate, g.slice(ple, l * P, P));
      Value p = g.rms_norm(g.matmul(g.constant(lw.ple_proj), gate), g.constant(lw.ple_post_norm), c.eps);
      h = g.add(h, p);
    }
    if (lw.layer_scalar) h = g.mul(h, g.constant(lw.layer_scalar));
    h = name(h, "out");
  }

  // Final-normed hidden states (the LM head's input), kept for drafters: MTP drafters take the normed
  // row (gemma4-assistant-spec §2.1), and the cache restores the right one after a rollback.
  Value normed = g.rms_norm(h, g.constant(w_.output_norm), c.eps);
  batch.keep_hidden(normed);
  Value rows = batch.last_rows(normed, n_logits);
  if (!rows) return {};
  return head_->build(g, rows, head_weights_).logits;
}

size_t Gemma4Model::target_cache_layer(const std::string& attention_type) const {
  if (attention_type != "full" && attention_type != "sliding")
    fail("gemma4: kv('{}'): expected 'full' or 'sliding'", attention_type);
  const bool full = attention_type == "full";
  for (size_t l = cfg_.layers.size(); l-- > 0;)  // the last layer of that type
    if (cfg_.layers[l].full == full) return cache_of_[l];
  fail("gemma4: the model has no {} attention layer", attention_type);
}

}  // namespace

float embedding_scale(int64_t n, DType type, const std::string& mode) {
  const float exact = std::sqrt(static_cast<float>(n));
  if (mode == "exact") return exact;
  if (mode == "bf16") return round_mantissa(exact, 8);
  // "dtype": transformers casts the scale to the table's dtype.
  switch (type) {
    case DType::BF16: return round_mantissa(exact, 8);
    case DType::F16: return round_mantissa(exact, 11);
    case DType::MLX_AFFINE: return round_mantissa(exact, 8);  // MLX exports of Gemma 4 compute in bf16
    default: return exact;
  }
}

bool is_gemma4(const ModelFile& file) {
  const std::string t = file.architecture();
  if (file.format() == "gguf") return t == "gemma4";
  // A multimodal config names the text model in text_config.
  const nlohmann::json cfg = file.metadata().value("config", nlohmann::json());
  const nlohmann::json text = cfg.is_object() ? cfg.value("text_config", nlohmann::json()) : nlohmann::json();
  const auto type = text.is_object() ? text.find("model_type") : text.end();
  const std::string tt = type != text.end() && type->is_string() ? type->get<std::string>() : std::string();
  return t == "gemma4" || t == "gemma4_text" || t == "gemma4_unified" || t == "gemma4_unified_text" ||
         tt == "gemma4_text" || tt == "gemma4_unified_text";
}

const OptionSchema& option_schema() {
  static const OptionSchema schema = {
      {"prefill_chunk", OptionType::Integer, "prompt tokens per graph run; also the deepest rollback a sliding-window cache allows",
       256, 1, kMaxChunk, {}},
      {"kv_cache_type", OptionType::String, "storage type of the KV cache (the backend must run WriteRows and Attention on it)",
       "F32", std::nullopt, std::nullopt, {"F32", "F16", "BF16"}},
      {"embedding_scale", OptionType::String,
       "sqrt(hidden) rounding: auto = exact for GGUF (llama.cpp), the table's dtype for safetensors/MLX (transformers)",
       "auto", std::nullopt, std::nullopt, {"auto", "exact", "bf16", "dtype"}},
  };
  return schema;
}

ModelInfo check(const ModelFile& file, const ComputeBackend& backend, const nlohmann::json& options) {
  return check_model(file, backend, options).info;
}

std::shared_ptr<Model> load_model(std::shared_ptr<const ModelFile> file, std::shared_ptr<ComputeBackend> backend,
                                  const nlohmann::json& options, const ModelParts& parts) {
  if (!file || !backend) fail("gemma4: load() needs a file and a backend");
  if (!is_gemma4(*file))
    fail("gemma4: {} is not a Gemma 4 text model (GGUF general.architecture 'gemma4' or config.json "
         "model_type 'gemma4' / 'gemma4_text')", file->path().string());
  return std::make_shared<Gemma4Model>(std::move(file), std::move(backend),
                                       options.is_object() ? options : nlohmann::json::object(), parts);
}

}  // namespace specula::gemma4

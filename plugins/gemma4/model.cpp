#include "model.hpp"

#include "chat_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/metadata.hpp"
#include "specula/tokenizer.hpp"

namespace specula::gemma4 {
namespace {

template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// Rounds to `significant` bits of mantissa, ties to even (bf16: 8, f16: 11).
float round_mantissa(float x, int significant) {
  int e = 0;
  const double m = std::frexp(static_cast<double>(x), &e);
  return static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(m, significant)), e - significant));
}

class Gemma4Model;

// One producer layer's cache: K [S, Hkv, D], V [S, Hkv, D] and the absolute position of each slot.
struct Cache {
  BackendTensorPtr k, v, pos;
  int64_t slots = 0;
  bool ring = false;  // sliding layers: slot = position % slots
};

// A graph for one (tokens, logits) shape, reused by every forward of that shape.
struct Built {
  Graph graph;
  Value ids, pos, ring_slot, iota_t, iota_h, logits;
};

class Gemma4Context final : public ModelContext, public TargetView {
 public:
  Gemma4Context(std::shared_ptr<const Gemma4Model> model, int64_t capacity);

  std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_logits) override;
  SampledToken forward_sample(std::span<const int32_t> tokens, const Sampler& sampler, const SamplingState& state,
                              float uniform, bool require_device) override;
  int64_t position() const override { return position_; }
  int64_t capacity() const override { return capacity_; }
  void truncate(int64_t pos) override;
  const TargetView& view() const override { return *this; }

  KvView kv(const std::string& attention_type) const override;
  BackendTensorPtr last_hidden() const override { return last_hidden_; }
  TokenEmbedding token_embedding() const override;

 private:
  std::vector<float> run_chunk(std::span<const int32_t> tokens, int64_t n_logits);
  void run(Built& b, std::span<const int32_t> tokens, std::vector<std::pair<Value, std::span<const std::byte>>> extra);
  void check_tokens(std::span<const int32_t> tokens, int64_t n_logits) const;
  Built& graph_for(int64_t T, int64_t n_logits);
  // The forward of T tokens ending in the sampler's device form; null (with `why`) when it has none.
  struct Sampling {
    std::unique_ptr<Built> built;  // null: the sampler or backend cannot (why says which)
    Value ids, uniform, token;
    std::string why;
  };
  Sampling& sampling_graph_for(int64_t T, const Sampler& sampler, const SamplingState& state);
  int64_t ring_slots() const;

  std::shared_ptr<const Gemma4Model> m_;
  int64_t capacity_;
  int64_t position_ = 0;
  std::vector<Cache> caches_;  // by layer; empty for KV-shared layers
  BackendTensorPtr last_hidden_;   // F32 [hidden], final-normed
  BackendTensorPtr chunk_hidden_;  // F32 [prefill_chunk, hidden]: every (normed) row of the last chunk, for rollback
  int64_t chunk_start_ = 0, chunk_len_ = 0;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Built>> graphs_;
  std::map<std::pair<int64_t, std::string>, Sampling> sampling_graphs_;  // by T and Sampler::device_key
};

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

class Gemma4Model final : public Model, public std::enable_shared_from_this<Gemma4Model> {
 public:
  Gemma4Model(std::shared_ptr<const ModelFile> file, std::shared_ptr<ComputeBackend> backend,
              const nlohmann::json& options)
      : file_(std::move(file)), backend_(std::move(backend)) {
    const Checked c = check_model(*file_, *backend_, options);
    cfg_ = c.cfg;
    w_ = load_weights(*file_, cfg_, *backend_);
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

    info_ = c.info;
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
    return std::make_unique<Gemma4Context>(shared_from_this(), cap);
  }

  // A sliding layer needs the window - 1 previous keys plus the chunk being processed.
  int64_t ring_slots() const { return cfg_.window - 1 + chunk_; }

  // Records the whole forward pass for T tokens, logits for the last n_logits of them.
  void build(Built& b, int64_t T, int64_t n_logits, const std::vector<Cache>& caches,
             const BackendTensorPtr& last_hidden, const BackendTensorPtr& chunk_hidden) const;

  const Config& cfg() const { return cfg_; }
  ComputeBackend& backend() const { return *backend_; }

  // Before a context allocates its caches: positions are int32, and the persistent tensors must fit the
  // device. The model's own context length (or a hostile one) can ask for far more than either.
  void check_context_fits(int64_t cap, bool asked) const {
    const std::string what = asked ? fmt::format("the context length {} asked for", cap)
                                   : fmt::format("the model's context length ({} = {})", cfg_.context_key, cap);
    const char* fix = "ask for a shorter context with --context-length N (target.context_length in the pipeline)";
    if (cap > limits::kTokens)
      fail("gemma4: {} exceeds the {} positions the model can address ({}); {}", what, limits::kTokens,
           file_->path().string(), fix);
    // The Gemma4Context constructor's allocations: K, V and positions of each producer layer, then
    // last_hidden and chunk_hidden (in double: a hostile size must not wrap around).
    const double cache_elem = dtype_traits(cache_type_)->block_bytes;
    double bytes = 4.0 * static_cast<double>(cfg_.hidden) * static_cast<double>(1 + chunk_);
    for (const LayerConfig& lc : cfg_.layers) {
      if (lc.producer >= 0) continue;
      const double slots = static_cast<double>(lc.full ? cap : std::min(ring_slots(), cap));
      bytes += slots * (2.0 * cache_elem * static_cast<double>(lc.kv_heads * lc.head_dim) + 4.0);
    }
    const DeviceInfo device = backend_->device();
    if (device.memory_bytes > 0 && bytes > static_cast<double>(device.memory_bytes))
      fail("gemma4: {} needs {:.0f} bytes ({:.1f} GiB) of KV cache, more than the {:.1f} GiB of {} ({}); {}", what,
           bytes, bytes / (1 << 30), static_cast<double>(device.memory_bytes) / (1 << 30), device.name,
           file_->path().string(), fix);
  }
  TokenEmbedding token_embedding() const { return {w_.embed, embed_scale_}; }
  int64_t chunk() const { return chunk_; }
  DType cache_type() const { return cache_type_; }

 private:
  Value mlp(Graph& g, const LayerWeights& lw, Value x) const {
    Value gate = g.gelu_tanh(g.matmul(g.constant(lw.gate), x));
    Value up = g.matmul(g.constant(lw.up), x);
    return g.matmul(g.constant(lw.down), g.mul(gate, up));
  }
  Value moe(Graph& g, const LayerWeights& lw, Value r, int64_t T) const;

  std::shared_ptr<const ModelFile> file_;
  std::shared_ptr<ComputeBackend> backend_;
  Config cfg_;
  Weights w_;
  ModelInfo info_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<const ChatFormat> chat_;
  BackendTensorPtr onehot_;
  float embed_scale_ = 1.0f, ple_scale_ = 1.0f;
  int64_t chunk_ = 256;
  DType cache_type_ = DType::F32;
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

void Gemma4Model::build(Built& b, int64_t T, int64_t n_logits, const std::vector<Cache>& caches,
                        const BackendTensorPtr& last_hidden, const BackendTensorPtr& chunk_hidden) const {
  Graph& g = b.graph;
  const Config& c = cfg_;
  const int64_t H = c.hidden, L = static_cast<int64_t>(c.layers.size()), P = c.ple;
  b.ids = g.input(DType::I32, {T}, "tokens");
  b.pos = g.input(DType::I32, {T}, "positions");
  b.ring_slot = g.input(DType::I32, {T}, "ring_slots");
  b.iota_t = g.input(DType::I32, {T}, "rows");     // 0..T-1
  b.iota_h = g.input(DType::I32, {H}, "features");  // 0..H-1

  Value h = g.scale(g.get_rows(g.constant(w_.embed), b.ids), embed_scale_);
  Value ple;
  if (P > 0) {
    // Per-layer inputs: token part (x sqrt(P)) plus the normed projection of the scaled embedding.
    Value tok = g.scale(g.get_rows(g.constant(w_.ple_embed), b.ids), ple_scale_);
    Value proj = g.scale(g.matmul(g.constant(w_.ple_model_proj), h), 1.0f / std::sqrt(static_cast<float>(H)));
    proj = g.rms_norm(g.reshape(proj, {T, L, P}), g.constant(w_.ple_proj_norm), c.eps);
    ple = g.scale(g.add(g.reshape(proj, {T, L * P}), tok), 1.0f / std::sqrt(2.0f));
  }

  struct Kv {
    Value k, v, pos;
  };
  std::vector<Kv> kv(L);
  for (int64_t l = 0; l < L; ++l) {
    const LayerConfig& lc = c.layers[l];
    const LayerWeights& lw = w_.layers[l];
    const RopeConfig& rope = lc.full ? c.rope_full : c.rope_sliding;
    const int64_t D = lc.head_dim, KVH = lc.kv_heads;
    auto name = [&](Value v, const char* what) { return g.named(v, fmt::format("blk.{}.{}", l, what)); };

    Value x = g.rms_norm(h, g.constant(lw.attn_norm), c.eps);
    Value q = g.reshape(g.matmul(g.constant(lw.q), x), {T, c.heads, D});
    q = g.rms_norm(q, g.constant(lw.q_norm), c.eps);
    q = g.rope(q, b.pos, rope.rotated_pairs, rope.theta, rope.exponent_divisor, rope.freq_scale);
    if (lc.producer < 0) {
      Value kraw = g.reshape(g.matmul(g.constant(lw.k), x), {T, KVH, D});
      // k_eq_v: V is the raw K projection, before k_norm and RoPE.
      Value v = lw.v ? g.reshape(g.matmul(g.constant(lw.v), x), {T, KVH, D}) : kraw;
      Value k = g.rms_norm(kraw, g.constant(lw.k_norm), c.eps);
      k = g.rope(k, b.pos, rope.rotated_pairs, rope.theta, rope.exponent_divisor, rope.freq_scale);
      v = g.rms_norm(v, Value{}, c.eps);
      const Cache& cache = caches[l];
      Value slot = cache.ring ? b.ring_slot : b.pos;
      kv[l] = {g.write_rows(cache.k, k, slot), g.write_rows(cache.v, v, slot), g.write_rows(cache.pos, b.pos, slot)};
      // Cache writes must run even when nothing downstream is read (a prefill without logits).
      g.mark_output(kv[l].k);
      g.mark_output(kv[l].v);
      g.mark_output(kv[l].pos);
    } else {
      kv[l] = kv[lc.producer];
    }
    Value a = g.attention(q, kv[l].k, kv[l].v, kv[l].pos, b.pos, 1.0f, lc.full ? 0 : c.window, true);
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

  // Final-normed hidden states (the LM head's input), for drafters: the last position's, and every row
  // of this chunk so a rollback into it can restore the right one. MTP drafters take the normed row
  // (gemma4-assistant-spec §2.1); norming all T rows costs T x H, nothing next to the layers.
  Value normed = g.rms_norm(h, g.constant(w_.output_norm), c.eps);
  Value flat = g.reshape(normed, {1, T * H});
  g.mark_output(g.write_rows(last_hidden, g.reshape(g.slice(flat, (T - 1) * H, H), {H, 1}), b.iota_h));
  g.mark_output(g.write_rows(chunk_hidden, normed, b.iota_t));
  if (n_logits > 0) {
    Value rows = T == n_logits ? normed : g.reshape(g.slice(flat, (T - n_logits) * H, n_logits * H), {n_logits, H});
    Value logits = g.matmul(g.constant(w_.embed), rows);
    if (c.softcap > 0.0f) logits = g.softcap(logits, c.softcap);
    b.logits = g.named(logits, "logits");
    g.mark_output(b.logits);
  }
}

// ---------------------------------------------------------------------------------------- context
Gemma4Context::Gemma4Context(std::shared_ptr<const Gemma4Model> model, int64_t capacity)
    : m_(std::move(model)), capacity_(capacity) {
  const Config& c = m_->cfg();
  ComputeBackend& be = m_->backend();
  caches_.resize(c.layers.size());
  for (size_t l = 0; l < c.layers.size(); ++l) {
    const LayerConfig& lc = c.layers[l];
    if (lc.producer >= 0) continue;  // reads its producer's cache
    Cache& cache = caches_[l];
    cache.ring = !lc.full && ring_slots() < capacity_;
    cache.slots = lc.full ? capacity_ : std::min(ring_slots(), capacity_);
    const std::string base = fmt::format("gemma4.cache.{}", l);
    cache.k = be.allocate(base + ".k", m_->cache_type(), {cache.slots, lc.kv_heads, lc.head_dim});
    cache.v = be.allocate(base + ".v", m_->cache_type(), {cache.slots, lc.kv_heads, lc.head_dim});
    cache.pos = be.allocate(base + ".pos", DType::I32, {cache.slots});
    be.write(*cache.pos, bytes_of(std::vector<int32_t>(cache.slots, -1)));  // every slot empty
  }
  last_hidden_ = be.allocate("gemma4.last_hidden", DType::F32, {c.hidden});
  chunk_hidden_ = be.allocate("gemma4.chunk_hidden", DType::F32, {m_->chunk(), c.hidden});
}

int64_t Gemma4Context::ring_slots() const { return m_->ring_slots(); }

Built& Gemma4Context::graph_for(int64_t T, int64_t n_logits) {
  auto& slot = graphs_[{T, n_logits}];
  if (!slot) {
    auto b = std::make_unique<Built>();
    m_->build(*b, T, n_logits, caches_, last_hidden_, chunk_hidden_);
    slot = std::move(b);
  }
  return *slot;
}

void Gemma4Context::check_tokens(std::span<const int32_t> tokens, int64_t n_logits) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const Config& c = m_->cfg();
  if (n == 0) fail("gemma4: forward() called with no tokens");
  if (n_logits < 0 || n_logits > n) fail("gemma4: forward() asked for {} logits of {} tokens", n_logits, n);
  if (position_ + n > capacity_)
    fail("gemma4: context overflow: {} tokens at position {} exceed the context length {}", n, position_,
         capacity_);
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab)
      fail("gemma4: token id {} at index {} is outside the vocabulary [0, {})", tokens[i], i, c.vocab);
}

std::vector<float> Gemma4Context::forward(std::span<const int32_t> tokens, int64_t n_logits) {
  check_tokens(tokens, n_logits);
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<float> out;
  out.reserve(static_cast<size_t>(n_logits * m_->cfg().vocab));
  for (int64_t start = 0; start < n; start += m_->chunk()) {
    const int64_t len = std::min(m_->chunk(), n - start);
    const int64_t want = std::clamp<int64_t>(n_logits - (n - start - len), 0, len);
    std::vector<float> part = run_chunk(tokens.subspan(start, len), want);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

Gemma4Context::Sampling& Gemma4Context::sampling_graph_for(int64_t T, const Sampler& sampler,
                                                           const SamplingState& state) {
  auto [it, fresh] = sampling_graphs_.try_emplace({T, sampler.device_key(state)});
  Sampling& s = it->second;
  if (!fresh) return s;
  auto b = std::make_unique<Built>();
  m_->build(*b, T, 1, caches_, last_hidden_, chunk_hidden_);
  Graph& g = b->graph;
  const std::vector<int32_t> ids = sampler.device_ids(state);
  s.ids = ids.empty() ? Value{} : g.input(DType::I32, {static_cast<int64_t>(ids.size())}, "sampler_ids");
  s.uniform = g.input(DType::F32, {1}, "uniform");
  s.token = sampler.sample_in_graph(g, g.reshape(b->logits, {m_->cfg().vocab}), s.ids, s.uniform, state,
                                    m_->backend(), &s.why);
  if (s.token) {
    g.mark_output(s.token);
    s.built = std::move(b);
  }
  return s;
}

SampledToken Gemma4Context::forward_sample(std::span<const int32_t> tokens, const Sampler& sampler,
                                           const SamplingState& state, float uniform, bool require_device) {
  check_tokens(tokens, 1);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t last = (n - 1) / m_->chunk() * m_->chunk();  // start of the last chunk
  Sampling& s = sampling_graph_for(n - last, sampler, state);
  if (!s.built) {
    if (require_device) fail("gemma4: device sampling required but unavailable: {}", s.why);
    const std::vector<float> logits = forward(tokens, 1);
    return {sampler.sample(logits, state, uniform), false, s.why};
  }
  for (int64_t start = 0; start < last; start += m_->chunk()) run_chunk(tokens.subspan(start, m_->chunk()), 0);
  const std::vector<int32_t> ids = sampler.device_ids(state);
  std::vector<std::pair<Value, std::span<const std::byte>>> extra{
      {s.uniform, std::as_bytes(std::span<const float>(&uniform, 1))}};
  if (s.ids) extra.emplace_back(s.ids, bytes_of(ids));
  run(*s.built, tokens.subspan(last), std::move(extra));
  int32_t token = -1;
  m_->backend().read(s.built->graph, s.token, std::as_writable_bytes(std::span<int32_t>(&token, 1)));
  return {token, true, {}};
}

std::vector<float> Gemma4Context::run_chunk(std::span<const int32_t> tokens, int64_t n_logits) {
  Built& b = graph_for(static_cast<int64_t>(tokens.size()), n_logits);
  run(b, tokens, {});
  std::vector<float> logits;
  if (n_logits > 0) {
    logits.resize(static_cast<size_t>(n_logits * m_->cfg().vocab));
    m_->backend().read(b.graph, b.logits, std::as_writable_bytes(std::span<float>(logits)));
  }
  return logits;
}

void Gemma4Context::run(Built& b, std::span<const int32_t> tokens,
                        std::vector<std::pair<Value, std::span<const std::byte>>> extra) {
  const int64_t T = static_cast<int64_t>(tokens.size());
  const int64_t H = m_->cfg().hidden;
  std::vector<int32_t> ids(tokens.begin(), tokens.end()), pos(T), ring(T), iota_t(T), iota_h(H);
  for (int64_t i = 0; i < std::max(T, H); ++i) {
    if (i < T) iota_t[i] = static_cast<int32_t>(i);
    if (i < H) iota_h[i] = static_cast<int32_t>(i);
  }
  const int64_t slots = ring_slots();
  for (int64_t t = 0; t < T; ++t) {
    pos[t] = static_cast<int32_t>(position_ + t);
    ring[t] = static_cast<int32_t>((position_ + t) % slots);
  }
  RunInputs in;
  in.inputs = {{b.ids, bytes_of(ids)}, {b.pos, bytes_of(pos)}, {b.ring_slot, bytes_of(ring)},
               {b.iota_t, bytes_of(iota_t)}, {b.iota_h, bytes_of(iota_h)}};
  in.inputs.insert(in.inputs.end(), extra.begin(), extra.end());
  m_->backend().run(b.graph, in);
  chunk_start_ = position_;
  chunk_len_ = T;
  position_ += T;
}

void Gemma4Context::truncate(int64_t pos) {
  if (pos < 0 || pos > position_) fail("gemma4: truncate({}) outside [0, {}]", pos, position_);
  if (pos == position_) return;
  const int64_t depth = position_ - pos;
  ComputeBackend& be = m_->backend();
  for (const Cache& cache : caches_) {
    if (!cache.pos) continue;
    // A ring has overwritten keys older than its window; only a rollback shallower than the chunk
    // leaves every key the next token needs in place.
    if (cache.ring && depth > m_->chunk())
      fail("gemma4: cannot roll back {} tokens: the sliding-window cache keeps only {} (option prefill_chunk)",
           depth, m_->chunk());
    std::vector<int32_t> p(cache.slots);
    be.read(*cache.pos, std::as_writable_bytes(std::span<int32_t>(p)));
    for (int32_t& v : p)
      if (v >= pos) v = -1;
    be.write(*cache.pos, bytes_of(p));
  }
  // The hidden state of the new last position, when the last chunk computed it.
  const int64_t row = pos - 1 - chunk_start_;
  if (row >= 0 && row < chunk_len_) {
    const int64_t H = m_->cfg().hidden;
    std::vector<float> rows(static_cast<size_t>(m_->chunk() * H));
    be.read(*chunk_hidden_, std::as_writable_bytes(std::span<float>(rows)));
    be.write(*last_hidden_, bytes_of(std::vector<float>(rows.begin() + row * H, rows.begin() + (row + 1) * H)));
  } else {
    log_debug("gemma4: after truncate({}) last_hidden() still holds position {}", pos, chunk_start_ + chunk_len_ - 1);
  }
  chunk_len_ = std::max<int64_t>(0, std::min(chunk_len_, pos - chunk_start_));
  position_ = pos;
}

TokenEmbedding Gemma4Context::token_embedding() const { return m_->token_embedding(); }

KvView Gemma4Context::kv(const std::string& attention_type) const {
  if (attention_type != "full" && attention_type != "sliding")
    fail("gemma4: kv('{}'): expected 'full' or 'sliding'", attention_type);
  const Config& c = m_->cfg();
  const bool full = attention_type == "full";
  for (int64_t l = static_cast<int64_t>(c.layers.size()) - 1; l >= 0; --l) {
    if (c.layers[l].full != full) continue;
    const int src = c.layers[l].producer >= 0 ? c.layers[l].producer : static_cast<int>(l);
    const Cache& cache = caches_[src];
    return {cache.k, cache.v, cache.pos, full ? 0 : c.window};
  }
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
  const nlohmann::json& md = file.metadata();
  if (file.format() == "gguf") {
    auto it = md.find("general.architecture");
    return it != md.end() && it->is_string() && *it == "gemma4";
  }
  auto cfg = md.find("config");
  if (cfg == md.end() || !cfg->is_object()) return false;
  auto type_of = [](const nlohmann::json& j) {
    auto t = j.is_object() ? j.find("model_type") : j.end();
    return t != j.end() && t->is_string() ? t->get<std::string>() : std::string();
  };
  const std::string t = type_of(*cfg), tt = type_of(cfg->value("text_config", nlohmann::json()));
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
                                  const nlohmann::json& options) {
  if (!file || !backend) fail("gemma4: load() needs a file and a backend");
  if (!is_gemma4(*file))
    fail("gemma4: {} is not a Gemma 4 text model (GGUF general.architecture 'gemma4' or config.json "
         "model_type 'gemma4' / 'gemma4_text')", file->path().string());
  return std::make_shared<Gemma4Model>(std::move(file), std::move(backend), options.is_object() ? options : nlohmann::json::object());
}

}  // namespace specula::gemma4

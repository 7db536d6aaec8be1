#include "model.hpp"

#include "chat_format.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>

#include "specula/error.hpp"
#include "specula/kv_cache.hpp"
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

// A graph for one batch shape (which sequences, how many tokens and logits each), reused by every step
// of that shape. `token` is set when the graph ends in the sampler's device form.
struct Built {
  Graph graph;
  std::unique_ptr<BatchGraph> batch;
  Value ids, logits;
  Value sampler_ids, uniform, token;
  std::string why;  // a sampling graph without `token`: why the sampler cannot run in it
};

// One sequence's share of a graph run: at most one step of tokens appended to its cache, logits for the
// last n_logits of them.
struct Part {
  KvCache* cache = nullptr;
  std::span<const int32_t> tokens;
  int64_t n_logits = 0;
};

class Gemma4Context final : public ModelContext, public TargetView {
 public:
  Gemma4Context(std::shared_ptr<const Gemma4Model> model, int64_t capacity);
  ~Gemma4Context() override;

  std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_logits) override;
  SampledToken forward_sample(std::span<const int32_t> tokens, const Sampler& sampler, const SamplingState& state,
                              float uniform, bool require_device) override;
  int64_t position() const override { return cache_.position(); }
  int64_t capacity() const override { return cache_.capacity(); }
  int64_t max_rollback() const override { return cache_.max_rollback(); }
  void truncate(int64_t pos) override { cache_.truncate(pos); }
  const TargetView& view() const override { return *this; }

  KvView kv(const std::string& attention_type) const override;
  BackendTensorPtr last_hidden() const override { return cache_.last_hidden(); }
  TokenEmbedding token_embedding() const override;

  const Gemma4Model* model() const { return m_.get(); }
  KvCache& cache() { return cache_; }

 private:
  std::shared_ptr<const Gemma4Model> m_;
  KvCache cache_;
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

    // One cache layer per layer that stores K/V; KV-shared layers read their producer's.
    cache_spec_.name = "gemma4.cache";
    cache_spec_.type = cache_type_;
    cache_spec_.step_tokens = chunk_;
    cache_spec_.hidden_size = cfg_.hidden;
    for (size_t l = 0; l < cfg_.layers.size(); ++l) {
      const LayerConfig& lc = cfg_.layers[l];
      if (lc.producer >= 0) {
        cache_of_.push_back(cache_of_[static_cast<size_t>(lc.producer)]);
        continue;
      }
      cache_of_.push_back(cache_spec_.layers.size());
      cache_spec_.layers.push_back({lc.kv_heads, lc.head_dim, lc.full ? 0 : cfg_.window, fmt::format("gemma4.cache.{}", l)});
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

  std::vector<std::vector<float>> forward_batch(std::span<const BatchEntry> batch) override;

  // One sequence: `tokens` in steps of prefill_chunk, logits for the last n_logits.
  std::vector<float> forward(KvCache& cache, std::span<const int32_t> tokens, int64_t n_logits) const;
  SampledToken forward_sample(KvCache& cache, std::span<const int32_t> tokens, const Sampler& sampler,
                              const SamplingState& state, float uniform, bool require_device) const;
  // Drops the graphs that write into a cache that is going away.
  void forget(uint64_t cache_id) const;

  const KvCacheSpec& cache_spec() const { return cache_spec_; }
  size_t cache_of(size_t layer) const { return cache_of_[layer]; }

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
    const double bytes = cache_spec_.bytes(cap);  // what the context's KvCache allocates
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
  // Records the forward pass of a batch: every part's tokens, logits for the last n_logits of each.
  void build(Built& b, std::span<const Part> parts) const;
  // The graph of a batch shape, ending in `sampler`'s device form when one is given.
  Built& graph_for(std::span<const Part> parts, const Sampler* sampler, const SamplingState* state) const;
  // Runs a graph of parts of at most one step each, advances their caches; extra inputs besides tokens.
  void execute(Built& b, std::span<const Part> parts, std::vector<std::pair<Value, std::span<const std::byte>>> extra) const;
  std::vector<float> run(std::span<const Part> parts) const;  // their logits, in order
  void check_tokens(const KvCache& cache, std::span<const int32_t> tokens, int64_t n_logits) const;

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
  KvCacheSpec cache_spec_;
  std::vector<size_t> cache_of_;  // by layer: the cache layer it writes or reads
  // Graphs by batch shape (cache id, tokens, logits of each part) and sampler device key.
  mutable std::mutex graphs_mu_;
  mutable std::map<std::pair<std::vector<int64_t>, std::string>, std::unique_ptr<Built>> graphs_;
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

void Gemma4Model::build(Built& b, std::span<const Part> parts) const {
  Graph& g = b.graph;
  std::vector<BatchGraph::Entry> entries;
  std::vector<int64_t> n_logits;
  for (const Part& part : parts) {
    entries.push_back({part.cache, static_cast<int64_t>(part.tokens.size())});
    n_logits.push_back(part.n_logits);
  }
  b.batch = std::make_unique<BatchGraph>(g, std::move(entries));
  BatchGraph& batch = *b.batch;
  const Config& c = cfg_;
  const int64_t T = batch.rows(), H = c.hidden, L = static_cast<int64_t>(c.layers.size()), P = c.ple;
  const Value pos = batch.positions();
  b.ids = g.input(DType::I32, {T}, "tokens");

  Value h = g.scale(g.get_rows(g.constant(w_.embed), b.ids), embed_scale_);
  Value ple;
  if (P > 0) {
    // Per-layer inputs: token part (x sqrt(P)) plus the normed projection of the scaled embedding.
    Value tok = g.scale(g.get_rows(g.constant(w_.ple_embed), b.ids), ple_scale_);
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
  if (Value rows = batch.last_rows(normed, n_logits)) {
    Value logits = g.matmul(g.constant(w_.embed), rows);
    if (c.softcap > 0.0f) logits = g.softcap(logits, c.softcap);
    b.logits = g.named(logits, "logits");
    g.mark_output(b.logits);
  }
}

Built& Gemma4Model::graph_for(std::span<const Part> parts, const Sampler* sampler, const SamplingState* state) const {
  std::vector<int64_t> shape;
  for (const Part& p : parts)
    shape.insert(shape.end(), {static_cast<int64_t>(p.cache->id()), static_cast<int64_t>(p.tokens.size()), p.n_logits});
  std::lock_guard<std::mutex> lock(graphs_mu_);
  auto& slot = graphs_[{std::move(shape), sampler ? "sampler:" + sampler->device_key(*state) : std::string()}];
  if (slot) return *slot;
  auto b = std::make_unique<Built>();
  build(*b, parts);
  if (sampler) {
    Graph& g = b->graph;
    const std::vector<int32_t> ids = sampler->device_ids(*state);
    b->sampler_ids = ids.empty() ? Value{} : g.input(DType::I32, {static_cast<int64_t>(ids.size())}, "sampler_ids");
    b->uniform = g.input(DType::F32, {1}, "uniform");
    b->token = sampler->sample_in_graph(g, g.reshape(b->logits, {cfg_.vocab}), b->sampler_ids, b->uniform, *state,
                                        *backend_, &b->why);
    if (b->token) g.mark_output(b->token);
  }
  slot = std::move(b);
  return *slot;
}

void Gemma4Model::forget(uint64_t cache_id) const {
  std::lock_guard<std::mutex> lock(graphs_mu_);
  std::erase_if(graphs_, [&](const auto& kv) {
    const std::vector<int64_t>& shape = kv.first.first;
    for (size_t i = 0; i < shape.size(); i += 3)
      if (static_cast<uint64_t>(shape[i]) == cache_id) return true;
    return false;
  });
}

void Gemma4Model::check_tokens(const KvCache& cache, std::span<const int32_t> tokens, int64_t n_logits) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) fail("gemma4: forward() called with no tokens");
  if (n_logits < 0 || n_logits > n) fail("gemma4: forward() asked for {} logits of {} tokens", n_logits, n);
  if (cache.position() + n > cache.capacity())
    fail("gemma4: context overflow: {} tokens at position {} exceed the context length {}", n, cache.position(),
         cache.capacity());
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab)
      fail("gemma4: token id {} at index {} is outside the vocabulary [0, {})", tokens[i], i, cfg_.vocab);
}

void Gemma4Model::execute(Built& b, std::span<const Part> parts,
                          std::vector<std::pair<Value, std::span<const std::byte>>> extra) const {
  std::vector<int32_t> ids;
  for (const Part& p : parts) ids.insert(ids.end(), p.tokens.begin(), p.tokens.end());
  RunInputs in;
  in.inputs.emplace_back(b.ids, bytes_of(ids));
  b.batch->set_inputs(in);
  in.inputs.insert(in.inputs.end(), extra.begin(), extra.end());
  backend_->run(b.graph, in);
  b.batch->appended();
}

std::vector<float> Gemma4Model::run(std::span<const Part> parts) const {
  Built& b = graph_for(parts, nullptr, nullptr);
  execute(b, parts, {});
  std::vector<float> logits;
  if (b.logits) {
    logits.resize(static_cast<size_t>(b.graph.shape(b.logits)[0] * cfg_.vocab));
    backend_->read(b.graph, b.logits, std::as_writable_bytes(std::span<float>(logits)));
  }
  return logits;
}

std::vector<float> Gemma4Model::forward(KvCache& cache, std::span<const int32_t> tokens, int64_t n_logits) const {
  check_tokens(cache, tokens, n_logits);
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<float> out;
  out.reserve(static_cast<size_t>(n_logits * cfg_.vocab));
  for (int64_t start = 0; start < n; start += chunk_) {
    const int64_t len = std::min(chunk_, n - start);
    const Part part{&cache, tokens.subspan(start, len), std::clamp<int64_t>(n_logits - (n - start - len), 0, len)};
    const std::vector<float> logits = run({&part, 1});
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

SampledToken Gemma4Model::forward_sample(KvCache& cache, std::span<const int32_t> tokens, const Sampler& sampler,
                                         const SamplingState& state, float uniform, bool require_device) const {
  check_tokens(cache, tokens, 1);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t last = (n - 1) / chunk_ * chunk_;  // start of the last step
  const Part tail{&cache, tokens.subspan(last), 1};
  Built& b = graph_for({&tail, 1}, &sampler, &state);
  if (!b.token) {
    if (require_device) fail("gemma4: device sampling required but unavailable: {}", b.why);
    const std::vector<float> logits = forward(cache, tokens, 1);
    return {sampler.sample(logits, state, uniform), false, b.why};
  }
  for (int64_t start = 0; start < last; start += chunk_) {
    const Part part{&cache, tokens.subspan(start, chunk_), 0};
    run({&part, 1});
  }
  const std::vector<int32_t> ids = sampler.device_ids(state);
  std::vector<std::pair<Value, std::span<const std::byte>>> extra{
      {b.uniform, std::as_bytes(std::span<const float>(&uniform, 1))}};
  if (b.sampler_ids) extra.emplace_back(b.sampler_ids, bytes_of(ids));
  execute(b, {&tail, 1}, std::move(extra));
  int32_t token = -1;
  backend_->read(b.graph, b.token, std::as_writable_bytes(std::span<int32_t>(&token, 1)));
  return {token, true, {}};
}

std::vector<std::vector<float>> Gemma4Model::forward_batch(std::span<const BatchEntry> batch) {
  std::vector<Part> parts;
  bool one_step = true;  // every entry fits one step: one graph for the whole batch
  for (size_t e = 0; e < batch.size(); ++e) {
    auto* ctx = dynamic_cast<Gemma4Context*>(batch[e].context);
    if (!ctx || ctx->model() != this) fail("gemma4: forward_batch: entry {} is not a context of this model", e);
    check_tokens(ctx->cache(), batch[e].tokens, batch[e].n_logits);
    for (const Part& p : parts)
      if (p.cache == &ctx->cache()) fail("gemma4: forward_batch: entry {} repeats the context of an earlier entry", e);
    parts.push_back({&ctx->cache(), batch[e].tokens, batch[e].n_logits});
    one_step = one_step && static_cast<int64_t>(batch[e].tokens.size()) <= chunk_;
  }
  std::vector<std::vector<float>> out;
  if (!one_step || parts.size() == 1) {
    for (const Part& p : parts) out.push_back(forward(*p.cache, p.tokens, p.n_logits));
    return out;
  }
  const std::vector<float> logits = run(parts);
  size_t at = 0;
  for (const Part& p : parts) {
    const size_t n = static_cast<size_t>(p.n_logits * cfg_.vocab);
    out.emplace_back(logits.begin() + static_cast<std::ptrdiff_t>(at), logits.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  return out;
}

// ---------------------------------------------------------------------------------------- context
Gemma4Context::Gemma4Context(std::shared_ptr<const Gemma4Model> model, int64_t capacity)
    : m_(std::move(model)), cache_(m_->backend(), m_->cache_spec(), capacity) {}

Gemma4Context::~Gemma4Context() { m_->forget(cache_.id()); }

std::vector<float> Gemma4Context::forward(std::span<const int32_t> tokens, int64_t n_logits) {
  return m_->forward(cache_, tokens, n_logits);
}

SampledToken Gemma4Context::forward_sample(std::span<const int32_t> tokens, const Sampler& sampler,
                                           const SamplingState& state, float uniform, bool require_device) {
  return m_->forward_sample(cache_, tokens, sampler, state, uniform, require_device);
}

TokenEmbedding Gemma4Context::token_embedding() const { return m_->token_embedding(); }

KvView Gemma4Context::kv(const std::string& attention_type) const {
  if (attention_type != "full" && attention_type != "sliding")
    fail("gemma4: kv('{}'): expected 'full' or 'sliding'", attention_type);
  const Config& c = m_->cfg();
  const bool full = attention_type == "full";
  for (int64_t l = static_cast<int64_t>(c.layers.size()) - 1; l >= 0; --l) {
    if (c.layers[l].full != full) continue;
    return cache_.view(m_->cache_of(static_cast<size_t>(l)));
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

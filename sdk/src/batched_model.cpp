#include "specula/batched_model.hpp"

#include <algorithm>

#include "specula/error.hpp"
#include "specula/sampler.hpp"

namespace specula {

// A graph for one batch shape, reused by every step of that shape. `token` is set when it ends in the
// sampler's device form.
struct BatchedModel::Built {
  Graph graph;
  std::unique_ptr<CompiledGraph> plan;  // after `graph`: destroyed before it
  std::unique_ptr<BatchGraph> batch;
  Value ids, logits;
  Value sampler_ids, uniform, token;  // a sampled verification: uniform F32 [2n + 1], token its verdict
  Value last, verdict;  // verify_greedy: the input before the drafts; I32 [drafts n, greedy n + 1]
  std::string why;  // a sampling graph without `token`: why the sampler cannot run in it
};

// A sequence: its cache, and the TargetView drafters read.
class BatchedModel::Context final : public ModelContext, public TargetView {
 public:
  Context(std::shared_ptr<const BatchedModel> model, int64_t capacity)
      : m_(std::move(model)), cache_(m_->backend(), m_->spec_, capacity) {}
  ~Context() override { m_->forget(cache_.id()); }

  std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_logits) override {
    return m_->forward(cache_, tokens, n_logits);
  }
  SampledToken forward_sample(std::span<const int32_t> tokens, const Sampler& sampler, const SamplingState& state,
                              float uniform) override {
    return m_->forward_sample(cache_, tokens, sampler, state, uniform);
  }
  int64_t position() const override { return cache_.position(); }
  int64_t capacity() const override { return cache_.capacity(); }
  int64_t max_rollback() const override { return cache_.max_rollback(); }
  void truncate(int64_t pos) override { cache_.truncate(pos); }
  void copy_prefix(const ModelContext& from, int64_t n) override {
    auto* other = dynamic_cast<const Context*>(&from);
    if (!other || other->m_ != m_) fail("{}: copy_prefix: the source is not a context of this model", m_->name_);
    cache_.copy_prefix(other->cache_, n);
  }
  const TargetView& view() const override { return *this; }

  // One verification of up to step_tokens - 1 drafts fits one graph; the buffer grows to the longest asked.
  BackendTensorPtr draft_tokens(int64_t n) override {
    if (n < 1 || n + 1 > m_->spec_.step_tokens) return nullptr;
    if (!drafts_ || drafts_->shape()[0] < n)
      drafts_ = m_->backend().allocate(m_->name_ + ".draft_tokens", DType::I32, {std::max<int64_t>(n, 4), 1});
    return drafts_;
  }
  GreedyVerification verify_greedy(int32_t last, int64_t n) override {
    if (!drafts_ || n < 1 || n > drafts_->shape()[0])
      fail("{}: verify_greedy of {} drafts, but draft_tokens() holds {}", m_->name_, n, drafts_ ? drafts_->shape()[0] : 0);
    return m_->verify_greedy(cache_, drafts_, last, n);
  }
  // One logits tensor per draft length, [n, vocab] exactly, so the verification reads it without a copy.
  BackendTensorPtr draft_logits(int64_t n, const Sampler& sampler, const SamplingState& state,
                                std::string* why) override {
    if (!draft_tokens(n)) {
      if (why) *why = fmt::format("{} drafts and the last token do not fit one step of {} tokens", n, m_->spec_.step_tokens);
      return nullptr;
    }
    BackendTensorPtr& logits = draft_logits_[n];
    if (!logits) logits = m_->backend().allocate(m_->name_ + ".draft_logits", DType::F32, {n, m_->vocab_});
    Built& b = m_->sampled_graph(cache_, drafts_, logits, n, sampler, state);
    if (!b.token) {
      if (why) *why = b.why;
      return nullptr;
    }
    return logits;
  }
  SampledVerification verify_sampled(int32_t last, int64_t n, const Sampler& sampler, const SamplingState& state,
                                     std::span<const float> uniforms) override {
    const auto it = draft_logits_.find(n);
    if (!drafts_ || n > drafts_->shape()[0] || it == draft_logits_.end() || !it->second)
      fail("{}: verify_sampled of {} drafts before draft_logits({}) gave a tensor", m_->name_, n, n);
    if (static_cast<int64_t>(uniforms.size()) != 2 * n + 1)
      fail("{}: verify_sampled of {} drafts takes {} uniforms, got {}", m_->name_, n, 2 * n + 1, uniforms.size());
    Built& b = m_->sampled_graph(cache_, drafts_, it->second, n, sampler, state);
    if (!b.token) fail("{}: verify_sampled: {}", m_->name_, b.why);
    const std::vector<int32_t> v = m_->run_verification(b, cache_, last, b.token, n + 2, {{b.uniform, std::as_bytes(uniforms)}});
    SampledVerification out;
    out.accepted = v[0];
    if (out.accepted < 0 || out.accepted > n)
      fail("{}: the backend's verdict accepted {} of {} drafts", m_->name_, out.accepted, n);
    out.tokens.assign(v.begin() + 1, v.begin() + 2 + out.accepted);
    return out;
  }

  KvView kv(const std::string& attention_type) const override {
    return cache_.view(m_->target_cache_layer(attention_type));
  }
  BackendTensorPtr last_hidden() const override { return cache_.last_hidden(); }
  TokenEmbedding token_embedding() const override { return m_->target_embedding(); }

  const BatchedModel* model() const { return m_.get(); }
  KvCache& cache() { return cache_; }

 private:
  std::shared_ptr<const BatchedModel> m_;
  KvCache cache_;
  BackendTensorPtr drafts_;  // draft_tokens(): I32 [N, 1]
  std::map<int64_t, BackendTensorPtr> draft_logits_;  // draft_logits(n): F32 [n, vocab]
};

BatchedModel::BatchedModel(std::string name, std::shared_ptr<ComputeBackend> backend)
    : name_(std::move(name)), backend_(std::move(backend)) {}

BatchedModel::~BatchedModel() = default;

void BatchedModel::set_attention(std::shared_ptr<const Attention> attention) {
  attention_ = attention ? std::move(attention) : standard_attention();
}

void BatchedModel::set_cache(KvCacheSpec spec, int64_t vocab) {
  spec_ = std::move(spec);
  vocab_ = vocab;
}

std::unique_ptr<ModelContext> BatchedModel::make_context(int64_t capacity) {
  return std::make_unique<Context>(shared_from_this(), capacity);
}

BatchedModel::Built& BatchedModel::cached_graph(GraphKey key, const std::function<void(Built&)>& build) const {
  std::lock_guard<std::mutex> lock(graphs_mu_);
  auto& slot = graphs_[std::move(key)];
  if (!slot) {
    auto b = std::make_unique<Built>();
    build(*b);
    try {
      b->plan = backend_->compile(b->graph);
    } catch (const Error& e) {
      // A sampling graph the backend refuses at this shape (e.g. a top-p draw past a device's loop limit):
      // without its token it is never run, and the host samples, saying why.
      if (!b->token) throw;
      b->token = Value{};
      b->why = fmt::format("the backend cannot run the sampling graph: {}", e.what());
    }
    slot = std::move(b);
  }
  return *slot;
}

BatchedModel::Built& BatchedModel::graph_for(std::span<const Part> parts, const Sampler* sampler, const SamplingState* state) const {
  std::vector<int64_t> shape;
  for (const Part& p : parts)
    shape.insert(shape.end(), {static_cast<int64_t>(p.cache->id()), static_cast<int64_t>(p.tokens.size()), p.n_logits});
  return cached_graph({std::move(shape), sampler ? "sampler:" + sampler->device_key(*state) : std::string()}, [&](Built& b) {
    std::vector<BatchGraph::Entry> entries;
    std::vector<int64_t> n_logits;
    for (const Part& part : parts) {
      entries.push_back({part.cache, static_cast<int64_t>(part.tokens.size())});
      n_logits.push_back(part.n_logits);
    }
    Graph& g = b.graph;
    b.batch = std::make_unique<BatchGraph>(g, std::move(entries), attention_);
    b.ids = g.input(DType::I32, {b.batch->rows()}, "tokens");
    b.logits = build_forward(*b.batch, b.ids, n_logits);
    if (b.logits) g.named(b.logits, "logits");
    // A sampling graph gives the host its token only; without its device form it is never run.
    if (b.logits && !sampler) g.mark_output(b.logits);
    if (sampler) {
      const std::vector<int32_t> ids = sampler->device_ids(*state);
      b.sampler_ids = ids.empty() ? Value{} : g.input(DType::I32, {static_cast<int64_t>(ids.size())}, "sampler_ids");
      b.uniform = g.input(DType::F32, {1}, "uniform");
      b.token = sampler->sample_in_graph(g, g.reshape(b.logits, {vocab_}), b.sampler_ids, b.uniform, *state,
                                         *backend_, &b.why);
      if (b.token) g.mark_output(b.token);
    }
  });
}

void BatchedModel::forget(uint64_t cache_id) const {
  std::lock_guard<std::mutex> lock(graphs_mu_);
  std::erase_if(graphs_, [&](const auto& kv) {
    const std::vector<int64_t>& shape = kv.first.first;
    for (size_t i = 0; i < shape.size(); i += 3)
      if (static_cast<uint64_t>(shape[i]) == cache_id) return true;
    return false;
  });
}

void BatchedModel::check_tokens(const KvCache& cache, std::span<const int32_t> tokens, int64_t n_logits) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) fail("{}: forward() called with no tokens", name_);
  if (n_logits < 0 || n_logits > n) fail("{}: forward() asked for {} logits of {} tokens", name_, n_logits, n);
  check_room(cache, n);
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= vocab_)
      fail("{}: token id {} at index {} is outside the vocabulary [0, {})", name_, tokens[i], i, vocab_);
}

void BatchedModel::check_room(const KvCache& cache, int64_t n) const {
  if (cache.position() + n > cache.capacity())
    fail("{}: context overflow: {} tokens at position {} exceed the context length {}", name_, n, cache.position(),
         cache.capacity());
}

void BatchedModel::execute(Built& b, std::span<const Part> parts,
                          std::vector<std::pair<Value, std::span<const std::byte>>> extra) const {
  std::vector<int32_t> ids;
  for (const Part& p : parts) ids.insert(ids.end(), p.tokens.begin(), p.tokens.end());
  RunInputs in;
  in.inputs.emplace_back(b.ids, bytes_of(ids));
  b.batch->set_inputs(in);
  in.inputs.insert(in.inputs.end(), extra.begin(), extra.end());
  b.plan->run(in);
  b.batch->appended();
}

std::vector<float> BatchedModel::run(std::span<const Part> parts) const {
  Built& b = graph_for(parts, nullptr, nullptr);
  execute(b, parts, {});
  std::vector<float> logits;
  if (b.logits) {
    logits.resize(static_cast<size_t>(b.graph.shape(b.logits)[0] * vocab_));
    b.plan->read(b.logits, std::as_writable_bytes(std::span<float>(logits)));
  }
  return logits;
}

std::vector<float> BatchedModel::forward(KvCache& cache, std::span<const int32_t> tokens, int64_t n_logits) const {
  check_tokens(cache, tokens, n_logits);
  const int64_t n = static_cast<int64_t>(tokens.size());
  std::vector<float> out;
  out.reserve(static_cast<size_t>(n_logits * vocab_));
  for (int64_t start = 0; start < n; start += spec_.step_tokens) {
    const int64_t len = std::min(spec_.step_tokens, n - start);
    const Part part{&cache, tokens.subspan(start, len), std::clamp<int64_t>(n_logits - (n - start - len), 0, len)};
    const std::vector<float> logits = run({&part, 1});
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

SampledToken BatchedModel::forward_sample(KvCache& cache, std::span<const int32_t> tokens, const Sampler& sampler,
                                         const SamplingState& state, float uniform) const {
  check_tokens(cache, tokens, 1);
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t last = (n - 1) / spec_.step_tokens * spec_.step_tokens;  // start of the last step
  const Part tail{&cache, tokens.subspan(last), 1};
  Built& b = graph_for({&tail, 1}, &sampler, &state);
  if (!b.token) return {-1, false, b.why};
  for (int64_t start = 0; start < last; start += spec_.step_tokens) {
    const Part part{&cache, tokens.subspan(start, spec_.step_tokens), 0};
    run({&part, 1});
  }
  const std::vector<int32_t> ids = sampler.device_ids(state);
  std::vector<std::pair<Value, std::span<const std::byte>>> extra{
      {b.uniform, std::as_bytes(std::span<const float>(&uniform, 1))}};
  if (b.sampler_ids) extra.emplace_back(b.sampler_ids, bytes_of(ids));
  execute(b, {&tail, 1}, std::move(extra));
  int32_t token = -1;
  b.plan->read(b.token, std::as_writable_bytes(std::span<int32_t>(&token, 1)));
  return {token, true, {}};
}

GreedyVerification BatchedModel::verify_greedy(KvCache& cache, const BackendTensorPtr& drafts, int32_t last,
                                              int64_t n) const {
  const int64_t N = drafts->shape()[0];
  Built& b = cached_graph({{static_cast<int64_t>(cache.id()), n + 1, n + 1}, fmt::format("verify:{}", N)}, [&](Built& nb) {
    const Value d = verification_forward(nb, cache, drafts, n);
    nb.verdict = nb.graph.concat(d, nb.graph.reshape(nb.graph.argmax(nb.logits), {n + 1}));
    nb.graph.mark_output(nb.verdict);
  });
  const std::vector<int32_t> verdict = run_verification(b, cache, last, b.verdict, 2 * n + 1, {});
  GreedyVerification v;
  v.drafts.assign(verdict.begin(), verdict.begin() + n);
  v.greedy.assign(verdict.begin() + n, verdict.end());
  return v;
}

BatchedModel::Built& BatchedModel::sampled_graph(KvCache& cache, const BackendTensorPtr& drafts,
                                                 const BackendTensorPtr& draft_logits, int64_t n,
                                                 const Sampler& sampler, const SamplingState& state) const {
  const int64_t N = drafts->shape()[0];
  const std::string key = fmt::format("verify:{}:sampler:{}", N, sampler.device_key(state));
  return cached_graph({{static_cast<int64_t>(cache.id()), n + 1, n + 1}, key}, [&](Built& nb) {
    const Value d = verification_forward(nb, cache, drafts, n);
    Graph& g = nb.graph;
    nb.uniform = g.input(DType::F32, {2 * n + 1}, "uniforms");
    nb.token = sampler.verify_in_graph(g, nb.logits, g.constant(draft_logits), d, nb.uniform, state, *backend_, &nb.why);
    if (nb.token) g.mark_output(nb.token);
  });
}

Value BatchedModel::verification_forward(Built& b, KvCache& cache, const BackendTensorPtr& drafts, int64_t n) const {
  Graph& g = b.graph;
  const int64_t N = drafts->shape()[0];
  b.batch = std::make_unique<BatchGraph>(g, std::vector<BatchGraph::Entry>{{&cache, n + 1}}, attention_);
  b.last = g.input(DType::I32, {1}, "last_token");
  const Value d = g.slice(g.reshape(g.constant(drafts), {N}), 0, n);
  b.ids = g.concat(b.last, d);
  b.logits = g.named(build_forward(*b.batch, b.ids, std::vector<int64_t>{n + 1}), "logits");
  return d;
}

std::vector<int32_t> BatchedModel::run_verification(Built& b, KvCache& cache, int32_t last, Value out, int64_t size,
                                                    std::vector<std::pair<Value, std::span<const std::byte>>> extra) const {
  const std::vector<int32_t> first{last};
  check_tokens(cache, first, 1);
  check_room(cache, b.graph.shape(b.ids)[0]);
  RunInputs in;
  in.inputs.emplace_back(b.last, std::as_bytes(std::span<const int32_t>(first)));
  b.batch->set_inputs(in);
  in.inputs.insert(in.inputs.end(), extra.begin(), extra.end());
  b.plan->run(in);
  b.batch->appended();
  std::vector<int32_t> values(static_cast<size_t>(size));
  b.plan->read(out, std::as_writable_bytes(std::span<int32_t>(values)));
  return values;
}

std::vector<std::vector<float>> BatchedModel::forward_batch(std::span<const BatchEntry> batch) {
  std::vector<Part> parts;
  bool one_step = true;  // every entry fits one step: one graph for the whole batch
  for (size_t e = 0; e < batch.size(); ++e) {
    auto* ctx = dynamic_cast<Context*>(batch[e].context);
    if (!ctx || ctx->model() != this) fail("{}: forward_batch: entry {} is not a context of this model", name_, e);
    check_tokens(ctx->cache(), batch[e].tokens, batch[e].n_logits);
    for (const Part& p : parts)
      if (p.cache == &ctx->cache()) fail("{}: forward_batch: entry {} repeats the context of an earlier entry", name_, e);
    parts.push_back({&ctx->cache(), batch[e].tokens, batch[e].n_logits});
    one_step = one_step && static_cast<int64_t>(batch[e].tokens.size()) <= spec_.step_tokens;
  }
  std::vector<std::vector<float>> out;
  if (!one_step || parts.size() == 1) {
    for (const Part& p : parts) out.push_back(forward(*p.cache, p.tokens, p.n_logits));
    return out;
  }
  const std::vector<float> logits = run(parts);
  size_t at = 0;
  for (const Part& p : parts) {
    const size_t n = static_cast<size_t>(p.n_logits * vocab_);
    out.emplace_back(logits.begin() + static_cast<std::ptrdiff_t>(at), logits.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  return out;
}

}  // namespace specula

#include "specula/batched_model.hpp"

#include <algorithm>

#include "specula/error.hpp"
#include "specula/sampler.hpp"

namespace specula {

// A graph for one batch shape, reused by every step of that shape: a forward graph ending in logits,
// or a round graph ending in the rounds' verdicts.
struct BatchedModel::Built {
  Graph graph;
  std::unique_ptr<CompiledGraph> plan;  // after `graph`: destroyed before it
  std::unique_ptr<BatchGraph> batch;
  Value ids, logits;
  Value uniforms;                   // a round graph: F32 [every round's uniforms]
  std::vector<Value> sampler_ids;   // a round graph: per round, I32 [n] (Sampler::device_ids) or none
  Value verdict;                    // a round graph: I32, every round's verdict in order (verdict_size)
  std::string why;                  // a round graph without `verdict`: why a rule cannot be decided in it
};

namespace {

// A round's verdict as its graph writes it: a plain step's token; greedy drafts, the drafts then each
// position's argmax; sampled drafts, Sampler::verify_in_graph's [accepted, tokens, -1 ...].
int64_t verdict_size(int64_t k, const RoundRule& rule) {
  if (k == 0) return 1;
  return rule.sampler ? k + 2 : 2 * k + 1;
}
int64_t uniform_count(int64_t k, const RoundRule& rule) {
  if (!rule.sampler) return 0;
  return k == 0 ? 1 : 2 * k + 1;
}

}  // namespace

// A sequence: its cache, and the TargetView drafters read.
class BatchedModel::Context final : public ModelContext, public TargetView {
 public:
  Context(std::shared_ptr<const BatchedModel> model, int64_t capacity)
      : m_(std::move(model)), cache_(m_->backend(), m_->spec_, capacity) {}
  ~Context() override { m_->forget(cache_.id()); }

  std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_logits) override {
    return m_->forward(cache_, tokens, n_logits);
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

  // A round's drafts need its [tokens, drafts] to fit one step; the drafts' buffer grows to the longest
  // asked, the sampled drafts' logits are one tensor per draft count ([k, vocab] exactly, so that the
  // verdict reads them without a copy).
  bool prepare_round(int64_t tokens, int64_t k, const RoundRule& rule, RoundBuffers& buffers,
                     std::string& why) override {
    if (tokens < 1 || k < 0) fail("{}: prepare_round of {} tokens and {} drafts", m_->name_, tokens, k);
    const int64_t step = m_->spec_.step_tokens;
    if (k > 0 && tokens + k > step) {
      why = fmt::format("{} drafts after {} token(s) do not fit one step of {} tokens", k, tokens, step);
      return false;
    }
    buffers = this->buffers(k, rule, true);
    // The graph of this round alone, built now so that a rule it cannot hold is known before drafting.
    const std::vector<int32_t> ids(static_cast<size_t>(k > 0 ? tokens : (tokens - 1) % step + 1), 0);
    const Round round{&cache_, ids, k, rule, buffers};
    Built& b = m_->round_graph({&round, 1});
    if (!b.verdict) why = b.why;
    return static_cast<bool>(b.verdict);
  }
  // The buffers of a round of k drafts under `rule`, made when `make`; else they must exist.
  RoundBuffers buffers(int64_t k, const RoundRule& rule, bool make) {
    RoundBuffers out;
    if (k == 0) return out;
    if (!drafts_ || drafts_->shape()[0] < k) {
      if (!make) fail("{}: a round of {} drafts was not prepared (ModelContext::prepare_round)", m_->name_, k);
      drafts_ = m_->backend().allocate(m_->name_ + ".draft_tokens", DType::I32, {std::max<int64_t>(k, 4), 1});
    }
    out.tokens = drafts_;
    if (rule.sampler) {
      BackendTensorPtr& logits = draft_logits_[k];
      if (!logits) {
        if (!make) fail("{}: a sampled round of {} drafts was not prepared (ModelContext::prepare_round)", m_->name_, k);
        logits = m_->backend().allocate(m_->name_ + ".draft_logits", DType::F32, {k, m_->vocab_});
      }
      out.logits = logits;
    }
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
  BackendTensorPtr drafts_;  // the rounds' drafts: I32 [N, 1]
  std::map<int64_t, BackendTensorPtr> draft_logits_;  // a sampled round of k drafts: F32 [k, vocab]
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
    // A round graph whose rule has no device form here (b->why) is never run, nor compiled.
    if (b->why.empty()) try {
        b->plan = backend_->compile(b->graph);
      } catch (const Error& e) {
        // A sampling graph the backend refuses at this shape (e.g. a top-p draw past a device's loop limit):
        // without its verdict it is never run, and the host decides, saying why.
        if (!b->verdict) throw;
        b->verdict = Value{};
        b->why = fmt::format("the backend cannot run the sampling graph: {}", e.what());
      }
    slot = std::move(b);
  }
  return *slot;
}

BatchedModel::Built& BatchedModel::graph_for(std::span<const Part> parts) const {
  std::vector<int64_t> shape;
  for (const Part& p : parts)
    shape.insert(shape.end(), {static_cast<int64_t>(p.cache->id()), static_cast<int64_t>(p.tokens.size()), p.n_logits});
  return cached_graph({std::move(shape), std::string()}, [&](Built& b) {
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
    if (b.logits) g.mark_output(g.named(b.logits, "logits"));
  });
}

BatchedModel::Built& BatchedModel::round_graph(std::span<const Round> rounds) const {
  std::vector<int64_t> shape;
  std::string key = "round";
  for (const Round& r : rounds) {
    shape.insert(shape.end(), {static_cast<int64_t>(r.cache->id()), static_cast<int64_t>(r.tokens.size()), r.drafts});
    const std::string rule = r.rule.sampler ? "sampler:" + r.rule.sampler->device_key(r.rule.state) : "argmax";
    key += r.drafts ? fmt::format("|{}:{}", r.buffers.tokens->shape()[0], rule) : "|" + rule;
  }
  return cached_graph({std::move(shape), std::move(key)}, [&](Built& b) {
    Graph& g = b.graph;
    std::vector<BatchGraph::Entry> entries;
    std::vector<int64_t> n_logits;
    int64_t host = 0, uniforms = 0;
    for (const Round& r : rounds) {
      const int64_t t = static_cast<int64_t>(r.tokens.size());
      entries.push_back({r.cache, t + r.drafts});
      n_logits.push_back(r.drafts + 1);
      host += t;
      uniforms += uniform_count(r.drafts, r.rule);
    }
    b.batch = std::make_unique<BatchGraph>(g, std::move(entries), attention_);
    b.ids = g.input(DType::I32, {host}, "tokens");
    if (uniforms) b.uniforms = g.input(DType::F32, {uniforms}, "uniforms");
    // Each round's rows: its host ids, then its drafts read where the drafter wrote them.
    std::vector<Value> drafts(rounds.size());
    Value ids;
    host = 0;
    for (size_t i = 0; i < rounds.size(); ++i) {
      const Round& r = rounds[i];
      const int64_t t = static_cast<int64_t>(r.tokens.size());
      Value x = g.slice(b.ids, host, t);
      host += t;
      if (r.drafts) {
        const int64_t N = r.buffers.tokens->shape()[0];
        drafts[i] = g.slice(g.reshape(g.constant(r.buffers.tokens), {N}), 0, r.drafts);
        x = g.concat(x, drafts[i]);
      }
      ids = ids ? g.concat(ids, x) : x;
    }
    const Value logits = g.named(build_forward(*b.batch, ids, n_logits), "logits");
    // Each round's verdict from its k + 1 rows of logits.
    int64_t row = 0;
    uniforms = 0;
    b.sampler_ids.resize(rounds.size());
    for (size_t i = 0; i < rounds.size(); ++i) {
      const Round& r = rounds[i];
      const int64_t k = r.drafts;
      const Value p = b.batch->rows(logits, row, k + 1);
      row += k + 1;
      const int64_t nu = uniform_count(k, r.rule);
      const Value u = nu ? g.slice(b.uniforms, uniforms, nu) : Value{};
      uniforms += nu;
      const Value v = round_verdict(b, i, r, p, drafts[i], u);
      if (!v) {
        if (b.why.empty()) b.why = "the sampler's device form gave no token";
        b.verdict = Value{};
        return;
      }
      b.verdict = b.verdict ? g.concat(b.verdict, v) : v;
    }
    g.mark_output(b.verdict);
  });
}

Value BatchedModel::round_verdict(Built& b, size_t i, const Round& r, Value p, Value drafts, Value u) const {
  Graph& g = b.graph;
  const int64_t k = r.drafts;
  if (!r.rule.sampler) {  // greedy: the argmax of every row
    const Value greedy = g.reshape(g.argmax(p), {k + 1});
    return k ? g.concat(drafts, greedy) : greedy;
  }
  if (k > 0) return r.rule.sampler->verify_in_graph(g, p, g.constant(r.buffers.logits), drafts, u, r.rule.state, *backend_, &b.why);
  const std::vector<int32_t> ids = r.rule.sampler->device_ids(r.rule.state);
  if (!ids.empty()) b.sampler_ids[i] = g.input(DType::I32, {static_cast<int64_t>(ids.size())}, fmt::format("sampler_ids.{}", i));
  return r.rule.sampler->sample_in_graph(g, g.reshape(p, {vocab_}), b.sampler_ids[i], u, r.rule.state, *backend_, &b.why);
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

void BatchedModel::execute(Built& b, std::span<const Part> parts) const {
  std::vector<int32_t> ids;
  for (const Part& p : parts) ids.insert(ids.end(), p.tokens.begin(), p.tokens.end());
  RunInputs in;
  in.inputs.emplace_back(b.ids, bytes_of(ids));
  b.batch->set_inputs(in);
  b.plan->run(in);
  b.batch->appended();
}

std::vector<float> BatchedModel::run(std::span<const Part> parts) const {
  Built& b = graph_for(parts);
  execute(b, parts);
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

std::vector<RoundVerdict> BatchedModel::run_rounds(std::span<const Round> rounds) const {
  Built& b = round_graph(rounds);
  if (!b.verdict) fail("{}: a round cannot be decided on the backend: {}", name_, b.why);
  std::vector<int32_t> ids;
  std::vector<float> uniforms;
  std::vector<std::vector<int32_t>> sampler_ids(rounds.size());
  int64_t size = 0;
  RunInputs in;
  for (size_t i = 0; i < rounds.size(); ++i) {
    const Round& r = rounds[i];
    ids.insert(ids.end(), r.tokens.begin(), r.tokens.end());
    const int64_t nu = uniform_count(r.drafts, r.rule);
    if (static_cast<int64_t>(r.rule.uniforms.size()) != nu)
      fail("{}: a round of {} drafts takes {} uniforms, got {}", name_, r.drafts, nu, r.rule.uniforms.size());
    uniforms.insert(uniforms.end(), r.rule.uniforms.begin(), r.rule.uniforms.end());
    if (b.sampler_ids[i]) {
      sampler_ids[i] = r.rule.sampler->device_ids(r.rule.state);
      in.inputs.emplace_back(b.sampler_ids[i], bytes_of(sampler_ids[i]));
    }
    size += verdict_size(r.drafts, r.rule);
  }
  in.inputs.emplace_back(b.ids, bytes_of(ids));
  if (b.uniforms) in.inputs.emplace_back(b.uniforms, std::as_bytes(std::span<const float>(uniforms)));
  b.batch->set_inputs(in);
  b.plan->run(in);
  b.batch->appended();
  std::vector<int32_t> read(static_cast<size_t>(size));
  b.plan->read(b.verdict, std::as_writable_bytes(std::span<int32_t>(read)));

  std::vector<RoundVerdict> out;
  const int32_t* v = read.data();
  for (const Round& r : rounds) {
    const int64_t k = r.drafts;
    RoundVerdict d;
    if (k == 0) {
      d.tokens = {v[0]};
    } else if (r.rule.sampler) {  // [accepted, tokens ...]
      d.accepted = v[0];
      if (d.accepted < 0 || d.accepted > k)
        fail("{}: the backend's verdict accepted {} of {} drafts", name_, d.accepted, k);
      d.tokens.assign(v + 1, v + 2 + d.accepted);
    } else {  // [drafts, greedy]: a draft is accepted while it is the argmax
      while (d.accepted < k && v[d.accepted] == v[k + d.accepted]) ++d.accepted;
      d.tokens.assign(v + k, v + k + d.accepted + 1);
    }
    v += verdict_size(k, r.rule);
    out.push_back(std::move(d));
  }
  return out;
}

std::vector<RoundVerdict> BatchedModel::verify(std::span<const RoundEntry> entries) {
  std::vector<Round> rounds;
  for (size_t e = 0; e < entries.size(); ++e) {
    const RoundEntry& entry = entries[e];
    auto* ctx = dynamic_cast<Context*>(entry.context);
    if (!ctx || ctx->model() != this) fail("{}: verify: round {} is not on a context of this model", name_, e);
    for (const Round& r : rounds)
      if (r.cache == &ctx->cache()) fail("{}: verify: round {} repeats the context of an earlier round", name_, e);
    check_tokens(ctx->cache(), entry.tokens, 1);
    check_room(ctx->cache(), static_cast<int64_t>(entry.tokens.size()) + entry.drafts);
    if (entry.drafts > 0 && static_cast<int64_t>(entry.tokens.size()) + entry.drafts > spec_.step_tokens)
      fail("{}: verify: round {} of {} drafts after {} token(s) exceeds one step of {} tokens", name_, e, entry.drafts,
           entry.tokens.size(), spec_.step_tokens);
    rounds.push_back({&ctx->cache(), entry.tokens, entry.drafts, entry.rule, ctx->buffers(entry.drafts, entry.rule, false)});
  }
  // A plain step after a prompt longer than a step: the earlier steps first, then the last one decides.
  for (Round& r : rounds) {
    const int64_t n = static_cast<int64_t>(r.tokens.size());
    const int64_t last = (n - 1) / spec_.step_tokens * spec_.step_tokens;
    for (int64_t start = 0; start < last; start += spec_.step_tokens) {
      const Part part{r.cache, r.tokens.subspan(start, spec_.step_tokens), 0};
      run({&part, 1});
    }
    r.tokens = r.tokens.subspan(last);
  }
  return run_rounds(rounds);
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

#include "specula/kv_cache.hpp"

#include <algorithm>
#include <atomic>
#include <numeric>

#include "specula/error.hpp"
#include "specula/log.hpp"

namespace specula {
namespace {

int64_t product(const Shape& s, size_t from) {
  int64_t n = 1;
  for (size_t i = from; i < s.size(); ++i) n *= s[i];
  return n;
}

// Slots of a layer for a sequence of `capacity` positions: a sliding layer needs its window - 1 previous
// keys plus the step being appended.
int64_t slots_of(const KvLayerSpec& l, const KvCacheSpec& spec, int64_t capacity) {
  return l.window > 0 ? std::min(l.window - 1 + spec.step_tokens, capacity) : capacity;
}

std::atomic<uint64_t> next_cache_id{1};

}  // namespace

double KvCacheSpec::bytes(int64_t capacity) const {
  const double elem = dtype_traits(type)->block_bytes;
  double b = 4.0 * static_cast<double>(hidden_size) * static_cast<double>(1 + step_tokens);
  for (const KvLayerSpec& l : layers) {
    const double slots = static_cast<double>(slots_of(l, *this, capacity));
    b += slots * (2.0 * elem * static_cast<double>(l.kv_heads * l.head_dim) + 4.0);
  }
  return b;
}

KvCache::KvCache(ComputeBackend& backend, KvCacheSpec spec, int64_t capacity)
    : backend_(backend), spec_(std::move(spec)), id_(next_cache_id++), capacity_(capacity) {
  if (capacity_ < 1) fail("{}: a KV cache needs a capacity of at least 1 token, not {}", spec_.name, capacity_);
  if (spec_.step_tokens < 1) fail("{}: KvCacheSpec::step_tokens = {} must be at least 1", spec_.name, spec_.step_tokens);
  layers_.reserve(spec_.layers.size());
  for (size_t i = 0; i < spec_.layers.size(); ++i) {
    const KvLayerSpec& ls = spec_.layers[i];
    Layer l;
    l.window = ls.window;
    l.slots = slots_of(ls, spec_, capacity_);
    l.ring = l.slots < capacity_;
    const std::string base = ls.name.empty() ? fmt::format("{}.{}", spec_.name, i) : ls.name;
    l.k = backend_.allocate(base + ".k", spec_.type, {l.slots, ls.kv_heads, ls.head_dim});
    l.v = backend_.allocate(base + ".v", spec_.type, {l.slots, ls.kv_heads, ls.head_dim});
    l.pos = backend_.allocate(base + ".pos", DType::I32, {l.slots});
    backend_.write(*l.pos, bytes_of(std::vector<int32_t>(static_cast<size_t>(l.slots), -1)));  // every slot empty
    layers_.push_back(std::move(l));
  }
  if (spec_.hidden_size > 0) {
    last_hidden_ = backend_.allocate(spec_.name + ".last_hidden", DType::F32, {spec_.hidden_size});
    step_hidden_ = backend_.allocate(spec_.name + ".step_hidden", DType::F32, {spec_.step_tokens, spec_.hidden_size});
  }
}

KvView KvCache::view(size_t layer) const {
  const Layer& l = layers_.at(layer);
  return {l.k, l.v, l.pos, l.window};
}

int32_t KvCache::slot(const Layer& layer, int64_t pos) const {
  return static_cast<int32_t>(layer.ring ? pos % layer.slots : pos);
}

int64_t KvCache::max_rollback() const {
  const bool ring = std::any_of(layers_.begin(), layers_.end(), [](const Layer& l) { return l.ring; });
  return ring ? std::min(spec_.step_tokens, position_) : position_;
}

// Rollback of `depth` positions: every layer's slots of the forgotten positions marked empty (slot ids
// and -1s from the host), and optionally row `hidden_row` of step_hidden copied into last_hidden.
struct KvCache::Rollback {
  Graph graph;
  std::unique_ptr<CompiledGraph> plan;  // after graph: destroyed first
  Value empty;                          // I32 [depth] of -1
  std::vector<Value> slots;             // per layer: I32 [depth]
  Value hidden_row, hidden_columns;     // I32 [1], I32 [hidden_size]
  std::vector<int32_t> empty_data, column_data;  // the constant inputs: -1s, 0..hidden_size-1
};

KvCache::~KvCache() = default;

KvCache::Rollback& KvCache::rollback(int64_t depth, bool hidden) {
  // Speculative depths (up to a step) are kept for the next rounds; a deeper one (copy_prefix of a
  // long prefix) replaces the single deep slot.
  if (depth > spec_.step_tokens)
    std::erase_if(rollbacks_, [&](const auto& kv) { return kv.first.first > spec_.step_tokens; });
  auto& r = rollbacks_[{depth, hidden}];
  if (r) return *r;
  r = std::make_unique<Rollback>();
  Graph& g = r->graph;
  r->empty = g.input(DType::I32, {depth}, "empty");
  r->empty_data.assign(static_cast<size_t>(depth), -1);
  for (size_t i = 0; i < layers_.size(); ++i) {
    r->slots.push_back(g.input(DType::I32, {depth}, fmt::format("slots.{}", i)));
    g.mark_output(g.write_rows(layers_[i].pos, r->empty, r->slots.back()));
  }
  if (hidden) {
    const int64_t H = spec_.hidden_size;
    r->hidden_row = g.input(DType::I32, {1}, "hidden_row");
    r->hidden_columns = g.input(DType::I32, {H}, "hidden_columns");
    r->column_data.resize(static_cast<size_t>(H));
    std::iota(r->column_data.begin(), r->column_data.end(), 0);
    const Value row = g.reshape(g.get_rows(g.constant(step_hidden_), r->hidden_row), {H, 1});
    g.mark_output(g.write_rows(last_hidden_, row, r->hidden_columns));
  }
  r->plan = backend_.compile(g);
  return *r;
}

void KvCache::truncate(int64_t pos) {
  if (pos < 0 || pos > position_) fail("{}: truncate({}) outside [0, {}]", spec_.name, pos, position_);
  if (pos == position_) return;
  const int64_t depth = position_ - pos;
  if (depth > max_rollback())
    fail("{}: cannot roll back {} tokens: the sliding-window cache keeps only {} (the model's step size, e.g. "
         "option prefill_chunk)", spec_.name, depth, max_rollback());
  // Within max_rollback the slots of positions [pos, position) hold exactly those positions (a ring has
  // not wrapped over them), so marking them empty forgets every position >= pos.
  const int64_t row = pos - 1 - step_start_;  // the hidden row of the new last position, if the last step has it
  const bool hidden = last_hidden_ && row >= 0 && row < step_len_;
  Rollback& r = rollback(depth, hidden);
  std::vector<std::vector<int32_t>> slots(layers_.size(), std::vector<int32_t>(static_cast<size_t>(depth)));
  RunInputs in;
  in.inputs.emplace_back(r.empty, bytes_of(r.empty_data));
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (int64_t j = 0; j < depth; ++j) slots[i][static_cast<size_t>(j)] = slot(layers_[i], pos + j);
    in.inputs.emplace_back(r.slots[i], bytes_of(slots[i]));
  }
  const std::vector<int32_t> hidden_row{static_cast<int32_t>(row)};
  if (hidden) {
    in.inputs.emplace_back(r.hidden_row, bytes_of(hidden_row));
    in.inputs.emplace_back(r.hidden_columns, bytes_of(r.column_data));
  }
  r.plan->run(in);
  if (!hidden && last_hidden_) {
    log_debug("{}: after truncate({}) last_hidden() still holds position {}", spec_.name, pos, step_start_ + step_len_ - 1);
  }
  step_len_ = std::max<int64_t>(0, std::min(step_len_, pos - step_start_));
  position_ = pos;
}

void KvCache::copy_prefix(const KvCache& from, int64_t n) {
  if (&from == this) return truncate(n);
  if (from.capacity_ != capacity_ || from.layers_.size() != layers_.size() || from.spec_.type != spec_.type ||
      from.spec_.step_tokens != spec_.step_tokens || from.spec_.hidden_size != spec_.hidden_size)
    fail("{}: copy_prefix: the caches differ in layout (capacity {} vs {})", spec_.name, from.capacity_, capacity_);
  if (n < 0 || n > from.position_ || from.position_ - n > from.max_rollback())
    fail("{}: copy_prefix({}): the source holds positions [0, {}) and can give back at most {}", spec_.name, n,
         from.position_, from.max_rollback());
  auto copy = [&](const BackendTensorPtr& src, const BackendTensorPtr& dst) {
    // Through F32 / I32 (what read() gives and write() takes for every cache type): F16 and BF16 values
    // come back exactly.
    std::vector<std::byte> buf(static_cast<size_t>(product(src->shape(), 0)) * 4);
    backend_.read(*src, buf);
    backend_.write(*dst, buf);
  };
  for (size_t i = 0; i < layers_.size(); ++i) {
    copy(from.layers_[i].k, layers_[i].k);
    copy(from.layers_[i].v, layers_[i].v);
    copy(from.layers_[i].pos, layers_[i].pos);
  }
  if (last_hidden_) {
    copy(from.last_hidden_, last_hidden_);
    copy(from.step_hidden_, step_hidden_);
  }
  position_ = from.position_;
  step_start_ = from.step_start_;
  step_len_ = from.step_len_;
  truncate(n);
}

void KvCache::appended(int64_t n) {
  step_start_ = position_;
  step_len_ = n;
  position_ += n;
}

// ------------------------------------------------------------------------------------------ batch
BatchGraph::BatchGraph(Graph& g, std::vector<Entry> entries, std::shared_ptr<const Attention> attention)
    : g_(g), entries_(std::move(entries)), attention_(attention ? std::move(attention) : standard_attention()) {
  if (entries_.empty()) fail("BatchGraph: a batch needs at least one sequence");
  int64_t hidden = 0;
  for (const Entry& e : entries_) {
    if (!e.cache || e.tokens < 1) fail("BatchGraph: every entry needs a cache and at least one token");
    if (e.tokens > e.cache->spec().step_tokens)
      fail("{}: {} tokens in one step exceed the cache's step of {}", e.cache->spec().name, e.tokens,
           e.cache->spec().step_tokens);
    const auto& a = e.cache->spec().layers;
    const auto& b = entries_[0].cache->spec().layers;
    const bool same = a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](const KvLayerSpec& x, const KvLayerSpec& y) {
                        return x.kv_heads == y.kv_heads && x.head_dim == y.head_dim && x.window == y.window;
                      });
    if (!same) fail("BatchGraph: the sequences of a batch must share one cache layout ({} differs)", e.cache->spec().name);
    offsets_.push_back(rows_);
    rows_ += e.tokens;
    hidden = e.cache->spec().hidden_size;
  }
  pos_ = g_.input(DType::I32, {rows_}, "positions");
  written_.assign(entries_.size(), std::vector<Written>(entries_[0].cache->spec().layers.size()));
  if (hidden > 0) {
    // keep_hidden's row ids: 0..tokens-1 into step_hidden, 0..hidden-1 into last_hidden (a column).
    for (size_t e = 0; e < entries_.size(); ++e)
      hidden_ids_.push_back(g_.input(DType::I32, {entries_[e].tokens}, fmt::format("hidden_rows.{}", e)));
    hidden_ids_.push_back(g_.input(DType::I32, {hidden}, "hidden_columns"));
  }
}

Value BatchGraph::rows(Value x, int64_t begin, int64_t n) const {
  const Shape s = g_.shape(x);
  const int64_t T = s[0];
  if (begin == 0 && n == T) return x;
  const int64_t row = product(s, 1);
  Shape out = s;
  out[0] = n;
  return g_.reshape(g_.slice(g_.reshape(x, {1, T * row}), begin * row, n * row), out);
}

Value BatchGraph::last_rows(Value x, std::span<const int64_t> n) const {
  if (n.size() != entries_.size()) fail("BatchGraph::last_rows: {} counts for {} entries", n.size(), entries_.size());
  const Shape s = g_.shape(x);
  const int64_t row = product(s, 1);
  Value out;
  int64_t total = 0;
  for (size_t e = 0; e < entries_.size(); ++e) {
    if (n[e] < 0 || n[e] > entries_[e].tokens)
      fail("BatchGraph::last_rows: {} rows of an entry of {} tokens", n[e], entries_[e].tokens);
    if (n[e] == 0) continue;
    Value part = g_.reshape(rows(x, offsets_[e] + entries_[e].tokens - n[e], n[e]), {1, n[e] * row});
    out = out ? g_.concat(out, part) : part;
    total += n[e];
  }
  if (!out) return out;
  Shape shape = s;
  shape[0] = total;
  return total == s[0] ? x : g_.reshape(out, shape);
}

Value BatchGraph::slots_for(size_t layer) {
  const int64_t window = entries_[0].cache->layer(layer).window;
  for (const SlotInput& s : slot_inputs_)
    if (s.window == window) return s.value;
  // Full layers (and windows no shorter than the capacity) keep position p in slot p: no input needed.
  const bool ring = std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.cache->layer(layer).ring; });
  const Value v = ring ? g_.input(DType::I32, {rows_}, fmt::format("slots.window{}", window)) : pos_;
  slot_inputs_.push_back({window, layer, ring, v, {}});
  return v;
}

Value BatchGraph::attention(size_t layer, Value q, Value k, Value v, float scale) {
  const Shape qs = g_.shape(q);
  if (qs.size() != 3 || qs[0] != rows_)
    fail("BatchGraph::attention: q must be [{}, Hq, D], not {}", rows_, shape_str(qs));
  const bool write = static_cast<bool>(k);
  if (write != static_cast<bool>(v)) fail("BatchGraph::attention: give both k and v, or neither");
  const Value slots = write ? slots_for(layer) : Value{};
  Value out;
  const int64_t C = qs[1] * (write ? g_.shape(v)[2] : entries_[0].cache->layer(layer).v->shape()[2]);
  for (size_t e = 0; e < entries_.size(); ++e) {
    const KvCache::Layer& l = entries_[e].cache->layer(layer);
    const int64_t off = offsets_[e], n = entries_[e].tokens;
    Written& w = written_[e][layer];
    const Value pos = entries_.size() == 1 ? pos_ : g_.slice(pos_, off, n);
    if (write) {
      const Value slot = entries_.size() == 1 ? slots : g_.slice(slots, off, n);
      w.k = g_.write_rows(l.k, rows(k, off, n), slot);
      w.v = g_.write_rows(l.v, rows(v, off, n), slot);
      w.pos = g_.write_rows(l.pos, pos, slot);
      // Cache writes must run even when nothing downstream is read (a prefill without logits).
      g_.mark_output(w.k);
      g_.mark_output(w.v);
      g_.mark_output(w.pos);
    } else if (!w.k) {
      fail("BatchGraph::attention: cache layer {} was not written in this graph before being read", layer);
    }
    if (in_use_.empty())
      for (size_t i = 0; i < entries_.size(); ++i)
        in_use_.push_back(g_.input(DType::I32, {1}, fmt::format("slots_in_use.{}", i)));
    Value a = attention_->build(g_, {rows(q, off, n), w.k, w.v, w.pos, pos, scale, l.window, true, in_use_[e]});
    if (entries_.size() == 1) return a;
    a = g_.reshape(a, {1, n * C});
    out = out ? g_.concat(out, a) : a;
  }
  return g_.reshape(out, {rows_, C});
}

void BatchGraph::keep_hidden(Value h) {
  if (hidden_ids_.empty()) fail("BatchGraph::keep_hidden: the cache keeps no hidden rows (KvCacheSpec::hidden_size)");
  const int64_t H = g_.shape(h).back();
  for (size_t e = 0; e < entries_.size(); ++e) {
    const KvCache& c = *entries_[e].cache;
    const Value own = rows(h, offsets_[e], entries_[e].tokens);
    const Value last = g_.reshape(rows(own, entries_[e].tokens - 1, 1), {H, 1});
    g_.mark_output(g_.write_rows(c.last_hidden(), last, hidden_ids_.back()));
    g_.mark_output(g_.write_rows(c.step_hidden(), own, hidden_ids_[e]));
  }
}

void BatchGraph::set_inputs(RunInputs& in) {
  pos_data_.resize(static_cast<size_t>(rows_));
  for (size_t e = 0; e < entries_.size(); ++e) {
    const KvCache& c = *entries_[e].cache;
    if (c.position() + entries_[e].tokens > c.capacity())
      fail("{}: context overflow: {} tokens at position {} exceed the context length {}", c.spec().name,
           entries_[e].tokens, c.position(), c.capacity());
    for (int64_t t = 0; t < entries_[e].tokens; ++t)
      pos_data_[static_cast<size_t>(offsets_[e] + t)] = static_cast<int32_t>(c.position() + t);
  }
  in.inputs.emplace_back(pos_, bytes_of(pos_data_));
  for (SlotInput& s : slot_inputs_) {
    if (!s.ring) continue;  // the positions themselves
    s.data.resize(static_cast<size_t>(rows_));
    for (size_t e = 0; e < entries_.size(); ++e) {
      const KvCache& c = *entries_[e].cache;
      for (int64_t t = 0; t < entries_[e].tokens; ++t)
        s.data[static_cast<size_t>(offsets_[e] + t)] = c.slot(c.layer(s.layer), c.position() + t);
    }
    in.inputs.emplace_back(s.value, bytes_of(s.data));
  }
  in_use_data_.resize(in_use_.size());  // sized once: the inputs point into it
  for (size_t e = 0; e < in_use_.size(); ++e) {
    const KvCache& c = *entries_[e].cache;
    in_use_data_[e] = static_cast<int32_t>(c.position() + entries_[e].tokens);
    in.inputs.emplace_back(in_use_[e], std::as_bytes(std::span<const int32_t>(&in_use_data_[e], 1)));
  }
  if (!hidden_ids_.empty()) {
    hidden_id_data_.resize(hidden_ids_.size());
    for (size_t i = 0; i < hidden_ids_.size(); ++i) {
      const int64_t n = g_.shape(hidden_ids_[i])[0];
      auto& d = hidden_id_data_[i];
      d.resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) d[static_cast<size_t>(j)] = static_cast<int32_t>(j);
      in.inputs.emplace_back(hidden_ids_[i], bytes_of(d));
    }
  }
}

void BatchGraph::appended() {
  for (const Entry& e : entries_) e.cache->appended(e.tokens);
}

}  // namespace specula

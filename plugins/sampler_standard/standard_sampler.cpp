#include "standard_sampler.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "specula/error.hpp"

namespace specula::sampling {

StandardSampler::StandardSampler(const SamplingParams& p) : params_(p), rng_(p.seed) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    fail("sampler 'standard': temperature {} must be a finite number >= 0", p.temperature);
  if (p.top_k < 0) fail("sampler 'standard': top_k {} must be >= 0 (0 = off)", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("sampler 'standard': top_p {} must be in (0, 1]", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) fail("sampler 'standard': min_p {} must be in [0, 1]", p.min_p);
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    fail("sampler 'standard': repetition_penalty {} must be a finite number > 0", p.repetition_penalty);
  if (p.penalty_window < 0) fail("sampler 'standard': penalty_window {} must be >= 0", p.penalty_window);
  if (p.min_length < 0) fail("sampler 'standard': min_length {} must be >= 0", p.min_length);
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    fail("sampler 'standard': presence_penalty {} must be in [-2, 2]", p.presence_penalty);
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    fail("sampler 'standard': frequency_penalty {} must be in [-2, 2]", p.frequency_penalty);
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0) fail("sampler 'standard': logit_bias names token {}; ids are >= 0", id);
    if (!(bias >= -100.0f && bias <= 100.0f))
      fail("sampler 'standard': logit_bias of token {} is {}; biases are in [-100, 100]", id, bias);
  }
}

float StandardSampler::next_uniform() {
  // 24 random bits: every value is exactly representable and strictly below 1.
  return static_cast<float>(rng_() >> 40) * 0x1p-24f;
}

std::vector<float> StandardSampler::adjusted_logits(std::span<const float> logits, const SamplingState& state) const {
  std::vector<float> x(logits.begin(), logits.end());
  const auto vocab = static_cast<int64_t>(x.size());
  auto in_range = [&](int32_t id) { return id >= 0 && id < vocab; };
  if (state.generated < params_.min_length)
    for (int32_t id : state.end_tokens)
      if (in_range(id)) x[id] = -FLT_MAX;
  if (params_.repetition_penalty != 1.0f && params_.penalty_window > 0) {
    const size_t n = std::min(state.history.size(), static_cast<size_t>(params_.penalty_window));
    std::vector<int32_t> ids(state.history.end() - static_cast<std::ptrdiff_t>(n), state.history.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    const float p = params_.repetition_penalty;
    for (int32_t id : ids)
      if (in_range(id)) x[id] = x[id] > 0.0f ? x[id] / p : x[id] * p;
  }
  if (history_penalties_active(state)) {
    // Counts over this completion's tokens only: the last `generated` ids of the history.
    const size_t n = std::min(state.history.size(), static_cast<size_t>(std::max(state.generated, 0)));
    std::vector<int32_t> ids(state.history.end() - static_cast<std::ptrdiff_t>(n), state.history.end());
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
      size_t j = i;
      while (j < ids.size() && ids[j] == ids[i]) ++j;
      const auto count = static_cast<float>(j - i);
      if (in_range(ids[i])) x[ids[i]] -= params_.presence_penalty + params_.frequency_penalty * count;
      i = j;
    }
  }
  for (const auto& [id, bias] : params_.logit_bias)
    if (in_range(id) && x[id] != -FLT_MAX) x[id] += bias;  // a suppressed end token stays suppressed
  return x;
}

StandardSampler::Candidates StandardSampler::candidates(std::span<const float> logits, const SamplingState& state) const {
  if (logits.empty()) fail("sampler 'standard': empty logits");
  const std::vector<float> x = adjusted_logits(logits, state);
  Candidates c;
  if (params_.temperature == 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < static_cast<int32_t>(x.size()); ++i)
      if (x[i] > x[best]) best = i;
    c.order = {best};
    c.set.w = {1.0f};
    c.set.keep = 1;
    c.set.mass = 1.0f;
    return c;
  }

  const auto vocab = static_cast<int64_t>(x.size());
  const int64_t k = params_.top_k > 0 ? std::min<int64_t>(params_.top_k, vocab) : vocab;
  c.order.resize(static_cast<size_t>(k));
  top_k_order(x, k, c.order.data());  // by logit, ties: lower id (TopK's order on every backend)
  const std::vector<int32_t>& order = c.order;
  // The weights, min-p, top-p and the draw: the rule every backend's TopPDraw computes too.
  std::vector<float> top(order.size());
  for (size_t i = 0; i < order.size(); ++i) top[i] = x[order[i]];
  c.set = top_p_set(top, 1.0f / params_.temperature, params_.top_p, params_.min_p);
  return c;
}

int32_t StandardSampler::sample(std::span<const float> logits, const SamplingState& state, float uniform) const {
  const Candidates c = candidates(logits, state);
  return c.order[top_p_pick(c.set, uniform)];
}

std::vector<TokenProbability> StandardSampler::distribution(std::span<const float> logits,
                                                            const SamplingState& state) const {
  const Candidates c = candidates(logits, state);
  // The draw's weights (kept as `weight` for the speculative rule), normalised in double to sum to 1.
  double mass = 0.0;
  for (size_t i = 0; i < c.set.keep; ++i) mass += c.set.w[i];
  std::vector<TokenProbability> out;
  out.reserve(c.set.keep);
  for (size_t i = 0; i < c.set.keep; ++i)
    if (c.set.w[i] > 0.0f) out.push_back({c.order[i], static_cast<double>(c.set.w[i]) / mass, c.set.w[i]});
  return out;
}

bool StandardSampler::penalty_active(const SamplingState& state) const {
  return params_.repetition_penalty != 1.0f && params_.penalty_window > 0 && !state.history.empty();
}

bool StandardSampler::history_penalties_active(const SamplingState& state) const {
  return (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) && state.generated > 0 &&
         !state.history.empty();
}

// Why the device forms refuse this state: the OpenAI penalties and logit_bias have no graph form yet.
std::string StandardSampler::host_only_reason() const {
  std::vector<std::string> what;
  if (params_.presence_penalty != 0.0f) what.emplace_back("presence_penalty");
  if (params_.frequency_penalty != 0.0f) what.emplace_back("frequency_penalty");
  if (!params_.logit_bias.empty()) what.emplace_back("logit_bias");
  if (what.empty()) return {};
  return fmt::format("{} {} applied on the host only (the sampler has no device form of {})", fmt::join(what, ", "),
                     what.size() == 1 ? "is" : "are", what.size() == 1 ? "it" : "them");
}

bool StandardSampler::suppression_active(const SamplingState& state) const {
  return state.generated < params_.min_length && !state.end_tokens.empty();
}

// The window's ids, padded to a fixed length by repeating the newest one (the penalty applies once per
// distinct id, so a repeat changes nothing) so that the graph keeps one shape while the history grows.
int64_t StandardSampler::window_slots(const SamplingState& state) const {
  if (!penalty_active(state)) return 0;
  const auto w = static_cast<int64_t>(params_.penalty_window);
  return std::max(std::min<int64_t>(w, static_cast<int64_t>(state.history.size())), std::min<int64_t>(w, kPaddedWindow));
}

std::vector<int32_t> StandardSampler::device_ids(const SamplingState& state) const {
  const int64_t slots = window_slots(state);
  const int64_t n = std::min<int64_t>(slots, static_cast<int64_t>(state.history.size()));
  std::vector<int32_t> ids(state.history.end() - n, state.history.end());
  ids.resize(static_cast<size_t>(slots), slots ? state.history.back() : 0);
  if (suppression_active(state)) ids.insert(ids.end(), state.end_tokens.begin(), state.end_tokens.end());
  return ids;
}

std::string StandardSampler::device_key(const SamplingState& state) const {
  const SamplingParams& p = params_;
  // The host-only rules are part of the key: a graph cached for a sampler without them (its key otherwise
  // equal) must not be reused for one with them, which the device forms decline.
  const std::string host = host_only_reason().empty() ? "" : fmt::format(" presence={} frequency={} bias={}",
                                                                         p.presence_penalty, p.frequency_penalty,
                                                                         p.logit_bias.size());
  return fmt::format("standard t={} k={} p={} minp={} rp={} window={} ends={}{}", p.temperature, p.top_k, p.top_p,
                     p.min_p, p.repetition_penalty, window_slots(state),
                     suppression_active(state) ? static_cast<int64_t>(state.end_tokens.size()) : 0, host);
}

Value StandardSampler::sample_in_graph(Graph& g, Value logits, Value ids, Value uniform, const SamplingState& state,
                                       const ComputeBackend& backend, std::string* why) const {
  const Node& ln = g.node(logits);
  if (ln.shape.size() != 1 || ln.type != DType::F32)
    fail("sampler 'standard': device logits must be F32 [vocab], got {} with {} axes", dtype_name(ln.type),
         ln.shape.size());
  const int64_t vocab = ln.shape[0];
  const int64_t slots = window_slots(state);
  const int64_t ends = suppression_active(state) ? static_cast<int64_t>(state.end_tokens.size()) : 0;
  const bool greedy = params_.temperature == 0.0f;
  if (std::string host = host_only_reason(); !host.empty()) {
    if (why) *why = std::move(host);
    return {};
  }
  if (slots + ends > 0 && (!ids || g.shape(ids) != Shape{slots + ends}))
    fail("sampler 'standard': the ids input must be I32 [{}] (device_ids), got {}", slots + ends,
         ids ? fmt::format("{} values", g.shape(ids)[0]) : std::string("none"));
  if (!greedy && (!uniform || g.shape(uniform) != Shape{1}))
    fail("sampler 'standard': the uniform input must be F32 [1]");

  // Every op this state's rules need, asked before anything is added to the graph.
  std::vector<Op> need{Op::Reshape};
  if (slots + ends > 0) need.insert(need.end(), {Op::GetRows, Op::Clamp, Op::Scatter});
  if (slots > 0 && ends > 0) need.push_back(Op::Slice);
  if (slots > 0) need.insert(need.end(), {Op::Div, Op::Scale, Op::Add});
  if (greedy) need.push_back(Op::Argmax);
  else need.insert(need.end(), {Op::TopK, Op::GetRows, Op::TopPDraw});
  for (Op op : need) {
    const Support s = backend.supports(op, DType::F32);
    if (!s.ok) {
      if (why) *why = fmt::format("backend '{}' lacks {} on F32 ({})", backend.name(), op_name(op), s.reason);
      return {};
    }
  }

  // Values read at `at` (I32 [m]) of x (F32 [vocab]) -> F32 [m].
  auto gather = [&](Value x, Value at) {
    return g.reshape(g.get_rows(g.reshape(x, {vocab, 1}), at), {g.shape(at)[0]});
  };
  Value x = logits;
  if (ends > 0) {
    Value end_ids = slots > 0 ? g.slice(ids, slots, ends) : ids;
    x = g.scatter(x, end_ids, g.clamp(gather(x, end_ids), -FLT_MAX, -FLT_MAX));
  }
  if (slots > 0) {
    // where(v > 0, v / p, v * p) = max(v, 0) / p + min(v, 0) * p, exactly: one term is always +-0.
    const float p = params_.repetition_penalty;
    const float inf = std::numeric_limits<float>::infinity();
    Value hist = ends > 0 ? g.slice(ids, 0, slots) : ids;
    Value v = gather(x, hist);
    Value pos = g.div(g.clamp(v, 0.0f, inf), g.clamp(v, p, p));
    Value neg = g.scale(g.clamp(v, -inf, 0.0f), p);
    x = g.scatter(x, hist, g.add(pos, neg));
  }
  if (greedy) return g.argmax(x);  // ties: the lowest index, as the host's strict '>' scan
  const int64_t k = params_.top_k > 0 ? std::min<int64_t>(params_.top_k, vocab) : vocab;
  Value order = g.top_k(x, k);  // by logit, ties: lower index first, as the host's partial sort
  return g.top_p_draw(gather(x, order), uniform, order, params_.temperature, params_.top_p, params_.min_p);
}

Value StandardSampler::verify_in_graph(Graph& g, Value target, Value draft, Value drafts, Value uniforms,
                                       const SamplingState& state, const ComputeBackend& backend,
                                       std::string* why) const {
  const auto refuse = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return Value{};
  };
  if (params_.temperature == 0.0f) return refuse("greedy rounds are verified by argmax");
  // The penalty window and end-token suppression would differ from row to row with the drafts.
  if (penalty_active(state)) return refuse("the repetition penalty depends on the drafts (the host verifies)");
  if (std::string host = host_only_reason(); !host.empty()) return refuse(host + " (the host verifies)");
  if (suppression_active(state))
    return refuse(fmt::format("end tokens are suppressed for {} more tokens (the host verifies)",
                              params_.min_length - state.generated));
  for (Op op : {Op::TopK, Op::AcceptDrafts}) {
    const Support s = backend.supports(op, DType::F32);
    if (!s.ok) return refuse(fmt::format("backend '{}' lacks {} on F32 ({})", backend.name(), op_name(op), s.reason));
  }
  const Shape& ts = g.shape(target);
  if (ts.size() != 2) fail("sampler 'standard': verify_in_graph: target logits must be [n + 1, vocab], got {}", shape_str(ts));
  const int64_t vocab = ts[1];
  const int64_t k = params_.top_k > 0 ? std::min<int64_t>(params_.top_k, vocab) : vocab;
  // TopK orders ties by the lower id, as candidates() does (top_k_order): the same candidates in the same order.
  return g.accept_drafts(target, g.top_k(target, k), draft, g.top_k(draft, k), drafts, uniforms, params_.temperature,
                         params_.top_p, params_.min_p);
}

}  // namespace specula::sampling

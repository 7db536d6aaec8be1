// The device sampler's ops on the CPU. top_p_draw is the SDK's sampling rule (sampling_rule.hpp), which
// the host sampler follows too, so the two agree bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels.hpp"
#include "specula/sampling_rule.hpp"
#include "specula/error.hpp"

namespace specula::cpu {

void clamp(const float* x, int64_t n, float lo, float hi, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
}

void scatter(const float* a, int64_t n, const int32_t* ids, const float* values, int64_t m, float* out,
             const std::string& node_name) {
  for (int64_t j = 0; j < m; ++j)
    if (ids[j] < 0 || ids[j] >= n)
      fail("CPU backend: Scatter '{}': id {} at index {} is outside [0, {})", node_name, ids[j], j, n);
  std::memcpy(out, a, static_cast<size_t>(n) * sizeof(float));
  for (int64_t j = 0; j < m; ++j) out[ids[j]] = values[j];
}

int32_t top_p_draw(const float* logits, const int32_t* ids, int64_t k, float uniform, float inv_temperature,
                   float top_p, float min_p) {
  const TopPSet set = top_p_set(std::span<const float>(logits, static_cast<size_t>(k)), inv_temperature, top_p, min_p);
  return ids[top_p_pick(set, uniform)];
}

// One row's distribution: top_p_set over its TopK prefix, and the weight of any token under it.
struct RowSet {
  const float* x;       // the row's logits [vocab]
  const int32_t* top;   // its TopK
  TopPSet set;
  float top_scaled;     // x_0 * inv_temperature
  float inv_t;

  RowSet(const float* row, const int32_t* top_ids, int64_t k, float inv_temperature, float top_p, float min_p)
      : x(row), top(top_ids), inv_t(inv_temperature) {
    std::vector<float> v(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) v[static_cast<size_t>(j)] = row[top_ids[j]];
    set = top_p_set(v, inv_temperature, top_p, min_p);
    top_scaled = v[0] * inv_temperature;
  }
  // Kept iff t ranks (by logit, then lower id) at or before the last kept candidate b.
  float weight(int32_t t) const {
    const int32_t b = top[set.keep - 1];
    const bool kept = x[t] > x[b] || (x[t] == x[b] && t <= b);
    return kept ? rule_weight(x[t], inv_t, top_scaled) : 0.0f;
  }
};

void accept_drafts(DraftRows p, DraftRows q, const int32_t* drafts, int64_t n, int64_t vocab, const float* uniforms,
                   float inv_temperature, float top_p, float min_p, int32_t* out, const std::string& node_name) {
  std::fill(out, out + n + 2, -1);
  for (int64_t i = 0; i < n; ++i)
    if (drafts[i] < 0 || drafts[i] >= vocab)
      fail("CPU backend: AcceptDrafts '{}': draft {} at index {} is outside [0, {})", node_name, drafts[i], i, vocab);
  auto row = [&](DraftRows r, int64_t i) {
    return RowSet(r.logits + i * vocab, r.top + i * r.k, r.k, inv_temperature, top_p, min_p);
  };
  int32_t accepted = 0;
  for (int64_t i = 0; i <= n; ++i) {
    const RowSet ps = row(p, i);
    const std::span<const float> pw = std::span<const float>(ps.set.w).first(ps.set.keep);
    if (i == n) {  // every draft accepted: the bonus from the last row
      out[1 + i] = ps.top[top_p_pick(ps.set, uniforms[2 * n])];
      break;
    }
    const RowSet qs = row(q, i);
    std::vector<float> q_of_p(ps.set.keep);
    for (size_t k = 0; k < ps.set.keep; ++k) q_of_p[k] = qs.weight(ps.top[k]);
    const int32_t d = drafts[i];
    const int64_t v = speculative_verdict(pw, ps.set.mass, q_of_p, ps.weight(d), qs.weight(d), qs.set.mass,
                                          uniforms[2 * i], uniforms[2 * i + 1]);
    if (v >= 0) {
      out[1 + i] = ps.top[v];
      break;
    }
    out[1 + i] = d;
    ++accepted;
  }
  out[0] = accepted;
}

}  // namespace specula::cpu

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

}  // namespace specula::cpu

// Random logits over a whole vocabulary for the masks' random walks: one draw of normal noise, rotated by
// a random offset at each step (drawing 262144 values a step would be most of a test's time).
#pragma once

#include <algorithm>
#include <cstddef>
#include <random>
#include <span>
#include <vector>

namespace specula::test {

class RandomLogits {
 public:
  RandomLogits(size_t vocab, float stddev, std::mt19937& rng) : noise_(vocab), logits_(vocab), rng_(rng) {
    std::normal_distribution<float> normal(0.0f, stddev);
    for (float& x : noise_) x = normal(rng_);
  }
  // The next step's logits (overwritten at the next call).
  std::span<float> next() {
    const auto offset = static_cast<std::ptrdiff_t>(rng_() % noise_.size());
    std::rotate_copy(noise_.begin(), noise_.begin() + offset, noise_.end(), logits_.begin());
    return logits_;
  }

 private:
  std::vector<float> noise_, logits_;
  std::mt19937& rng_;
};

}  // namespace specula::test

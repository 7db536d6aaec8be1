#include "specula/core/acceptance_replay.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string>

#include "specula/error.hpp"

namespace specula::core {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

}  // namespace

std::vector<double> AcceptanceReplay::parse_profile(std::string_view text) {
  constexpr const char* kWhat =
      "entry i is the fraction of rounds whose first i drafts are all accepted, e.g. 0.844,0.599,0.385,0.271, "
      "or 0 to reject every draft";
  std::vector<double> out;
  for (size_t at = 0;;) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item(trim(text.substr(at, comma - at)));
    char* end = nullptr;
    errno = 0;
    const double a = item.empty() ? 0.0 : std::strtod(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || errno != 0 || !std::isfinite(a))
      fail("acceptance profile '{}': entry {} ('{}') is not a number; {}", text, out.size() + 1, item, kWhat);
    if (a < 0 || a > 1)
      fail("acceptance profile '{}': entry {} is {}, outside [0, 1]; {}", text, out.size() + 1, a, kWhat);
    if (!out.empty() && a > out.back())
      fail("acceptance profile '{}': entry {} ({}) is above entry {} ({}): a round cannot accept its first {} drafts "
           "more often than its first {}; {}", text, out.size() + 1, a, out.size(), out.back(), out.size() + 1,
           out.size(), kWhat);
    out.push_back(a);
    if (comma == text.size()) break;
    at = comma + 1;
  }
  return out;
}

AcceptanceReplay::AcceptanceReplay(std::vector<double> profile, std::vector<int32_t> greedy, uint64_t seed,
                                   ComputeBackend* backend)
    : profile_(std::move(profile)), greedy_(std::move(greedy)), state_(seed), backend_(backend) {
  if (greedy_.empty()) fail("acceptance replay: the greedy run holds no tokens");
  for (size_t i = 0; i < profile_.size(); ++i)
    if (!(profile_[i] >= 0 && profile_[i] <= (i ? profile_[i - 1] : 1.0)))
      fail("acceptance replay: profile entry {} is {}; each must lie in [0, the entry before] (parse_profile checks "
           "a profile given as text)", i + 1, profile_[i]);
}

void AcceptanceReplay::check(const SamplingParams& params) const {
  if (params.temperature > 0.0f)
    fail("the acceptance replay runs with greedy decoding only (temperature 0, got {}): it plants the target's own "
         "greedy tokens as drafts, and a sampled token is not known before the round",
         params.temperature);
}

double AcceptanceReplay::expected_tokens(std::span<const double> profile, int k) {
  double e = 1;
  for (int i = 0; i < k && i < static_cast<int>(profile.size()); ++i) e += profile[static_cast<size_t>(i)];
  return e;
}

double AcceptanceReplay::uniform() { return static_cast<double>(splitmix64(state_) >> 11) * 0x1p-53; }

void AcceptanceReplay::check(std::span<const int32_t> history) {
  if (history.size() > greedy_.size())
    fail("acceptance replay: the generation holds {} tokens (prompt included), more than the {} of the plain greedy run "
         "it replays; make that run longer (max_tokens plus the longest draft and one)", history.size(), greedy_.size());
  const auto [got, want] = std::mismatch(history.begin(), history.end(), greedy_.begin());
  if (got != history.end())
    fail("acceptance replay: token {} of the sequence (prompt included) is {} where the plain greedy run of the same "
         "prompt has {}: the target's verification forward did not reproduce the argmax of its single-token decode, "
         "so greedy speculative decoding left plain greedy decoding's tokens and no draft can be planted. That is a "
         "bug of the model or backend (or the greedy run was not of this prompt): report it with the file and backend",
         got - history.begin(), *got, *want);
}

std::vector<int32_t> AcceptanceReplay::plan(std::span<const int32_t> history, int64_t n) {
  check(history);
  std::vector<int32_t> drafts(static_cast<size_t>(std::max<int64_t>(n, 0)));
  bool accepted = true;  // drafts 1..i-1 are the target's own tokens
  for (size_t i = 0; i < drafts.size(); ++i) {
    // Past the greedy run's end generation has stopped: nothing there is emitted, any token serves.
    const int32_t next = greedy_[std::min(history.size() + i, greedy_.size() - 1)];
    // a_i past the profile's last entry is 0 (so is a_(i-1) one further on).
    auto a_at = [&](size_t k) { return k == 0 ? 1.0 : k - 1 < profile_.size() ? profile_[k - 1] : 0.0; };
    const double before = a_at(i), a = a_at(i + 1);
    accepted = accepted && before > 0 && uniform() < a / before;
    drafts[i] = accepted ? next : (next > 0 ? next - 1 : next + 1);
  }
  return drafts;
}

void AcceptanceReplay::replace(std::span<const int32_t> history, std::span<int32_t> drafts) {
  const std::vector<int32_t> planned = plan(history, static_cast<int64_t>(drafts.size()));
  std::copy(planned.begin(), planned.end(), drafts.begin());
}

void AcceptanceReplay::replace(std::span<const int32_t> history, int64_t n, BackendTensor& held) {
  if (!backend_)
    fail("acceptance replay: the drafter kept its drafts on the backend, but the replay has no backend to write "
         "them with (pass the pipeline's backend)");
  const Shape& shape = held.shape();
  if (held.type() != DType::I32 || shape.size() != 2 || shape[1] != 1 || shape[0] < n)
    fail("acceptance replay: the drafts held on the backend ('{}') are not an I32 [N >= {}, 1] tensor", held.name(), n);
  std::vector<int32_t> rows(static_cast<size_t>(shape[0]), 0);  // rows past n are never verified
  const std::vector<int32_t> planned = plan(history, n);
  std::copy(planned.begin(), planned.end(), rows.begin());
  backend_->write(held, std::as_bytes(std::span<const int32_t>(rows)));
}

}  // namespace specula::core

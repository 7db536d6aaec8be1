// Fakes of every plugin interface for the engine and CLI tests: a "toy" target whose logits are a
// deterministic pseudo-random function of the whole prefix, a drafter that proposes the target's greedy
// continuation but deliberately errs on a fixed pattern, a byte tokenizer, a trivial chat format, a
// seeded softmax sampler, and a backend that computes nothing. Used in-process (engine tests) and built
// into the test plugin libspecula-toy.so (CLI tests).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <thread>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/compute.hpp"
#include "specula/error.hpp"
#include "specula/model.hpp"
#include "specula/model_file.hpp"
#include "specula/sampler.hpp"
#include "specula/tokenizer.hpp"

namespace toy {

inline uint64_t mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Logits after `prefix`: a pure function of (seed, every token of the prefix).
inline std::vector<float> logits_after(std::span<const int32_t> prefix, int64_t vocab, uint64_t seed, float sharpness) {
  uint64_t h = mix(seed);
  for (int32_t t : prefix) h = mix(h ^ static_cast<uint64_t>(t + 1));
  std::vector<float> out(vocab);
  for (int64_t v = 0; v < vocab; ++v) {
    uint64_t r = mix(h ^ (static_cast<uint64_t>(v) * 0x2545F4914F6CDD1Dull));
    out[v] = sharpness * (static_cast<float>(r >> 40) / static_cast<float>(1ull << 24) - 0.5f);
  }
  return out;
}

inline int32_t argmax(std::span<const float> x) {
  int32_t best = 0;
  for (size_t i = 1; i < x.size(); ++i) {
    if (x[i] > x[best]) best = static_cast<int32_t>(i);
  }
  return best;
}

struct Config {
  int64_t vocab = 64;
  int64_t context_length = 128;
  uint64_t seed = 7;
  float sharpness = 8.0f;
  std::vector<int32_t> end_tokens{0};
  int delay_ms = 0;  // each forward sleeps this long (Ctrl+C tests need a generation that takes a while)
};

// Token 0 is the end token (special); token v >= 1 spells the character kAlphabet[v % size].
inline const std::string kAlphabet = " abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?";

class Tokenizer final : public specula::Tokenizer {
 public:
  explicit Tokenizer(int64_t vocab) : vocab_(vocab) {}
  int64_t vocab_size() const override { return vocab_; }
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override {
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(bos());
    for (char c : text) {
      size_t at = kAlphabet.find(c);
      if (at == std::string::npos) at = 0;
      ids.push_back(static_cast<int32_t>(1 + at % (vocab_ - 1)));
    }
    return ids;
  }
  std::vector<int32_t> encode_prompt(std::string_view text, std::span<const specula::TextRange>) const override {
    return encode(text, false, true);  // the toy vocabulary has no special token text could spell
  }
  std::string token_bytes(int32_t id) const override { return id == 0 ? std::string() : piece(id); }
  std::string piece(int32_t id) const override {
    if (id == 0) return "<end>";
    return std::string(1, kAlphabet[(id - 1) % kAlphabet.size()]);
  }
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id == 0 && skip_special) continue;
      s += piece(id);
    }
    return s;
  }
  bool is_special(int32_t id) const override { return id == 0; }
  std::optional<int32_t> token_id(std::string_view p) const override {
    for (int32_t i = 0; i < vocab_; ++i) {
      if (piece(i) == p) return i;
    }
    return std::nullopt;
  }
  int32_t bos() const override { return 1; }
  int32_t eos() const override { return 0; }

 private:
  int64_t vocab_;
};

class ChatFormat final : public specula::ChatFormat {
 public:
  explicit ChatFormat(std::shared_ptr<const Tokenizer> tok) : tok_(std::move(tok)) {}
  specula::RenderedChat render_chat(std::span<const specula::ChatMessage> messages, bool add_generation_prompt,
                                    bool enable_thinking) const override {
    specula::RenderedChat r;
    for (const auto& m : messages) {
      r.text += m.role.substr(0, 1) + ":";
      r.content.push_back({r.text.size(), r.text.size() + m.content.size()});
      r.text += m.content + ".";
    }
    if (add_generation_prompt) r.text += "a:";
    return r;
  }
  class Filter final : public AnswerFilter {
   public:
    explicit Filter(std::shared_ptr<const Tokenizer> tok) : tok_(std::move(tok)) {}
    std::string push(int32_t token) override { return tok_->is_special(token) ? std::string() : tok_->token_bytes(token); }
    std::string finish() override { return {}; }

   private:
    std::shared_ptr<const Tokenizer> tok_;
  };
  std::unique_ptr<AnswerFilter> answer_filter(bool show_thoughts) const override {
    return std::make_unique<Filter>(tok_);
  }
  std::vector<int32_t> stop_tokens() const override { return {}; }

 private:
  std::shared_ptr<const Tokenizer> tok_;
};

// What the drafter may see of the toy target: its position, plus (toy only) the tokens themselves.
class View final : public specula::TargetView {
 public:
  explicit View(const std::vector<int32_t>& tokens) : tokens_(tokens) {}
  specula::KvView kv(const std::string&) const override { return {}; }
  specula::BackendTensorPtr last_hidden() const override { return nullptr; }
  specula::TokenEmbedding token_embedding() const override { return {}; }  // the toy has no tensors
  int64_t position() const override { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  const std::vector<int32_t>& tokens_;
};

class Context final : public specula::ModelContext {
 public:
  Context(const Config& c, int64_t capacity, int64_t* forwards) : config_(c), capacity_(capacity), forwards_(forwards), view_(tokens_) {}
  std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_logits) override {
    if (tokens.empty() || n_logits < 1 || n_logits > static_cast<int64_t>(tokens.size())) {
      specula::fail("toy forward: {} tokens, {} logits", tokens.size(), n_logits);
    }
    if (position() + static_cast<int64_t>(tokens.size()) > capacity_) {
      specula::fail("toy context overflow: {} + {} > {}", position(), tokens.size(), capacity_);
    }
    if (forwards_) ++*forwards_;
    if (config_.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(config_.delay_ms));
    const size_t first_logit = tokens.size() - n_logits;
    std::vector<float> out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens_.push_back(tokens[i]);
      if (i >= first_logit) {
        auto row = logits_after(tokens_, config_.vocab, config_.seed, config_.sharpness);
        out.insert(out.end(), row.begin(), row.end());
      }
    }
    return out;
  }
  int64_t position() const override { return static_cast<int64_t>(tokens_.size()); }
  int64_t capacity() const override { return capacity_; }
  void truncate(int64_t pos) override {
    if (pos < 0 || pos > position()) specula::fail("toy truncate({}) at position {}", pos, position());
    tokens_.resize(pos);
  }
  const specula::TargetView& view() const override { return view_; }

 private:
  Config config_;
  int64_t capacity_;
  int64_t* forwards_;
  std::vector<int32_t> tokens_;
  View view_;
};

class Model final : public specula::Model {
 public:
  explicit Model(Config c) : config_(std::move(c)) {
    info_.architecture = "toy";
    info_.vocab_size = config_.vocab;
    info_.hidden_size = 1;
    info_.context_length = config_.context_length;
    info_.end_tokens = config_.end_tokens;
    tokenizer_ = std::make_shared<Tokenizer>(config_.vocab);
    chat_ = std::make_shared<ChatFormat>(tokenizer_);
  }
  const specula::ModelInfo& info() const override { return info_; }
  std::shared_ptr<const specula::Tokenizer> tokenizer() const override { return tokenizer_; }
  std::shared_ptr<const specula::ChatFormat> chat_format() const override { return chat_; }
  std::unique_ptr<specula::ModelContext> new_context(const specula::ContextOptions& o) override {
    int64_t cap = o.context_length > 0 ? o.context_length : config_.context_length;
    return std::make_unique<Context>(config_, cap, &forwards);
  }
  const Config& config() const { return config_; }
  int64_t forwards = 0;  // target forward passes, for the tests

 private:
  Config config_;
  specula::ModelInfo info_;
  std::shared_ptr<Tokenizer> tokenizer_;
  std::shared_ptr<ChatFormat> chat_;
};

// Proposes the target's greedy continuation, except that every `error_every`-th proposal (by absolute
// position) is deliberately wrong, so acceptance is partial and rollback is exercised. It has no
// distribution (a point-mass proposal at any temperature).
class Drafter final : public specula::Drafter {
 public:
  Drafter(Config target, int error_every) : target_(std::move(target)), error_every_(error_every) {}
  std::vector<specula::DraftStep> draft(const specula::TargetView& view, const specula::DraftRequest& r) override {
    const auto* v = dynamic_cast<const View*>(&view);
    if (!v) specula::fail("toy drafter needs a toy target");
    std::vector<int32_t> prefix = v->tokens();
    prefix.push_back(r.last_token);
    std::vector<specula::DraftStep> out;
    for (int i = 0; i < r.n; ++i) {
      int32_t t = argmax(logits_after(prefix, target_.vocab, target_.seed, target_.sharpness));
      if (error_every_ > 0 && static_cast<int64_t>(prefix.size()) % error_every_ == 0) {
        t = static_cast<int32_t>((t + 1) % target_.vocab);
      }
      out.push_back({t, {}});  // no distribution: a point mass
      prefix.push_back(t);
    }
    ++calls;
    return out;
  }
  int64_t calls = 0;

 private:
  Config target_;
  int error_every_;
};

// Greedy when temperature is 0; else softmax(logits / T) drawn by inverse CDF over token ids.
// Repetition penalty divides positive (multiplies negative) logits of tokens in the penalty window.
class Sampler final : public specula::Sampler {
 public:
  explicit Sampler(specula::SamplingParams p) : params_(p), state_(p.seed) {}
  const specula::SamplingParams& params() const override { return params_; }
  int32_t sample(std::span<const float> logits, const specula::SamplingState& s, float u) const override {
    std::vector<float> x = adjusted(logits, s);
    if (params_.temperature <= 0) return argmax(x);
    std::vector<double> p = weights(x);
    double total = 0;
    for (double w : p) total += w;
    double target = u * total, acc = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      acc += p[i];
      if (target < acc) return static_cast<int32_t>(i);
    }
    return static_cast<int32_t>(x.size() - 1);
  }
  std::vector<specula::TokenProbability> distribution(std::span<const float> logits,
                                                      const specula::SamplingState& s) const override {
    std::vector<float> x = adjusted(logits, s);
    if (params_.temperature <= 0) return {{argmax(x), 1.0}};
    std::vector<double> p = weights(x);
    double total = 0;
    for (double w : p) total += w;
    std::vector<specula::TokenProbability> out;
    for (size_t i = 0; i < p.size(); ++i)
      if (p[i] > 0) out.push_back({static_cast<int32_t>(i), p[i] / total});
    std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.probability > b.probability; });
    return out;
  }
  float next_uniform() override {
    state_ = mix(state_);
    return static_cast<float>(state_ >> 40) / static_cast<float>(1ull << 24);
  }

 private:
  // Penalty and end-token suppression applied to a copy.
  std::vector<float> adjusted(std::span<const float> logits, const specula::SamplingState& s) const {
    std::vector<float> x(logits.begin(), logits.end());
    if (params_.repetition_penalty != 1.0f) {
      size_t from = s.history.size() > static_cast<size_t>(params_.penalty_window)
                        ? s.history.size() - params_.penalty_window : 0;
      std::vector<bool> seen(x.size(), false);
      for (size_t i = from; i < s.history.size(); ++i) {
        int32_t t = s.history[i];
        if (t < 0 || t >= static_cast<int32_t>(x.size()) || seen[t]) continue;
        seen[t] = true;
        x[t] = x[t] > 0 ? x[t] / params_.repetition_penalty : x[t] * params_.repetition_penalty;
      }
    }
    if (s.generated < params_.min_length) {
      for (int32_t e : s.end_tokens) x[e] = -INFINITY;
    }
    return x;
  }
  // exp((x - max) / T), unnormalised.
  std::vector<double> weights(const std::vector<float>& x) const {
    float mx = x[argmax(x)];
    std::vector<double> p(x.size());
    for (size_t i = 0; i < x.size(); ++i) p[i] = std::exp((x[i] - mx) / params_.temperature);
    return p;
  }

  specula::SamplingParams params_;
  uint64_t state_;
};

}  // namespace toy

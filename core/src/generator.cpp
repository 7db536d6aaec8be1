#include "specula/core/generator.hpp"

#include <algorithm>
#include <chrono>
#include <optional>
#include <unordered_set>

#include "specula/core/acceptance_replay.hpp"
#include "specula/core/draft_length.hpp"
#include "specula/core/speculative.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"

namespace specula::core {

std::string_view stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::EndToken: return "end_token";
    case StopReason::MaxTokens: return "max_tokens";
    case StopReason::ContextFull: return "context_full";
    case StopReason::StopString: return "stop_string";
    case StopReason::Interrupted: return "interrupted";
  }
  return "";
}

namespace {

// Length of the UTF-8 sequence a lead byte starts, 0 for a byte that cannot start one.
size_t utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return c >= 0xC2 ? 2 : 0;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return c <= 0xF4 ? 4 : 0;
  return 0;
}

bool continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

const std::string kReplacement = "\xEF\xBF\xBD";

}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    unsigned char c = static_cast<unsigned char>(pending_[i]);
    size_t len = utf8_length(c);
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    if (i + len > pending_.size()) {
      // Incomplete: hold it back unless what has arrived is already invalid.
      bool ok = true;
      for (size_t k = i + 1; k < pending_.size(); ++k) ok = ok && continuation(static_cast<unsigned char>(pending_[k]));
      if (ok) break;
      out += kReplacement;
      ++i;
      continue;
    }
    bool ok = true;
    for (size_t k = 1; k < len; ++k) ok = ok && continuation(static_cast<unsigned char>(pending_[i + k]));
    if (!ok) {
      out += kReplacement;
      ++i;
      continue;
    }
    out.append(pending_, i, len);
    i += len;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::finish() {
  std::string out = pending_.empty() ? std::string() : kReplacement;
  pending_.clear();
  return out;
}

Generator::Generator(std::shared_ptr<Model> model, std::shared_ptr<Sampler> sampler, std::shared_ptr<Drafter> drafter)
    : model_(std::move(model)), sampler_(std::move(sampler)), drafter_(std::move(drafter)) {
  if (!model_) fail("Generator: no model");
  if (!sampler_) fail("Generator: no sampler");
}

GenerationResult Generator::generate(std::span<const int32_t> prompt, const GenerationOptions& options,
                                     const TokenCallback& on_token, int64_t context_length) {
  ContextOptions co;
  co.context_length = context_length;
  auto context = model_->new_context(co);
  if (!context) fail("model returned no context");
  return generate(*context, prompt, options, on_token);
}

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

// Not in the anonymous namespace: Generation::State (declared in the header) holds one.
namespace detail {

// Turns accepted tokens into visible text: through the chat format's AnswerFilter when the model has
// one, else through the tokenizer's bytes (special tokens hidden), else nothing.
class TextStream {
 public:
  TextStream(const Model& model, bool show_thoughts) {
    if (auto cf = model.chat_format()) filter_ = cf->answer_filter(show_thoughts);
    tokenizer_ = model.tokenizer();
  }
  std::string push(int32_t token) {
    if (filter_) return filter_->push(token);
    if (tokenizer_ && !tokenizer_->is_special(token)) return utf8_.push(tokenizer_->token_bytes(token));
    return {};
  }
  std::string finish() {
    if (filter_) return filter_->finish();
    return utf8_.finish();
  }

 private:
  std::unique_ptr<ChatFormat::AnswerFilter> filter_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  Utf8Stream utf8_;
};

}  // namespace detail

// The state of one generation between steps; its member functions are the steps of the loop that
// Generator::generate runs (start: checks, prefill, first token; step: one decode step; finish).
struct Generation::State {
  std::shared_ptr<Model> model;
  std::shared_ptr<Sampler> sampler;
  std::shared_ptr<Drafter> drafter;
  ModelContext& ctx;
  const std::vector<int32_t> prompt;
  const GenerationOptions options;
  const TokenCallback on_token;
  const ModelInfo& info;
  const int64_t vocab;
  int64_t start = 0;
  int64_t capacity = 0;
  bool llamacpp = false;        // llama.cpp's draft-mtp loop (GenerationOptions::convention)
  bool sampled_drafts = false;  // drafts sampled from the drafter's distribution (else greedy)
  SamplingDevice device = SamplingDevice::Auto;
  std::unordered_set<int32_t> stops;
  GenerationResult result;
  std::vector<int32_t> history;
  detail::TextStream text;
  bool done = false;
  std::string held;  // visible text not handed out yet because it may begin a stop string
  int32_t last = -1;
  std::optional<DraftLength> policy;
  std::vector<int32_t> scratch;
  int64_t rounds = 0;
  Clock::time_point t1;
  struct Planned {
    std::vector<int32_t> input;  // [last] or [last, d1..dn]
    std::vector<DraftStep> steps;
    std::vector<int32_t> drafts;
    std::vector<Distribution> q;  // the drafter's distribution per sampled draft
    std::vector<float> draft_uniforms;  // one per sampled draft, drawn before drafting
    double draft_seconds = 0;
    int64_t base = 0;             // the context's position before the forward
    bool on_device = false;       // the drafts stayed on the backend: verified by ctx.verify_greedy / verify_sampled
    bool sampled_on_device = false;  // ... sampled there, with `state` (ctx.verify_sampled)
    SamplingState state;
    RoundTrace trace;
  } pending;

  State(std::shared_ptr<Model> m, std::shared_ptr<Sampler> s, std::shared_ptr<Drafter> d, ModelContext& c,
        std::span<const int32_t> p, const GenerationOptions& o, const TokenCallback& cb)
      : model(std::move(m)), sampler(std::move(s)), drafter(std::move(d)), ctx(c), prompt(p.begin(), p.end()),
        options(o), on_token(cb), info(model->info()), vocab(info.vocab_size), text(*model, o.show_thoughts) {}

  GenerationStats& stats() { return result.stats; }

  // One uniform per plain step, greedy or not, on the host as in the device graph.
  int32_t sample_row(std::span<const float> row) { return sample_row(row, sampler->next_uniform()); }
  int32_t sample_row(std::span<const float> row, float u) {
    if (static_cast<int64_t>(row.size()) != vocab) {
      fail("model returned {} logits per position, expected vocab_size {}", row.size(), vocab);
    }
    SamplingState state{history, static_cast<int32_t>(result.tokens.size()), info.end_tokens};
    int32_t t = sampler->sample(row, state, u);
    if (t < 0 || t >= vocab) fail("sampler returned token {} outside the vocabulary [0, {})", t, vocab);
    return t;
  }
  // Plain steps (prefill's last chunk, undrafted decode steps): forward and sampling in one graph unless
  // sampler.device is off or the model cannot; then (and for speculative verification, n + 1 rows) the
  // host samples, here and only here.
  int32_t forward_sample(std::span<const int32_t> tokens) {
    if (device == SamplingDevice::Off) {
      ++stats().host_sampled_tokens;
      return sample_row(ctx.forward(tokens, 1));
    }
    SamplingState state{history, static_cast<int32_t>(result.tokens.size()), info.end_tokens};
    const float u = sampler->next_uniform();
    const SampledToken s = ctx.forward_sample(tokens, *sampler, state, u);
    if (s.on_device) {
      if (s.token < 0 || s.token >= vocab)
        fail("device sampling returned token {} outside the vocabulary [0, {})", s.token, vocab);
      ++stats().device_sampled_tokens;
      return s.token;
    }
    if (device == SamplingDevice::On) fail("device sampling required but unavailable: {}", s.host_reason);
    ++stats().host_sampled_tokens;
    if (stats().host_sampling_reason.empty()) stats().host_sampling_reason = s.host_reason;
    return sample_row(ctx.forward(tokens, 1), u);
  }
  // Hands visible text to the result and the callback; false when it completed a stop string (the text
  // is cut before it). `last_piece`: nothing follows, so nothing is held back.
  bool deliver(int32_t t, std::string piece, bool last_piece) {
    held += piece;
    size_t cut = std::string::npos;
    for (const auto& stop : options.stop_strings) {
      if (!stop.empty()) cut = std::min(cut, held.find(stop));
    }
    size_t keep = 0;
    if (cut == std::string::npos && !last_piece) {
      for (const auto& stop : options.stop_strings) {
        if (stop.empty()) continue;
        for (size_t n = std::min(stop.size() - 1, held.size()); n > keep; --n) {
          if (held.compare(held.size() - n, n, stop, 0, n) == 0) keep = n;
        }
      }
    }
    const std::string out = held.substr(0, cut != std::string::npos ? cut : held.size() - keep);
    held.erase(0, cut != std::string::npos ? held.size() : out.size());
    result.text += out;
    if (on_token) on_token(t, out);
    return cut == std::string::npos;
  }
  // Accepts one token; returns false when generation has ended.
  bool emit(int32_t t) {
    if (stops.count(t)) {
      result.stop_reason = StopReason::EndToken;
      result.stop_token = t;
      done = true;
      return false;
    }
    result.tokens.push_back(t);
    history.push_back(t);
    if (!deliver(t, text.push(t), false)) {
      result.stop_reason = StopReason::StopString;
      done = true;
      return false;
    }
    if (!llamacpp && static_cast<int64_t>(result.tokens.size()) >= options.max_tokens) {
      result.stop_reason = StopReason::MaxTokens;
      done = true;
      return false;
    }
    return true;
  }
  void count_step(int64_t n) {
    auto& by_length = stats().steps_by_draft_length;
    if (static_cast<int64_t>(by_length.size()) <= n) by_length.resize(n + 1);
    ++by_length[n];
  }
  // The sampling state of the token after `drafted` further tokens (drafts, not yet accepted).
  SamplingState state_after(std::span<const int32_t> drafted) {
    const int32_t generated = static_cast<int32_t>(result.tokens.size() + drafted.size());
    if (drafted.empty()) return SamplingState{history, generated, info.end_tokens};
    scratch.assign(history.begin(), history.end());
    scratch.insert(scratch.end(), drafted.begin(), drafted.end());
    return SamplingState{scratch, generated, info.end_tokens};
  }
  Distribution distribution_of(std::span<const float> row, std::span<const int32_t> drafted, const char* whose) {
    if (static_cast<int64_t>(row.size()) != vocab)
      fail("{} returned {} logits per position, expected vocab_size {}", whose, row.size(), vocab);
    Distribution d = sampler->distribution(row, state_after(drafted));
    if (d.empty()) fail("the sampler returned an empty distribution for the {}'s logits", whose);
    for (const TokenProbability& c : d)
      if (c.token < 0 || c.token >= vocab)
        fail("sampler's distribution holds token {} outside the vocabulary [0, {})", c.token, vocab);
    return d;
  }

  void begin();
  // A step in two halves, so that several generations can share one target forward (step_all): plan()
  // checks the stop conditions and drafts, leaving the tokens to process in `pending.input` (false: the
  // generation has ended, nothing to run); conclude() takes their logits ([input size, vocab]), samples
  // or accepts, emits and rolls back.
  // `alone`: this generation's forward runs by itself, so its drafts may stay on the backend.
  bool plan(bool alone);
  void conclude(std::span<const float> logits, double forward_seconds);
  // The rest of a speculative round of n drafts: `decide(i)` gives the verdict on draft i (i = n: the
  // bonus token, never accepted) with the round's uniforms `u` (round_uniforms: 2n + 1, drawn before the
  // round is decided, two per draft and one for the bonus, used or not, so that a round decided on the
  // backend draws the same ones).
  void conclude_round(int64_t n, std::span<const float> u, const std::function<Verdict(int64_t)>& decide,
                      double forward_seconds, std::span<const float> logits);
  std::vector<float> round_uniforms(int64_t n) {
    std::vector<float> u(static_cast<size_t>(2 * n + 1));
    for (float& x : u) x = sampler->next_uniform();
    return u;
  }
  // Greedy choices are plain argmaxes now (no repetition penalty, end tokens no longer held back), so a
  // round can be verified on the backend without logits.
  bool argmax_greedy() const {
    const SamplingParams& sp = sampler->params();
    return sp.temperature == 0.0f && sp.repetition_penalty == 1.0f &&
           sp.min_length <= static_cast<int64_t>(result.tokens.size());
  }
  void run_planned();  // the forward of a planned step on its own, then conclude()
  void step();
  GenerationResult finish();
};

void Generation::State::begin() {
  if (vocab <= 0) fail("model reports vocab_size {}; cannot sample", vocab);
  if (prompt.empty()) fail("the prompt is empty: at least one token is needed to start generation");
  if (options.max_tokens < 1) fail("max_tokens must be at least 1, got {}", options.max_tokens);
  start = ctx.position();
  capacity = ctx.capacity();
  if (start + static_cast<int64_t>(prompt.size()) > capacity) {
    fail("the prompt has {} tokens{} but the context holds {} tokens; shorten the prompt or raise "
         "target.context_length", prompt.size(),
         start ? fmt::format(" (after {} tokens already in the context)", start) : std::string(), capacity);
  }

  llamacpp = drafter && options.convention == DraftConvention::LlamaCpp;
  if (llamacpp && start + static_cast<int64_t>(prompt.size()) < 2)
    fail("the llamacpp drafting convention drafts from the target's hidden state of the token before the "
         "prompt's last one: the context needs at least 2 tokens, got {}", start + static_cast<int64_t>(prompt.size()));
  if (llamacpp && options.draft_auto)
    fail("the llamacpp drafting convention drafts a fixed number of tokens per round as llama.cpp does; "
         "draft_tokens: auto is not available with it");
  // At temperature > 0 Specula's drafts are sampled from the drafter's distribution; otherwise greedy
  // (a point mass for the acceptance rule).
  sampled_drafts = sampler->params().temperature > 0.0f && !llamacpp;
  if (options.replay && sampler->params().temperature > 0.0f)
    fail("the acceptance replay runs with greedy decoding only (temperature 0, got {}): it plants the target's own "
         "greedy tokens as drafts, and a sampled token is not known before the round",
         sampler->params().temperature);

  stops.insert(info.end_tokens.begin(), info.end_tokens.end());
  if (auto cf = model->chat_format()) {
    for (int32_t t : cf->stop_tokens()) stops.insert(t);
  }
  stops.insert(options.stop_tokens.begin(), options.stop_tokens.end());

  stats().prompt_tokens = static_cast<int64_t>(prompt.size());
  history = prompt;
  device = sampler->params().device;

  // Prefill. Specula: every prompt token, the last chunk ending in the first sampled token (counted in
  // prefill_seconds). llamacpp: all but the last prompt token, which the first round verifies.
  auto t0 = Clock::now();
  {
    const std::span<const int32_t> p(prompt);
    const int64_t n = static_cast<int64_t>(prompt.size()) - (llamacpp ? 1 : 0);
    const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : std::max<int64_t>(n, 1);
    for (int64_t at = 0; at < n; at += chunk) {
      const int64_t len = std::min(chunk, n - at);
      if (at + len < n || llamacpp) ctx.forward(p.subspan(at, len), 1);
      else last = forward_sample(p.subspan(at, len));
    }
    if (llamacpp) last = prompt.back();
  }
  stats().prefill_seconds = seconds_since(t0);

  t1 = Clock::now();
  if (!llamacpp) emit(last);
  if (drafter && options.draft_auto) policy.emplace(options.draft_max, options.draft_tokens);
}

bool Generation::State::plan(bool alone) {
  if (done) return false;
  if (options.interrupt && options.interrupt->load()) {
    result.stop_reason = StopReason::Interrupted;
    done = true;
    return false;
  }
  const int64_t room = capacity - ctx.position();  // positions the context can still take
  if (room < 1) {
    result.stop_reason = StopReason::ContextFull;
    log_warn("generation stopped: the context of {} tokens is full", capacity);
    done = true;
    return false;
  }
  const int64_t produced = static_cast<int64_t>(result.tokens.size());
  const int64_t want = policy ? policy->next() : options.draft_tokens;
  int64_t n = 0;
  if (llamacpp) {
    // llama.cpp caps the draft only by a positive limit (common_speculative_draft); the context
    // bound is kept whatever it says, where llama.cpp would overflow its context.
    const int64_t limit = std::min(room - 2, options.max_tokens - produced - 1);
    n = std::min(limit > 0 ? std::min(want, limit) : want, room - 1);
  } else if (drafter) {
    n = std::min<int64_t>({want, room - 1, options.max_tokens - produced - 1});
  }
  pending = Planned{};
  std::vector<DraftStep>& steps = pending.steps;
  std::vector<int32_t>& drafts = pending.drafts;
  std::vector<Distribution>& q = pending.q;
  double& draft_seconds = pending.draft_seconds;
  if (n > 0) {
    DraftRequest request;
    request.last_token = last;
    request.n = static_cast<int>(n);
    request.logits = static_cast<bool>(options.on_round);
    if (sampled_drafts) {
      // The drafts' uniforms first, so a drafter sampling on the backend draws with the same ones.
      pending.draft_uniforms.resize(static_cast<size_t>(n));
      for (float& u : pending.draft_uniforms) u = sampler->next_uniform();
      request.uniforms = pending.draft_uniforms;
      request.pick = [&](int step, std::span<const float> row) {
        if (step != static_cast<int>(drafts.size()) || step >= static_cast<int>(n))
          fail("drafter asked for draft step {} after {} steps of {}; steps are picked in order", step, drafts.size(), n);
        q.push_back(distribution_of(row, drafts, "drafter"));
        const int32_t t = draw(q.back(), pending.draft_uniforms[static_cast<size_t>(step)]);
        drafts.push_back(t);
        return t;
      };
    }
    // A round alone can keep its drafts on the backend: one read per round (the verdict). Greedy rounds
    // verify by argmax; sampled ones with the sampler's device form when it can (no penalty window or
    // end-token suppression in force), else the host decides and says why.
    if (alone && device != SamplingDevice::Off && !llamacpp && !request.logits) {
      if (!sampled_drafts && argmax_greedy()) {
        request.device_tokens = ctx.draft_tokens(n);
      } else if (sampled_drafts) {
        pending.state = state_after({});
        std::string why;
        request.device_logits = ctx.draft_logits(n, *sampler, pending.state, &why);
        if (request.device_logits) {
          request.device_tokens = ctx.draft_tokens(n);
          request.sampler = sampler.get();
          request.state = pending.state;
        } else if (stats().host_sampling_reason.empty()) {
          stats().host_sampling_reason = "speculative rounds verify on the host: " + why;
        }
      }
    }
    auto td = Clock::now();
    steps = drafter->draft(ctx.view(), request);
    draft_seconds = seconds_since(td);
    stats().draft_seconds += draft_seconds;
    if (static_cast<int64_t>(steps.size()) > n) steps.resize(static_cast<size_t>(n));
    drafts.clear();
    // Tokens -1: the drafter kept them on the backend (DraftRequest::device_tokens).
    const auto held = [](const DraftStep& st) { return st.token < 0; };
    pending.on_device = request.device_tokens && !steps.empty() && std::all_of(steps.begin(), steps.end(), held);
    pending.sampled_on_device = pending.on_device && request.device_logits;
    if (!pending.on_device && request.device_tokens && std::any_of(steps.begin(), steps.end(), held))
      fail("drafter returned some drafts on the backend (token -1) and some on the host; it must keep all or none");
    for (const DraftStep& st : pending.on_device ? std::span<const DraftStep>() : std::span<const DraftStep>(steps)) {
      if (st.token < 0 || st.token >= vocab) fail("drafter proposed token {} outside the vocabulary [0, {})", st.token, vocab);
      drafts.push_back(st.token);
    }
    // A drafter that did not use `pick` (it has no distribution) proposed a point mass.
    if (q.size() < drafts.size()) q.clear();
    q.resize(std::min(q.size(), drafts.size()));
    // The acceptance replay plants its drafts where the verification reads them.
    if (options.replay && pending.on_device)
      options.replay->replace(history, static_cast<int64_t>(steps.size()), *request.device_tokens);
    else if (options.replay)
      options.replay->replace(history, drafts);
  }
  pending.input.push_back(last);
  pending.input.insert(pending.input.end(), drafts.begin(), drafts.end());
  pending.base = ctx.position();
  if (!drafts.empty() && options.on_round) {
    RoundTrace& trace = pending.trace;
    trace.round = rounds;
    trace.n_past = pending.base;
    trace.last_token = last;
    trace.draft = drafts;
    for (DraftStep& st : steps) trace.draft_logits.push_back(std::move(st.logits));
  }
  return true;
}

void Generation::State::step() {
  if (plan(true)) run_planned();
}

void Generation::State::run_planned() {
  if (pending.drafts.empty() && !pending.on_device) {  // a plain step: forward and sampling in one graph where possible
    const auto tp = Clock::now();
    last = forward_sample(std::span<const int32_t>(&last, 1));
    if (policy) policy->observe_plain(seconds_since(tp));
    if (drafter) count_step(0);
    emit(last);
    return;
  }
  const auto tv = Clock::now();
  if (pending.sampled_on_device) {  // drafts, q, p and the verdict on the backend
    const int64_t n = static_cast<int64_t>(pending.steps.size());  // drafts held on the backend
    const std::vector<float> u = round_uniforms(n);
    const SampledVerification v = ctx.verify_sampled(last, n, *sampler, pending.state, u);
    const double seconds = seconds_since(tv);
    if (v.accepted < 0 || v.accepted > n || static_cast<int64_t>(v.tokens.size()) != v.accepted + 1)
      fail("model decided a round of {} drafts as {} accepted with {} tokens", n, v.accepted, v.tokens.size());
    for (int32_t t : v.tokens)
      if (t < 0 || t >= vocab) fail("a round verified on the backend gave token {} outside the vocabulary [0, {})", t, vocab);
    pending.drafts.assign(v.tokens.begin(), v.tokens.begin() + v.accepted);  // the rejected ones never left
    ++stats().device_verified_steps;
    conclude_round(
        n, u,
        [&](int64_t i) {
          ++stats().device_sampled_tokens;
          return i < v.accepted ? Verdict{true, v.tokens[static_cast<size_t>(i)]}
                                : Verdict{false, v.tokens[static_cast<size_t>(v.accepted)]};
        },
        seconds, {});
    return;
  }
  if (pending.on_device) {  // drafts and verdict stay on the backend but for one read of ids
    const int64_t n = static_cast<int64_t>(pending.steps.size());  // drafts held on the backend
    GreedyVerification v = ctx.verify_greedy(last, n);
    const double seconds = seconds_since(tv);
    if (static_cast<int64_t>(v.drafts.size()) != n || static_cast<int64_t>(v.greedy.size()) != n + 1)
      fail("model verified {} drafts with {} greedy tokens, expected {} and {}", v.drafts.size(), v.greedy.size(), n,
           n + 1);
    for (const std::vector<int32_t>* ids : {&v.drafts, &v.greedy})
      for (int32_t t : *ids)
        if (t < 0 || t >= vocab) fail("a round verified on the backend gave token {} outside the vocabulary [0, {})", t, vocab);
    pending.drafts = std::move(v.drafts);
    ++stats().device_verified_steps;
    const std::vector<float> u = round_uniforms(n);
    conclude_round(
        n, u,
        [&](int64_t i) {  // the rule with one-hot p and q: accepted when the draft is the argmax
          ++stats().device_sampled_tokens;
          const int32_t greedy = v.greedy[static_cast<size_t>(i)];
          return Verdict{i < n && pending.drafts[static_cast<size_t>(i)] == greedy, greedy};
        },
        seconds, {});
    return;
  }
  const std::vector<float> logits = ctx.forward(pending.input, static_cast<int64_t>(pending.input.size()));
  conclude(logits, seconds_since(tv));
}

void Generation::State::conclude(std::span<const float> logits, double forward_seconds) {
  if (pending.drafts.empty()) {  // a plain step of a batch: sampled on the host
    ++stats().host_sampled_tokens;
    if (stats().host_sampling_reason.empty())
      stats().host_sampling_reason = "several sequences in one forward pass sample on the host";
    last = sample_row(logits);
    if (policy) policy->observe_plain(forward_seconds);
    if (drafter) count_step(0);
    emit(last);
    return;
  }
  // Speculative step: [last, d1..dn] verified in one forward, n+1 logit rows.
  const int64_t n = static_cast<int64_t>(pending.drafts.size());
  if (static_cast<int64_t>(logits.size()) != (n + 1) * vocab) {
    fail("model returned {} logits for a verification of {} positions, expected {}", logits.size(), n + 1,
         (n + 1) * vocab);
  }
  const std::vector<Distribution>& q = pending.q;
  const std::vector<float> u = round_uniforms(n);
  conclude_round(
      n, u,
      [&](int64_t i) {
        // The accepted drafts are in the history already: p is the target's distribution as plain
        // decoding would see it there.
        ++stats().host_sampled_tokens;
        const Distribution p = distribution_of(logits.subspan(i * vocab, vocab), {}, "model");
        if (i == n) return Verdict{false, draw(p, u[2 * n])};
        static const Distribution kPointMass;  // an empty q: the draft is certain
        const Distribution& qi = q.empty() ? kPointMass : q[static_cast<size_t>(i)];
        return accept_draft(p, qi, pending.drafts[static_cast<size_t>(i)], u[2 * i], u[2 * i + 1]);
      },
      forward_seconds, logits);
}

void Generation::State::conclude_round(int64_t n, std::span<const float> u, const std::function<Verdict(int64_t)>& decide,
                                       double forward_seconds, std::span<const float> logits) {
  if (static_cast<int64_t>(u.size()) != 2 * n + 1) fail("a round of {} drafts needs {} uniforms, got {}", n, 2 * n + 1, u.size());
  const int64_t base = pending.base;
  RoundTrace& trace = pending.trace;
  const double draft_seconds = pending.draft_seconds, verify_seconds = forward_seconds;
  // Each draft in turn by the speculative sampling rule (speculative.hpp): accepted ones are emitted, the
  // first rejected one is replaced and ends the step; when all are accepted the last row gives a bonus.
  int64_t accepted = 0;
  for (int64_t i = 0; i <= n && !done; ++i) {
    const Verdict v = decide(i);
    last = v.token;
    if (v.accepted) ++accepted;
    emit(v.token);
    if (!v.accepted) break;
  }
  // Keep `last` of the step and the accepted drafts; forget the rejected ones.
  ctx.truncate(base + 1 + accepted);
  auto& st = stats();
  st.speculative_steps += 1;
  st.drafted_tokens += n;
  st.accepted_tokens += accepted;
  count_step(n);
  if (static_cast<int64_t>(st.drafted_by_position.size()) < n) {
    st.drafted_by_position.resize(n);
    st.accepted_by_position.resize(n);
  }
  for (int64_t i = 0; i < n; ++i) {
    ++st.drafted_by_position[i];
    if (i < accepted) ++st.accepted_by_position[i];
  }
  if (policy) policy->observe_step(static_cast<int>(n), static_cast<int>(accepted), draft_seconds, verify_seconds);
  if (options.on_round && !logits.empty()) {
    for (int64_t i = 0; i <= n; ++i) {
      const auto r = logits.subspan(i * vocab, vocab);
      trace.target_greedy.push_back(static_cast<int32_t>(std::max_element(r.begin(), r.end()) - r.begin()));
    }
    trace.accepted = accepted;
    options.on_round(trace);
  }
  ++rounds;
  // llamacpp: the round completes, then generation stops once more than max_tokens were produced.
  if (llamacpp && !done && static_cast<int64_t>(result.tokens.size()) > options.max_tokens) {
    result.stop_reason = StopReason::MaxTokens;
    done = true;
  }
}

GenerationResult Generation::State::finish() {
  if (!done) {
    result.stop_reason = StopReason::Interrupted;
    done = true;
  }
  // llamacpp, stopped before its first round: the last prompt token is still to be processed.
  if (llamacpp && rounds == 0 && result.tokens.empty()) ctx.forward(std::span<const int32_t>(prompt).last(1), 1);
  // One invariant whatever ended generation: the context holds the prompt and every generated token but
  // the last (the plain loop may have processed that one too, a speculative step an accepted end token).
  const int64_t keep = start + static_cast<int64_t>(prompt.size()) +
                       std::max<int64_t>(0, static_cast<int64_t>(result.tokens.size()) - 1);
  if (ctx.position() > keep) ctx.truncate(keep);
  if (options.replay) options.replay->check(history);  // the last round too left plain greedy's tokens alone
  if (result.stop_reason != StopReason::StopString) {
    std::string rest = text.finish();
    if ((!rest.empty() || !held.empty()) && !deliver(-1, rest, true)) result.stop_reason = StopReason::StopString;
  }
  stats().decode_seconds = seconds_since(t1);
  stats().generated_tokens = static_cast<int64_t>(result.tokens.size());
  return std::move(result);
}

Generation::Generation(std::unique_ptr<State> state) : s_(std::move(state)) {}
Generation::Generation(Generation&&) noexcept = default;
Generation& Generation::operator=(Generation&&) noexcept = default;
Generation::~Generation() = default;
bool Generation::finished() const { return s_->done; }
void Generation::step() { s_->step(); }

void Generation::step_all(std::span<Generation* const> generations) {
  std::vector<State*> ready;
  for (Generation* g : generations)
    if (g && g->s_->plan(generations.size() == 1)) ready.push_back(g->s_.get());
  while (!ready.empty()) {
    Model& model = *ready.front()->model;
    std::vector<State*> group, rest;
    for (State* s : ready) (s->model.get() == &model ? group : rest).push_back(s);
    ready = std::move(rest);
    if (group.size() == 1) {  // alone: plain steps keep device sampling
      group[0]->run_planned();
      continue;
    }
    std::vector<BatchEntry> batch;
    for (State* s : group)
      batch.push_back({&s->ctx, s->pending.input, static_cast<int64_t>(s->pending.input.size())});
    const auto t = Clock::now();
    const std::vector<std::vector<float>> logits = model.forward_batch(batch);
    const double seconds = seconds_since(t);
    if (logits.size() != group.size())
      fail("model returned logits for {} sequences of a batch of {}", logits.size(), group.size());
    for (size_t i = 0; i < group.size(); ++i) group[i]->conclude(logits[i], seconds);
  }
}
GenerationResult Generation::finish() { return s_->finish(); }
const std::vector<int32_t>& Generation::tokens() const { return s_->result.tokens; }

Generation Generator::start(ModelContext& ctx, std::span<const int32_t> prompt, const GenerationOptions& options,
                            const TokenCallback& on_token) {
  auto state = std::make_unique<Generation::State>(model_, sampler_, drafter_, ctx, prompt, options, on_token);
  state->begin();
  return Generation(std::move(state));
}

GenerationResult Generator::generate(ModelContext& ctx, std::span<const int32_t> prompt,
                                     const GenerationOptions& options, const TokenCallback& on_token) {
  Generation g = start(ctx, prompt, options, on_token);
  while (!g.finished()) g.step();
  return g.finish();
}

}  // namespace specula::core

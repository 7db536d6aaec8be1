#include "specula/core/generator.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <unordered_set>

#include "round_policy.hpp"
#include "specula/core/draft_length.hpp"
#include "specula/core/speculative.hpp"
#include "specula/core/grammar.hpp"
#include "specula/core/token_constraint.hpp"
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

// The state of one generation between steps. A step is one round, in four stages that run in this order:
// plan() (stop conditions, the draft length: 0 is a plain step), propose() (where the round is decided,
// then the drafter's drafts, on the host or waiting on the backend), verify_rounds() (the target's forward
// and the verdict: the accepted drafts and the token after them; the rounds of several generations run
// together) and emit() (tokens to the result and the text, rollback, statistics).
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
  const std::unique_ptr<RoundPolicy> rules;
  TextOutput text;
  int64_t start = 0;
  int64_t capacity = 0;
  bool sampled_drafts = false;  // drafts sampled from the drafter's distribution (else greedy)
  SamplingDevice device = SamplingDevice::Auto;
  std::unordered_set<int32_t> stops;
  std::unique_ptr<TokenConstraint> constraint;  // GenerationOptions::response_format
  std::vector<float> masked;                    // a row with the constraint's mask applied
  GenerationResult result;
  std::vector<int32_t> history;  // prompt and accepted tokens: the sampler's state
  bool done = false;
  int32_t last = -1;             // accepted, not yet processed by the target
  std::optional<DraftLength> length;  // draft_tokens: auto
  std::vector<int32_t> scratch;
  std::optional<TokenLogprob> first_logprob;  // the prefill's token, accepted at the end of begin()
  int64_t rounds = 0;
  Clock::time_point t1;

  // The round in progress, from plan() to emit().
  struct Round {
    int64_t n = 0;                      // drafts asked for (plan), then proposed (propose); 0: a plain step
    int64_t base = 0;                   // the context's position before the verification
    std::vector<int32_t> tokens;        // the host ids the target processes first: [last] (the first token: a prompt's tail)
    std::vector<int32_t> drafts;        // proposed on the host (empty when they wait on the backend)
    std::vector<Distribution> q;        // the drafter's distribution per sampled draft (empty: point masses)
    std::vector<float> draft_uniforms;  // one per sampled draft, drawn before drafting
    std::vector<float> uniforms;        // the verdict's: 1 for a plain step, 2n + 1 for n drafts
    bool on_backend = false;            // verified and decided on the backend (ModelContext::prepare_round)
    RoundRule rule;                     // on_backend: what decides it (no sampler: greedy drafts, by argmax)
    RoundBuffers buffers;               // on_backend: where its drafts wait
    double draft_seconds = 0;
    RoundTrace trace;
  } round;
  // What the verify stage decided: `accepted` drafts, then the replacement of the first rejected one or the
  // bonus token (a plain step: its one token).
  struct Outcome {
    int64_t accepted = 0;
    std::vector<int32_t> tokens;         // [accepted + 1]
    double seconds = 0;                  // the verification's forward
    std::vector<int32_t> target_greedy;  // GenerationOptions::on_round: the target's argmax per verified row
    std::vector<TokenLogprob> logprobs;  // GenerationOptions::logprobs: one per token of `tokens`
  };

  State(std::shared_ptr<Model> m, std::shared_ptr<Sampler> s, std::shared_ptr<Drafter> d, ModelContext& c,
        std::span<const int32_t> p, const GenerationOptions& o, const TokenCallback& cb)
      : model(std::move(m)), sampler(std::move(s)), drafter(std::move(d)), ctx(c), prompt(p.begin(), p.end()),
        options(o), on_token(cb), info(model->info()), vocab(info.vocab_size),
        rules(RoundPolicy::make(o.convention, drafter != nullptr)), text(*model, o.show_thoughts, o.stop_strings) {}

  GenerationStats& stats() { return result.stats; }

  void begin();
  bool plan();
  void propose();
  void choose_verifier();
  void draft();
  // The verify stage of several generations' rounds, on one model: one Model::verify for the rounds
  // decided on the backend, one forward_batch for the others, decided on the host (decide()).
  static std::vector<Outcome> verify_rounds(std::span<State* const> states);
  Outcome decide(std::span<const float> logits);  // on the host, from the logits of [tokens, drafts]
  void emit(const Outcome& outcome);
  GenerationResult finish();

  // Sampling on the host, here and only here (plain steps the device cannot take, host verification).
  int32_t sample_row(std::span<const float> row, float u) {
    if (static_cast<int64_t>(row.size()) != vocab) {
      fail("model returned {} logits per position, expected vocab_size {}", row.size(), vocab);
    }
    SamplingState state{history, static_cast<int32_t>(result.tokens.size()), info.end_tokens};
    int32_t t = sampler->sample(row, state, u);
    if (t < 0 || t >= vocab) fail("sampler returned token {} outside the vocabulary [0, {})", t, vocab);
    return t;
  }
  // A row of the target's logits as the sampling rule sees it: masked by the constraint (after the
  // accepted tokens and `drafted`), when there is one.
  std::span<const float> constrained(std::span<const float> row, std::span<const int32_t> drafted) {
    if (!constraint) return row;
    const auto t0 = Clock::now();
    masked.assign(row.begin(), row.end());
    constraint->mask(masked, drafted);
    stats().constraint_seconds += seconds_since(t0);
    ++stats().constrained_rows;
    return masked;
  }
  // Accepts one token; false when generation has ended (an end or stop token, a stop string, max_tokens).
  bool accept(int32_t t, const TokenLogprob* lp = nullptr) {
    if (stops.count(t)) {
      result.stop_reason = StopReason::EndToken;
      result.stop_token = t;
      done = true;
      return false;
    }
    if (constraint) {
      const auto t0 = Clock::now();
      constraint->accept(t);
      stats().constraint_seconds += seconds_since(t0);
    }
    result.tokens.push_back(t);
    history.push_back(t);
    if (lp) {
      result.logprobs.push_back(*lp);
      if (options.on_logprob) options.on_logprob(*lp);
    }
    const TextOutput::Piece piece = text.push(t);
    result.text += piece.text;
    if (on_token) on_token(t, piece.text);
    if (piece.stop) {
      result.stop_reason = StopReason::StopString;
      done = true;
      return false;
    }
    if (rules->ends(static_cast<int64_t>(result.tokens.size()), options.max_tokens, true)) {
      result.stop_reason = StopReason::MaxTokens;
      done = true;
      return false;
    }
    return true;
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
  // The verdict's uniforms, drawn before it is decided wherever that is, used or not, so that the host and
  // the backend draw the same ones: one for a plain step; two per draft and one for the bonus.
  void draw_uniforms() {
    round.uniforms.resize(static_cast<size_t>(2 * round.n + 1));
    for (float& x : round.uniforms) x = sampler->next_uniform();
  }
  // Greedy choices are plain argmaxes now (no repetition penalty, end tokens no longer held back), so a
  // round can be verified on the backend without logits.
  bool argmax_greedy() const { return greedy_host_reason().empty(); }
  // Why a greedy round's choices are not plain argmaxes of the target's logits (empty when they are).
  std::string greedy_host_reason() const {
    const SamplingParams& sp = sampler->params();
    if (sp.temperature != 0.0f) return "sampled";
    if (sp.repetition_penalty != 1.0f) return "the repetition penalty reads the history";
    if (sp.presence_penalty != 0.0f || sp.frequency_penalty != 0.0f)
      return "presence_penalty / frequency_penalty read the generated tokens";
    if (!sp.logit_bias.empty()) return "logit_bias changes the argmax";
    if (sp.min_length > static_cast<int64_t>(result.tokens.size())) return "end tokens are suppressed (min_length)";
    return {};
  }
  // Token i of a host-decided outcome was decided from row i of its logits.
  void record_logprobs(std::span<const float> logits, Outcome& o) const {
    if (options.logprobs < 0) return;
    for (size_t i = 0; i < o.tokens.size(); ++i)
      o.logprobs.push_back(token_logprob(logits.subspan(i * static_cast<size_t>(vocab), static_cast<size_t>(vocab)),
                                         o.tokens[i], options.logprobs));
  }
  static const TokenLogprob* logprob_at(const Outcome& o, size_t i) {
    return i < o.logprobs.size() ? &o.logprobs[i] : nullptr;
  }
  void count_step(int64_t n) {
    auto& by_length = stats().steps_by_draft_length;
    if (static_cast<int64_t>(by_length.size()) <= n) by_length.resize(n + 1);
    ++by_length[n];
  }
};

void Generation::State::begin() {
  if (vocab <= 0) fail("model reports vocab_size {}; cannot sample", vocab);
  if (prompt.empty()) fail("the prompt is empty: at least one token is needed to start generation");
  if (options.max_tokens < 1) fail("max_tokens must be at least 1, got {}", options.max_tokens);
  start = ctx.position();
  capacity = ctx.capacity();
  const int64_t after_prompt = start + static_cast<int64_t>(prompt.size());
  if (after_prompt > capacity) {
    fail("the prompt has {} tokens{} but the context holds {} tokens; shorten the prompt or raise "
         "target.context_length", prompt.size(),
         start ? fmt::format(" (after {} tokens already in the context)", start) : std::string(), capacity);
  }
  rules->check(after_prompt, options);
  // At temperature > 0 the drafts are sampled from the drafter's distribution where the convention does;
  // otherwise greedy (a point mass for the acceptance rule).
  sampled_drafts = sampler->params().temperature > 0.0f && rules->samples_drafts();
  if (options.draft_hook) options.draft_hook->check(sampler->params());

  if (!options.ignore_eos) {
    stops.insert(info.end_tokens.begin(), info.end_tokens.end());
    if (auto cf = model->chat_format()) {
      for (int32_t t : cf->stop_tokens()) stops.insert(t);
    }
  }
  stops.insert(options.stop_tokens.begin(), options.stop_tokens.end());
  if (!options.response_format.empty()) {
    const std::string& kind = options.response_format;
    const std::string name = kind == "json_object" || kind == "json_schema" ? "response_format " + kind : kind;
    if (kind != "json_object" && options.grammar.empty())
      fail("{} needs its grammar (GenerationOptions::grammar); only json_object has none", name);
    if (stops.empty())
      fail("{} needs a token that ends generation after the answer; with ignore_eos give stop_token_ids", name);
    const auto tokenizer = model->tokenizer();
    if (!tokenizer) fail("{} needs the model's tokenizer, and this model has none", name);
    // The answer may end only where it is complete, with a token that ends generation.
    std::vector<int32_t> ends(stops.begin(), stops.end());
    constraint = kind == "json_object" ? json_object_constraint(token_trie(tokenizer), std::move(ends), vocab)
                                       : grammar_constraint(shared_gbnf(options.grammar), tokenizer, std::move(ends), vocab, name);
  }

  stats().prompt_tokens = static_cast<int64_t>(prompt.size());
  history = prompt;
  device = sampler->params().device;

  // Prefill: the prompt tokens the convention prefills, the last chunk ending in the first sampled token
  // (counted in prefill_seconds); a prompt token left over is `last`, which the first round verifies.
  auto t0 = Clock::now();
  const std::span<const int32_t> p(prompt);
  const int64_t n = rules->prefilled(static_cast<int64_t>(prompt.size()));
  const bool first_token = n == static_cast<int64_t>(prompt.size());
  const int64_t chunk = options.prefill_chunk > 0 ? options.prefill_chunk : std::max<int64_t>(n, 1);
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t len = std::min(chunk, n - at);
    if (at + len < n || !first_token) ctx.forward(p.subspan(at, len), 1);
    else {  // the first token: a plain step on the prompt's tail
      round = Round{};
      round.tokens.assign(p.begin() + at, p.begin() + at + len);
      choose_verifier();
      State* self = this;
      const Outcome o = verify_rounds({&self, 1}).front();
      ++(round.on_backend ? stats().device_sampled_tokens : stats().host_sampled_tokens);
      last = o.tokens.front();
      if (const TokenLogprob* lp = logprob_at(o, 0)) first_logprob = *lp;
    }
  }
  if (!first_token) last = prompt.back();
  stats().prefill_seconds = seconds_since(t0);

  t1 = Clock::now();
  if (first_token) accept(last, first_logprob ? &*first_logprob : nullptr);
  if (drafter && options.draft_auto) length.emplace(options.draft_max, options.draft_tokens);
}

// Ends generation when asked to or when the context is full; else sets the round's draft length.
bool Generation::State::plan() {
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
  round = Round{};
  if (drafter) {
    const int64_t want = length ? length->next() : options.draft_tokens;
    round.n = rules->draft_length(want, room, options.max_tokens - static_cast<int64_t>(result.tokens.size()));
  }
  return true;
}

// The round's host ids, where it is decided, and the drafter's n drafts after `last`.
void Generation::State::propose() {
  round.base = ctx.position();
  round.tokens = {last};
  choose_verifier();
  if (round.n > 0) draft();
}

// Whether the round is verified and decided on the backend (ModelContext::prepare_round): a plain step
// unless sampler.device is off; drafts where the convention allows it and nobody reads their logits,
// greedy ones by argmax, sampled ones by the sampler's device verdict when it has one here (no penalty
// window or end-token suppression in force). Else the host decides, and the first reason is kept.
void Generation::State::choose_verifier() {
  const int64_t n = round.n;
  round.on_backend = false;
  if (device == SamplingDevice::Off) return;
  if (constraint) {
    if (n == 0 && device == SamplingDevice::On)
      fail("device sampling required but unavailable: {} masks the logits on the host", constraint->name());
    if (stats().host_sampling_reason.empty())
      stats().host_sampling_reason = constraint->name() + " masks the logits on the host";
    return;
  }
  if (options.logprobs >= 0) {  // the logprobs are read from the target's logits, on the host
    if (stats().host_sampling_reason.empty())
      stats().host_sampling_reason = "logprobs read the target's logits (every step samples and verifies on the host)";
    return;
  }
  if (n > 0 && (!rules->rounds_on_backend() || options.on_round)) return;
  if (n > 0 && !sampled_drafts && !argmax_greedy()) {
    // Greedy drafts verified on the host under rules the argmax cannot apply: say which.
    if (stats().host_sampling_reason.empty())
      stats().host_sampling_reason = "speculative rounds verify on the host: " + greedy_host_reason();
    return;
  }
  round.rule = RoundRule{n > 0 && !sampled_drafts ? nullptr : sampler.get(), state_after({}), {}};
  std::string why;
  round.on_backend = ctx.prepare_round(static_cast<int64_t>(round.tokens.size()), n, round.rule, round.buffers, why);
  if (round.on_backend) return;
  if (n == 0 && device == SamplingDevice::On) fail("device sampling required but unavailable: {}", why);
  if (stats().host_sampling_reason.empty())
    stats().host_sampling_reason = n > 0 ? "speculative rounds verify on the host: " + why : why;
}

// The drafter's n drafts: into the round's buffers when it is decided on the backend and the drafter can
// keep them there, else to the host (sampled ones picked here, from the drafter's distribution).
void Generation::State::draft() {
  const int64_t n = round.n;
  DraftRequest request;
  request.last_token = last;
  request.n = static_cast<int>(n);
  request.logits = static_cast<bool>(options.on_round);
  if (sampled_drafts) {
    // The drafts' uniforms first, so a drafter sampling on the backend draws with the same ones.
    round.draft_uniforms.resize(static_cast<size_t>(n));
    for (float& u : round.draft_uniforms) u = sampler->next_uniform();
  }
  // Sampled drafts are drawn here from the drafter's distribution; under a constraint every draft is
  // picked here too, from the drafter's row masked as the target's will be (a draft the grammar forbids
  // would only be rejected), greedy ones by argmax.
  if (sampled_drafts || constraint) {
    request.pick = [&](int step, std::span<const float> row) {
      if (step != static_cast<int>(round.drafts.size()) || step >= static_cast<int>(n))
        fail("drafter asked for draft step {} after {} steps of {}; steps are picked in order", step,
             round.drafts.size(), n);
      const std::span<const float> allowed = constrained(row, round.drafts);
      int32_t t;
      if (sampled_drafts) {
        round.q.push_back(distribution_of(allowed, round.drafts, "drafter"));
        t = draw(round.q.back(), round.draft_uniforms[static_cast<size_t>(step)]);
      } else {
        t = static_cast<int32_t>(std::max_element(allowed.begin(), allowed.end()) - allowed.begin());
      }
      round.drafts.push_back(t);
      return t;
    };
  }
  if (round.on_backend) {
    request.buffers = round.buffers;
    request.rule = RoundRule{round.rule.sampler, round.rule.state, round.draft_uniforms};
  }
  const auto td = Clock::now();
  std::vector<DraftStep> steps = drafter->draft(ctx.view(), request);
  round.draft_seconds = seconds_since(td);
  stats().draft_seconds += round.draft_seconds;
  if (static_cast<int64_t>(steps.size()) > n) steps.resize(static_cast<size_t>(n));
  round.n = static_cast<int64_t>(steps.size());
  // Tokens -1: the drafter kept them in the round's buffers. A drafter that could not drafted on the host,
  // and the host verifies them.
  const auto held = [](const DraftStep& st) { return st.token < 0; };
  const bool kept = round.on_backend && !steps.empty() && std::all_of(steps.begin(), steps.end(), held);
  if (!kept && round.on_backend && std::any_of(steps.begin(), steps.end(), held))
    fail("drafter returned some drafts on the backend (token -1) and some on the host; it must keep all or none");
  round.on_backend = kept || (round.on_backend && steps.empty());
  round.drafts.clear();
  if (kept) {
    if (options.draft_hook) options.draft_hook->drafted(history, round.n, *round.buffers.tokens);
    return;
  }
  for (const DraftStep& st : steps) {
    if (st.token < 0 || st.token >= vocab) fail("drafter proposed token {} outside the vocabulary [0, {})", st.token, vocab);
    round.drafts.push_back(st.token);
  }
  // A drafter that did not use `pick` (it has no distribution) proposed a point mass.
  if (round.q.size() < round.drafts.size()) round.q.clear();
  round.q.resize(std::min(round.q.size(), round.drafts.size()));
  if (options.draft_hook) options.draft_hook->drafted(history, round.drafts);
  if (!round.drafts.empty() && options.on_round) {
    round.trace.round = rounds;
    round.trace.n_past = round.base;
    round.trace.last_token = last;
    round.trace.draft = round.drafts;
    for (DraftStep& st : steps) round.trace.draft_logits.push_back(std::move(st.logits));
  }
}

std::vector<Generation::State::Outcome> Generation::State::verify_rounds(std::span<State* const> states) {
  Model& model = *states.front()->model;
  std::vector<Outcome> out(states.size());
  std::vector<RoundEntry> on_backend;
  std::vector<BatchEntry> on_host;
  std::vector<size_t> backend_at, host_at;  // their states' indices
  for (size_t i = 0; i < states.size(); ++i) {
    State& s = *states[i];
    Round& r = s.round;
    s.draw_uniforms();
    if (r.on_backend) {
      // A greedy round's verdict is its argmax: its uniforms are drawn, not read.
      if (r.rule.sampler) r.rule.uniforms = r.uniforms;
      on_backend.push_back({&s.ctx, r.tokens, r.n, r.rule});
      backend_at.push_back(i);
    } else {
      r.tokens.insert(r.tokens.end(), r.drafts.begin(), r.drafts.end());
      on_host.push_back({&s.ctx, r.tokens, r.n + 1});
      host_at.push_back(i);
    }
  }
  if (!on_backend.empty()) {
    const auto t = Clock::now();
    std::vector<RoundVerdict> verdicts = model.verify(on_backend);
    const double seconds = seconds_since(t);
    if (verdicts.size() != on_backend.size())
      fail("model returned {} verdicts for {} rounds", verdicts.size(), on_backend.size());
    for (size_t j = 0; j < verdicts.size(); ++j) {
      State& s = *states[backend_at[j]];
      RoundVerdict& v = verdicts[j];
      if (v.accepted < 0 || v.accepted > s.round.n || static_cast<int64_t>(v.tokens.size()) != v.accepted + 1)
        fail("model decided a round of {} drafts as {} accepted with {} tokens", s.round.n, v.accepted, v.tokens.size());
      for (int32_t tok : v.tokens)
        if (tok < 0 || tok >= s.vocab)
          fail("a round decided on the backend gave token {} outside the vocabulary [0, {})", tok, s.vocab);
      out[backend_at[j]] = Outcome{v.accepted, std::move(v.tokens), seconds, {}, {}};
    }
  }
  if (!on_host.empty()) {
    const auto t = Clock::now();
    const std::vector<std::vector<float>> logits = model.forward_batch(on_host);
    const double seconds = seconds_since(t);
    if (logits.size() != on_host.size())
      fail("model returned logits for {} sequences of a batch of {}", logits.size(), on_host.size());
    for (size_t j = 0; j < logits.size(); ++j) {
      out[host_at[j]] = states[host_at[j]]->decide(logits[j]);
      out[host_at[j]].seconds = seconds;
    }
  }
  return out;
}

Generation::State::Outcome Generation::State::decide(std::span<const float> logits) {
  const int64_t n = static_cast<int64_t>(round.drafts.size());
  Outcome o;
  if (static_cast<int64_t>(logits.size()) != (n + 1) * vocab) {
    fail("model returned {} logits for a verification of {} positions, expected {}", logits.size(), n + 1,
         (n + 1) * vocab);
  }
  if (n == 0) {  // a plain step
    o.tokens = {sample_row(constrained(logits, {}), round.uniforms[0])};
    record_logprobs(logits, o);
    return o;
  }
  // Each draft in turn by the speculative sampling rule (speculative.hpp), p being the target's
  // distribution as plain decoding would see it after the drafts before it; the first rejected one is
  // replaced and ends the round; when all are accepted the last row gives a bonus token.
  const std::span<const float> u(round.uniforms);
  const std::span<const int32_t> drafts(round.drafts);
  for (int64_t i = 0; i <= n; ++i) {
    const Distribution p = distribution_of(constrained(logits.subspan(i * vocab, vocab), drafts.first(i)),
                                           drafts.first(i), "model");
    if (i == n) {
      o.tokens.push_back(draw(p, u[2 * n]));
      break;
    }
    static const Distribution kPointMass;  // an empty q: the draft is certain
    const Distribution& qi = round.q.empty() ? kPointMass : round.q[static_cast<size_t>(i)];
    const Verdict v = accept_draft(p, qi, drafts[i], u[2 * i], u[2 * i + 1]);
    o.tokens.push_back(v.token);
    if (!v.accepted) break;
    ++o.accepted;
  }
  record_logprobs(logits, o);
  if (options.on_round) {
    for (int64_t i = 0; i <= n; ++i) {
      const auto r = logits.subspan(i * vocab, vocab);
      o.target_greedy.push_back(static_cast<int32_t>(std::max_element(r.begin(), r.end()) - r.begin()));
    }
  }
  return o;
}

// The round's tokens to the result until one ends generation; the target forgets the rejected drafts.
void Generation::State::emit(const Outcome& o) {
  auto& st = stats();
  if (round.n == 0) {  // a plain step
    ++(round.on_backend ? st.device_sampled_tokens : st.host_sampled_tokens);
    last = o.tokens.front();
    if (length) length->observe_plain(o.seconds);
    if (drafter) count_step(0);
    accept(last, logprob_at(o, 0));
    return;
  }
  const int64_t n = round.n;
  int64_t accepted = 0;
  for (size_t i = 0; i < o.tokens.size() && !done; ++i) {
    const bool draft = static_cast<int64_t>(i) < o.accepted;
    ++(round.on_backend ? st.device_sampled_tokens : st.host_sampled_tokens);
    last = o.tokens[i];
    if (draft) ++accepted;
    accept(last, logprob_at(o, i));
    if (!draft) break;
  }
  // Keep `last` of the round and the accepted drafts; forget the rejected ones.
  ctx.truncate(round.base + 1 + accepted);
  st.speculative_steps += 1;
  st.drafted_tokens += n;
  st.accepted_tokens += accepted;
  if (round.on_backend) ++st.device_verified_steps;
  count_step(n);
  if (static_cast<int64_t>(st.drafted_by_position.size()) < n) {
    st.drafted_by_position.resize(n);
    st.accepted_by_position.resize(n);
  }
  for (int64_t i = 0; i < n; ++i) {
    ++st.drafted_by_position[i];
    if (i < accepted) ++st.accepted_by_position[i];
  }
  if (length) length->observe_step(static_cast<int>(n), static_cast<int>(accepted), round.draft_seconds, o.seconds);
  if (options.on_round && !o.target_greedy.empty()) {
    round.trace.target_greedy = o.target_greedy;
    round.trace.accepted = accepted;
    options.on_round(round.trace);
  }
  ++rounds;
  if (!done && rules->ends(static_cast<int64_t>(result.tokens.size()), options.max_tokens, false)) {
    result.stop_reason = StopReason::MaxTokens;
    done = true;
  }
}

GenerationResult Generation::State::finish() {
  if (!done) {
    result.stop_reason = StopReason::Interrupted;
    done = true;
  }
  // Stopped before the first round verified the prompt's last token (a convention that does not prefill
  // it): process it now.
  const int64_t after_prompt = start + static_cast<int64_t>(prompt.size());
  if (ctx.position() < after_prompt)
    ctx.forward(std::span<const int32_t>(prompt).last(static_cast<size_t>(after_prompt - ctx.position())), 1);
  // One invariant whatever ended generation: the context holds the prompt and every generated token but
  // the last (the plain loop may have processed that one too, a speculative step an accepted end token).
  const int64_t keep = after_prompt + std::max<int64_t>(0, static_cast<int64_t>(result.tokens.size()) - 1);
  if (ctx.position() > keep) ctx.truncate(keep);
  if (options.draft_hook) options.draft_hook->finished(history);
  if (result.stop_reason != StopReason::StopString) {
    const TextOutput::Rest rest = text.finish();
    if (rest.any) {
      result.text += rest.text;
      if (on_token) on_token(-1, rest.text);
      if (rest.stop) result.stop_reason = StopReason::StopString;
    }
  }
  stats().decode_seconds = seconds_since(t1);
  stats().generated_tokens = static_cast<int64_t>(result.tokens.size());
  return std::move(result);
}

TokenLogprob token_logprob(std::span<const float> row, int32_t token, int top) {
  if (row.empty() || token < 0 || token >= static_cast<int32_t>(row.size()))
    fail("token_logprob: token {} outside a row of {} logits", token, row.size());
  double m = row[0];
  for (float x : row) m = std::max(m, static_cast<double>(x));
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - m);
  const double log_z = m + std::log(sum);
  TokenLogprob out;
  out.token = token;
  out.logprob = static_cast<float>(row[token] - log_z);
  // The `top` largest by a scan with a small sorted list: the vocabulary is large, `top` at most 20.
  const auto k = static_cast<size_t>(std::clamp<int64_t>(top, 0, static_cast<int64_t>(row.size())));
  std::vector<int32_t> best;
  best.reserve(k + 1);
  for (int32_t i = 0; k > 0 && i < static_cast<int32_t>(row.size()); ++i) {
    if (best.size() == k && row[i] <= row[best.back()]) continue;  // ties: the lower id stays
    auto at = std::upper_bound(best.begin(), best.end(), i, [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    best.insert(at, i);
    if (best.size() > k) best.pop_back();
  }
  for (int32_t i : best) out.top.emplace_back(i, static_cast<float>(row[i] - log_z));
  return out;
}

Generation::Generation(std::unique_ptr<State> state) : s_(std::move(state)) {}
Generation::Generation(Generation&&) noexcept = default;
Generation& Generation::operator=(Generation&&) noexcept = default;
Generation::~Generation() = default;
bool Generation::finished() const { return s_->done; }
void Generation::step() {
  Generation* self = this;
  step_all({&self, 1});
}

void Generation::step_all(std::span<Generation* const> generations) {
  std::vector<State*> ready;
  for (Generation* g : generations) {
    if (!g || !g->s_->plan()) continue;
    g->s_->propose();
    ready.push_back(g->s_.get());
  }
  // One verify stage per model (a Generator has one; several generators may share a step).
  while (!ready.empty()) {
    std::vector<State*> group, rest;
    for (State* s : ready) (s->model == ready.front()->model ? group : rest).push_back(s);
    ready = std::move(rest);
    const std::vector<State::Outcome> outcomes = State::verify_rounds(group);
    for (size_t i = 0; i < group.size(); ++i) group[i]->emit(outcomes[i]);
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

// The generation engine: prefill, then a decode loop that either samples one token per target forward
// or, with a Drafter, runs speculative rounds: plan (the draft length), propose (the drafter's n drafts),
// verify (n + 1 positions in one target forward, decided by the speculative rule), emit (the accepted
// drafts and the correction or bonus token; the target rolled back past the rest). See
// docs/architecture.md, "A speculative round".
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "specula/model.hpp"
#include "specula/core/text_output.hpp"
#include "specula/sampler.hpp"

namespace specula::core {

// Sees each round's drafts before they are verified and may replace them: the acceptance replay
// (acceptance_replay.hpp), a benchmark, is one.
class DraftHook {
 public:
  virtual ~DraftHook() = default;
  // Throws when the generation's sampling does not suit the hook.
  virtual void check(const SamplingParams& params) const { (void)params; }
  // `history`: the tokens so far, prompt first; its last one is the token the round verifies first.
  virtual void drafted(std::span<const int32_t> history, std::span<int32_t> drafts) = 0;
  // The same for n drafts the drafter kept on the backend (rows 0..n-1 of `held`, I32 [N >= n, 1]).
  virtual void drafted(std::span<const int32_t> history, int64_t n, BackendTensor& held) = 0;
  // The generation has ended with `history`.
  virtual void finished(std::span<const int32_t> history) { (void)history; }
};

// How the speculative loop runs; docs/gemma4-assistant.md, "Conventions", lists every difference.
enum class DraftConvention {
  // The whole prompt is prefilled and its last row gives the first token; a round drafts at most what
  // max_tokens leaves (minus its correction/bonus token) and may be a plain step; at temperature > 0
  // the drafter samples its drafts from its own distribution q.
  Specula,
  // llama.cpp's draft-mtp loop (examples/speculative-simple with common/speculative.cpp): every prompt
  // id but the last is prefilled and the first round verifies [last prompt id, drafts]; the draft is
  // min(K, max_tokens - produced - 1, context room - 2) tokens, or K when that limit is not positive;
  // generation stops after the round in which more than max_tokens tokens were produced; drafts are
  // greedy (llama.cpp's draft sampler takes the top candidate) at any temperature.
  LlamaCpp,
};

// One speculative round as it ran, for traces (GenerationOptions::on_round).
struct RoundTrace {
  int64_t round = 0;                   // speculative rounds before this one
  int64_t n_past = 0;                  // position of last_token: the tokens the target held while drafting
  int32_t last_token = -1;             // the token the round verifies first (committed, not yet processed)
  std::vector<int32_t> draft;
  std::vector<int32_t> target_greedy;  // the target's argmax at each of the draft.size() + 1 verified rows
  int64_t accepted = 0;                // drafts accepted (a prefix of `draft`)
  std::vector<std::vector<float>> draft_logits;  // the drafter's logits at each step ([vocab]; empty if none)
};

// One emitted token's log-probability: log_softmax of the target's raw logits at its position (before
// the sampler's temperature, top-k/p, penalties and biases: vLLM's "raw" logprobs), with and without a
// drafter alike (under speculation, the verification row the token was decided from).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the most likely (token, logprob) there, most likely first
};

struct GenerationOptions {
  int max_tokens = 256;                 // tokens generated at most (stop/end tokens not counted)
  std::vector<int32_t> stop_tokens;     // extra stop tokens besides the model's end tokens and the chat
                                        // format's stop tokens
  bool ignore_eos = false;              // the model's end tokens and the chat format's stop tokens do not
                                        // end generation (stop_tokens still do)
  bool show_thoughts = false;           // AnswerFilter: keep the thought channel visible
  int draft_tokens = 3;                 // tokens the drafter proposes per speculative step
  bool draft_auto = false;              // pick the length per step from measured costs and acceptance
                                        // (draft_length.hpp), starting at draft_tokens
  int draft_max = 8;                    // the longest draft draft_auto may pick
  int64_t prefill_chunk = 0;            // prompt tokens per forward during prefill; 0 = all at once
  std::vector<std::string> stop_strings; // generation ends when the visible text holds one (it is cut
                                         // off, and text that may start one is held back while streaming)
  const std::atomic<bool>* interrupt = nullptr;  // when it turns true, generation ends after the current
                                                 // step (Ctrl+C), with stop reason "interrupted"
  DraftConvention convention = DraftConvention::Specula;  // with a drafter: how the speculative loop runs
  // Called after every speculative round; makes the drafter return its logits (the trace's top-K).
  std::function<void(const RoundTrace&)> on_round;
  // Sees (and may replace) each round's drafts before verification, e.g. the acceptance replay
  // benchmark. Must outlive the generation.
  DraftHook* draft_hook = nullptr;
  // Structured output (token_constraint.hpp, grammar.hpp): "" (none); "json_object": the answer is one
  // JSON object, then an end token; or what `grammar` stands for ("json_schema", "regex", "grammar",
  // "tool_choice required", ...: named in messages and stats), the answer then a sentence of `grammar`
  // (GBNF; json_schema_grammar.hpp compiles schemas and regular expressions to it). Every row the target
  // computes is masked on the host before the sampling rule, so rounds verify on the host
  // (GenerationStats::host_sampling_reason says so); drafts keep running and a draft the constraint
  // forbids is rejected.
  std::string response_format;
  std::string grammar;
  // >= 0: record each emitted token's TokenLogprob with this many alternatives (0..20). The target's
  // logits must reach the host: every step samples and every round verifies there (the stats' reason says so).
  int logprobs = -1;
  // With logprobs: called with each token's TokenLogprob just before the TokenCallback for that token.
  std::function<void(const TokenLogprob&)> on_logprob;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;           // the prompt's forward pass(es)
  double decode_seconds = 0;            // everything after: forwards, drafting, sampling
  // Speculative decoding only.
  int64_t speculative_steps = 0;
  int64_t drafted_tokens = 0;           // proposed by the drafter
  int64_t accepted_tokens = 0;          // proposals the target agreed with
  double draft_seconds = 0;             // time spent inside Drafter::draft
  std::vector<int64_t> drafted_by_position;   // [i]: steps that drafted an (i + 1)-th token
  std::vector<int64_t> accepted_by_position;  // [i]: steps whose (i + 1)-th draft was accepted (llama-server's
                                              // spec_decode_num_accepted_tokens_per_pos_total)
  std::vector<int64_t> steps_by_draft_length; // [n]: steps (plain ones at 0) that drafted n tokens
  // Where tokens were sampled (sampler.device): in the model's graph, or on the host from logits.
  int64_t device_sampled_tokens = 0;
  int64_t host_sampled_tokens = 0;
  int64_t device_verified_steps = 0;    // speculative steps verified on the backend (one read of ids each)
  std::string host_sampling_reason;     // why a plain step sampled on the host (first reason seen)
  double constraint_seconds = 0;        // GenerationOptions::response_format: masking rows, advancing the matcher
  int64_t constrained_rows = 0;         // rows masked
  // "device", "host" or "mixed" (speculative steps sample on the host unless verified on the backend).
  std::string sampling_path() const {
    return !host_sampled_tokens ? "device" : (!device_sampled_tokens ? "host" : "mixed");
  }

  double prefill_tokens_per_second() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0; }
  // Tokens produced by the decode loop (all but the first, which comes from the prefill logits).
  double decode_tokens_per_second() const {
    return decode_seconds > 0 && generated_tokens > 1 ? (generated_tokens - 1) / decode_seconds : 0;
  }
  double acceptance_rate() const { return drafted_tokens ? double(accepted_tokens) / drafted_tokens : 0; }
  // Drafts accepted per speculative step.
  double mean_accepted_length() const { return speculative_steps ? double(accepted_tokens) / speculative_steps : 0; }
  // Target forwards saved: tokens emitted per speculative step.
  double tokens_per_step() const {
    return speculative_steps ? double(accepted_tokens + speculative_steps) / speculative_steps : 0;
  }
};

enum class StopReason { EndToken, MaxTokens, ContextFull, StopString, Interrupted };
// "end_token", "max_tokens", "context_full", "stop_string", "interrupted"
std::string_view stop_reason_name(StopReason r);

struct GenerationResult {
  std::vector<int32_t> tokens;          // generated ids, without the final end/stop token
  std::string text;                     // visible text (AnswerFilter output), "" without a tokenizer
  StopReason stop_reason = StopReason::MaxTokens;
  int32_t stop_token = -1;              // the end/stop token that ended generation, or -1
  GenerationStats stats;
  std::vector<TokenLogprob> logprobs;   // with GenerationOptions::logprobs >= 0: one per token of `tokens`
};

// log_softmax(row)[token] and the `top` most likely tokens (ties: lower id), in double, rounded to float.
TokenLogprob token_logprob(std::span<const float> row, int32_t token, int top);

// Called as tokens are accepted: `text` is the visible text they completed (may be empty). A last call
// with token -1 flushes text held back at the end (an incomplete UTF-8 sequence, a filter's tail).
using TokenCallback = std::function<void(int32_t token, std::string_view text)>;

class Generator;

// One generation run step by step: what Generator::generate runs as a loop, for callers that interleave
// several generations between steps (the server's scheduler). Created by Generator::start, which checks
// the prompt, prefills it and emits the first token; each step() then runs one decode step (a plain
// token, or one speculative round with a drafter) until finished(); finish() flushes the text held back
// and returns the result. The context passed to start() must outlive the Generation.
class Generation {
 public:
  Generation(Generation&&) noexcept;
  Generation& operator=(Generation&&) noexcept;
  ~Generation();

  bool finished() const;
  // One decode step; nothing when finished. Honours GenerationOptions::interrupt before the step.
  void step();
  // One step of each generation, the target forwards of those on one model as one batch
  // (Model::forward_batch: each weight is read once for all of them). Each generation drafts, accepts
  // and rolls back on its own; greedy tokens equal stepping each alone. Plain steps of a batch sample
  // on the host. The contexts must be distinct; finished generations are skipped.
  static void step_all(std::span<Generation* const> generations);
  // Ends the generation (stop reason Interrupted when it had not finished) and returns the result; the
  // context is left as Generator::generate leaves it. Call once.
  GenerationResult finish();
  // The tokens accepted so far.
  const std::vector<int32_t>& tokens() const;

 private:
  friend class Generator;
  struct State;
  explicit Generation(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

class Generator {
 public:
  // `drafter` may be null (plain decoding). The model's chat format (when it has one) filters the
  // streamed text; otherwise text is decoded with the model's tokenizer (when it has one).
  Generator(std::shared_ptr<Model> model, std::shared_ptr<Sampler> sampler, std::shared_ptr<Drafter> drafter = nullptr);

  // Generates in `context`, which must be fresh (position 0) or hold a previous conversation prefix:
  // `prompt` is processed from context.position() on. Throws specula::Error when the prompt does not
  // fit the context. On return the context holds the prompt and every generated token except the last
  // one (never the end token), so a conversation continues by feeding result.tokens.back() first.
  GenerationResult generate(ModelContext& context, std::span<const int32_t> prompt, const GenerationOptions& options,
                            const TokenCallback& on_token = {});
  // The same, step by step (Generation). Checks and prefills at once; throws as generate() does.
  Generation start(ModelContext& context, std::span<const int32_t> prompt, const GenerationOptions& options,
                   const TokenCallback& on_token = {});
  // Convenience: a fresh context of `context_length` (0 = the model's own).
  GenerationResult generate(std::span<const int32_t> prompt, const GenerationOptions& options,
                            const TokenCallback& on_token = {}, int64_t context_length = 0);

  const Model& model() const { return *model_; }

 private:
  std::shared_ptr<Model> model_;
  std::shared_ptr<Sampler> sampler_;
  std::shared_ptr<Drafter> drafter_;
};


}  // namespace specula::core

// Model (a target architecture) and Drafter (a speculative drafter) interfaces. Model plugins build
// them on top of ModelFile (weights and metadata) and ComputeBackend (all computation).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/compute.hpp"
#include "specula/error.hpp"
#include "specula/attention.hpp"
#include "specula/kv_cache.hpp"
#include "specula/lm_head.hpp"
#include "specula/model_file.hpp"
#include "specula/sampler.hpp"
#include "specula/tokenizer.hpp"

namespace specula {

struct ModelInfo {
  std::string architecture;     // "gemma4"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t context_length = 0;   // the longest context the model supports
  std::vector<int32_t> end_tokens;  // generation stops on any of these
  nlohmann::json details;       // architecture-specific facts for `specula inspect` and logs
};

// The target's token embedding table as loaded (any dtype the backend's GetRows reads) and the scale
// the target multiplies looked-up rows by: a drafter embeds tokens exactly as the target does.
struct TokenEmbedding {
  BackendTensorPtr table;  // [vocab, hidden_size]
  float scale = 1.0f;
};

// What a drafter may read of a running target: its KV caches (per attention type), the hidden state
// it produced for the last token it processed, and its token embedding.
class TargetView {
 public:
  virtual ~TargetView() = default;
  // "full" or "sliding": the cache of the target's last layer of that attention type.
  virtual KvView kv(const std::string& attention_type) const = 0;
  // The final-normed hidden state (the LM head's input) of the last processed position:
  // F32 [hidden_size]. MTP drafters take this row as their recurrent input.
  virtual BackendTensorPtr last_hidden() const = 0;
  virtual int64_t position() const = 0;   // tokens processed so far
  virtual TokenEmbedding token_embedding() const = 0;
};

class ModelContext;

// How a round's verdict is decided: by `sampler` under `state` (on the backend: its device form,
// Sampler::sample_in_graph for a plain step, Sampler::verify_in_graph for drafts), or, for drafts,
// greedily (sampler null: each position's argmax, ties the lower id; accepted while a draft is it).
// `uniforms`: what the decision draws with, 1 for a plain step, 2k + 1 for k drafts (acceptance and
// residual per draft, then the bonus); for a drafter (DraftRequest::rule), one per draft step.
struct RoundRule {
  const Sampler* sampler = nullptr;
  SamplingState state;
  std::span<const float> uniforms;
};

// Where a round's drafts wait on the backend (ModelContext::prepare_round): a drafter writes draft k into
// row k of `tokens` (I32 [N >= k, 1]) and, when the round is sampled, the logits it drew it from (over the
// whole vocabulary) into row k of `logits` (F32 [k, vocab]). Empty for a plain step.
struct RoundBuffers {
  BackendTensorPtr tokens, logits;
};

// One sequence's round for Model::verify: its context processes `tokens` (host ids: the token accepted
// last, or a prompt's tail), then `drafts` ids from the buffers prepare_round gave, and `rule` decides.
// drafts = 0 is a plain step: the token after `tokens`.
struct RoundEntry {
  ModelContext* context = nullptr;
  std::span<const int32_t> tokens;
  int64_t drafts = 0;
  RoundRule rule;
};

// A round's verdict, read back in one transfer: the accepted drafts, then the replacement of the first
// rejected one or the bonus token (a plain step: its token).
struct RoundVerdict {
  int64_t accepted = 0;
  std::vector<int32_t> tokens;  // [accepted + 1]
};

struct ContextOptions {
  int64_t context_length = 0;  // 0 = the model's own
};

// The per-sequence state of a target model: its KV cache and position.
class ModelContext {
 public:
  virtual ~ModelContext() = default;
  // Processes `tokens` at positions position()..position()+n-1. Returns log-softmax-ready logits
  // (after the final softcap) for the last `n_logits` positions, F32 [n_logits, vocab], on the host.
  // Throws specula::Error when the context would overflow.
  virtual std::vector<float> forward(std::span<const int32_t> tokens, int64_t n_logits = 1) = 0;
  virtual int64_t position() const = 0;
  virtual int64_t capacity() const = 0;
  // Forgets every position >= pos (speculative rollback). pos <= position().
  virtual void truncate(int64_t pos) = 0;
  // The deepest truncate() allowed from the current position (a sliding-window ring has overwritten
  // older keys). The default: any.
  virtual int64_t max_rollback() const { return position(); }
  // Prefix sharing: this context takes the first n positions of `from` (a context of the same model
  // and capacity; from.position() - n <= from.max_rollback()), so a shared prompt prefix (a system
  // prompt) is processed once. The default: not supported.
  virtual void copy_prefix(const ModelContext& from, int64_t n) {
    (void)from;
    (void)n;
    fail("this model's contexts cannot share a prefix (no ModelContext::copy_prefix)");
  }
  virtual const TargetView& view() const = 0;
  // A speculative round on the backend (docs/architecture.md, "A round"): readies this context for a
  // round of `tokens` host ids and k drafts decided by `rule` (its uniforms unused here), and gives the
  // buffers the drafts go into (none when k = 0). Returns false, with the reason in `why`, when it cannot
  // (the rule has no device form here, the round exceeds one step); the engine then runs forward() and
  // decides on the host. The default: cannot.
  virtual bool prepare_round(int64_t tokens, int64_t k, const RoundRule& rule, RoundBuffers& buffers,
                             std::string& why) {
    (void)tokens, (void)k, (void)rule, (void)buffers;
    why = "the model plugin decides rounds on the host only (no ModelContext::prepare_round)";
    return false;
  }
};

// One sequence's share of a batched forward pass (Model::forward_batch).
struct BatchEntry {
  ModelContext* context = nullptr;   // a context of this model; each at most once per batch
  std::span<const int32_t> tokens;   // appended at context->position()
  int64_t n_logits = 1;              // logits for the last n_logits tokens
};

// Plugin kind "model": a loaded target model.
class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelInfo& info() const = 0;
  virtual std::shared_ptr<const Tokenizer> tokenizer() const = 0;
  virtual std::shared_ptr<const ChatFormat> chat_format() const = 0;
  virtual std::unique_ptr<ModelContext> new_context(const ContextOptions& options) = 0;
  // Runs every entry, returning each one's logits [n_logits, vocab] in order: the same numbers as each
  // context's forward() in turn. Models that batch run them in one forward pass, reading each weight
  // once for all rows (decode is bandwidth-bound: N sequences cost little more than one). The default
  // runs them one after the other.
  virtual std::vector<std::vector<float>> forward_batch(std::span<const BatchEntry> batch) {
    std::vector<std::vector<float>> out;
    for (const BatchEntry& e : batch) out.push_back(e.context->forward(e.tokens, e.n_logits));
    return out;
  }
  // Runs the rounds of `rounds` (each context prepared by prepare_round for its shape and rule, at most
  // once per call) and returns each verdict in order, with one read. Models that batch run them in one
  // forward pass. The default: no device rounds (prepare_round never says yes).
  virtual std::vector<RoundVerdict> verify(std::span<const RoundEntry> rounds) {
    (void)rounds;
    fail("this model cannot verify rounds on the backend (no Model::verify)");
  }
};

// The parts a model or drafter is loaded with besides its file and backend, as the pipeline names them
// (target.lm_head, target.attention, the same under drafter) and the host makes them from their plugins.
// Empty: the standard part.
struct ModelParts {
  std::shared_ptr<const LmHead> lm_head;      // null: standard_lm_head()
  std::shared_ptr<const Attention> attention; // null: standard_attention()
};

// Loads a Model of this plugin's architecture. Checks every tensor it needs and throws naming the
// missing or misshaped one. `options` carries the pipeline's target section.
class ModelLoader {
 public:
  virtual ~ModelLoader() = default;
  virtual std::string architecture() const = 0;            // "gemma4"
  virtual bool accepts(const ModelFile& file) const = 0;   // does this file hold this architecture?
  // What load() checks from metadata alone, without reading a weight: the options, the configuration,
  // what the backend must support (e.g. the KV cache dtype). Returns the ModelInfo load() would report,
  // so that `specula validate` can check a drafter and the context length against it. Throws the
  // message load() would. The default checks nothing and knows only the architecture.
  virtual ModelInfo check(const ModelFile& file, const ComputeBackend& backend, const nlohmann::json& options) const {
    (void)file; (void)backend; (void)options;
    ModelInfo info;
    info.architecture = architecture();
    return info;
  }
  // `parts`: the LM head (and further parts) the pipeline chose; the host fills in its defaults.
  virtual std::shared_ptr<Model> load(std::shared_ptr<const ModelFile> file,
                                      std::shared_ptr<ComputeBackend> backend,
                                      const nlohmann::json& options, const ModelParts& parts = {}) const = 0;
};

// What the engine asks of Drafter::draft: n steps after `last_token`, returned on the host (the
// drafter's argmax, or `pick`'s choice), or written into round buffers on the backend.
struct DraftRequest {
  int32_t last_token = -1;  // accepted by the target but not yet processed by it
  int n = 0;                // draft steps (tokens) to run
  // Return each step's logits (DraftStep::logits): for a trace, or to sample. Off on the common greedy
  // path, where only the drafted ids need to leave the backend.
  bool logits = false;
  // Sampled drafting on the host: picks step k's token from its logits (F32 [vocab]; implies `logits`);
  // step k + 1 then embeds the picked token. Unset: the drafter's own greedy choice (argmax).
  std::function<int32_t(int step, std::span<const float> logits)> pick;
  // Drafts that stay on the backend (set only without `logits`): the round's buffers from
  // ModelContext::prepare_round. A drafter that can writes step k's token into row k of buffers.tokens
  // and feeds it to step k + 1 there; with rule.sampler set it also writes step k's logits into row k of
  // buffers.logits and draws the token in its graph (Sampler::sample_in_graph under rule.state with
  // rule.uniforms[k], what `pick` would draw with). It returns n steps with token -1. A drafter that
  // cannot ignores the buffers and drafts as if they were absent.
  RoundBuffers buffers;
  RoundRule rule;
};

// One draft step: the drafted token and, when asked, the distribution it came from as logits over the
// whole vocabulary (log_softmax(logits) is the drafter's log-probability of each token). A drafter
// without a distribution returns no logits; the engine then takes the draft as certain (q = 1).
struct DraftStep {
  int32_t token = -1;
  std::vector<float> logits;
};

// A drafter proposes the next tokens of a target from the target's own state.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // Runs up to `request.n` steps following `request.last_token`; reads the target's state through
  // `target` only.
  virtual std::vector<DraftStep> draft(const TargetView& target, const DraftRequest& request) = 0;
};

// Plugin kind "drafter".
class DrafterLoader {
 public:
  virtual ~DrafterLoader() = default;
  virtual std::string architecture() const = 0;            // "gemma4-assistant"
  virtual bool accepts(const ModelFile& file) const = 0;
  // What load() checks from metadata alone: the options and the pairing with `target` (as
  // ModelLoader::check reports it: hidden size, vocabulary, layer types, KV geometry). Throws the
  // message load() would. The default checks nothing.
  virtual void check(const ModelFile& file, const ComputeBackend& backend, const ModelInfo& target,
                     const nlohmann::json& options) const {
    (void)file; (void)backend; (void)target; (void)options;
  }
  virtual std::shared_ptr<Drafter> load(std::shared_ptr<const ModelFile> file,
                                        std::shared_ptr<ComputeBackend> backend,
                                        const ModelInfo& target, const nlohmann::json& options,
                                        const ModelParts& parts = {}) const = 0;
};

}  // namespace specula

// The application API: open a pipeline, chat with the model, stream the answer. Layered on the core
// (plugin host, pipeline, Generator) and the SDK's interfaces; separate from the plugin ABI, so an
// application includes this header and links Specula::api (docs/api.md).
//
//   auto model = specula::api::Model::open("configs/default.yaml");   // or a GGUF file / model directory
//   auto session = model->new_session();
//   auto sampling = model->default_sampling();
//   sampling.max_tokens = 80;
//   session->generate_stream({{"user", "And Moses said"}}, sampling,
//                            [](std::string_view chunk) { std::cout << chunk << std::flush; });
//
// Thread-safety. A Model may be shared by any number of threads: its const members (tokenize, render,
// info) are read-only, and every call that runs the model takes the Model's engine lock for one step
// (the prefill, or one decode step / speculative round), so sessions on different threads interleave
// step by step. The backends do not promise concurrent runs, hence the lock; the multi-sequence core
// will replace it with one batched forward. A Session is one conversation and is used by one thread at
// a time; only Session::cancel() may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "specula/core/generator.hpp"
#include "specula/core/pipeline.hpp"
#include "specula/model.hpp"
#include "specula/tokenizer.hpp"
#include "specula/tool_calls.hpp"

namespace specula::api {

using ChatMessage = specula::ChatMessage;  // {role: "system" | "user" | "assistant" | "tool", content, tool_calls, tool_call_id, name}
using ToolCall = specula::ToolCall;        // {name, arguments (JSON object text)}

// How a chat prompt tokenizes what the messages say: as text (a control token's spelling, "<|turn>",
// stays text: no message can open a turn of another role), or with the special tokens it spells parsed
// (for callers trusted to write the format themselves).
enum class ContentTokens { Text, Parsed };

// The seed's ChatSamplingConfig. Model::default_sampling() fills it from the pipeline's sampler section
// (and, for a model opened from its path, from its generation_config.json).
struct SamplingConfig {
  float temperature = 0.0f;         // 0 = greedy
  int32_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off
  // OpenAI's penalties, [-2, 2], 0 = off: logit -= presence * (count > 0) + frequency * count over the
  // tokens generated so far (not the prompt). They and logit_bias are applied on the host: a drafter
  // stays on, its drafts verified there (Result's stats say why: host_sampling_reason).
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias = {};  // (token id, bias in [-100, 100]) added to the logits
  // >= 0: Result::logprobs and Chunk::logprob, each token's log_softmax of the target's raw logits (before
  // temperature, top-k/p, penalties) with this many most likely alternatives (0..20); -1 = off. The
  // target's logits must reach the host: it samples and verifies there (a drafter stays on).
  int logprobs = -1;
  int max_tokens = 256;
  int32_t min_tokens = 0;           // end tokens suppressed before this many tokens
  uint64_t seed = 0;
  std::vector<std::string> stop;    // generation ends before the first of these strings
  bool show_thoughts = false;       // keep the thought channel in the answer text
  bool reasoning = false;           // hand the thought channel separately (Chunk::reasoning, Result::reasoning)
  std::vector<int32_t> stop_token_ids;  // generation also ends at these tokens (vLLM's stop_token_ids)
  bool ignore_eos = false;          // the model's end tokens and the chat format's stop tokens do not end it
  // Speculative decoding for this generation (with a drafter; unset: the pipeline's drafter section):
  // draft_tokens 0 = off, N = N tokens per round; draft_auto = pick the length per round, at most
  // draft_max.
  std::optional<int> draft_tokens;
  std::optional<bool> draft_auto;
  std::optional<int> draft_max;
  // Structured output (core::GenerationOptions): "" none; "json_object": one JSON object; "json_schema":
  // JSON valid against the schema in `format_spec` (JSON text); "regex": text the pattern in `format_spec`
  // matches whole; "grammar": a sentence of the GBNF grammar in `format_spec` (llama.cpp's format).
  std::string response_format;
  std::string format_spec;
};

struct OpenOptions {
  std::vector<std::filesystem::path> plugin_paths;  // searched for plugins first
  std::vector<core::Override> overrides;            // pipeline keys, as the CLI flags set them
  bool load_drafter = true;
};

// What a streamed step delivers: the token (-1 for the final flush) and the visible text it completed
// (valid UTF-8, thought channel removed, stop strings cut); `reasoning` the thought-channel text it
// completed when SamplingConfig::reasoning is set.
struct Chunk {
  int32_t token = -1;
  std::string_view text;
  std::string_view reasoning;
  // The tool calls this token completed (Gemma 4: `<|tool_call>call:NAME{...}<tool_call|>`, parsed;
  // the call's text never reaches `text`).
  std::span<const ToolCall> tool_calls;
  const core::TokenLogprob* logprob = nullptr;  // with SamplingConfig::logprobs: this token's (token >= 0)
};
using ChunkCallback = std::function<void(const Chunk&)>;
using TextCallback = std::function<void(std::string_view text)>;

struct Result {
  std::string text;                 // the answer (visible text)
  std::string reasoning;            // the thought channel (with SamplingConfig::reasoning)
  std::vector<ToolCall> tool_calls; // the tool calls the model wrote, parsed, in order
  std::vector<int32_t> tokens;      // generated ids, without the end token
  core::StopReason stop_reason = core::StopReason::MaxTokens;  // Interrupted after Session::cancel()
  int32_t stop_token = -1;
  int64_t cached_tokens = 0;        // prompt tokens the session's context already held (not recomputed)
  core::GenerationStats stats;      // prompt/generated tokens, prefill/decode tok/s, drafted/accepted, ...
  std::vector<core::TokenLogprob> logprobs;  // with SamplingConfig::logprobs: one per token of `tokens`
};

class Session;

class Model {
 public:
  // A pipeline YAML file, or a model file / directory (GGUF, safetensors, MLX; format and architecture
  // detected) run with the default pipeline, whose sampling defaults then come from the checkpoint's
  // generation_config.json when it has one. Throws specula::Error naming what failed.
  static std::shared_ptr<Model> open(const std::filesystem::path& path, const OpenOptions& options = {});
  // A pipeline given as YAML text; relative paths resolve against `base_dir`.
  static std::shared_ptr<Model> from_yaml(std::string_view yaml, const std::filesystem::path& base_dir,
                                          const OpenOptions& options = {});
  // A pipeline already read (core::load_pipeline, core::default_pipeline).
  static std::shared_ptr<Model> from_pipeline(core::Pipeline pipeline, const OpenOptions& options = {});

  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelInfo& info() const;
  const core::Pipeline& pipeline() const;
  const core::BuiltPipeline& built() const;  // backend, target, drafter, sampler as built
  bool has_drafter() const;
  // A session's context length (target.context_length, or the model's own).
  int64_t context_length() const;
  SamplingConfig default_sampling() const;

  std::vector<int32_t> tokenize(std::string_view text, bool parse_special = false) const;
  std::string detokenize(std::span<const int32_t> ids, bool skip_special = true) const;
  // The conversation in the model's chat format, ending with the generation prompt; the pipeline's
  // chat.system is added when `messages` hold no system message. Needs a chat format.
  // `enable_thinking` overrides the pipeline's chat.enable_thinking.
  // `tools`: tool declarations, a JSON array in OpenAI's form ([{"type": "function", "function": {"name",
  // "description", "parameters"}}]); "" for none (docs/api.md "Tool calls").
  std::string render(std::span<const ChatMessage> messages, std::optional<bool> enable_thinking = {},
                     std::string_view tools = {}) const;
  // render() tokenized, ready for Session::generate: the template's special tokens parsed, the messages'
  // contents as `content` says.
  std::vector<int32_t> chat_prompt(std::span<const ChatMessage> messages, std::optional<bool> enable_thinking = {},
                                   ContentTokens content = ContentTokens::Text, std::string_view tools = {}) const;

  std::unique_ptr<Session> new_session();

  // One-off calls on a fresh session.
  Result generate_stream(std::span<const ChatMessage> messages, const SamplingConfig& sampling,
                         const TextCallback& on_text = {});
  Result generate(std::span<const int32_t> prompt, const SamplingConfig& sampling,
                  const core::TokenCallback& on_token = {});

  struct Impl;

 private:
  friend class Session;
  explicit Model(std::shared_ptr<Impl> impl);
  RenderedChat rendered(std::span<const ChatMessage> messages, std::optional<bool> enable_thinking,
                        std::string_view tools) const;
  std::shared_ptr<Impl> impl_;
};

// One conversation: a context (KV cache) of its own. A new prompt that starts with tokens the context
// already holds (the previous turns of a chat, a shared system prompt) reuses them and processes only
// the rest (Result::cached_tokens).
class Session {
 public:
  ~Session();

  Result generate_stream(std::span<const ChatMessage> messages, const SamplingConfig& sampling,
                         const TextCallback& on_text = {});
  // Token level: `on_token(id, visible text)` per accepted token, then (-1, the rest) at the end.
  Result generate(std::span<const int32_t> prompt, const SamplingConfig& sampling,
                  const core::TokenCallback& on_token = {});
  Result generate_chunks(std::span<const int32_t> prompt, const SamplingConfig& sampling,
                         const ChunkCallback& on_chunk);

  // Step by step, for schedulers that interleave sessions: begin() reuses the common prefix, prefills
  // the rest and emits the first token; step() runs one decode step; end() returns the result. Throws
  // specula::Error for a prompt that does not fit (the session is then empty and reusable).
  void begin(std::span<const int32_t> prompt, const SamplingConfig& sampling, ChunkCallback on_chunk = {});
  bool active() const;    // between begin() and end()
  bool finished() const;  // the active generation has ended (end token, limit, stop string, cancel)
  void step();
  // One step of each session (all active), their target forwards as one batch (core::Generation::step_all):
  // what a scheduler serving several sessions calls between admissions. On an error every session of the
  // call is emptied (as step() does for its one) and the error is rethrown.
  static void step_all(std::span<Session* const> sessions);
  Result end();

  // Ends the running generation after its current step, from any thread (stop reason Interrupted).
  // Cleared by the next begin().
  void cancel();

  // Prompt tokens the context holds of `prompt` and would reuse (at most prompt.size() - 1).
  size_t reusable_prefix(std::span<const int32_t> prompt) const;
  int64_t position() const;   // tokens the context holds
  int64_t capacity() const;
  void reset();               // forget the conversation

 private:
  friend class Model;
  struct State;
  explicit Session(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

// Splits generated tokens into answer and thought-channel text with the chat format's own filters (one
// hiding the thought channel, one showing it): what differs is the thought. Used for `reasoning`.
class ThoughtSplitter {
 public:
  explicit ThoughtSplitter(const ChatFormat& format);
  // The thought-channel text token `token` completed (empty outside the channel).
  std::string push(int32_t token);
  std::string finish();

 private:
  std::unique_ptr<ChatFormat::AnswerFilter> answer_, all_;
};

}  // namespace specula::api

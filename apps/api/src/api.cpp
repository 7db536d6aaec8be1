#include "specula/api.hpp"

#include <algorithm>
#include <mutex>
#include <optional>

#include "specula/hub.hpp"
#include "specula/core/json_schema_grammar.hpp"
#include "specula/core/plugin_host.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"

namespace specula::api {

namespace fs = std::filesystem;

struct Model::Impl {
  core::Pipeline pipeline;
  std::unique_ptr<core::PluginHost> host;  // owns the plugin libraries; declared before what they made
  core::BuiltPipeline built;
  SamplingConfig defaults;
  std::mutex engine;  // one model step at a time (see api.hpp, "Thread-safety")

  std::shared_ptr<Sampler> make_sampler(const SamplingConfig& s) const {
    SamplingParams p = pipeline.sampler.params;  // penalty_window, device: the pipeline's
    p.temperature = s.temperature;
    p.top_k = s.top_k;
    p.top_p = s.top_p;
    p.min_p = s.min_p;
    p.repetition_penalty = s.repetition_penalty;
    p.presence_penalty = s.presence_penalty;
    p.frequency_penalty = s.frequency_penalty;
    p.logit_bias = s.logit_bias;
    p.min_length = s.min_tokens;
    p.seed = s.seed;
    return host->make_sampler(pipeline.sampler.plugin, p, pipeline.sampler.options, pipeline.sampler.options_at);
  }
};

namespace {

// As the CLI decides: a directory, or a file that is not *.yaml / *.yml, is a checkpoint.
bool is_model_path(const fs::path& p) {
  if (core::hub::is_ref(p.string())) return true;  // hf://OWNER/REPO...: resolved when the target opens
  std::error_code ec;
  if (fs::is_directory(p, ec)) return true;
  const std::string ext = p.extension().string();
  return ext != ".yaml" && ext != ".yml";
}

// The GBNF a response format stands for ("" for none and json_object, which has its own recognizer).
std::string grammar_of(const std::string& kind, const std::string& spec) {
  if (kind.empty() || kind == "json_object") {
    if (!spec.empty()) fail("format_spec is given but response_format is \"{}\"; set response_format to json_schema, regex or grammar", kind);
    return {};
  }
  if (spec.empty()) fail("response_format {} needs format_spec (the schema, pattern or grammar)", kind);
  if (kind == "json_schema") return json_schema_to_gbnf(spec);
  if (kind == "regex") return regex_to_gbnf(spec);
  return spec;  // "grammar", and the server's forced tool calls ("tool_choice required")
}

SamplingConfig sampling_of(const core::Pipeline& p, const SamplingParams& sp) {
  SamplingConfig s;
  s.temperature = sp.temperature;
  s.top_k = sp.top_k;
  s.top_p = sp.top_p;
  s.min_p = sp.min_p;
  s.repetition_penalty = sp.repetition_penalty;
  s.presence_penalty = sp.presence_penalty;
  s.frequency_penalty = sp.frequency_penalty;
  s.logit_bias = sp.logit_bias;
  s.min_tokens = sp.min_length;
  s.seed = sp.seed;
  s.max_tokens = p.sampler.max_tokens;
  s.stop = p.sampler.stop;
  s.show_thoughts = p.chat.show_thoughts;
  return s;
}

}  // namespace

std::shared_ptr<Model> Model::from_pipeline(core::Pipeline pipeline, const OpenOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->pipeline = std::move(pipeline);
  if (impl->pipeline.sampler.random_seed)
    log_info("seed: {} (drawn at random)", impl->pipeline.sampler.params.seed);
  std::vector<fs::path> first = options.plugin_paths;
  first.insert(first.end(), impl->pipeline.plugin_paths.begin(), impl->pipeline.plugin_paths.end());
  impl->host = std::make_unique<core::PluginHost>();
  impl->host->discover(core::plugin_search_path(first));
  for (const auto& r : impl->host->rejected()) log_debug("{}", r.reason);
  core::BuildOptions build;
  build.load_drafter = options.load_drafter;
  build.locate = core::hub::model_locator();  // hf:// ids: resolved into the Hugging Face cache
  impl->built = core::build_pipeline(impl->pipeline, *impl->host, build);
  if (!impl->built.target->tokenizer())
    fail("{}: the model has no tokenizer; the application API works on text", impl->pipeline.target.model.string());
  // The sampler section's values, and the checkpoint's generation_config.json for the keys it leaves unset.
  impl->defaults = sampling_of(impl->pipeline, impl->built.sampling);
  return std::shared_ptr<Model>(new Model(std::move(impl)));
}

std::shared_ptr<Model> Model::open(const fs::path& path, const OpenOptions& options) {
  if (!is_model_path(path)) return from_pipeline(core::load_pipeline(path, options.overrides), options);
  std::vector<core::Override> overrides = options.overrides;
  const std::string target = core::hub::is_ref(path.string()) ? path.string() : fs::absolute(path).lexically_normal().string();
  overrides.insert(overrides.begin(), {"target.model", target, "model path " + path.string()});
  return from_pipeline(core::default_pipeline(overrides), options);
}

std::shared_ptr<Model> Model::from_yaml(std::string_view yaml, const fs::path& base_dir, const OpenOptions& options) {
  return from_pipeline(core::parse_pipeline(yaml, "pipeline text", base_dir, options.overrides), options);
}

Model::Model(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;

const ModelInfo& Model::info() const { return impl_->built.target->info(); }
const core::Pipeline& Model::pipeline() const { return impl_->pipeline; }
const core::BuiltPipeline& Model::built() const { return impl_->built; }
bool Model::has_drafter() const { return static_cast<bool>(impl_->built.drafter); }
SamplingConfig Model::default_sampling() const { return impl_->defaults; }

int64_t Model::context_length() const {
  const int64_t own = info().context_length;
  return impl_->pipeline.target.context_length > 0 ? impl_->pipeline.target.context_length : own;
}

std::vector<int32_t> Model::tokenize(std::string_view text, bool parse_special) const {
  return impl_->built.target->tokenizer()->encode(text, false, parse_special);
}

std::string Model::detokenize(std::span<const int32_t> ids, bool skip_special) const {
  const auto tok = impl_->built.target->tokenizer();
  for (int32_t id : ids)
    if (id < 0 || id >= tok->vocab_size()) fail("token id {} is outside the vocabulary of {} tokens", id, tok->vocab_size());
  return tok->decode(ids, skip_special);
}

RenderedChat Model::rendered(std::span<const ChatMessage> messages, std::optional<bool> enable_thinking,
                            std::string_view tools) const {
  const auto chat = impl_->built.target->chat_format();
  if (!chat) fail("the model has no chat format; give a prompt as tokens or plain text instead of messages");
  if (messages.empty()) fail("no messages: a conversation needs at least one message");
  std::vector<ChatMessage> all;
  const bool has_system = std::any_of(messages.begin(), messages.end(), [](const ChatMessage& m) { return m.role == "system"; });
  if (!has_system && !impl_->pipeline.chat.system.empty()) all.push_back({"system", impl_->pipeline.chat.system});
  all.insert(all.end(), messages.begin(), messages.end());
  return chat->render_chat_tools(all, tools, true, enable_thinking.value_or(impl_->pipeline.chat.enable_thinking));
}

std::string Model::render(std::span<const ChatMessage> messages, std::optional<bool> enable_thinking,
                          std::string_view tools) const {
  return rendered(messages, enable_thinking, tools).text;
}

std::vector<int32_t> Model::chat_prompt(std::span<const ChatMessage> messages, std::optional<bool> enable_thinking,
                                        ContentTokens content, std::string_view tools) const {
  const RenderedChat r = rendered(messages, enable_thinking, tools);
  const auto& tok = *impl_->built.target->tokenizer();
  return content == ContentTokens::Parsed ? tok.encode(r.text, false, true) : tok.encode_prompt(r.text, r.content);
}

// ---- Session ----

struct Session::State {
  std::shared_ptr<Model::Impl> model;
  std::unique_ptr<ModelContext> ctx;
  std::vector<int32_t> held;  // the ids the context has processed, in order
  std::atomic<bool> cancelled{false};
  // The active generation.
  std::optional<core::Generation> generation;
  std::vector<int32_t> prompt;
  int64_t cached = 0;
  bool reasoning = false;
  std::unique_ptr<ThoughtSplitter> splitter;
  std::string thoughts;
  std::optional<ToolCallExtractor> tool_calls;
  std::vector<ToolCall> calls;
  ChunkCallback on_chunk;
  std::optional<core::TokenLogprob> logprob;  // the token being delivered's (GenerationOptions::on_logprob)

  ContextOptions context_options;

  // Empties the context. A sliding-window cache cannot roll back past what it keeps (the gemma4 plugin
  // refuses even truncate(0) then): a fresh context instead.
  void forget() {
    held.clear();
    try {
      ctx->truncate(0);
    } catch (const std::exception&) {  // (a plugin's specula::Error is not the host's type)
      ctx = model->built.target->new_context(context_options);
      if (!ctx) fail("the model plugin returned no context");
    }
  }
};

std::unique_ptr<Session> Model::new_session() {
  auto s = std::make_unique<Session::State>();
  s->model = impl_;
  s->context_options.context_length = impl_->pipeline.target.context_length;
  {
    std::lock_guard lock(impl_->engine);
    s->ctx = impl_->built.target->new_context(s->context_options);
  }
  if (!s->ctx) fail("the model plugin returned no context");
  return std::unique_ptr<Session>(new Session(std::move(s)));
}

Session::Session(std::unique_ptr<State> state) : s_(std::move(state)) {}
Session::~Session() = default;

size_t Session::reusable_prefix(std::span<const int32_t> prompt) const {
  size_t common = 0;
  while (common < s_->held.size() && common < prompt.size() && s_->held[common] == prompt[common]) ++common;
  return prompt.empty() ? 0 : std::min(common, prompt.size() - 1);  // at least one token is fed
}

int64_t Session::position() const { return s_->ctx->position(); }
int64_t Session::capacity() const { return s_->ctx->capacity(); }
bool Session::active() const { return s_->generation.has_value(); }
bool Session::finished() const { return !s_->generation || s_->generation->finished(); }
void Session::cancel() { s_->cancelled = true; }

void Session::reset() {
  if (active()) fail("Session::reset during a generation; end() it first");
  std::lock_guard lock(s_->model->engine);
  s_->forget();
}

void Session::begin(std::span<const int32_t> prompt, const SamplingConfig& sampling, ChunkCallback on_chunk) {
  auto& s = *s_;
  if (s.generation) fail("Session::begin while a generation is active; end() it first");
  if (prompt.empty()) fail("the prompt is empty: at least one token is needed to start generation");
  const int64_t vocab = s.model->built.target->info().vocab_size;
  for (int32_t id : prompt)
    if (id < 0 || id >= vocab) fail("prompt token id {} is outside the vocabulary of {} tokens", id, vocab);
  s.cancelled = false;
  s.prompt.assign(prompt.begin(), prompt.end());
  s.on_chunk = std::move(on_chunk);
  s.thoughts.clear();
  s.reasoning = sampling.reasoning && !sampling.show_thoughts;
  const auto chat = s.model->built.target->chat_format();
  s.splitter = s.reasoning && chat ? std::make_unique<ThoughtSplitter>(*chat) : nullptr;
  s.calls.clear();
  s.tool_calls.reset();
  if (chat) s.tool_calls.emplace(s.model->built.target->tokenizer());

  core::GenerationOptions o;
  o.max_tokens = sampling.max_tokens;
  o.stop_strings = sampling.stop;
  o.show_thoughts = sampling.show_thoughts;
  o.interrupt = &s.cancelled;
  core::apply_drafting(s.model->pipeline, o);
  o.stop_tokens = sampling.stop_token_ids;
  o.ignore_eos = sampling.ignore_eos;
  o.response_format = sampling.response_format;
  o.grammar = grammar_of(sampling.response_format, sampling.format_spec);
  if (sampling.logprobs > 20) fail("logprobs {} is more than 20 alternatives", sampling.logprobs);
  o.logprobs = sampling.logprobs;
  s.logprob.reset();
  if (o.logprobs >= 0) o.on_logprob = [&s](const core::TokenLogprob& lp) { s.logprob = lp; };
  if (sampling.draft_tokens) o.draft_tokens = *sampling.draft_tokens;
  if (sampling.draft_auto) o.draft_auto = *sampling.draft_auto;
  if (sampling.draft_max) o.draft_max = *sampling.draft_max;
  if (o.draft_tokens == 0) o.draft_auto = false;
  if (o.draft_auto) o.draft_tokens = std::clamp(o.draft_tokens, 1, std::max(1, o.draft_max));
  core::Generator generator(s.model->built.target, s.model->make_sampler(sampling), s.model->built.drafter);

  std::lock_guard lock(s.model->engine);
  size_t common = reusable_prefix(prompt);
  try {
    s.ctx->truncate(static_cast<int64_t>(common));
  } catch (const std::exception& e) {
    // A sliding-window cache cannot always roll back that far: start over instead.
    log_debug("prefix reuse of {} tokens not possible ({}); processing the whole prompt", common, e.what());
    common = 0;
    s.forget();
  }
  s.held.resize(common);
  s.cached = static_cast<int64_t>(common);
  const std::span<const int32_t> fresh = prompt.subspan(common);
  try {
    s.generation.emplace(generator.start(*s.ctx, fresh, o, [&s](int32_t token, std::string_view text) {
      std::string thought;
      if (s.splitter) thought = token >= 0 ? s.splitter->push(token) : s.splitter->finish();
      s.thoughts += thought;
      std::vector<ToolCall> calls;
      if (s.tool_calls && token >= 0) calls = s.tool_calls->push(token);
      s.calls.insert(s.calls.end(), calls.begin(), calls.end());
      Chunk chunk{token, text, thought, calls};
      if (token >= 0 && s.logprob) chunk.logprob = &*s.logprob;
      if (s.on_chunk) s.on_chunk(chunk);
      if (token >= 0) s.logprob.reset();
    }));
  } catch (...) {
    s.forget();
    throw;
  }
}

void Session::step() {
  auto& s = *s_;
  if (!s.generation) fail("Session::step without an active generation; begin() one first");
  std::lock_guard lock(s.model->engine);
  try {
    s.generation->step();
  } catch (...) {
    s.generation.reset();
    s.forget();
    throw;
  }
}

void Session::step_all(std::span<Session* const> sessions) {
  std::vector<core::Generation*> generations;
  std::vector<std::mutex*> engines;
  for (Session* session : sessions) {
    if (!session->s_->generation) fail("Session::step_all: a session without an active generation; begin() one first");
    generations.push_back(&*session->s_->generation);
    engines.push_back(&session->s_->model->engine);
  }
  // Each model's engine lock once, in address order (two schedulers never deadlock).
  std::sort(engines.begin(), engines.end());
  engines.erase(std::unique(engines.begin(), engines.end()), engines.end());
  std::vector<std::unique_lock<std::mutex>> locks;
  for (std::mutex* m : engines) locks.emplace_back(*m);
  try {
    core::Generation::step_all(generations);
  } catch (...) {
    for (Session* session : sessions) {
      session->s_->generation.reset();
      session->s_->forget();
    }
    throw;
  }
}

Result Session::end() {
  auto& s = *s_;
  if (!s.generation) fail("Session::end without an active generation");
  core::GenerationResult g;
  {
    std::lock_guard lock(s.model->engine);
    try {
      g = s.generation->finish();
    } catch (...) {
      s.generation.reset();
      s.forget();
      throw;
    }
    s.generation.reset();
    // The context holds a prefix of prompt + generated tokens (the last one may not have been fed).
    s.held.insert(s.held.end(), s.prompt.begin() + s.cached, s.prompt.end());
    s.held.insert(s.held.end(), g.tokens.begin(), g.tokens.end());
    s.held.resize(std::min(s.held.size(), static_cast<size_t>(s.ctx->position())));
  }
  Result r;
  r.text = std::move(g.text);
  r.reasoning = std::move(s.thoughts);
  r.tool_calls = std::move(s.calls);
  s.calls.clear();
  r.tokens = std::move(g.tokens);
  r.stop_reason = g.stop_reason;
  r.stop_token = g.stop_token;
  r.cached_tokens = s.cached;
  r.stats = std::move(g.stats);
  r.logprobs = std::move(g.logprobs);
  s.on_chunk = {};
  s.splitter.reset();
  return r;
}

Result Session::generate_chunks(std::span<const int32_t> prompt, const SamplingConfig& sampling,
                                const ChunkCallback& on_chunk) {
  begin(prompt, sampling, on_chunk);
  while (!finished()) step();
  return end();
}

Result Session::generate(std::span<const int32_t> prompt, const SamplingConfig& sampling,
                         const core::TokenCallback& on_token) {
  return generate_chunks(prompt, sampling, [&](const Chunk& c) {
    if (on_token) on_token(c.token, c.text);
  });
}

Result Session::generate_stream(std::span<const ChatMessage> messages, const SamplingConfig& sampling,
                                const TextCallback& on_text) {
  Model model(s_->model);  // a view on the same Impl, for render and tokenize
  const std::vector<int32_t> prompt = model.chat_prompt(messages);
  return generate_chunks(prompt, sampling, [&](const Chunk& c) {
    if (on_text && !c.text.empty()) on_text(c.text);
  });
}

Result Model::generate_stream(std::span<const ChatMessage> messages, const SamplingConfig& sampling,
                              const TextCallback& on_text) {
  return new_session()->generate_stream(messages, sampling, on_text);
}

Result Model::generate(std::span<const int32_t> prompt, const SamplingConfig& sampling,
                       const core::TokenCallback& on_token) {
  return new_session()->generate(prompt, sampling, on_token);
}

// ---- ThoughtSplitter ----

ThoughtSplitter::ThoughtSplitter(const ChatFormat& format)
    : answer_(format.answer_filter(false)), all_(format.answer_filter(true)) {}

std::string ThoughtSplitter::push(int32_t token) {
  const std::string a = answer_->push(token);
  std::string all = all_->push(token);
  return all == a ? std::string() : all;
}

std::string ThoughtSplitter::finish() {
  const std::string a = answer_->finish();
  std::string all = all_->finish();
  return all == a ? std::string() : all;
}

}  // namespace specula::api

// `specula chat`: a multi-turn conversation on stdin/stdout. Each turn re-renders the whole history with
// the model's chat format and reuses the KV cache for the prefix the context already holds.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include <fmt/format.h>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/core/generator.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"

namespace {

namespace cli = specula::cli;

int run_chat(const std::vector<std::string>& args) {
  cli::ModelArgs model;
  cli::SamplingArgs sampling;
  std::string system;
  bool show_thoughts = false, think = false, no_drafter = false;
  cli::po::options_description desc(
      "usage: specula chat PIPELINE.yaml [options]\n"
      "       specula chat --model PATH [--backend NAME] [options]\n\n"
      "A conversation: type a message and press Enter. /reset starts over, /exit (or end of input) quits.\n"
      "Reads stdin line by line, so it also works with piped input.\n\noptions");
  desc.add_options()("help,h", "show this help")("system", cli::po::value(&system),
                                                 "system message (overrides the pipeline's chat.system)")(
      "think", cli::po::bool_switch(&think), "enable the model's thinking (overrides chat.enable_thinking)")(
      "show-thoughts", cli::po::bool_switch(&show_thoughts), "also print the model's thought channel")(
      "no-drafter", cli::po::bool_switch(&no_drafter), "ignore the pipeline's drafter (plain decoding)");
  cli::add_model_options(desc, model);
  cli::add_sampling_options(desc, sampling);
  cli::add_log_options(desc);
  cli::po::positional_options_description pos;
  pos.add("pipeline", 1);
  cli::po::variables_map vm;
  if (!cli::parse_args(args, desc, pos, vm)) return 0;

  cli::Session s = cli::open_session(model, &sampling, !no_drafter);
  auto& target = s.built.target;
  const auto tokenizer = target->tokenizer();
  const auto chat = target->chat_format();
  if (!tokenizer || !chat) specula::fail("the model has no tokenizer or chat format; `specula chat` needs both");
  if (vm.count("system")) s.pipeline.chat.system = system;
  if (think) s.pipeline.chat.enable_thinking = true;

  specula::core::GenerationOptions options;
  options.max_tokens = s.pipeline.sampler.max_tokens;
  options.show_thoughts = show_thoughts || s.pipeline.chat.show_thoughts;
  if (s.pipeline.drafter) options.draft_tokens = s.pipeline.drafter->draft_tokens;
  specula::core::Generator generator(target, s.built.sampler, s.built.drafter);
  specula::ContextOptions context_options;
  context_options.context_length = s.pipeline.target.context_length;
  auto context = target->new_context(context_options);

  std::vector<specula::ChatMessage> history;
  std::vector<int32_t> held;  // the ids the context has processed, in order
  auto reset = [&] {
    history.clear();
    if (!s.pipeline.chat.system.empty()) history.push_back({"system", s.pipeline.chat.system});
    context->truncate(0);
    held.clear();
  };
  reset();

  const bool interactive = isatty(STDIN_FILENO);
  if (interactive) fmt::print(stderr, "specula chat: /reset starts over, /exit quits.\n");
  std::string line;
  while (true) {
    if (interactive) {
      fmt::print("> ");
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      reset();
      if (interactive) fmt::print(stderr, "(conversation reset)\n");
      continue;
    }
    if (line.empty()) continue;

    history.push_back({"user", line});
    const auto ids = tokenizer->encode(chat->render(history, true, s.pipeline.chat.enable_thinking), false, true);
    // Keep what the context already holds of this prompt; feed only the rest (at least one token).
    size_t common = 0;
    while (common < held.size() && common < ids.size() && held[common] == ids[common]) ++common;
    common = std::min(common, ids.size() - 1);
    context->truncate(static_cast<int64_t>(common));
    held.resize(common);
    const std::span<const int32_t> fresh(ids.data() + common, ids.size() - common);
    specula::core::GenerationResult result;
    try {
      result = generator.generate(*context, fresh, options, [&](int32_t, std::string_view text) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      });
    } catch (const specula::Error& e) {
      fmt::print(stderr, "\nspecula chat: {} (use /reset to start over)\n", e.what());
      history.pop_back();
      context->truncate(0);
      held.clear();
      continue;
    }
    fmt::print("\n");
    std::fflush(stdout);
    // The context holds a prefix of prompt + generated tokens (the last one may not have been fed).
    held.insert(held.end(), fresh.begin(), fresh.end());
    held.insert(held.end(), result.tokens.begin(), result.tokens.end());
    held.resize(std::min(held.size(), static_cast<size_t>(context->position())));
    // The raw reply, thought channel included: the chat format strips it from history as the template does.
    history.push_back({"assistant", tokenizer->decode(result.tokens, false)});
    const auto& st = result.stats;
    specula::log_info("{} prompt tokens ({} reused), {} generated, {:.1f} tok/s, stop: {}", ids.size(), common,
                      st.generated_tokens, st.decode_tokens_per_second(),
                      specula::core::stop_reason_name(result.stop_reason));
  }
  return 0;
}

}  // namespace

SPECULA_COMMAND("chat", "multi-turn chat on stdin/stdout (pipeline YAML or --model)", run_chat);

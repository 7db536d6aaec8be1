// `specula chat`: a multi-turn conversation on stdin/stdout. Each turn re-renders the whole history with
// the model's chat format and reuses the KV cache for the prefix the context already holds.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/core/generator.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"

namespace {

namespace cli = specula::cli;

const char* kHelp =
    "/help          this list\n"
    "/system TEXT   set the system message (the conversation is kept)\n"
    "/save FILE     write the conversation to FILE as JSON\n"
    "/reset         start over\n"
    "/exit, /quit   leave (so does end of input, or Ctrl+C at the prompt)\n"
    "Ctrl+C while a reply is generated stops the reply; a second Ctrl+C exits.\n";

int run_chat(const std::vector<std::string>& args) {
  cli::ModelArgs model;
  bool show_thoughts = false, think = false, no_drafter = false;
  cli::po::options_description desc(
      "usage: specula chat PIPELINE.yaml [options]\n"
      "       specula chat MODEL.gguf|MODEL_DIR [options]\n"
      "       specula chat -m PATH [-b NAME] [options]\n\n"
      "A conversation: type a message and press Enter; /help lists the commands. Reads stdin line by\n"
      "line, so it also works with piped input. When the context is full, the oldest turns are dropped\n"
      "(chat.context_full: error refuses instead).\n\noptions");
  desc.add_options()("help,h", "show this help")("system,s", cli::po::value<std::string>(),
                                                 "system message (overrides the pipeline's chat.system)")(
      "think", cli::po::bool_switch(&think), "enable the model's thinking (overrides chat.enable_thinking)")(
      "show-thoughts", cli::po::bool_switch(&show_thoughts), "also print the model's thought channel")(
      "no-drafter", cli::po::bool_switch(&no_drafter), "ignore the pipeline's drafter (plain decoding)");
  cli::add_model_options(desc, model);
  cli::add_sampling_options(desc, model);
  cli::add_log_options(desc);
  cli::po::positional_options_description pos;
  pos.add("pipeline", 1);
  cli::po::variables_map vm;
  if (!cli::parse_args(args, desc, pos, vm)) return 0;
  if (vm.count("system")) model.overrides.push_back({"chat.system", vm["system"].as<std::string>(), "command line (--system)"});

  cli::Session s = cli::open_session(model, !no_drafter);
  auto& target = s.built.target;
  const auto tokenizer = target->tokenizer();
  const auto chat = target->chat_format();
  if (!tokenizer || !chat) specula::fail("the model has no tokenizer or chat format; `specula chat` needs both");
  if (think) s.pipeline.chat.enable_thinking = true;

  specula::core::GenerationOptions options;
  options.max_tokens = s.pipeline.sampler.max_tokens;
  options.show_thoughts = show_thoughts || s.pipeline.chat.show_thoughts;
  options.stop_strings = s.pipeline.sampler.stop;
  options.interrupt = cli::interrupt_flag();
  specula::core::apply_drafting(s.pipeline, options);
  specula::core::Generator generator(target, s.built.sampler, s.built.drafter);
  specula::ContextOptions context_options;
  context_options.context_length = s.pipeline.target.context_length;
  auto context = target->new_context(context_options);
  const int64_t capacity = context->capacity();
  cli::install_interrupt_handler();

  std::string system = s.pipeline.chat.system;
  std::vector<specula::ChatMessage> turns;  // user and assistant messages, oldest first
  std::vector<int32_t> held;                // the ids the context has processed, in order
  auto conversation = [&] {
    std::vector<specula::ChatMessage> all;
    if (!system.empty()) all.push_back({"system", system});
    all.insert(all.end(), turns.begin(), turns.end());
    return all;
  };
  auto reset = [&] {
    turns.clear();
    context->truncate(0);
    held.clear();
  };

  const bool interactive = isatty(STDIN_FILENO);
  if (interactive) fmt::print(stderr, "specula chat: /help lists the commands, /exit quits.\n");
  std::string line;
  while (true) {
    if (interactive) {
      fmt::print("> ");
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line == "/exit" || line == "/quit") break;
    if (line == "/help") {
      fmt::print(stderr, "{}", kHelp);
      continue;
    }
    if (line == "/reset") {
      reset();
      fmt::print(stderr, "(conversation reset)\n");
      continue;
    }
    if (line == "/system" || line.rfind("/system ", 0) == 0) {
      system = line.size() > 8 ? line.substr(8) : std::string();
      fmt::print(stderr, "{}\n", system.empty() ? "(system message removed)" : "(system message set)");
      continue;
    }
    if (line == "/save" || line.rfind("/save ", 0) == 0) {
      const std::string file = line.size() > 6 ? line.substr(6) : std::string();
      nlohmann::json j = nlohmann::json::array();
      for (const auto& m : conversation()) j.push_back({{"role", m.role}, {"content", m.content}});
      std::ofstream out(file, std::ios::binary);
      if (file.empty() || !(out << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n")) {
        fmt::print(stderr, "specula chat: /save {}: cannot be written (give a file name)\n", file);
      } else {
        fmt::print(stderr, "(saved {} messages to {})\n", j.size(), file);
      }
      continue;
    }
    if (line.size() > 1 && line[0] == '/' && line.find(' ') == std::string::npos && line.find('/', 1) == std::string::npos) {
      fmt::print(stderr, "specula chat: unknown command {}; /help lists them\n", line);
      continue;
    }
    if (line.empty()) continue;

    turns.push_back({"user", line});
    auto render = [&] { return tokenizer->encode(chat->render(conversation(), true, s.pipeline.chat.enable_thinking), false, true); };
    std::vector<int32_t> ids = render();
    // Leave room for a whole reply: drop the oldest exchanges first (or refuse, with context_full: error).
    int dropped = 0;
    while (static_cast<int64_t>(ids.size()) + options.max_tokens > capacity && turns.size() > 1 &&
           s.pipeline.chat.drop_old_turns) {
      turns.erase(turns.begin(), turns.begin() + std::min<size_t>(2, turns.size() - 1));
      ++dropped;
      ids = render();
    }
    if (dropped) {
      fmt::print(stderr, "(context full: dropped the {} oldest exchange{} to make room)\n", dropped, dropped > 1 ? "s" : "");
    }
    if (static_cast<int64_t>(ids.size()) >= capacity ||
        (!s.pipeline.chat.drop_old_turns && static_cast<int64_t>(ids.size()) + options.max_tokens > capacity)) {
      fmt::print(stderr, "specula chat: the conversation needs {} tokens{} but the context holds {}; /reset starts over\n",
                 ids.size(), s.pipeline.chat.drop_old_turns ? "" : " plus room for a reply", capacity);
      turns.pop_back();
      continue;
    }
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
      turns.pop_back();
      context->truncate(0);
      held.clear();
      continue;
    }
    fmt::print("\n");
    std::fflush(stdout);
    if (result.stop_reason == specula::core::StopReason::Interrupted) {
      fmt::print(stderr, "(reply interrupted)\n");
      cli::clear_interrupt();
    }
    // The context holds a prefix of prompt + generated tokens (the last one may not have been fed).
    held.insert(held.end(), fresh.begin(), fresh.end());
    held.insert(held.end(), result.tokens.begin(), result.tokens.end());
    held.resize(std::min(held.size(), static_cast<size_t>(context->position())));
    // The raw reply, thought channel included: the chat format strips it from history as the template does.
    turns.push_back({"assistant", tokenizer->decode(result.tokens, false)});
    const auto& st = result.stats;
    specula::log_info("{} prompt tokens ({} reused), {} generated, {:.1f} tok/s, stop: {}", ids.size(), common,
                      st.generated_tokens, st.decode_tokens_per_second(),
                      specula::core::stop_reason_name(result.stop_reason));
  }
  return 0;
}

}  // namespace

SPECULA_COMMAND("chat", "multi-turn chat on stdin/stdout (pipeline YAML or --model)", run_chat);

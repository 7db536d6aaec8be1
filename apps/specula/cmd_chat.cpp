// `specula chat`: a multi-turn conversation on stdin/stdout, on the application API (specula/api.hpp). Each
// turn re-renders the whole history with the model's chat format; the session reuses the KV cache for the
// prefix its context already holds.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/api.hpp"
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
  cli::po::variables_map vm;
  if (!cli::parse_model_command(args, desc, model, vm)) return 0;

  specula::core::Pipeline pipeline = cli::resolve_pipeline(model);
  if (think) pipeline.chat.enable_thinking = true;
  std::string system = pipeline.chat.system;
  pipeline.chat.system.clear();  // the conversation below holds it (and /system changes it)
  const int max_tokens = pipeline.sampler.max_tokens;
  const bool drop_old_turns = pipeline.chat.drop_old_turns;
  specula::api::OpenOptions open;
  open.plugin_paths.assign(model.plugin_paths.begin(), model.plugin_paths.end());
  open.load_drafter = !no_drafter;
  const auto llm = specula::api::Model::from_pipeline(std::move(pipeline), open);
  if (!llm->built().target->tokenizer() || !llm->built().target->chat_format())
    specula::fail("the model has no tokenizer or chat format; `specula chat` needs both");
  specula::api::SamplingConfig sampling = llm->default_sampling();
  sampling.show_thoughts = sampling.show_thoughts || show_thoughts;
  // One session: each turn's prompt is the whole conversation, and the session reuses the prefix its
  // context already holds (the earlier turns), so only the new message is processed.
  const auto session = llm->new_session();
  const int64_t capacity = session->capacity();
  cli::install_interrupt_handler();

  std::vector<specula::ChatMessage> turns;  // user and assistant messages, oldest first
  auto conversation = [&] {
    std::vector<specula::ChatMessage> all;
    if (!system.empty()) all.push_back({"system", system});
    all.insert(all.end(), turns.begin(), turns.end());
    return all;
  };
  auto reset = [&] {
    turns.clear();
    session->reset();
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
    auto prompt_tokens = [&] { return static_cast<int64_t>(llm->chat_prompt(conversation()).size()); };
    int64_t needed = prompt_tokens();
    // Leave room for a whole reply: drop the oldest exchanges first (or refuse, with context_full: error).
    int dropped = 0;
    while (needed + max_tokens > capacity && turns.size() > 1 && drop_old_turns) {
      turns.erase(turns.begin(), turns.begin() + std::min<size_t>(2, turns.size() - 1));
      ++dropped;
      needed = prompt_tokens();
    }
    if (dropped) {
      fmt::print(stderr, "(context full: dropped the {} oldest exchange{} to make room)\n", dropped, dropped > 1 ? "s" : "");
    }
    if (needed >= capacity || (!drop_old_turns && needed + max_tokens > capacity)) {
      fmt::print(stderr, "specula chat: the conversation needs {} tokens{} but the context holds {}; /reset starts over\n",
                 needed, drop_old_turns ? "" : " plus room for a reply", capacity);
      turns.pop_back();
      continue;
    }
    // Ctrl+C ends the reply after its current step (the handler only sets a flag).
    std::atomic<bool> generating{true};
    std::thread watcher([&] {
      while (generating.load()) {
        if (cli::interrupt_flag()->load()) session->cancel();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    specula::api::Result result;
    std::string error;
    try {
      result = session->generate_stream(conversation(), sampling, [](std::string_view text) {
        std::fwrite(text.data(), 1, text.size(), stdout);
        std::fflush(stdout);
      });
    } catch (const specula::Error& e) {
      error = e.what();
    }
    generating = false;
    watcher.join();
    if (!error.empty()) {
      fmt::print(stderr, "\nspecula chat: {} (use /reset to start over)\n", error);
      turns.pop_back();
      session->reset();
      continue;
    }
    fmt::print("\n");
    // Tool calls the model wrote (parsed, not part of the text): shown; `specula chat` declares no tools
    // and runs none, so the conversation goes on with the user.
    for (const auto& call : result.tool_calls) fmt::print("[tool call] {} {}\n", call.name, call.arguments);
    std::fflush(stdout);
    if (result.stop_reason == specula::core::StopReason::Interrupted) {
      fmt::print(stderr, "(reply interrupted)\n");
      cli::clear_interrupt();
    }
    // The raw reply, thought channel included: the chat format strips it from history as the template does.
    turns.push_back({"assistant", llm->detokenize(result.tokens, false)});
    const auto& st = result.stats;
    specula::log_info("{} prompt tokens ({} reused), {} generated, {:.1f} tok/s, stop: {}", needed, result.cached_tokens,
                      st.generated_tokens, st.decode_tokens_per_second(),
                      specula::core::stop_reason_name(result.stop_reason));
  }
  return 0;
}

}  // namespace

SPECULA_COMMAND("chat", "multi-turn chat on stdin/stdout (pipeline YAML or --model)", run_chat);

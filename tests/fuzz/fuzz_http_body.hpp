// What one fuzz input exercises of `specula serve`'s request path: a request body read by the server's own
// code (apps/serve/src/request.cpp: the JSON parsed with its depth bounded, every field checked) and, when
// accepted, its prompt rendered in Gemma 4's chat format and tokenized with the base tokenizer (the cut
// Gemma 4 vocabulary of fuzz_text_bodies.hpp), message contents as text. A bad body must end in the
// server's HttpError; another exception, a crash or UB is a bug, and a broken invariant traps (a prompt
// id outside the vocabulary, a prompt or limits the context cannot hold, a control token that a
// message's content spelled).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "chat_format.hpp"  // plugins/gemma4
#include "fuzz_text_bodies.hpp"
#include "request.hpp"      // apps/serve/src

namespace specula::fuzz {

inline const gemma4::Gemma4ChatFormat& base_chat_format() {
  static const gemma4::Gemma4ChatFormat format(std::shared_ptr<const Tokenizer>(&base_tokenizer(), [](const Tokenizer*) {}));
  return format;
}

// What the server knows of the model it serves, for the base tokenizer and chat format, with the same
// calls api::Model::chat_prompt makes.
inline const serve::ServedModel& fuzz_served_model() {
  static const serve::ServedModel model = [] {
    serve::ServedModel m;
    const Tokenizer& tok = base_tokenizer();
    m.name = "fuzz-model";
    m.vocab_size = tok.vocab_size();
    m.context_length = 4096;
    m.bos = tok.bos();
    m.defaults.max_tokens = 64;
    m.has_drafter = true;
    m.chat_prompt = [&tok](std::span<const ChatMessage> messages, std::optional<bool> thinking, std::string_view tools) {
      const RenderedChat r = base_chat_format().render_chat_tools(messages, tools, true, thinking.value_or(false));
      return tok.encode_prompt(r.text, r.content);
    };
    m.tokenize = [&tok](std::string_view text) { return tok.encode(text, false, true); };
    return m;
  }();
  return model;
}

// The turn tokens a chat prompt holds; only the template may write them.
inline size_t turn_tokens(const std::vector<int32_t>& ids) {
  static const int32_t open = *base_tokenizer().token_id("<|turn>");
  return static_cast<size_t>(std::count(ids.begin(), ids.end(), open));
}

// Input: ENDPOINT NUL BODY, ENDPOINT one of chat, completions, tokenize, detokenize (anything else: chat).
inline bool http_request_one(const uint8_t* data, size_t size) {
  quiet_logs();
  const auto parts = split_parts(data, size, 2);
  const std::string_view endpoint = parts[0];
  const serve::ServedModel& model = fuzz_served_model();
  try {
    const nlohmann::json body = serve::parse_json_body(parts[1]);
    if (endpoint == "tokenize") {
      for (int32_t id : serve::read_tokenize(body, model).tokens)
        if (id < 0 || id >= model.vocab_size) __builtin_trap();
      return true;
    }
    if (endpoint == "detokenize") {
      for (int32_t id : serve::read_detokenize(body, model))
        if (id < 0 || id >= model.vocab_size) __builtin_trap();
      return true;
    }
    const bool chat = endpoint != "completions";
    const serve::CompletionRequest r = serve::read_completion(body, chat, model, 42);
    const auto& s = r.sampling;
    const auto n = static_cast<int64_t>(r.prompt.size());
    if (n == 0 || s.max_tokens < 1 || n + s.max_tokens > model.context_length || s.min_tokens > s.max_tokens)
      __builtin_trap();
    for (int32_t id : r.prompt)
      if (id < 0 || id >= model.vocab_size) __builtin_trap();
    if (!(s.temperature >= 0 && s.temperature <= 2 && s.top_p > 0 && s.top_p <= 1)) __builtin_trap();
    if (chat) {
      // The same conversation with every content emptied has as many turns: no content became one.
      std::optional<bool> thinking;
      if (auto k = body.find("chat_template_kwargs"); k != body.end() && k->is_object() && k->contains("enable_thinking") &&
                                                       (*k)["enable_thinking"].is_boolean())
        thinking = (*k)["enable_thinking"].get<bool>();
      std::vector<ChatMessage> skeleton;
      for (const auto& m : body["messages"]) {
        ChatMessage s{m["role"] == "developer" ? "system" : m["role"].get<std::string>(), ""};
        if (m.contains("tool_calls") && !m["tool_calls"].is_null()) s.tool_calls = m["tool_calls"].dump();
        skeleton.push_back(std::move(s));
      }
      if (turn_tokens(r.prompt) != turn_tokens(model.chat_prompt(skeleton, thinking, r.tools))) __builtin_trap();
    }
    return true;
  } catch (const serve::HttpError&) {
    return false;
  }
}

}  // namespace specula::fuzz

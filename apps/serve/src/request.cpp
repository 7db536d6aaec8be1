#include "request.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "specula/core/grammar.hpp"
#include "specula/core/json_schema_grammar.hpp"
#include "specula/error.hpp"
#include "specula/metadata.hpp"

namespace specula::serve {

using json = nlohmann::json;

void bad_request(std::string message, std::string param, std::string code) {
  throw HttpError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

std::string error_body(const HttpError& e) {
  const json err = {{"message", e.message},
                    {"type", e.type},
                    {"param", e.param.empty() ? json() : json(e.param)},
                    {"code", e.code.empty() ? json() : json(e.code)}};
  return json{{"error", err}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

// A value as an error message quotes it: never more than a short prefix of what the client sent.
std::string quote(const json& v) { return json_text(v, 40); }

// Where the parser is, for naming the field of an error found while parsing ("messages[2].content").
// nlohmann's parser callback reports each container's start and end, each key and each scalar; the
// callback throws to stop the parse at kMaxJsonDepth.
class ParsePosition {
 public:
  struct TooDeep {};

  bool on_event(int depth, json::parse_event_t event, const json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxJsonDepth) throw TooDeep{};
        frames_.push_back({event == json::parse_event_t::array_start, 0, {}});
        break;
      case json::parse_event_t::key: frames_.back().key = parsed.get<std::string>(); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        frames_.pop_back();
        completed_element();
        break;
      case json::parse_event_t::value: completed_element(); break;
    }
    return true;
  }

  // The path of the value being read, its first `levels` levels ("messages[2].content").
  std::string path(size_t levels = 6) const {
    std::string out;
    for (size_t i = 0; i < frames_.size() && i < levels; ++i) {
      const Frame& f = frames_[i];
      if (f.array) out += fmt::format("[{}]", f.elements);
      else if (!f.key.empty()) out += (out.empty() ? "" : ".") + f.key.substr(0, 40);
    }
    return out;
  }

 private:
  struct Frame {
    bool array = false;
    size_t elements = 0;  // completed elements of an array: the one being read is at this index
    std::string key;      // the key being read in an object
  };
  void completed_element() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().elements;
  }
  std::vector<Frame> frames_;
};

// nlohmann's parse error text without its exception id and its "last read: '...'", which quotes the input.
std::string parse_error_reason(const json::exception& e) {
  std::string what = e.what();
  if (const size_t at = what.find("; last read"); at != std::string::npos) what.resize(at);
  if (const size_t id = what.find("] "); id != std::string::npos) what.erase(0, id + 2);
  return what.substr(0, 160);
}

// ---- typed readers: a missing or null field keeps the default ----

bool present(const json& b, const char* key) {
  auto it = b.find(key);
  return it != b.end() && !it->is_null();
}

void only_keys(const json& object, const std::set<std::string>& allowed, const std::string& where = {}) {
  for (const auto& [key, value] : object.items()) {
    if (allowed.count(key)) continue;
    const std::string name = where.empty() ? key : where + "." + key;
    bad_request(fmt::format("unknown field '{}'", name.substr(0, 80)), name.substr(0, 80));
  }
}

void read_bool(const json& b, const char* key, bool& out) {
  if (!present(b, key)) return;
  const json& v = b[key];
  if (!v.is_boolean()) bad_request(fmt::format("'{}' must be a boolean, got {}", key, quote(v)), key);
  out = v.get<bool>();
}

double read_number(const json& v, const std::string& name, double lo, double hi) {
  if (!v.is_number()) bad_request(fmt::format("'{}' must be a number, got {}", name, quote(v)), name);
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi)
    bad_request(fmt::format("'{}' must be between {} and {}, got {}", name, lo, hi, quote(v)), name);
  return d;
}

int64_t read_int(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad_request(fmt::format("'{}' must be an integer, got {}", name, quote(v)), name);
  const bool huge = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max());
  const int64_t i = huge ? std::numeric_limits<int64_t>::max() : v.get<int64_t>();
  if (huge || i < lo || i > hi)
    bad_request(fmt::format("'{}' must be an integer between {} and {}, got {}", name, lo, hi, quote(v)), name);
  return i;
}

std::string read_string(const json& v, const std::string& name) {
  if (!v.is_string()) bad_request(fmt::format("'{}' must be a string, got {}", name, quote(v)), name);
  return v.get<std::string>();
}

const json& read_object(const json& v, const std::string& name) {
  if (!v.is_object()) bad_request(fmt::format("'{}' must be an object, got {}", name, quote(v)), name);
  return v;
}

void check_model_name(const json& b, const ServedModel& model) {
  if (!present(b, "model")) return;
  const std::string name = read_string(b["model"], "model");
  if (name != model.name)
    throw HttpError{404, fmt::format("the model {} does not exist; this server serves '{}' (GET /v1/models)", quote(name),
                                     model.name),
                    "invalid_request_error", "model", "model_not_found"};
}

// The fields both completion endpoints share (OpenAI's names; top_k, min_p, min_tokens, repetition_penalty
// as vLLM and llama-server add them).
const std::set<std::string> kCommonKeys = {
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
    "user", "frequency_penalty", "presence_penalty", "logit_bias", "repetition_penalty", "min_tokens", "logprobs",
    "stop_token_ids", "ignore_eos", "speculative.n_max", "speculative.mode",
    "grammar", "json_schema", "guided_json", "guided_regex", "guided_grammar"};

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// Returns whether max_tokens was given.
bool read_sampling(const json& b, CompletionRequest& r, uint64_t unseeded) {
  auto& s = r.sampling;
  if (present(b, "temperature")) s.temperature = static_cast<float>(read_number(b["temperature"], "temperature", 0, 2));
  if (present(b, "top_p")) {
    s.top_p = static_cast<float>(read_number(b["top_p"], "top_p", 0, 1));
    if (s.top_p <= 0) bad_request("'top_p' must be above 0 (1 = off)", "top_p");
  }
  if (present(b, "top_k")) {
    const int64_t k = read_int(b["top_k"], "top_k", -1, kMaxInt32);
    s.top_k = k < 0 ? 0 : static_cast<int32_t>(k);  // -1: off, as vLLM
  }
  if (present(b, "min_p")) s.min_p = static_cast<float>(read_number(b["min_p"], "min_p", 0, 1));
  if (present(b, "repetition_penalty"))
    s.repetition_penalty = static_cast<float>(read_number(b["repetition_penalty"], "repetition_penalty", 0.01, 100));
  // A request without a seed draws its own: the pipeline's seed would make every such request alike.
  s.seed = unseeded;
  if (present(b, "seed")) {
    const json& v = b["seed"];
    s.seed = v.is_number_unsigned() ? v.get<uint64_t>()
                                    : static_cast<uint64_t>(read_int(v, "seed", std::numeric_limits<int64_t>::min(),
                                                                     std::numeric_limits<int64_t>::max()));
  }
  bool max_given = false;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (!present(b, key)) continue;
    s.max_tokens = static_cast<int>(read_int(b[key], key, 1, kMaxInt32));
    max_given = true;
  }
  if (present(b, "min_tokens")) s.min_tokens = static_cast<int32_t>(read_int(b["min_tokens"], "min_tokens", 0, kMaxInt32));
  if (present(b, "stop")) {
    const json& v = b["stop"];
    s.stop.clear();
    if (v.is_string()) {
      s.stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      if (v.size() > 4) bad_request(fmt::format("'stop' holds at most 4 strings, got {}", v.size()), "stop");
      for (const auto& item : v) s.stop.push_back(read_string(item, "stop"));
    } else {
      bad_request(fmt::format("'stop' must be a string or a list of strings, got {}", quote(v)), "stop");
    }
    for (const auto& stop : s.stop) {
      if (stop.empty()) bad_request("'stop' strings must not be empty", "stop");
      if (stop.size() > kMaxStopBytes)
        bad_request(fmt::format("'stop' strings hold at most {} bytes, got one of {}", kMaxStopBytes, stop.size()), "stop");
    }
  }
  if (present(b, "n")) r.n = static_cast<int>(read_int(b["n"], "n", 1, kMaxChoices));
  if (present(b, "presence_penalty"))
    s.presence_penalty = static_cast<float>(read_number(b["presence_penalty"], "presence_penalty", -2, 2));
  if (present(b, "frequency_penalty"))
    s.frequency_penalty = static_cast<float>(read_number(b["frequency_penalty"], "frequency_penalty", -2, 2));
  if (present(b, "logit_bias")) {
    // OpenAI's form: {"token id": bias}; ids are checked against the vocabulary in read_completion.
    const json& o = read_object(b["logit_bias"], "logit_bias");
    if (o.size() > 1024) bad_request(fmt::format("'logit_bias' holds at most 1024 ids, got {}", o.size()), "logit_bias");
    s.logit_bias.clear();
    for (const auto& [key, bias] : o.items()) {
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc{} || end != key.data() + key.size() || id < 0 || id > kMaxInt32)
        bad_request(fmt::format("'logit_bias' keys must be token ids (decimal integers >= 0), got {}", quote(json(key))),
                    "logit_bias");
      const double v = bias.is_number() ? bias.get<double>() : NAN;
      if (!(v >= -100 && v <= 100))
        bad_request(fmt::format("'logit_bias' of token {} must be a number between -100 and 100, got {}", key, quote(bias)),
                    "logit_bias");
      s.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(v));
    }
  }
  // logprobs: chat {"logprobs": true, "top_logprobs": 0..20}; completions {"logprobs": 0..20} (OpenAI
  // allows 5; vLLM 20). Off: false / null / absent.
  if (present(b, "logprobs")) {
    const json& v = b["logprobs"];
    if (r.chat) {
      if (!v.is_boolean()) bad_request(fmt::format("'logprobs' must be a boolean, got {}", quote(v)), "logprobs");
      if (v.get<bool>()) s.logprobs = 0;
    } else {
      s.logprobs = static_cast<int>(read_int(v, "logprobs", 0, 20));
    }
  }
  if (r.chat && present(b, "top_logprobs")) {
    const int n = static_cast<int>(read_int(b["top_logprobs"], "top_logprobs", 0, 20));
    if (s.logprobs < 0) bad_request("'top_logprobs' needs \"logprobs\": true", "top_logprobs");
    s.logprobs = n;
  }
  if (present(b, "user")) read_string(b["user"], "user");
  // vLLM's stop_token_ids and ignore_eos.
  if (present(b, "stop_token_ids")) {
    const json& v = b["stop_token_ids"];
    if (!v.is_array()) bad_request(fmt::format("'stop_token_ids' must be a list of token ids, got {}", quote(v)), "stop_token_ids");
    if (v.size() > 64) bad_request(fmt::format("'stop_token_ids' holds at most 64 ids, got {}", v.size()), "stop_token_ids");
    s.stop_token_ids.clear();
    for (const auto& id : v) s.stop_token_ids.push_back(static_cast<int32_t>(read_int(id, "stop_token_ids", 0, kMaxInt32)));
  }
  read_bool(b, "ignore_eos", s.ignore_eos);
  // Per-request speculative decoding, under llama-server's flat key speculative.n_max (the draft length;
  // 0 = off) and Specula's speculative.mode ("off", "fixed", "auto").
  std::optional<std::string> mode;
  if (present(b, "speculative.mode")) {
    mode = read_string(b["speculative.mode"], "speculative.mode");
    if (*mode != "off" && *mode != "fixed" && *mode != "auto")
      bad_request(fmt::format("'speculative.mode' must be \"off\", \"fixed\" or \"auto\", got {}", quote(b["speculative.mode"])),
                  "speculative.mode");
  }
  std::optional<int> n_max;
  if (present(b, "speculative.n_max")) n_max = static_cast<int>(read_int(b["speculative.n_max"], "speculative.n_max", 0, 16));
  r.asks_drafting = (mode && *mode != "off") || (n_max && *n_max > 0);
  if (mode == "off" || n_max == 0) {
    if (mode && *mode != "off") bad_request("'speculative.n_max' 0 turns drafting off; it needs no mode but \"off\"", "speculative.n_max");
    s.draft_tokens = 0;
    s.draft_auto = false;
  } else if (mode || n_max) {
    if (mode == "auto") {
      s.draft_auto = true;
      if (n_max) s.draft_max = *n_max;
    } else {
      if (mode) s.draft_auto = false;
      if (n_max) {
        s.draft_tokens = *n_max;
        if (!mode) s.draft_auto = false;
      }
    }
  }
  read_bool(b, "stream", r.stream);
  if (present(b, "stream_options")) {
    const json& o = read_object(b["stream_options"], "stream_options");
    if (!r.stream) bad_request("'stream_options' is only allowed with \"stream\": true", "stream_options");
    only_keys(o, {"include_usage"}, "stream_options");
    read_bool(o, "include_usage", r.include_usage);
  }
  return max_given;
}

bool valid_function_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.'))
      return false;
  return true;
}

std::string function_name(const json& v, const std::string& where) {
  const std::string name = read_string(v, where);
  if (!valid_function_name(name))
    bad_request(fmt::format("'{}' must be 1 to 64 of a-z, A-Z, 0-9, '_', '-', '.', got {}", where, quote(v)), where);
  return name;
}

// An assistant message's tool_calls, checked, as the JSON text ChatMessage::tool_calls holds.
std::string read_tool_calls(const json& v, const std::string& where) {
  if (!v.is_array() || v.empty()) bad_request(fmt::format("'{}' must be a non-empty list of tool calls", where), where);
  if (v.size() > kMaxTools) bad_request(fmt::format("'{}' holds at most {} calls", where, kMaxTools), where);
  json out = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", where, i);
    const json& c = read_object(v[i], at);
    only_keys(c, {"id", "type", "function", "index"}, at);
    if (present(c, "type") && read_string(c["type"], at + ".type") != "function")
      bad_request(fmt::format("'{}.type' must be \"function\"", at), at + ".type");
    if (!present(c, "function")) bad_request(fmt::format("'{}.function' is required", at), at + ".function");
    const json& f = read_object(c["function"], at + ".function");
    only_keys(f, {"name", "arguments"}, at + ".function");
    if (!present(f, "name")) bad_request(fmt::format("'{}.function.name' is required", at), at + ".function.name");
    json call = {{"type", "function"}, {"function", {{"name", function_name(f["name"], at + ".function.name")}}}};
    if (present(c, "id")) call["id"] = read_string(c["id"], at + ".id");
    if (present(f, "arguments")) {
      const json& a = f["arguments"];
      if (!a.is_string() && !a.is_object())
        bad_request(fmt::format("'{}.function.arguments' must be a JSON string, got {}", at, quote(a)), at + ".function.arguments");
      call["function"]["arguments"] = a;
    }
    out.push_back(std::move(call));
  }
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The request's tools, checked, as a JSON array of {"type": "function", "function": {...}}.
std::string read_tools(const json& v) {
  if (!v.is_array()) bad_request(fmt::format("'tools' must be a list of tools, got {}", quote(v)), "tools");
  if (v.size() > kMaxTools) bad_request(fmt::format("'tools' holds at most {} tools, got {}", kMaxTools, v.size()), "tools");
  if (v.empty()) return {};
  json out = json::array();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = fmt::format("tools[{}]", i);
    const json& t = read_object(v[i], at);
    only_keys(t, {"type", "function"}, at);
    if (!present(t, "type") || read_string(t["type"], at + ".type") != "function")
      bad_request(fmt::format("'{}.type' must be \"function\"", at), at + ".type");
    if (!present(t, "function")) bad_request(fmt::format("'{}.function' is required", at), at + ".function");
    const json& f = read_object(t["function"], at + ".function");
    only_keys(f, {"name", "description", "parameters", "strict"}, at + ".function");
    if (!present(f, "name")) bad_request(fmt::format("'{}.function.name' is required", at), at + ".function.name");
    json fn = {{"name", function_name(f["name"], at + ".function.name")}};
    if (present(f, "description")) fn["description"] = read_string(f["description"], at + ".function.description");
    if (present(f, "parameters")) fn["parameters"] = read_object(f["parameters"], at + ".function.parameters");
    if (present(f, "strict")) {  // enforced when tool_choice forces a call (docs/serving.md "Tool calls")
      bool strict = false;
      read_bool(f, "strict", strict);
    }
    out.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return out.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string message_content(const json& m, const std::string& where) {
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array())
    bad_request(fmt::format("'{}' must be a string or a list of text parts, got {}", where, quote(*it)), where);
  std::string text;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& part = (*it)[i];
    const std::string at = fmt::format("{}[{}]", where, i);
    const bool text_part = part.is_object() && part.size() == 2 && part.contains("type") && part["type"] == "text" &&
                           part.contains("text") && part["text"].is_string();
    if (!text_part) bad_request(fmt::format("'{}': only parts {{\"type\": \"text\", \"text\": STRING}} are supported", at), at);
    text += part["text"].get_ref<const std::string&>();
  }
  return text;
}

std::vector<ChatMessage> read_messages(const json& b) {
  if (!b.contains("messages")) bad_request("'messages' is required", "messages");
  const json& ms = b["messages"];
  if (!ms.is_array() || ms.empty())
    bad_request(fmt::format("'messages' must be a non-empty list of {{\"role\", \"content\"}}, got {}", quote(ms)), "messages");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < ms.size(); ++i) {
    const json& m = ms[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object() || !m.contains("role")) bad_request(fmt::format("'{}' must be an object with a role", where), where);
    std::string role = read_string(m["role"], where + ".role");
    if (role == "developer") role = "system";  // OpenAI's newer name for it
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      bad_request(fmt::format("'{}.role' must be system, developer, user, assistant or tool, got {}", where, quote(role)),
                  where + ".role");
    if (role == "assistant") only_keys(m, {"role", "content", "name", "tool_calls", "reasoning_content"}, where);
    else if (role == "tool") only_keys(m, {"role", "content", "name", "tool_call_id"}, where);
    else only_keys(m, {"role", "content", "name"}, where);
    ChatMessage msg{role, message_content(m, where + ".content")};
    if (present(m, "name")) msg.name = read_string(m["name"], where + ".name");
    if (role == "assistant" && present(m, "reasoning_content")) read_string(m["reasoning_content"], where + ".reasoning_content");
    if (role == "assistant" && present(m, "tool_calls")) msg.tool_calls = read_tool_calls(m["tool_calls"], where + ".tool_calls");
    if (role == "tool") {
      if (!present(m, "tool_call_id")) bad_request(fmt::format("'{}.tool_call_id' is required", where), where + ".tool_call_id");
      msg.tool_call_id = read_string(m["tool_call_id"], where + ".tool_call_id");
      if (i == 0 || (out.back().role != "tool" && out.back().tool_calls.empty()))
        bad_request(fmt::format("'{}': a tool message must follow an assistant message with tool_calls (or another tool "
                                "message)", where), where);
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::vector<int32_t> token_ids(const json& v, const std::string& name, int64_t vocab) {
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const auto& id : v) {
    const int64_t i = read_int(id, name, 0, vocab - 1);
    ids.push_back(static_cast<int32_t>(i));
  }
  return ids;
}

std::vector<int32_t> chat_prompt(const ServedModel& model, const std::vector<ChatMessage>& messages,
                                 std::optional<bool> thinking, std::string_view tools = {}) {
  if (!model.chat_prompt) bad_request("the model has no chat format; use /v1/completions with a prompt", "messages");
  try {
    return model.chat_prompt(messages, thinking, tools);
  } catch (const std::exception& e) {  // the chat format's own errors (a plugin's Error type)
    bad_request(e.what(), "messages");
  }
}

}  // namespace

json parse_json_body(std::string_view body) {
  if (body.empty()) bad_request("the request body is empty; send a JSON object");
  ParsePosition position;
  json j;
  try {
    j = json::parse(body.begin(), body.end(),
                    [&](int depth, json::parse_event_t event, json& parsed) { return position.on_event(depth, event, parsed); });
  } catch (const ParsePosition::TooDeep&) {
    const std::string field = position.path(1);
    bad_request(fmt::format("the request body nests deeper than {} levels (at '{}')", kMaxJsonDepth, position.path()), field);
  } catch (const json::out_of_range&) {  // a number beyond the double range (1e400)
    const std::string at = position.path();
    bad_request(fmt::format("'{}' is out of range: a number beyond the range of a double (about 1.8e308)", at), at);
  } catch (const json::exception& e) {
    bad_request(fmt::format("the request body is not valid JSON: {}", parse_error_reason(e)));
  }
  if (!j.is_object()) bad_request(fmt::format("the request body must be a JSON object, got {}", quote(j)));
  return j;
}

// The request body read again with its objects' keys in the order the client wrote them (nlohmann::json
// sorts keys, and a schema's property order is the order the answer writes them), parsed on first use.
class OrderedBody {
 public:
  explicit OrderedBody(std::string_view raw) : raw_(raw) {}
  // The value at `pointer` (e.g. "/response_format/json_schema/schema") as text, or `read`'s text.
  std::string text(const std::string& pointer, const json& read) {
    if (!doc_ && !raw_.empty()) doc_ = nlohmann::ordered_json::parse(raw_, nullptr, false);
    if (!doc_ || doc_->is_discarded()) return read.dump();
    const nlohmann::ordered_json::json_pointer at(pointer);
    return doc_->contains(at) ? doc_->at(at).dump() : read.dump();
  }

 private:
  std::string_view raw_;
  std::optional<nlohmann::ordered_json> doc_;
};

// One output constraint per request: compiled here, so that a bad schema, pattern or grammar is a 400
// naming the field (the compiled grammar is kept: generation finds it parsed).
void set_format(CompletionRequest& r, const std::string& kind, const std::string& spec, const std::string& field) {
  if (!r.sampling.response_format.empty())
    bad_request(fmt::format("'{}' and '{}' both constrain the output; give one", r.format_field, field), field);
  r.sampling.response_format = kind;
  r.sampling.format_spec = spec;
  r.format_field = field;
  if (kind == "json_object") return;
  try {
    shared_gbnf(kind == "json_schema" ? json_schema_to_gbnf(spec) : kind == "regex" ? regex_to_gbnf(spec) : spec);
  } catch (const Error& e) {
    bad_request(fmt::format("'{}': {}", field, e.what()), field);
  }
}

// llama-server's `grammar` and `json_schema`, vLLM's `guided_json`, `guided_regex` and `guided_grammar`.
void read_guided(const json& b, CompletionRequest& r, OrderedBody& ordered) {
  for (const char* field : {"json_schema", "guided_json"}) {
    if (!present(b, field)) continue;
    const json& v = b[field];
    if (v.is_string()) {  // vLLM takes the schema as text too
      const auto parsed = nlohmann::ordered_json::parse(v.get_ref<const std::string&>(), nullptr, false);
      if (parsed.is_discarded()) bad_request(fmt::format("'{}' is a string that is not JSON", field), field);
      set_format(r, "json_schema", parsed.dump(), field);
    } else {
      read_object(v, field);
      set_format(r, "json_schema", ordered.text(std::string("/") + field, v), field);
    }
  }
  if (present(b, "guided_regex")) set_format(r, "regex", read_string(b["guided_regex"], "guided_regex"), "guided_regex");
  for (const char* field : {"grammar", "guided_grammar"})
    if (present(b, field)) set_format(r, "grammar", read_string(b[field], field), field);
}

// Tool i's parameters schema as text ("" when it has none); `tools` holds every tool of the body, in order.
std::string parameters(const json& tools, size_t i, OrderedBody& ordered) {
  const json& f = tools[i]["function"];
  return f.contains("parameters") ? ordered.text(fmt::format("/tools/{}/function/parameters", i), f["parameters"]) : "";
}

// tool_choice "required" or {"type": "function", "function": {"name"}}: the answer is a tool call (one of
// the tools; with parallel_tool_calls, one or more), its arguments valid against the tool's parameters.
void force_tool_call(CompletionRequest& r, const json& choice, OrderedBody& ordered) {
  const json tools = r.tools.empty() ? json::array() : json::parse(r.tools);
  if (tools.empty()) bad_request("tool_choice forces a tool call but 'tools' declares none", "tool_choice");
  std::vector<ToolGrammarFunction> functions;
  std::string kind = "tool_choice required";
  if (choice.is_object()) {
    only_keys(choice, {"type", "function"}, "tool_choice");
    const json* name = choice.contains("function") && choice["function"].is_object() && choice["function"].contains("name")
                           ? &choice["function"]["name"] : nullptr;
    if (!present(choice, "type") || choice["type"] != "function" || !name || !name->is_string())
      bad_request(fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", "
                              "\"function\": {{\"name\"}}}}, got {}", quote(choice)), "tool_choice");
    kind = "tool_choice " + name->get<std::string>();
    for (size_t i = 0; i < tools.size(); ++i)
      if (tools[i]["function"]["name"] == *name) functions.push_back({*name, parameters(tools, i, ordered)});
    if (functions.empty())
      bad_request(fmt::format("tool_choice names the function '{}', which 'tools' does not declare", name->get<std::string>()),
                  "tool_choice");
  } else {
    for (size_t i = 0; i < tools.size(); ++i) functions.push_back({tools[i]["function"]["name"], parameters(tools, i, ordered)});
  }
  std::string gbnf;
  try {
    gbnf = tool_call_gbnf(functions, choice.is_string() && r.parallel_tool_calls);
  } catch (const Error& e) {
    bad_request(fmt::format("'tools': {}", e.what()), "tools");
  }
  set_format(r, kind, gbnf, "tool_choice");
}

CompletionRequest read_completion(const json& b, bool chat, const ServedModel& model, uint64_t unseeded,
                                  std::string_view raw_body) {
  OrderedBody ordered(raw_body);
  std::set<std::string> keys = kCommonKeys;
  if (chat)
    keys.insert({"messages", "max_completion_tokens", "top_logprobs", "include_reasoning", "chat_template_kwargs",
                 "response_format", "tools", "tool_choice", "parallel_tool_calls"});
  else keys.insert({"prompt", "echo", "suffix", "best_of"});
  only_keys(b, keys);
  check_model_name(b, model);
  CompletionRequest r;
  r.chat = chat;
  r.sampling = model.defaults;
  const bool max_given = read_sampling(b, r, unseeded);
  read_guided(b, r, ordered);
  const char* prompt_field = chat ? "messages" : "prompt";
  if (chat) {
    const auto messages = read_messages(b);
    std::optional<bool> thinking;
    if (present(b, "chat_template_kwargs")) {
      const json& k = read_object(b["chat_template_kwargs"], "chat_template_kwargs");
      only_keys(k, {"enable_thinking"}, "chat_template_kwargs");
      if (present(k, "enable_thinking")) {
        bool t = false;
        read_bool(k, "enable_thinking", t);
        thinking = t;
      }
    }
    read_bool(b, "include_reasoning", r.sampling.reasoning);
    if (present(b, "response_format")) {
      const json& f = read_object(b["response_format"], "response_format");
      const json type = f.contains("type") ? f["type"] : json();
      if (type == "json_schema") {
        only_keys(f, {"type", "json_schema"}, "response_format");
        if (!present(f, "json_schema")) bad_request("'response_format.json_schema' is required", "response_format.json_schema");
        const json& js = read_object(f["json_schema"], "response_format.json_schema");
        only_keys(js, {"name", "description", "schema", "strict"}, "response_format.json_schema");
        if (!present(js, "schema"))  // OpenAI allows it out: any JSON then
          bad_request("'response_format.json_schema.schema' is required", "response_format.json_schema.schema");
        set_format(r, "json_schema", ordered.text("/response_format/json_schema/schema", js["schema"]),
                   "response_format.json_schema.schema");
      } else if (f.size() == 1 && (type == "text" || type == "json_object")) {
        if (type == "json_object") set_format(r, "json_object", "", "response_format");
      } else {
        bad_request(fmt::format("'response_format' must be {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or "
                                "{{\"type\": \"json_schema\", \"json_schema\": {{\"name\", \"schema\"}}}}, got {}", quote(f)),
                    "response_format");
      }
    }
    if (present(b, "tools")) r.tools = read_tools(b["tools"]);
    read_bool(b, "parallel_tool_calls", r.parallel_tool_calls);
    if (present(b, "tool_choice")) {
      const json& c = b["tool_choice"];
      if (c.is_string() && c == "none") {
        r.tools.clear();  // the model is not told of the tools (a call it writes anyway is still parsed)
      } else if (c.is_string() && c == "auto") {
      } else if ((c.is_string() && c == "required") || c.is_object()) {
        force_tool_call(r, c, ordered);
      } else {
        bad_request(fmt::format("'tool_choice' must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", "
                                "\"function\": {{\"name\"}}}}, got {}", quote(c)), "tool_choice");
      }
    }
    r.prompt = chat_prompt(model, messages, thinking, r.tools);
  } else {
    if (!b.contains("prompt")) bad_request("'prompt' is required", "prompt");
    const json* p = &b["prompt"];
    if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
    if (p->is_string()) {
      if (p->get_ref<const std::string&>().empty()) bad_request("'prompt' is empty", "prompt");
      r.prompt = model.tokenize(p->get_ref<const std::string&>());
    } else if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
      r.prompt = token_ids(*p, "prompt", model.vocab_size);
    } else {
      bad_request(fmt::format("'prompt' must be a string, a list of one string, or a list of token ids, got {}", quote(*p)),
                  "prompt");
    }
    bool echo = false;
    read_bool(b, "echo", echo);
    if (echo) bad_request("'echo' is not supported", "echo");
    if (present(b, "suffix")) bad_request("'suffix' is not supported", "suffix");
    if (present(b, "best_of") && read_int(b["best_of"], "best_of", 1, 128) != 1)
      bad_request("only best_of = 1 is supported", "best_of");
  }
  if (r.prompt.empty()) bad_request("the prompt is empty after tokenization", prompt_field);

  auto& s = r.sampling;
  const int64_t capacity = model.context_length;
  const int64_t n = static_cast<int64_t>(r.prompt.size());
  if (!max_given) s.max_tokens = static_cast<int>(std::clamp<int64_t>(capacity - n, 1, s.max_tokens));
  if (n >= capacity || n + s.max_tokens > capacity)
    throw HttpError{400, fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                     "({} in the prompt, {} in the completion). Please reduce the length of the {} or "
                                     "the completion.", capacity, n + s.max_tokens, n, s.max_tokens, prompt_field),
                    "invalid_request_error", prompt_field, "context_length_exceeded"};
  if (!model.has_drafter && r.asks_drafting)
    bad_request("this server runs no drafter: speculative.mode \"fixed\"/\"auto\" or speculative.n_max > 0 cannot be "
                "honoured", present(b, "speculative.mode") ? "speculative.mode" : "speculative.n_max");
  for (int32_t id : s.stop_token_ids)
    if (id >= model.vocab_size)
      bad_request(fmt::format("'stop_token_ids' holds {}, outside the vocabulary of {} tokens", id, model.vocab_size),
                  "stop_token_ids");
  for (const auto& [id, bias] : s.logit_bias)
    if (id >= model.vocab_size)
      bad_request(fmt::format("'logit_bias' names token {}, outside the vocabulary of {} tokens", id, model.vocab_size),
                  "logit_bias");
  if (s.min_tokens > s.max_tokens)
    bad_request(fmt::format("'min_tokens' ({}) must not exceed max_tokens ({})", s.min_tokens, s.max_tokens), "min_tokens");
  return r;
}

TokenizeRequest read_tokenize(const json& b, const ServedModel& model) {
  only_keys(b, {"model", "content", "prompt", "messages", "add_special", "with_pieces"});
  check_model_name(b, model);
  TokenizeRequest r;
  bool add_special = false;
  read_bool(b, "with_pieces", r.with_pieces);
  read_bool(b, "add_special", add_special);
  if (b.contains("messages")) {
    r.tokens = chat_prompt(model, read_messages(b), std::nullopt);
    return r;
  }
  const char* key = b.contains("content") ? "content" : "prompt";
  if (!b.contains(key)) bad_request("give 'content' (text) or 'messages'", "content");
  r.tokens = model.tokenize(read_string(b[key], key));
  if (add_special) r.tokens.insert(r.tokens.begin(), model.bos);
  return r;
}

std::vector<int32_t> read_detokenize(const json& b, const ServedModel& model) {
  only_keys(b, {"model", "tokens"});
  check_model_name(b, model);
  if (!b.contains("tokens") || !b["tokens"].is_array())
    bad_request(fmt::format("'tokens' must be a list of token ids, got {}", b.contains("tokens") ? quote(b["tokens"]) : "nothing"),
                "tokens");
  return token_ids(b["tokens"], "tokens", model.vocab_size);
}

}  // namespace specula::serve

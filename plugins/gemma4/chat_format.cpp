#include "chat_format.hpp"

#include <algorithm>
#include <array>
#include <set>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/error.hpp"
#include "specula/tool_calls.hpp"

namespace specula::gemma4 {
namespace {

constexpr std::string_view kChannelOpen = "<|channel>";
constexpr std::string_view kChannelClose = "<channel|>";
constexpr std::string_view kEmptyThought = "<|channel>thought\n<channel|>";
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the UTF-8 sequence announced by a lead byte, 0 for a byte that cannot start one.
size_t sequence_length(unsigned char c) {
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return 2;
  if (c >= 0xE0 && c <= 0xEF) return 3;
  if (c >= 0xF0 && c <= 0xF4) return 4;
  return 0;
}

// Whether s[i..i+n) is a valid UTF-8 sequence of length n (checking overlong and surrogate forms).
bool valid_sequence(std::string_view s, size_t i, size_t n) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  for (size_t k = 1; k < n; ++k)
    if ((b(k) & 0xC0) != 0x80) return false;
  if (n == 3 && ((b(0) == 0xE0 && b(1) < 0xA0) || (b(0) == 0xED && b(1) > 0x9F))) return false;
  if (n == 4 && ((b(0) == 0xF0 && b(1) < 0x90) || (b(0) == 0xF4 && b(1) > 0x8F))) return false;
  return true;
}

// Whether s[i..) (fewer than n bytes) could still become a valid sequence with more bytes.
bool valid_prefix(std::string_view s, size_t i) {
  const size_t have = s.size() - i;
  for (size_t k = 1; k < have; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
  if (have >= 2) {
    const auto b0 = static_cast<unsigned char>(s[i]), b1 = static_cast<unsigned char>(s[i + 1]);
    if ((b0 == 0xE0 && b1 < 0xA0) || (b0 == 0xED && b1 > 0x9F) || (b0 == 0xF0 && b1 < 0x90) ||
        (b0 == 0xF4 && b1 > 0x8F))
      return false;
  }
  return true;
}

// Moves the complete UTF-8 text at the front of `pending` into the result; bytes that can never be
// valid become U+FFFD, an incomplete sequence at the end stays pending (all of it when `final`
// is false, replaced when true).
std::string take_valid(std::string& pending, bool final) {
  std::string out;
  size_t i = 0;
  while (i < pending.size()) {
    const size_t n = sequence_length(static_cast<unsigned char>(pending[i]));
    if (n == 0) {
      out += kReplacement;
      ++i;
    } else if (i + n <= pending.size()) {
      if (valid_sequence(pending, i, n)) {
        out.append(pending, i, n);
        i += n;
      } else {
        out += kReplacement;
        ++i;
      }
    } else if (!final && valid_prefix(pending, i)) {
      break;
    } else {
      out += kReplacement;
      ++i;
    }
  }
  pending.erase(0, i);
  return out;
}

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Decodes the character starting at s[i] (valid UTF-8 assumed; invalid bytes read as themselves).
char32_t decode_at(std::string_view s, size_t i, size_t& len) {
  const auto c = static_cast<unsigned char>(s[i]);
  len = sequence_length(c);
  if (len <= 1 || i + len > s.size() || !valid_sequence(s, i, len)) {
    len = 1;
    return c;
  }
  char32_t v = c & (0xFF >> (len + 1));
  for (size_t k = 1; k < len; ++k) v = (v << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return v;
}

// The template's strip_thinking(): drops every `<|channel>...<channel|>` block, then trims.
std::string strip_thinking(std::string_view text) {
  std::string out;
  size_t i = 0;
  while (true) {
    const size_t close = text.find(kChannelClose, i);
    const std::string_view part = text.substr(i, close == std::string_view::npos ? std::string_view::npos : close - i);
    const size_t open = part.find(kChannelOpen);
    out.append(part.substr(0, open));
    if (close == std::string_view::npos) break;
    i = close + kChannelClose.size();
  }
  return trim_like_python(out);
}

int32_t require_token(const Tokenizer& tok, std::string_view piece) {
  auto id = tok.token_id(piece);
  if (!id) fail("gemma4 chat format: the tokenizer has no '{}' token; is this a Gemma 4 vocabulary?", piece);
  return *id;
}

class Filter final : public ChatFormat::AnswerFilter {
 public:
  Filter(std::shared_ptr<const Tokenizer> tok, int32_t open, int32_t close, bool show_thoughts)
      : tok_(std::move(tok)), open_(open), close_(close), show_(show_thoughts) {
    if (auto id = tok_->token_id("<|tool_call>")) call_open_ = *id;
    if (auto id = tok_->token_id("<tool_call|>")) call_close_ = *id;
  }

  std::string push(int32_t token) override {
    std::string out;
    // A tool call (outside the thought channel): hidden when well-formed (ToolCallExtractor reports
    // it), handed back as text, spelled as written, when not.
    if (!in_thought_ && call_open_ >= 0) {
      if (token == call_open_) {
        out = take_valid(pending_, true);
        if (in_call_) out += malformed();  // a second opening: the first block was never closed
        in_call_ = true;
        call_.clear();
        return out;
      }
      if (in_call_) {
        if (token != call_close_) {
          call_ += tool_call_text(*tok_, token);
          return {};
        }
        in_call_ = false;
        if (parse_gemma4_tool_call(call_)) return {};
        call_ += "<tool_call|>";
        return malformed();
      }
    }
    if (token == open_) {
      out = take_valid(pending_, true);  // nothing may straddle the channel boundary
      in_thought_ = true;
      in_channel_name_ = true;
      return out;
    }
    if (token == close_) {
      out = take_valid(pending_, true);
      if (in_thought_ && show_) out += "\n";
      in_thought_ = false;
      in_channel_name_ = false;
      return out;
    }
    if (tok_->is_special(token)) return {};
    if (in_thought_) {
      if (!show_) return {};
      if (in_channel_name_) {  // "thought\n": the channel's name, up to its first newline
        const std::string bytes = tok_->token_bytes(token);
        const size_t nl = bytes.find('\n');
        if (nl == std::string::npos) return {};
        in_channel_name_ = false;
        pending_ += bytes.substr(nl + 1);
        return take_valid(pending_, false);
      }
    }
    pending_ += tok_->token_bytes(token);
    return take_valid(pending_, false);
  }

  std::string finish() override {
    std::string out = take_valid(pending_, true);
    if (in_call_) out += malformed();  // never closed
    in_call_ = false;
    return out;
  }

 private:
  std::string malformed() {
    std::string text = "<|tool_call>" + call_;
    call_.clear();
    return take_valid(text, true);
  }

  std::shared_ptr<const Tokenizer> tok_;  // the filter may outlive its format
  int32_t open_, close_;
  bool show_;
  bool in_thought_ = false, in_channel_name_ = false;
  std::string pending_;
  int32_t call_open_ = -1, call_close_ = -1;
  bool in_call_ = false;
  std::string call_;
};

}  // namespace

std::string trim_like_python(std::string_view s) {
  size_t begin = 0, end = s.size(), len = 0;
  while (begin < end && is_python_space(decode_at(s, begin, len))) begin += len;
  while (end > begin) {
    size_t start = end - 1;  // back up to the start of the last character
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80 && end - start < 4) --start;
    const char32_t c = decode_at(s, start, len);
    if (start + len != end || !is_python_space(c)) break;
    end = start;
  }
  return std::string(s.substr(begin, end - begin));
}

Gemma4ChatFormat::Options Gemma4ChatFormat::options_from_template(std::string_view jinja) {
  Options o;
  // The larger models' templates spell the empty thought block out in their generation prompt.
  o.empty_thought_when_not_thinking = jinja.find("'<|channel>thought\\n<channel|>'") != std::string_view::npos;
  o.merge_consecutive_assistant = jinja.find("continue_same_model_turn") != std::string_view::npos;
  return o;
}

Gemma4ChatFormat::Options Gemma4ChatFormat::options_for(const ModelFile& file) {
  const auto& md = file.metadata();
  if (auto it = md.find("tokenizer.chat_template"); it != md.end() && it->is_string())
    return options_from_template(it->get_ref<const std::string&>());
  if (auto tc = md.find("tokenizer_config"); tc != md.end() && tc->is_object())
    if (auto it = tc->find("chat_template"); it != tc->end() && it->is_string())
      return options_from_template(it->get_ref<const std::string&>());
  return Options{};
}

Gemma4ChatFormat::Gemma4ChatFormat(std::shared_ptr<const Tokenizer> tokenizer, Options options)
    : tok_(std::move(tokenizer)), options_(options) {
  if (!tok_) fail("gemma4 chat format: no tokenizer");
  channel_open_ = require_token(*tok_, kChannelOpen);
  channel_close_ = require_token(*tok_, kChannelClose);
  turn_end_ = require_token(*tok_, "<turn|>");
  require_token(*tok_, "<|turn>");
}

namespace {

using json = nlohmann::json;
constexpr std::string_view kQ = "<|\"|>";

std::string upper_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  return s;
}
std::string lower_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

// Jinja's truthiness of a JSON value (missing = null = false).
bool truthy(const json* v) {
  if (!v || v->is_null()) return false;
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_string() || v->is_array() || v->is_object()) return !v->empty();
  if (v->is_number_integer()) return v->get<int64_t>() != 0;
  if (v->is_number_unsigned()) return v->get<uint64_t>() != 0;
  return v->get<double>() != 0;
}
const json* field(const json& o, const char* key) {
  if (!o.is_object()) return nullptr;
  auto it = o.find(key);
  return it == o.end() ? nullptr : &*it;
}
// `value['type'] | upper`: a missing type renders empty.
std::string type_upper(const json& o) {
  const json* t = field(o, "type");
  return t && t->is_string() ? upper_ascii(t->get<std::string>()) : std::string();
}
// Jinja's dictsort: keys ordered case-insensitively.
std::vector<std::pair<std::string, const json*>> dictsort(const json& o) {
  std::vector<std::pair<std::string, const json*>> items;
  for (auto it = o.begin(); it != o.end(); ++it) items.emplace_back(it.key(), &it.value());
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return lower_ascii(a.first) < lower_ascii(b.first); });
  return items;
}

// Renders the template's macros; client strings between <|"|> delimiters are recorded as content.
class ToolWriter {
 public:
  explicit ToolWriter(RenderedChat& r) : r_(r), out_(r.text) {}

  void text(const std::string& s) {  // what a client wrote, between special-token boundaries
    r_.content.push_back({out_.size(), out_.size() + s.size()});
    out_ += s;
  }
  // A name or key the template writes bare: a client's spelling of a special token stays text.
  void bare(const std::string& s) {
    if (s.find('<') != std::string::npos) text(s);
    else out_ += s;
  }
  void quoted(const std::string& s) {
    out_ += kQ;
    text(s);
    out_ += kQ;
  }

  // format_argument(argument, escape_keys)
  void argument(const json& v, bool escape_keys) {
    if (v.is_string()) {
      quoted(v.get<std::string>());
    } else if (v.is_boolean()) {
      out_ += v.get<bool>() ? "true" : "false";
    } else if (v.is_object()) {
      out_ += '{';
      bool first = true;
      for (const auto& [key, value] : dictsort(v)) {
        if (!first) out_ += ',';
        first = false;
        if (escape_keys) quoted(key);
        else bare(key);
        out_ += ':';
        argument(*value, escape_keys);
      }
      out_ += '}';
    } else if (v.is_array()) {
      out_ += '[';
      for (size_t i = 0; i < v.size(); ++i) {
        if (i) out_ += ',';
        argument(v[i], escape_keys);
      }
      out_ += ']';
    } else if (v.is_null()) {
      out_ += "None";  // Python's spelling, as the template prints it
    } else {
      out_ += v.dump();
    }
  }

  void required_list(const json& req) {
    out_ += "required:[";
    if (req.is_array())
      for (size_t i = 0; i < req.size(); ++i) {
        if (i) out_ += ',';
        quoted(req[i].is_string() ? req[i].get<std::string>() : req[i].dump());
      }
    out_ += ']';
  }

  // format_parameters(properties, required)
  void parameters(const json& properties) {
    static const std::set<std::string> standard = {"description", "type", "properties", "required", "nullable"};
    if (!properties.is_object()) return;
    bool found_first = false;
    for (const auto& [key, vp] : dictsort(properties)) {
      const json& value = *vp;
      if (standard.count(key)) continue;
      if (found_first) out_ += ',';
      found_first = true;
      bare(key);
      out_ += ":{";
      bool add_comma = false;
      auto comma = [&] {
        if (add_comma) out_ += ',';
        else add_comma = true;
      };
      if (const json* d = field(value, "description"); truthy(d)) {
        out_ += "description:";
        quoted(d->is_string() ? d->get<std::string>() : d->dump());
        add_comma = true;
      }
      const std::string type = type_upper(value);
      if (type == "STRING") {
        if (const json* e = field(value, "enum"); truthy(e)) {
          comma();
          out_ += "enum:";
          argument(*e, true);
        }
      } else if (type == "ARRAY") {
        const json* items = field(value, "items");
        if (items && items->is_object() && !items->empty()) {
          comma();
          out_ += "items:{";
          bool first = true;
          for (const auto& [ik, iv] : dictsort(*items)) {
            if (iv->is_null()) continue;
            if (!first) out_ += ',';
            first = false;
            if (ik == "properties") {
              out_ += "properties:{";
              if (iv->is_object()) parameters(*iv);
              out_ += '}';
            } else if (ik == "required") {
              required_list(*iv);
            } else if (ik == "type") {
              out_ += "type:";
              if (iv->is_string()) {
                argument(upper_ascii(iv->get<std::string>()), true);
              } else {
                json up = json::array();
                if (iv->is_array())
                  for (const auto& t : *iv) up.push_back(upper_ascii(t.is_string() ? t.get<std::string>() : t.dump()));
                argument(up, true);
              }
            } else {
              bare(ik);
              out_ += ":";
              argument(*iv, true);
            }
          }
          out_ += '}';
        }
      }
      if (truthy(field(value, "nullable"))) {
        comma();
        out_ += "nullable:true";
      }
      if (type == "OBJECT") {
        const json* props = field(value, "properties");
        comma();
        out_ += "properties:{";
        parameters(props && props->is_object() ? *props : value);
        out_ += '}';
        if (const json* req = field(value, "required"); truthy(req)) {
          comma();
          required_list(*req);
        }
      }
      comma();
      out_ += "type:";
      out_ += kQ;
      out_ += type;
      out_ += kQ;
      out_ += '}';
    }
  }

  // format_function_declaration(tool), trimmed (it starts and ends with no whitespace of its own).
  void declaration(const json& tool) {
    const json* fn = field(tool, "function");
    if (!fn || !fn->is_object()) fail("gemma4 chat format: a tool without a 'function' object");
    const json* name = field(*fn, "name");
    if (!name || !name->is_string()) fail("gemma4 chat format: a tool function without a name");
    out_ += "declaration:";
    bare(name->get<std::string>());
    out_ += "{description:";
    const json* desc = field(*fn, "description");
    quoted(desc && desc->is_string() ? desc->get<std::string>() : std::string());
    if (const json* params = field(*fn, "parameters"); truthy(params)) {
      out_ += ",parameters:{";
      if (const json* props = field(*params, "properties"); truthy(props)) {
        out_ += "properties:{";
        parameters(*props);
        out_ += "},";
      }
      if (const json* req = field(*params, "required"); truthy(req)) {
        required_list(*req);
        out_ += ',';
      }
      if (const json* type = field(*params, "type"); truthy(type)) {
        out_ += "type:";
        out_ += kQ;
        out_ += type_upper(*params);
        out_ += kQ;
        out_ += '}';
      }
    }
    out_ += '}';
  }

  // A tool call in an assistant message: arguments given as a JSON object (or as JSON text that
  // parses to one) render as the template renders a mapping; other text goes in verbatim.
  void call(const json& tc) {
    const json* fn = field(tc, "function");
    const json* name = fn ? field(*fn, "name") : nullptr;
    if (!name || !name->is_string()) fail("gemma4 chat format: a tool call without function.name");
    out_ += "<|tool_call>call:";
    bare(name->get<std::string>());
    out_ += "{";
    const json* args = field(*fn, "arguments");
    json parsed;
    if (args && args->is_string()) {
      parsed = json::parse(args->get<std::string>(), nullptr, false);
      if (parsed.is_object()) args = &parsed;
    }
    if (args && args->is_object()) {
      bool first = true;
      for (const auto& [key, value] : dictsort(*args)) {
        if (!first) out_ += ',';
        first = false;
        bare(key);
        out_ += ":";
        argument(*value, false);
      }
    } else if (args && args->is_string()) {
      text(args->get<std::string>());
    }
    out_ += "}<tool_call|>";
  }

  // format_tool_response_block(name, text)
  void response(const std::string& name, const std::string& body) {
    out_ += "<|tool_response>response:";
    bare(name);
    out_ += "{value:";
    quoted(body);
    out_ += "}<tool_response|>";
  }

 private:
  RenderedChat& r_;
  std::string& out_;
};

json parse_json_array(std::string_view text, const char* what) {
  if (text.empty()) return json::array();
  json j = json::parse(text, nullptr, false);
  if (!j.is_array()) fail("gemma4 chat format: {} must be a JSON array", what);
  return j;
}

}  // namespace

RenderedChat Gemma4ChatFormat::render_chat(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                           bool enable_thinking) const {
  return render_chat_tools(messages, {}, add_generation_prompt, enable_thinking);
}

RenderedChat Gemma4ChatFormat::render_chat_tools(std::span<const ChatMessage> messages, std::string_view tools_text,
                                                 bool add_generation_prompt, bool enable_thinking) const {
  const json tools = parse_json_array(tools_text, "tools");
  RenderedChat r;
  std::string& out = r.text;
  out = tok_->piece(tok_->bos());
  ToolWriter w(r);
  // A message's content, as the template trims it: recorded as content (text, whatever it spells).
  auto content = [&](std::string text) { w.text(text); };
  enum class Prev { None, Think, Tool, ToolCall, ToolResponse } prev = Prev::None;
  size_t first = 0;
  const bool system_first = !messages.empty() && (messages[0].role == "system" || messages[0].role == "developer");
  if (enable_thinking || system_first || !tools.empty()) {
    out += "<|turn>system\n";
    if (enable_thinking) {
      out += "<|think|>\n";
      prev = Prev::Think;
    }
    if (system_first) {
      content(trim_like_python(messages[0].content));
      first = 1;
    }
    for (const auto& tool : tools) {
      out += "<|tool>";
      w.declaration(tool);
      out += "<tool|>";
      prev = Prev::Tool;
    }
    out += "<turn|>\n";
  }
  const std::string* previous_role = nullptr;  // of the previous message that is not a tool message
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") {  // rendered after the assistant message whose calls it answers
      // (the template drops a tool message that answers no call: an error here instead)
      size_t j = i;
      while (j > first && messages[j - 1].role == "tool") --j;
      if (j == first || messages[j - 1].tool_calls.empty())
        fail("gemma4 chat format: a tool message must follow an assistant message with tool_calls");
      continue;
    }
    prev = Prev::None;
    const bool model = m.role == "assistant" || m.role == "model";
    // Consecutive assistant messages (tool messages between them aside) continue one model turn.
    const bool continues = options_.merge_consecutive_assistant && model && previous_role &&
                           *previous_role == "assistant";
    if (!continues) out += "<|turn>" + std::string(m.role == "assistant" ? "model" : m.role) + "\n";
    const json calls = parse_json_array(m.tool_calls, "tool_calls");
    for (const auto& tc : calls) {
      w.call(tc);
      prev = Prev::ToolCall;
    }
    bool responded = false;
    if (!calls.empty()) {
      for (size_t k = i + 1; k < messages.size() && messages[k].role == "tool"; ++k) {
        const ChatMessage& follow = messages[k];
        std::string name = follow.name.empty() ? "unknown" : follow.name;
        for (const auto& tc : calls) {
          const json* id = field(tc, "id");
          const std::string tc_id = id && id->is_string() ? id->get<std::string>() : std::string();
          const json* fn = field(tc, "function");
          const json* fname = fn ? field(*fn, "name") : nullptr;
          if (tc_id == follow.tool_call_id && fname && fname->is_string()) name = fname->get<std::string>();
        }
        w.response(name, follow.content);
        responded = true;
        prev = Prev::ToolResponse;
      }
    }
    content(model ? strip_thinking(m.content) : trim_like_python(m.content));
    if (prev == Prev::ToolCall && !responded) out += "<|tool_response>";
    else if (!(responded && m.content.empty())) out += "<turn|>\n";
    previous_role = &m.role;
  }
  if (add_generation_prompt && prev != Prev::ToolResponse && prev != Prev::ToolCall) {
    out += "<|turn>model\n";
    if (!enable_thinking && options_.empty_thought_when_not_thinking) out += kEmptyThought;
  }
  return r;
}

std::unique_ptr<ChatFormat::AnswerFilter> Gemma4ChatFormat::answer_filter(bool show_thoughts) const {
  return std::make_unique<Filter>(tok_, channel_open_, channel_close_, show_thoughts);
}

std::vector<int32_t> Gemma4ChatFormat::stop_tokens() const {
  std::vector<int32_t> ids{turn_end_, tok_->eos()};
  if (auto id = tok_->token_id("<|tool_response>")) ids.push_back(*id);
  return ids;
}

}  // namespace specula::gemma4

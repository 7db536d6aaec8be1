#include "specula/tool_calls.hpp"

#include <nlohmann/json.hpp>

namespace specula {
namespace {

using json = nlohmann::json;

constexpr std::string_view kQuote = "<|\"|>";

struct Malformed {};

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}

  json object(int depth) {  // at '{'
    if (depth > kMaxToolCallDepth) throw Malformed{};
    expect('{');
    json out = json::object();
    skip_ws();
    if (peek() == '}') {
      ++i_;
      return out;
    }
    while (true) {
      skip_ws();
      std::string k = key();
      skip_ws();
      expect(':');
      skip_ws();
      out[k] = value(depth + 1);
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}');
      return out;
    }
  }

  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  bool done() const { return i_ == s_.size(); }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void expect(char c) {
    if (peek() != c) throw Malformed{};
    ++i_;
  }
  size_t pos() const { return i_; }
  void seek(size_t i) { i_ = i; }

 private:
  bool at_quote() const { return s_.substr(i_, kQuote.size()) == kQuote; }

  std::string quoted() {  // at <|"|>
    i_ += kQuote.size();
    const size_t end = s_.find(kQuote, i_);
    if (end == std::string_view::npos) throw Malformed{};
    std::string out(s_.substr(i_, end - i_));
    i_ = end + kQuote.size();
    return out;
  }

  std::string key() {
    if (at_quote()) return quoted();
    const size_t start = i_;
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ':' || c == '{' || c == '}' || c == '[' || c == ']' || c == ',' || c == '<' || c == ' ' || c == '\t' ||
          c == '\n' || c == '\r')
        break;
      ++i_;
    }
    if (i_ == start) throw Malformed{};
    return std::string(s_.substr(start, i_ - start));
  }

  json value(int depth) {
    if (depth > kMaxToolCallDepth) throw Malformed{};
    if (at_quote()) return quoted();
    const char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') {
      ++i_;
      json out = json::array();
      skip_ws();
      if (peek() == ']') {
        ++i_;
        return out;
      }
      while (true) {
        skip_ws();
        out.push_back(value(depth + 1));
        skip_ws();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        expect(']');
        return out;
      }
    }
    // A bare word: true, false, null, None or a number.
    const size_t start = i_;
    while (i_ < s_.size()) {
      const char d = s_[i_];
      if (d == ',' || d == '}' || d == ']' || d == ' ' || d == '\t' || d == '\n' || d == '\r') break;
      ++i_;
    }
    const std::string_view word = s_.substr(start, i_ - start);
    if (word == "true") return true;
    if (word == "false") return false;
    if (word == "null" || word == "None") return nullptr;
    if (word.empty() || !number(word)) throw Malformed{};
    try {
      json n = json::parse(word);
      if (!n.is_number()) throw Malformed{};
      return n;
    } catch (const json::exception&) {  // out of the double range
      throw Malformed{};
    }
  }

  // JSON's number syntax: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  static bool number(std::string_view w) {
    size_t i = 0;
    auto digits = [&] {
      const size_t s = i;
      while (i < w.size() && w[i] >= '0' && w[i] <= '9') ++i;
      return i > s;
    };
    if (i < w.size() && w[i] == '-') ++i;
    if (i < w.size() && w[i] == '0') ++i;
    else if (!digits()) return false;
    if (i < w.size() && w[i] == '.') {
      ++i;
      if (!digits()) return false;
    }
    if (i < w.size() && (w[i] == 'e' || w[i] == 'E')) {
      ++i;
      if (i < w.size() && (w[i] == '+' || w[i] == '-')) ++i;
      if (!digits()) return false;
    }
    return i == w.size();
  }

  std::string_view s_;
  size_t i_ = 0;
};

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.' ||
         c == ':' || c == '/';
}

}  // namespace

std::optional<ToolCall> parse_gemma4_tool_call(std::string_view body) {
  Reader r(body);
  r.skip_ws();
  const size_t start = r.pos();
  if (body.substr(start, 5) != "call:") return std::nullopt;
  size_t i = start + 5;
  const size_t name_start = i;
  while (i < body.size() && body[i] != '{' && name_char(body[i])) ++i;
  if (i == name_start || i >= body.size() || body[i] != '{') return std::nullopt;
  ToolCall call;
  call.name = std::string(body.substr(name_start, i - name_start));
  r.seek(i);
  try {
    const json args = r.object(0);
    r.skip_ws();
    if (!r.done()) return std::nullopt;
    // Invalid UTF-8 becomes U+FFFD in the dump, which can reorder the object's keys: parsed once more, the
    // text is canonical (what a client re-serialising it gets).
    call.arguments = json::parse(args.dump(-1, ' ', false, json::error_handler_t::replace)).dump();
  } catch (const Malformed&) {
    return std::nullopt;
  }
  return call;
}

std::string tool_call_text(const Tokenizer& tok, int32_t token) {
  return tok.is_special(token) ? tok.piece(token) : tok.token_bytes(token);
}

ToolCallExtractor::ToolCallExtractor(std::shared_ptr<const Tokenizer> tok) : tok_(std::move(tok)) {
  if (!tok_) return;
  const auto open = tok_->token_id("<|tool_call>");
  const auto close = tok_->token_id("<tool_call|>");
  if (open && close) {
    open_ = *open;
    close_ = *close;
  }
  if (auto id = tok_->token_id("<|channel>")) channel_open_ = *id;
  if (auto id = tok_->token_id("<channel|>")) channel_close_ = *id;
}

std::vector<ToolCall> ToolCallExtractor::push(int32_t token) {
  if (open_ < 0) return {};
  // A call inside the thought channel is not one (the answer filter does not look for calls there).
  if (!inside_ && token == channel_open_) in_channel_ = true;
  if (token == channel_close_) in_channel_ = false;
  if (in_channel_) return {};
  if (token == open_) {
    inside_ = true;  // a second opening restarts the block (the filter hands the first back as text)
    body_.clear();
    return {};
  }
  if (!inside_) return {};
  if (token == close_) {
    inside_ = false;
    auto call = parse_gemma4_tool_call(body_);
    body_.clear();
    if (call) return {std::move(*call)};
    return {};
  }
  body_ += tool_call_text(*tok_, token);
  return {};
}

}  // namespace specula

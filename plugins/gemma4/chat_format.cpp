#include "chat_format.hpp"

#include <array>

#include "specula/error.hpp"

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
      : tok_(std::move(tok)), open_(open), close_(close), show_(show_thoughts) {}

  std::string push(int32_t token) override {
    std::string out;
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

  std::string finish() override { return take_valid(pending_, true); }

 private:
  std::shared_ptr<const Tokenizer> tok_;  // the filter may outlive its format
  int32_t open_, close_;
  bool show_;
  bool in_thought_ = false, in_channel_name_ = false;
  std::string pending_;
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

RenderedChat Gemma4ChatFormat::render_chat(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                           bool enable_thinking) const {
  RenderedChat r;
  std::string& out = r.text;
  out = tok_->piece(tok_->bos());
  // A message's content, as the template trims it: recorded as content (text, whatever it spells).
  auto content = [&](std::string text) {
    r.content.push_back({out.size(), out.size() + text.size()});
    out += text;
  };
  size_t first = 0;
  const bool system_first = !messages.empty() && (messages[0].role == "system" || messages[0].role == "developer");
  if (enable_thinking || system_first) {
    out += "<|turn>system\n";
    if (enable_thinking) out += "<|think|>\n";
    if (system_first) {
      content(trim_like_python(messages[0].content));
      first = 1;
    }
    out += "<turn|>\n";
  }
  const std::string* previous_role = nullptr;
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "tool") fail("gemma4 chat format: tool messages are not supported");
    const bool model = m.role == "assistant" || m.role == "model";
    // Consecutive assistant messages continue one model turn.
    const bool continues = options_.merge_consecutive_assistant && m.role == "assistant" && previous_role &&
                           *previous_role == "assistant";
    if (!continues) out += "<|turn>" + std::string(model ? "model" : m.role) + "\n";
    content(model ? strip_thinking(m.content) : trim_like_python(m.content));
    out += "<turn|>\n";
    previous_role = &m.role;
  }
  if (add_generation_prompt) {
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

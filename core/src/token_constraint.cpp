// The JSON-object constraint: a byte-level pushdown recognizer small enough to copy at every trie node
// (a 64-level container stack in one word), walked over the vocabulary's byte trie to mask a row. Written
// here rather than taken from a library: xgrammar's C++ core is not among the packages the project may
// use, and JSON needs only this recognizer.
#include "specula/core/token_constraint.hpp"

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>

#include "specula/error.hpp"
#include "token_trie.hpp"

namespace specula {

std::shared_ptr<const TokenTrie> token_trie(const std::shared_ptr<const Tokenizer>& tokenizer_ptr) {
  if (!tokenizer_ptr) fail("token_trie: no tokenizer");
  const Tokenizer& tokenizer = *tokenizer_ptr;
  // Kept while its tokenizer lives (the weak pointer tells a new tokenizer at a freed address apart).
  static std::mutex mutex;
  static std::map<const Tokenizer*, std::pair<std::weak_ptr<const Tokenizer>, std::shared_ptr<const TokenTrie>>> built;
  std::lock_guard lock(mutex);
  std::erase_if(built, [](const auto& e) { return e.second.first.expired(); });
  if (auto it = built.find(&tokenizer); it != built.end()) return it->second.second;
  // A pointer trie first, then laid out breadth-first in flat arrays.
  struct Build {
    std::map<uint8_t, std::unique_ptr<Build>> next;
    std::vector<int32_t> ids;
  };
  Build root;
  const int64_t vocab = tokenizer.vocab_size();
  auto trie = std::make_shared<TokenTrie>();
  trie->vocab = vocab;
  trie->bytes.resize(static_cast<size_t>(vocab));
  for (int32_t id = 0; id < vocab; ++id) {
    if (tokenizer.is_special(id)) continue;
    const std::string& bytes = trie->bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(id);
    if (bytes.empty()) continue;
    Build* n = &root;
    for (const char c : bytes) {
      auto& child = n->next[static_cast<uint8_t>(c)];
      if (!child) child = std::make_unique<Build>();
      n = child.get();
    }
    n->ids.push_back(id);
  }
  std::vector<const Build*> order{&root};
  trie->nodes.emplace_back();
  for (size_t i = 0; i < order.size(); ++i) {
    const Build* b = order[i];
    TokenTrie::Node& n = trie->nodes[i];
    n.first_token = static_cast<uint32_t>(trie->ids.size());
    n.tokens = static_cast<uint32_t>(b->ids.size());
    trie->ids.insert(trie->ids.end(), b->ids.begin(), b->ids.end());
    n.first_child = static_cast<uint32_t>(trie->edges.size());
    n.children = static_cast<uint32_t>(b->next.size());
    for (const auto& [byte, child] : b->next) {
      trie->edges.push_back({byte, static_cast<uint32_t>(order.size())});
      order.push_back(child.get());
      trie->nodes.emplace_back();
    }
  }
  built[&tokenizer] = {tokenizer_ptr, trie};
  return trie;
}

namespace {

// Where the recognizer is. Containers are a bit stack: 1 = object, 0 = array.
enum class Mode : uint8_t {
  Start,      // before the root object: '{'
  ObjFirst,   // after '{': a key or '}'
  ObjKey,     // after ',' in an object: a key
  Colon,      // after a key: ':'
  Value,      // after ':' or ',' in an array: a value
  ArrFirst,   // after '[': a value or ']'
  After,      // after a value in a container: ',' or the closing bracket
  String,     // inside a string (key when `key`)
  Escape,     // after '\' in a string
  Unicode,    // \uXXXX: `count` hex digits left
  Number,     // `count`: the number's sub-state (NumState)
  Literal,    // true / false / null: `literal`, `count` bytes matched
  Done,       // the root object closed
};

enum NumState : uint8_t { Minus, Zero, Int, Dot, Frac, Exp, ExpSign, ExpDigits };

constexpr int kMaxDepth = 64;
constexpr int kMaxWhitespace = 16;
// Numbers every strict parser reads as finite doubles (nlohmann refuses 1e400): at most 20 integer digits
// and a two-digit exponent. The bound also keeps a model from writing digits forever.
constexpr int kMaxIntegerDigits = 20, kMaxExponentDigits = 2;
constexpr const char* kLiterals[3] = {"true", "false", "null"};

struct Json {
  uint64_t stack = 0;
  uint8_t depth = 0;
  Mode mode = Mode::Start;
  uint8_t count = 0;
  uint8_t literal = 0;
  uint8_t whitespace = 0;  // in a row
  uint8_t utf8 = 0;        // continuation bytes the current character still needs (in a string)
  uint8_t utf8_lead = 0;   // the lead byte, to refuse overlong and surrogate forms
  bool key = false;
  bool need_low = false;   // a \u escape of a high surrogate must be followed by one of a low surrogate
  uint16_t code = 0;       // the \u escape read so far
  uint8_t digits = 0;      // in a number: integer digits, then exponent digits

  bool in_object() const { return depth > 0 && ((stack >> (depth - 1)) & 1); }
  bool open(bool object) {
    if (depth >= kMaxDepth) return false;
    stack = object ? stack | (uint64_t{1} << depth) : stack & ~(uint64_t{1} << depth);
    ++depth;
    mode = object ? Mode::ObjFirst : Mode::ArrFirst;
    return true;
  }
  bool close(bool object) {
    if (depth == 0 || in_object() != object) return false;
    --depth;
    mode = depth == 0 ? Mode::Done : Mode::After;
    return true;
  }
  bool value_start(uint8_t c) {
    switch (c) {
      case '{': return open(true);
      case '[': return open(false);
      case '"': mode = Mode::String; key = false; return true;
      case '-': mode = Mode::Number; count = Minus; return true;
      case 't': case 'f': case 'n':
        mode = Mode::Literal;
        literal = c == 't' ? 0 : c == 'f' ? 1 : 2;
        count = 1;
        return true;
      default:
        if (c >= '0' && c <= '9') {
          mode = Mode::Number;
          count = c == '0' ? Zero : Int;
          digits = 1;
          return true;
        }
        return false;
    }
  }
  static bool space(uint8_t c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
  static bool digit(uint8_t c) { return c >= '0' && c <= '9'; }
  static bool hex(uint8_t c) { return digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

  bool step(uint8_t c) {
    const bool ws = space(c);
    if (ws && mode != Mode::String && mode != Mode::Escape && mode != Mode::Unicode && mode != Mode::Number &&
        mode != Mode::Literal) {
      if (mode == Mode::Done || ++whitespace > kMaxWhitespace) return false;
      return true;
    }
    if (!ws) whitespace = 0;
    switch (mode) {
      case Mode::Start: return c == '{' && open(true);
      case Mode::ObjFirst:
        if (c == '}') return close(true);
        [[fallthrough]];
      case Mode::ObjKey:
        if (c != '"') return false;
        mode = Mode::String;
        key = true;
        return true;
      case Mode::Colon:
        if (c != ':') return false;
        mode = Mode::Value;
        return true;
      case Mode::ArrFirst:
        if (c == ']') return close(false);
        [[fallthrough]];
      case Mode::Value: return value_start(c);
      case Mode::After:
        if (c == ',') {
          mode = in_object() ? Mode::ObjKey : Mode::Value;
          return true;
        }
        return (c == '}' || c == ']') && close(c == '}');
      case Mode::String: return string_byte(c);
      case Mode::Escape:
        if (c == 'u') {
          mode = Mode::Unicode;
          count = 4;
          code = 0;
          return true;
        }
        mode = Mode::String;
        return !need_low &&
               (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't');
      case Mode::Unicode: {
        if (!hex(c)) return false;
        code = static_cast<uint16_t>(code * 16 + (digit(c) ? c - '0' : (c | 0x20) - 'a' + 10));
        if (--count > 0) return true;
        mode = Mode::String;
        // Surrogates only in pairs (strict parsers refuse a lone one).
        const bool high = code >= 0xD800 && code <= 0xDBFF, low = code >= 0xDC00 && code <= 0xDFFF;
        if (need_low != low) return false;
        need_low = high;
        return true;
      }
      case Mode::Number: return number_byte(c);
      case Mode::Literal: {
        const char* lit = kLiterals[literal];
        if (c != static_cast<uint8_t>(lit[count])) return false;
        if (lit[++count] == '\0') mode = Mode::After;
        return true;
      }
      case Mode::Done: return false;
    }
    return false;
  }

  bool string_byte(uint8_t c) {
    if (utf8 > 0) {  // a continuation byte, in the range the lead allows (no overlong forms, no surrogates)
      uint8_t lo = 0x80, hi = 0xBF;
      if (utf8_lead) {
        if (utf8_lead == 0xE0) lo = 0xA0;
        if (utf8_lead == 0xED) hi = 0x9F;
        if (utf8_lead == 0xF0) lo = 0x90;
        if (utf8_lead == 0xF4) hi = 0x8F;
        utf8_lead = 0;
      }
      if (c < lo || c > hi) return false;
      --utf8;
      return true;
    }
    if (need_low && c != '\\') return false;
    if (c == '"') {
      mode = key ? Mode::Colon : Mode::After;
      return true;
    }
    if (c == '\\') {
      mode = Mode::Escape;
      return true;
    }
    if (c < 0x20) return false;  // control characters must be escaped
    if (c < 0x80) return true;
    if (c >= 0xC2 && c <= 0xDF) utf8 = 1;
    else if (c >= 0xE0 && c <= 0xEF) utf8 = 2;
    else if (c >= 0xF0 && c <= 0xF4) utf8 = 3;
    else return false;
    utf8_lead = c;
    return true;
  }

  bool number_byte(uint8_t c) {
    const bool d = digit(c);
    switch (static_cast<NumState>(count)) {
      case Minus:
        if (!d) return false;
        count = c == '0' ? Zero : Int;
        digits = 1;
        return true;
      case Zero:
        if (c == '.') return count = Dot, true;
        if (c == 'e' || c == 'E') return count = Exp, true;
        break;  // the number ends
      case Int:
        if (d) return ++digits <= kMaxIntegerDigits;
        if (c == '.') return count = Dot, true;
        if (c == 'e' || c == 'E') return count = Exp, true;
        break;
      case Dot:
        if (!d) return false;
        count = Frac;
        return true;
      case Frac:
        if (d) return true;
        if (c == 'e' || c == 'E') return count = Exp, true;
        break;
      case Exp:
        if (c == '+' || c == '-') return count = ExpSign, true;
        [[fallthrough]];
      case ExpSign:
        if (!d) return false;
        count = ExpDigits;
        digits = 1;
        return true;
      case ExpDigits:
        if (d) return ++digits <= kMaxExponentDigits;
        break;
    }
    // A complete number ends at the byte after it, which the container then reads.
    mode = Mode::After;
    return step(c);
  }
};

// A trie node to visit with the recognizer's state there.
struct Frame {
  uint32_t node;
  Json state;
};

class JsonObjectConstraint final : public TokenConstraint {
 public:
  JsonObjectConstraint(std::shared_ptr<const TokenTrie> trie, std::vector<int32_t> end_tokens, int64_t vocab)
      : trie_(std::move(trie)), end_(std::move(end_tokens)), vocab_(vocab) {
    if (!trie_) fail("json_object constraint: no vocabulary trie");
    if (trie_->vocab > vocab_)
      fail("json_object constraint: the tokenizer has {} tokens but the model's vocabulary {}", trie_->vocab, vocab_);
  }

  void mask(std::span<float> logits, std::span<const int32_t> pending) const override {
    if (static_cast<int64_t>(logits.size()) != vocab_)
      fail("json_object constraint: {} logits for a vocabulary of {}", logits.size(), vocab_);
    Json s = state_;
    for (const int32_t t : pending)
      if (!advance(s, t)) fail("json_object constraint: draft token {} was not allowed where it stands", t);
    allowed_.assign(static_cast<size_t>(vocab_), 0);
    if (s.mode == Mode::Done) {
      for (const int32_t e : end_) allowed_[static_cast<size_t>(e)] = 1;
    } else if (s.mode == Mode::String && s.utf8 == 0 && !s.need_low) {
      std::call_once(trie_->strings_once, [&] { classify_string_tokens(); });
      for (const int32_t t : trie_->string_inner) allowed_[static_cast<size_t>(t)] = 1;
      for (const int32_t t : trie_->string_exit) {
        Json next = s;
        if (advance(next, t)) allowed_[static_cast<size_t>(t)] = 1;
      }
    } else {
      walk(s);
    }
    constexpr float kNo = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < logits.size(); ++i)
      if (!allowed_[i]) logits[i] = kNo;
  }

  void accept(int32_t token) override {
    if (!advance(state_, token)) fail("json_object constraint: token {} was not allowed here", token);
  }
  bool complete() const override { return state_.mode == Mode::Done; }
  std::string name() const override { return "response_format json_object"; }

 private:
  // Moves `s` past `token`'s bytes: false when they leave the language.
  bool advance(Json& s, int32_t token) const {
    if (s.mode == Mode::Done) return std::find(end_.begin(), end_.end(), token) != end_.end();
    if (token < 0 || token >= trie_->vocab) return false;
    const std::string& bytes = trie_->bytes[static_cast<size_t>(token)];
    if (bytes.empty()) return false;
    for (const char c : bytes)
      if (!s.step(static_cast<uint8_t>(c))) return false;
    return true;
  }
  // TokenTrie::string_inner / string_exit, from a string just opened inside an object.
  void classify_string_tokens() const {
    Json start;
    start.step('{');
    start.step('"');
    for (int32_t id = 0; id < trie_->vocab; ++id) {
      const std::string& bytes = trie_->bytes[static_cast<size_t>(id)];
      if (bytes.empty()) continue;
      Json s = start;
      bool ok = true, inside = true;
      for (const char c : bytes) {
        if (!s.step(static_cast<uint8_t>(c))) {
          ok = false;
          break;
        }
        if (s.mode != Mode::String && s.mode != Mode::Escape && s.mode != Mode::Unicode) {
          inside = false;
          break;
        }
      }
      if (!inside) trie_->string_exit.push_back(id);
      else if (ok) trie_->string_inner.push_back(id);
    }
  }
  // Every token whose bytes the recognizer takes from `s`: a depth-first walk of the trie that stops
  // where a byte is refused.
  void walk(const Json& s) const {
    std::vector<Frame>& stack = frames_;
    stack.clear();
    stack.push_back({0, s});
    while (!stack.empty()) {
      const Frame f = stack.back();
      stack.pop_back();
      const TokenTrie::Node& n = trie_->nodes[f.node];
      for (uint32_t e = 0; e < n.children; ++e) {
        const TokenTrie::Edge& edge = trie_->edges[n.first_child + e];
        Json next = f.state;
        if (!next.step(edge.byte)) continue;
        const TokenTrie::Node& child = trie_->nodes[edge.node];
        for (uint32_t i = 0; i < child.tokens; ++i) allowed_[static_cast<size_t>(trie_->ids[child.first_token + i])] = 1;
        if (child.children) stack.push_back({edge.node, next});
      }
    }
  }

  std::shared_ptr<const TokenTrie> trie_;
  std::vector<int32_t> end_;
  int64_t vocab_;
  Json state_;
  mutable std::vector<uint8_t> allowed_;  // scratch of mask()
  mutable std::vector<Frame> frames_;     // scratch of walk()
};

}  // namespace

std::unique_ptr<TokenConstraint> json_object_constraint(std::shared_ptr<const TokenTrie> trie,
                                                        std::vector<int32_t> end_tokens, int64_t vocab) {
  return std::make_unique<JsonObjectConstraint>(std::move(trie), std::move(end_tokens), vocab);
}

JsonPrefix check_json_object_prefix(std::string_view text) {
  Json s;
  for (const char c : text)
    if (!s.step(static_cast<uint8_t>(c))) return {};
  return {true, s.mode == Mode::Done};
}

}  // namespace specula

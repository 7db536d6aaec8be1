// The GBNF engine: a parser to flat rules, a matcher that keeps the set of parse stacks a prefix allows
// (llama.cpp's design: each stack a list of positions in the rules, the top a terminal), and a token
// constraint that masks a row by walking the vocabulary's byte trie. A walk from a stack whose top sits
// in free text visits most of the trie (~0.1 s), so the tokens each stack allows are kept per grammar,
// and a row's mask is the union over the current stacks of those kept sets (xgrammar's idea of a mask
// cache, keyed here by the whole stack: a string at one place of a schema has one stack each time).
// Written here rather than taken from a library: xgrammar's C++ core is not among the packages the
// project may use.
#include "specula/core/grammar.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <list>
#include <map>
#include <mutex>
#include <unordered_map>

#include "specula/error.hpp"
#include "token_trie.hpp"

namespace specula {
namespace gbnf {  // named, not anonymous: core is built as one unity file

enum class Op : uint8_t {
  End,    // the end of a rule's last alternative
  Alt,    // the end of an alternative; the next one follows
  Ref,    // value: a rule
  Set,    // value: a character set
  Token,  // value: a special token, by index into Grammar::tokens
};

struct Element {
  Op op = Op::End;
  uint32_t value = 0;
};

struct CharSet {
  bool negated = false;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive

  bool matches(uint32_t cp) const {
    for (const auto& [lo, hi] : ranges)
      if (cp >= lo && cp <= hi) return !negated;
    return negated;
  }
  // Whether some code point in [lo, hi] matches (a half-read UTF-8 character is still possible).
  bool intersects(uint32_t lo, uint32_t hi) const {
    if (!negated) {
      for (const auto& [a, b] : ranges)
        if (a <= hi && b >= lo) return true;
      return false;
    }
    // Negated: some point of [lo, hi] lies outside every range.
    std::vector<std::pair<uint32_t, uint32_t>> sorted = ranges;
    std::sort(sorted.begin(), sorted.end());
    uint32_t next = lo;
    for (const auto& [a, b] : sorted) {
      if (b < next) continue;
      if (a > next) return true;
      if (b >= hi) return false;
      next = b + 1;
    }
    return next <= hi;
  }
};

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr size_t kMaxGrammarBytes = size_t{1} << 20;   // 1 MiB of GBNF
constexpr size_t kMaxElements = size_t{1} << 22;       // after repetitions are unrolled
constexpr uint32_t kMaxRepetition = 10000;             // {m,n}
constexpr size_t kMaxStacks = 1024;                    // alive at once: more means a very ambiguous grammar
constexpr size_t kMaxStackDepth = 1024;                // nesting a prefix may reach (deeper: not allowed)
constexpr int kMaxExpandDepth = 4096;                  // rules entered without reading a character
constexpr size_t kMaxExpansions = 1 << 16;             // rules entered to read one character

}  // namespace gbnf

class Grammar {
 public:
  std::vector<gbnf::Element> elements;
  std::vector<uint32_t> rule_start;  // each rule's first element
  std::vector<std::string> rule_names;
  std::vector<gbnf::CharSet> sets;
  std::vector<std::string> tokens;  // "<|tool_call>" or "<[12]>"
  uint32_t root = 0;

  bool is_end(uint32_t pos) const { return elements[pos].op == gbnf::Op::End || elements[pos].op == gbnf::Op::Alt; }
  // The first elements of a rule's alternatives.
  template <typename F>
  void for_each_alternative(uint32_t rule, F&& f) const {
    uint32_t pos = rule_start[rule];
    while (true) {
      f(pos);
      while (!is_end(pos)) ++pos;
      if (elements[pos].op == gbnf::Op::End) return;
      ++pos;
    }
  }

  // The tokens each stack allows (see the file comment), per vocabulary trie.
  struct Masks {
    std::mutex mutex;
    const TokenTrie* trie = nullptr;
    std::unordered_map<std::string, std::shared_ptr<const std::vector<uint64_t>>> by_stack;
  };
  mutable Masks masks;
};

namespace gbnf {

// ---------------------------------------------------------------------------------------------------
// Parsing

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  std::shared_ptr<Grammar> parse(std::string_view root_name) {
    if (text_.size() > kMaxGrammarBytes) fail("grammar: {} bytes, more than the {} allowed", text_.size(), kMaxGrammarBytes);
    skip_space(true);
    while (!eof()) {
      parse_rule();
      skip_space(true);
    }
    for (size_t r = 0; r < rules_.size(); ++r)
      if (!defined_[r]) fail("grammar: rule '{}' is used but never defined", names_[r]);
    const auto root = symbols_.find(std::string(root_name));
    if (root == symbols_.end()) fail("grammar: no rule '{}' (the start rule)", root_name);
    auto g = std::make_shared<Grammar>();
    g->root = root->second;
    g->rule_names = names_;
    g->sets = std::move(sets_);
    g->tokens = std::move(tokens_);
    for (const auto& alternatives : rules_) {
      g->rule_start.push_back(static_cast<uint32_t>(g->elements.size()));
      for (size_t a = 0; a < alternatives.size(); ++a) {
        g->elements.insert(g->elements.end(), alternatives[a].begin(), alternatives[a].end());
        g->elements.push_back({a + 1 < alternatives.size() ? Op::Alt : Op::End, 0});
      }
    }
    check_left_recursion(*g);
    return g;
  }

 private:
  using Sequence = std::vector<Element>;
  using Alternatives = std::vector<Sequence>;

  [[noreturn]] void error(std::string_view what) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') ++line, column = 1;
      else ++column;
    }
    fail("grammar, line {} column {}: {}", line, column, what);
  }
  bool eof() const { return pos_ >= text_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }
  static bool word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  }
  // Spaces, tabs and comments; newlines too inside parentheses (a rule ends at a newline otherwise).
  void skip_space(bool newlines) {
    while (!eof()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else if (c == '#') {
        while (!eof() && peek() != '\n') ++pos_;
      } else {
        return;
      }
    }
  }
  std::string parse_name() {
    const size_t start = pos_;
    while (word_char(peek())) ++pos_;
    if (pos_ == start) error("expected a rule name");
    return std::string(text_.substr(start, pos_ - start));
  }
  uint32_t symbol(const std::string& name) {
    auto [it, added] = symbols_.try_emplace(name, static_cast<uint32_t>(rules_.size()));
    if (added) {
      rules_.emplace_back();
      names_.push_back(name);
      defined_.push_back(false);
    }
    return it->second;
  }
  uint32_t new_rule(Alternatives alternatives) {
    const uint32_t id = symbol(fmt::format("{}-{}", current_, rules_.size()));
    count(alternatives);
    rules_[id] = std::move(alternatives);
    defined_[id] = true;
    return id;
  }
  void count(const Alternatives& alternatives) {
    for (const auto& s : alternatives) elements_ += s.size() + 1;
    if (elements_ > kMaxElements) error(fmt::format("the grammar unrolls to more than {} elements", kMaxElements));
  }

  void parse_rule() {
    current_ = parse_name();
    const uint32_t id = symbol(current_);
    if (defined_[id]) error(fmt::format("rule '{}' is defined twice", current_));
    skip_space(false);
    if (text_.substr(pos_, 3) != "::=") error(fmt::format("expected '::=' after the rule name '{}'", current_));
    pos_ += 3;
    skip_space(true);
    Alternatives alternatives = parse_alternatives(false);
    skip_space(false);
    if (!eof() && peek() != '\n' && peek() != '\r') error(fmt::format("unexpected '{}'", peek()));
    count(alternatives);
    rules_[id] = std::move(alternatives);
    defined_[id] = true;
  }

  Alternatives parse_alternatives(bool nested) {
    Alternatives out{parse_sequence(nested)};
    while (peek() == '|') {
      ++pos_;
      skip_space(true);
      out.push_back(parse_sequence(nested));
    }
    return out;
  }

  Sequence parse_sequence(bool nested) {
    Sequence out;
    size_t last = out.size();  // where the last item starts (a repetition applies to it)
    while (!eof()) {
      const char c = peek();
      if (c == '"') {
        last = out.size();
        ++pos_;
        while (peek() != '"') {
          if (eof() || peek() == '\n') error("unterminated string literal");
          const uint32_t cp = parse_char();
          out.push_back({Op::Set, add_set({false, {{cp, cp}}})});
        }
        ++pos_;
      } else if (c == '[') {
        last = out.size();
        out.push_back({Op::Set, add_set(parse_class())});
      } else if (c == '.') {
        last = out.size();
        ++pos_;
        out.push_back({Op::Set, add_set({true, {}})});
      } else if (c == '<') {
        last = out.size();
        out.push_back({Op::Token, parse_token()});
      } else if (word_char(c)) {
        last = out.size();
        out.push_back({Op::Ref, symbol(parse_name())});
      } else if (c == '(') {
        ++pos_;
        skip_space(true);
        Alternatives group = parse_alternatives(true);
        if (peek() != ')') error("expected ')'");
        ++pos_;
        last = out.size();
        out.push_back({Op::Ref, new_rule(std::move(group))});
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last == out.size()) error(fmt::format("'{}' repeats nothing", c));
        repeat(out, last);
      } else {
        break;
      }
      skip_space(nested);
    }
    return out;
  }

  // A repetition of out[last..] (one item): rewritten into rules, as llama.cpp does.
  void repeat(Sequence& out, size_t last) {
    uint32_t min = 0, max = std::numeric_limits<uint32_t>::max();  // max: unbounded
    const char c = text_[pos_++];
    if (c == '+') min = 1;
    else if (c == '?') max = 1;
    else if (c == '{') {
      skip_space(false);
      min = parse_count();
      skip_space(false);
      if (peek() == ',') {
        ++pos_;
        skip_space(false);
        if (peek() != '}') max = parse_count();
      } else {
        max = min;
      }
      skip_space(false);
      if (peek() != '}') error("expected '}' closing the repetition");
      ++pos_;
      if (max < min) error(fmt::format("repetition {{{},{}}}: the maximum is below the minimum", min, max));
    }
    Sequence item(out.begin() + static_cast<std::ptrdiff_t>(last), out.end());
    out.resize(last);
    if (item.size() > 1) item = {{Op::Ref, new_rule({item})}};
    for (uint32_t i = 0; i < min; ++i) out.insert(out.end(), item.begin(), item.end());
    if (elements_ + out.size() > kMaxElements) error(fmt::format("the grammar unrolls to more than {} elements", kMaxElements));
    if (max == std::numeric_limits<uint32_t>::max()) {  // R ::= item R | (empty)
      const uint32_t r = symbol(fmt::format("{}-{}", current_, rules_.size()));
      Sequence more = item;
      more.push_back({Op::Ref, r});
      count({more, {}});
      rules_[r] = {more, {}};
      defined_[r] = true;
      out.push_back({Op::Ref, r});
    } else if (max > min) {  // item (item (item)?)?: one way to read each count
      uint32_t inner = new_rule({item, {}});
      for (uint32_t i = 1; i < max - min; ++i) {
        Sequence s = item;
        s.push_back({Op::Ref, inner});
        inner = new_rule({s, {}});
      }
      out.push_back({Op::Ref, inner});
    }
  }
  uint32_t parse_count() {
    uint64_t n = 0;
    const size_t start = pos_;
    while (peek() >= '0' && peek() <= '9') {
      n = n * 10 + static_cast<uint64_t>(peek() - '0');
      if (n > kMaxRepetition) error(fmt::format("a repetition count above {}", kMaxRepetition));
      ++pos_;
    }
    if (pos_ == start) error("expected a number in the repetition");
    return static_cast<uint32_t>(n);
  }

  CharSet parse_class() {  // at '['
    ++pos_;
    CharSet set;
    if (peek() == '^') {
      set.negated = true;
      ++pos_;
    }
    while (peek() != ']') {
      if (eof()) error("unterminated character class");
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < text_.size()) {
        ++pos_;
        hi = parse_char();
        if (hi < lo) error("a character range whose end is below its start");
      }
      set.ranges.emplace_back(lo, hi);
    }
    ++pos_;
    return set;
  }

  uint32_t parse_token() {  // at '<': <[id]> or the token's text up to '>'
    const size_t end = text_.find('>', pos_);
    if (end == std::string_view::npos) error("unterminated token '<...>'");
    const std::string name(text_.substr(pos_, end + 1 - pos_));
    pos_ = end + 1;
    const auto it = std::find(tokens_.begin(), tokens_.end(), name);
    if (it != tokens_.end()) return static_cast<uint32_t>(it - tokens_.begin());
    tokens_.push_back(name);
    return static_cast<uint32_t>(tokens_.size() - 1);
  }

  // One character of a literal or class: an escape or a UTF-8 sequence.
  uint32_t parse_char() {
    if (peek() == '\\') {
      if (++pos_ >= text_.size()) error("an escape '\\' at the end of the grammar");
      const char e = text_[pos_++];
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': case '.': case '(': case ')':
        case '|': case '*': case '+': case '?': case '{': case '}': case '<': case '>': case '\'':
          return static_cast<uint8_t>(e);
        default: pos_ -= 2; error(fmt::format("unknown escape '\\{}'", e));
      }
    }
    const auto b = static_cast<uint8_t>(text_[pos_]);
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + static_cast<size_t>(n) > text_.size()) error("invalid UTF-8 in the grammar");
    uint32_t cp = n == 1 ? b : b & (0x3F >> (n - 1));
    for (int i = 1; i < n; ++i) {
      const auto c = static_cast<uint8_t>(text_[pos_ + static_cast<size_t>(i)]);
      if ((c & 0xC0) != 0x80) error("invalid UTF-8 in the grammar");
      cp = (cp << 6) | (c & 0x3F);
    }
    pos_ += static_cast<size_t>(n);
    return cp;
  }
  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = peek();
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) error(fmt::format("expected {} hexadecimal digits", digits));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > kMaxCodePoint) error("a code point above U+10FFFF");
    return v;
  }
  uint32_t add_set(CharSet set) {
    sets_.push_back(std::move(set));
    return static_cast<uint32_t>(sets_.size() - 1);
  }

  // A rule that can reach itself without reading a character would make the matcher loop: refused.
  void check_left_recursion(const Grammar& g) const {
    const size_t n = g.rule_start.size();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        g.for_each_alternative(r, [&](uint32_t pos) {
          while (!g.is_end(pos) && g.elements[pos].op == Op::Ref && nullable[g.elements[pos].value]) ++pos;
          if (g.is_end(pos)) nullable[r] = 1;
        });
        changed |= nullable[r] != 0;
      }
    }
    // Rules each rule may enter first; then a depth-first search for a cycle.
    std::vector<std::vector<uint32_t>> first(n);
    for (uint32_t r = 0; r < n; ++r)
      g.for_each_alternative(r, [&](uint32_t pos) {
        for (; !g.is_end(pos) && g.elements[pos].op == Op::Ref; ++pos) {
          first[r].push_back(g.elements[pos].value);
          if (!nullable[g.elements[pos].value]) break;
        }
      });
    std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
    for (uint32_t start = 0; start < n; ++start) {
      if (color[start]) continue;
      std::vector<std::pair<uint32_t, size_t>> path{{start, 0}};
      color[start] = 1;
      while (!path.empty()) {
        auto& [r, i] = path.back();
        if (i == first[r].size()) {
          color[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t next = first[r][i++];
        if (color[next] == 1) fail("grammar: rule '{}' is left-recursive (it can reach itself before reading a character)", g.rule_names[next]);
        if (color[next] == 0) {
          color[next] = 1;
          path.push_back({next, 0});
        }
      }
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
  std::map<std::string, uint32_t> symbols_;
  std::vector<Alternatives> rules_;
  std::vector<std::string> names_;
  std::vector<bool> defined_;
  std::vector<CharSet> sets_;
  std::vector<std::string> tokens_;
  std::string current_;
  size_t elements_ = 0;
};

// ---------------------------------------------------------------------------------------------------
// Matching

// A UTF-8 character half read: the bits so far and how many continuation bytes are still due.
struct Partial {
  uint32_t cp = 0;
  uint8_t left = 0;
  uint8_t length = 0;
  bool operator==(const Partial&) const = default;
};

// A set of stacks, flat: for each, its depth, then its positions bottom to top. Depth 0: the grammar is
// complete there.
using Stacks = std::vector<uint32_t>;

template <typename F>
void for_each_stack(const Stacks& s, F&& f) {
  for (size_t i = 0; i < s.size(); i += 1 + s[i]) f(std::span<const uint32_t>(s.data() + i + 1, s[i]));
}

class Matcher {
 public:
  explicit Matcher(const Grammar& g) : g_(g) {}

  Stacks start() {
    Stacks out;
    expansions_ = 0;
    // The root rule's alternatives, as if referenced from a one-element rule.
    g_.for_each_alternative(g_.root, [&](uint32_t pos) {
      work_.clear();
      if (!g_.is_end(pos)) work_.push_back(pos);
      expand(out, 0);
    });
    return out;
  }

  // Reads one byte: false when no stack can take it.
  bool step_byte(const Stacks& in, Partial& p, uint8_t b, Stacks& out) {
    out.clear();
    if (p.left == 0) {
      if (b < 0x80) return step_char(in, b, out);
      if (b >= 0xC2 && b <= 0xDF) p = {b & 0x1Fu, 1, 2};
      else if (b >= 0xE0 && b <= 0xEF) p = {b & 0x0Fu, 2, 3};
      else if (b >= 0xF0 && b <= 0xF4) p = {b & 0x07u, 3, 4};
      else return false;
    } else {
      if ((b & 0xC0) != 0x80) return false;
      p.cp = (p.cp << 6) | (b & 0x3Fu);
      if (--p.left == 0) {
        const uint32_t cp = p.cp;
        const uint32_t least = p.length == 2 ? 0x80 : p.length == 3 ? 0x800 : 0x10000;
        p = {};
        if (cp < least || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        return step_char(in, cp, out);
      }
    }
    // Half a character: go on while some stack could still take a character that starts so.
    // (Overlong forms, surrogates and points past U+10FFFF are ruled out here, not only at the last byte:
    // a token ending in such a half would leave nothing to follow it.)
    const uint32_t least = p.length == 2 ? 0x80 : p.length == 3 ? 0x800 : 0x10000;
    const uint32_t lo = std::max(p.cp << (6 * p.left), least);
    const uint32_t hi = std::min((p.cp << (6 * p.left)) | ((1u << (6 * p.left)) - 1), kMaxCodePoint);
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return false;
    bool possible = false;
    for_each_stack(in, [&](std::span<const uint32_t> s) {
      if (!possible && !s.empty() && g_.elements[s.back()].op == Op::Set) possible = g_.sets[g_.elements[s.back()].value].intersects(lo, hi);
    });
    if (possible) out = in;
    return possible;
  }

  bool step_char(const Stacks& in, uint32_t cp, Stacks& out) {
    return step_where(in, out, [&](const Element& e) { return e.op == Op::Set && g_.sets[e.value].matches(cp); });
  }
  bool step_token(const Stacks& in, uint32_t token, Stacks& out) {
    return step_where(in, out, [&](const Element& e) { return e.op == Op::Token && e.value == token; });
  }

 private:
  // Moves every stack whose top terminal `takes` past it.
  template <typename Takes>
  bool step_where(const Stacks& in, Stacks& out, Takes&& takes) {
    out.clear();
    expansions_ = 0;
    for_each_stack(in, [&](std::span<const uint32_t> s) {
      if (s.empty() || !takes(g_.elements[s.back()])) return;
      work_.assign(s.begin(), s.end() - 1);
      if (!g_.is_end(s.back() + 1)) work_.push_back(s.back() + 1);
      expand(out, 0);
    });
    return !out.empty();
  }

  // Adds to `out` the stacks `work_` stands for, each with a terminal on top (or empty: complete).
  // Leaves work_ as it found it.
  void expand(Stacks& out, int depth) {
    if (work_.empty() || g_.elements[work_.back()].op != Op::Ref) return add(out);
    if (depth > kMaxExpandDepth) fail("grammar: more than {} rules entered without reading a character", kMaxExpandDepth);
    // Rules that may be empty, nested and repeated, can read nothing in exponentially many ways.
    if (++expansions_ > kMaxExpansions)
      fail("grammar: more than {} ways to read the output at one character; make the grammar less ambiguous "
           "(e.g. no repeated rules that may be empty)", kMaxExpansions);
    const uint32_t pos = work_.back();
    work_.pop_back();
    const size_t base = work_.size();
    if (!g_.is_end(pos + 1)) work_.push_back(pos + 1);
    const size_t below = work_.size();
    g_.for_each_alternative(g_.elements[pos].value, [&](uint32_t alt) {
      if (!g_.is_end(alt)) work_.push_back(alt);
      expand(out, depth + 1);
      work_.resize(below);
    });
    work_.resize(base);
    work_.push_back(pos);
  }
  void add(Stacks& out) {
    if (work_.size() > kMaxStackDepth) return;  // nesting past the bound: not allowed
    bool seen = false;
    for_each_stack(out, [&](std::span<const uint32_t> s) {
      seen = seen || std::equal(s.begin(), s.end(), work_.begin(), work_.end());
    });
    if (seen) return;
    if (count_guard(out) + 1 > kMaxStacks) fail("grammar: more than {} ways to read the output at once; make the grammar less ambiguous", kMaxStacks);
    out.push_back(static_cast<uint32_t>(work_.size()));
    out.insert(out.end(), work_.begin(), work_.end());
  }
  static size_t count_guard(const Stacks& out) {
    size_t n = 0;
    for_each_stack(out, [&](std::span<const uint32_t>) { ++n; });
    return n;
  }

  const Grammar& g_;
  std::vector<uint32_t> work_;
  size_t expansions_ = 0;  // in the current step
};

bool is_complete(const Stacks& s, const Partial& p) {
  bool done = false;
  for_each_stack(s, [&](std::span<const uint32_t> st) { done = done || st.empty(); });
  return done && p.left == 0;
}

// ---------------------------------------------------------------------------------------------------
// The token constraint

constexpr size_t kMaxKeptMasks = 512;  // per grammar: 32 KiB each over Gemma's vocabulary

class GrammarConstraint final : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Tokenizer> tokenizer,
                    std::vector<int32_t> end_tokens, int64_t vocab, std::string name)
      : g_(std::move(grammar)), trie_(token_trie(tokenizer)), end_(std::move(end_tokens)), vocab_(vocab),
        name_(std::move(name)), matcher_(*g_) {
    if (trie_->vocab > vocab_) fail("{}: the tokenizer has {} tokens but the model's vocabulary {}", name_, trie_->vocab, vocab_);
    for (const std::string& t : g_->tokens) {
      std::optional<int32_t> id;
      if (t.size() > 4 && t[1] == '[' && t[t.size() - 2] == ']') {
        try {
          id = std::stoi(t.substr(2, t.size() - 4));
        } catch (const std::exception&) {
        }
      } else {
        id = tokenizer->token_id(t);
      }
      if (!id || *id < 0 || *id >= vocab_) fail("{}: the grammar names the token {}, which the vocabulary lacks", name_, t);
      token_ids_.push_back(*id);
    }
    stacks_ = matcher_.start();
    size_t longest = 0;
    for (const std::string& b : trie_->bytes) longest = std::max(longest, b.size());
    scratch_.resize(longest + 1);  // walk() holds references into it while it recurses
  }

  void mask(std::span<float> logits, std::span<const int32_t> pending) const override {
    if (static_cast<int64_t>(logits.size()) != vocab_) fail("{}: {} logits for a vocabulary of {}", name_, logits.size(), vocab_);
    State s{stacks_, partial_, finished_};
    for (const int32_t t : pending)
      if (!advance(s, t)) fail("{}: draft token {} was not allowed where it stands", name_, t);
    allowed_.assign((static_cast<size_t>(vocab_) + 63) / 64, 0);
    if (s.finished) {
      for (const int32_t e : end_) allow(e);
    } else {
      for_each_stack(s.stacks, [&](std::span<const uint32_t> st) {
        if (st.empty()) return;
        const Element& top = g_->elements[st.back()];
        if (top.op == Op::Token) {
          if (s.partial.left == 0) allow(token_ids_[top.value]);
          return;
        }
        const auto kept = tokens_from(st, s.partial);
        for (size_t w = 0; w < kept->size(); ++w) allowed_[w] |= (*kept)[w];
      });
      if (is_complete(s.stacks, s.partial))
        for (const int32_t e : end_) allow(e);
    }
    bool any = false;
    constexpr float kNo = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < logits.size(); ++i) {
      if ((allowed_[i / 64] >> (i % 64)) & 1) any = true;
      else logits[i] = kNo;
    }
    if (!any) fail("{}: no token of the vocabulary can continue the output here (the grammar asks for a character no token spells)", name_);
  }

  void accept(int32_t token) override {
    State s{stacks_, partial_, finished_};
    if (!advance(s, token)) fail("{}: token {} was not allowed here", name_, token);
    stacks_ = std::move(s.stacks);
    partial_ = s.partial;
    finished_ = s.finished;
  }
  bool complete() const override { return finished_ || is_complete(stacks_, partial_); }
  std::string name() const override { return name_; }

 private:
  struct State {
    Stacks stacks;
    Partial partial;
    bool finished = false;  // an end token was taken
  };

  void allow(int32_t id) const { allowed_[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64); }

  bool advance(State& s, int32_t token) const {
    const bool end = std::find(end_.begin(), end_.end(), token) != end_.end();
    if (s.finished) return end;  // (a drafter may draft past the end: only more ends, never used)
    if (end && is_complete(s.stacks, s.partial)) {
      s.finished = true;
      return true;
    }
    Stacks next;
    if (s.partial.left == 0)
      for (size_t i = 0; i < token_ids_.size(); ++i)
        if (token_ids_[i] == token && matcher_.step_token(s.stacks, static_cast<uint32_t>(i), next)) {
          s.stacks = std::move(next);
          return true;
        }
    if (token < 0 || token >= trie_->vocab) return false;
    const std::string& bytes = trie_->bytes[static_cast<size_t>(token)];
    if (bytes.empty()) return false;
    for (const char c : bytes) {
      if (!matcher_.step_byte(s.stacks, s.partial, static_cast<uint8_t>(c), next)) return false;
      std::swap(s.stacks, next);
    }
    return true;
  }

  // The byte tokens one stack allows: kept per grammar, else found by a walk of the trie.
  std::shared_ptr<const std::vector<uint64_t>> tokens_from(std::span<const uint32_t> stack, const Partial& p) const {
    std::string key{static_cast<char>(p.left), static_cast<char>(p.length)};
    key.append(reinterpret_cast<const char*>(&p.cp), sizeof p.cp);
    key.append(reinterpret_cast<const char*>(stack.data()), stack.size_bytes());
    Grammar::Masks& masks = g_->masks;
    {
      std::lock_guard lock(masks.mutex);
      if (masks.trie != trie_.get()) {
        masks.by_stack.clear();
        masks.trie = trie_.get();
      }
      if (auto it = masks.by_stack.find(key); it != masks.by_stack.end()) return it->second;
    }
    auto bits = std::make_shared<std::vector<uint64_t>>((static_cast<size_t>(vocab_) + 63) / 64, 0);
    Stacks one{static_cast<uint32_t>(stack.size())};
    one.insert(one.end(), stack.begin(), stack.end());
    walk(0, one, p, *bits, 0);
    std::lock_guard lock(masks.mutex);
    if (masks.trie != trie_.get()) return bits;
    if (masks.by_stack.size() >= kMaxKeptMasks) masks.by_stack.clear();
    masks.by_stack.emplace(std::move(key), bits);
    return bits;
  }

  // Depth-first over the trie below `node`, `in` being the stacks there: marks the tokens that end
  // where some stack is still alive.
  void walk(uint32_t node, const Stacks& in, const Partial& p, std::vector<uint64_t>& bits, size_t depth) const {
    const TokenTrie::Node& n = trie_->nodes[node];
    for (uint32_t e = 0; e < n.children; ++e) {
      const TokenTrie::Edge& edge = trie_->edges[n.first_child + e];
      Partial next_p = p;
      Stacks& next = scratch_[depth];
      if (!matcher_.step_byte(in, next_p, edge.byte, next)) continue;
      const TokenTrie::Node& child = trie_->nodes[edge.node];
      for (uint32_t i = 0; i < child.tokens; ++i) {
        const auto id = static_cast<size_t>(trie_->ids[child.first_token + i]);
        bits[id / 64] |= uint64_t{1} << (id % 64);
      }
      if (child.children) walk(edge.node, next, next_p, bits, depth + 1);
    }
  }

  std::shared_ptr<const Grammar> g_;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<int32_t> end_;
  int64_t vocab_;
  std::string name_;
  std::vector<int32_t> token_ids_;  // by Grammar::tokens index
  mutable Matcher matcher_;
  Stacks stacks_;
  Partial partial_;
  bool finished_ = false;
  mutable std::vector<uint64_t> allowed_;    // scratch of mask()
  mutable std::vector<Stacks> scratch_;       // of walk(), by depth
};

}  // namespace gbnf

std::shared_ptr<const Grammar> parse_gbnf(std::string_view text, std::string_view root) {
  return gbnf::Parser(text).parse(root);
}

std::shared_ptr<const Grammar> shared_gbnf(std::string_view text) {
  // The few grammars used last, so that a schema sent again finds its masks computed.
  static std::mutex mutex;
  static std::list<std::pair<std::string, std::shared_ptr<const Grammar>>> recent;
  constexpr size_t kKept = 16;
  {
    std::lock_guard lock(mutex);
    for (auto it = recent.begin(); it != recent.end(); ++it)
      if (it->first == text) {
        recent.splice(recent.begin(), recent, it);
        return it->second;
      }
  }
  auto g = parse_gbnf(text);
  std::lock_guard lock(mutex);
  recent.emplace_front(std::string(text), g);
  if (recent.size() > kKept) recent.pop_back();
  return g;
}

GrammarPrefix check_grammar_prefix(const Grammar& grammar, std::string_view text) {
  gbnf::Matcher m(grammar);
  gbnf::Stacks s = m.start(), next;
  gbnf::Partial p;
  for (const char c : text) {
    if (!m.step_byte(s, p, static_cast<uint8_t>(c), next)) return {};
    std::swap(s, next);
  }
  return {true, gbnf::is_complete(s, p)};
}

std::unique_ptr<TokenConstraint> grammar_constraint(std::shared_ptr<const Grammar> grammar,
                                                    std::shared_ptr<const Tokenizer> tokenizer,
                                                    std::vector<int32_t> end_tokens, int64_t vocab, std::string name) {
  if (!grammar) fail("grammar_constraint: no grammar");
  if (!tokenizer) fail("{} needs the model's tokenizer, and this model has none", name);
  return std::make_unique<gbnf::GrammarConstraint>(std::move(grammar), std::move(tokenizer), std::move(end_tokens), vocab,
                                             std::move(name));
}

}  // namespace specula

// JSON Schema, regular expressions and Gemma 4 tool calls compiled to GBNF text for the grammar engine
// (grammar.cpp). Strings are sets of code-point ranges so that a pattern's classes can be kept inside a
// JSON string (quote, backslash and control characters escaped or left out); integer bounds become digit
// ranges; everything else maps one keyword to one rule.
#include "specula/core/json_schema_grammar.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "specula/error.hpp"

namespace specula {
namespace schema_grammar {  // named, not anonymous: core is built as one unity file

// Ordered: an object's properties are written in the order the schema gives them.
using json = nlohmann::ordered_json;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code points, inclusive, sorted, disjoint

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxDepth = 64;                   // schema nesting (refs aside)
constexpr size_t kMaxGrammarBytes = 200000;     // of GBNF: a hostile schema cannot grow it without bound
constexpr int64_t kMaxCount = 10000;            // maxLength, maxItems, {m,n} (the engine's own bound too)
constexpr size_t kMaxPatternBytes = 10000;      // of a regular expression
constexpr int kMaxGemmaDepth = 24;              // schema nesting in the Gemma 4 spelling: see any_value
constexpr int kGemmaAnyDepth = 8;               // nesting of a free value there: 24 + 8 stays within kMaxToolCallDepth
constexpr int64_t kMaxMagnitude = 999999999999999;  // 15 digits: integers every parser reads exactly

// ---------------------------------------------------------------------------------------------------
// Text of GBNF terminals

std::string hex_escape(uint32_t cp) {
  return cp <= 0xFF ? fmt::format("\\x{:02X}", cp) : cp <= 0xFFFF ? fmt::format("\\u{:04X}", cp) : fmt::format("\\U{:08X}", cp);
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// A GBNF string literal spelling `text` (UTF-8).
std::string literal(std::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    const auto c = static_cast<uint8_t>(ch);
    if (c == '"' || c == '\\') out += '\\', out += ch;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) out += hex_escape(c);
    else out += ch;
  }
  return out + "\"";
}

std::string class_char(uint32_t cp) {
  if (cp == ']' || cp == '\\' || cp == '^' || cp == '-' || cp == '"') return std::string("\\") + static_cast<char>(cp);
  if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) return hex_escape(cp);
  std::string s;
  append_utf8(s, cp);
  return s;
}

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (const auto& [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) out.back().second = std::max(out.back().second, hi);
    else out.emplace_back(lo, hi);
  }
  return out;
}
Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : normalize(r)) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}
Ranges subtract(const Ranges& a, const Ranges& b) {
  Ranges keep = complement(b), out;
  for (const auto& [lo, hi] : normalize(a))
    for (const auto& [klo, khi] : keep)
      if (std::max(lo, klo) <= std::min(hi, khi)) out.emplace_back(std::max(lo, klo), std::min(hi, khi));
  return out;
}
bool contains(const Ranges& r, uint32_t cp) {
  return std::any_of(r.begin(), r.end(), [&](const auto& p) { return cp >= p.first && cp <= p.second; });
}

std::string char_class(const Ranges& r) {
  if (r.empty()) fail("a character class that matches nothing");
  std::string out = "[";
  for (const auto& [lo, hi] : r) {
    out += class_char(lo);
    if (hi != lo) out += "-" + class_char(hi);
  }
  return out + "]";
}

// How a pattern's characters are written: as they are, inside a JSON string (quote and backslash escaped,
// control characters left out), or inside a Gemma 4 string (no '<': it could spell the closing token).
enum class CharContext { Raw, JsonString, GemmaString };

std::string chars(const Ranges& set, CharContext ctx) {
  if (ctx == CharContext::Raw) return char_class(normalize(set));
  if (ctx == CharContext::GemmaString) return char_class(subtract(set, {{'<', '<'}}));
  const Ranges plain = subtract(set, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}});
  std::vector<std::string> alts;
  if (!plain.empty()) alts.push_back(char_class(plain));
  if (contains(set, '"')) alts.push_back(literal("\\\""));
  if (contains(set, '\\')) alts.push_back(literal("\\\\"));
  // The control characters patterns name in practice, by their one short escape (others are left out).
  for (const auto& [cp, escape] : {std::pair{'\n', "\\n"}, std::pair{'\r', "\\r"}, std::pair{'\t', "\\t"}})
    if (contains(set, static_cast<uint32_t>(cp))) alts.push_back(literal(escape));
  if (alts.empty()) fail("a character class that matches only control characters other than \\n \\r \\t, which this grammar does not write in a JSON string");
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

std::string repeat(const std::string& item, int64_t min, int64_t max) {  // max < 0: unbounded
  if (min > kMaxCount || max > kMaxCount) fail("a repetition count above {}", kMaxCount);
  if (max < 0) return fmt::format("{}{{{},}}", item, min);
  if (min == max) return min == 1 ? item : fmt::format("{}{{{}}}", item, min);
  return fmt::format("{}{{{},{}}}", item, min, max);
}

// ---------------------------------------------------------------------------------------------------
// Regular expressions (ECMAScript subset) to a GBNF expression

class RegexCompiler {
 public:
  RegexCompiler(std::string_view pattern, CharContext ctx) : p_(pattern), ctx_(ctx) {
    if (pattern.size() > kMaxPatternBytes) fail("regex: {} bytes, more than the {} allowed", pattern.size(), kMaxPatternBytes);
  }

  std::string compile() {
    if (!p_.empty() && p_[0] == '^') ++i_;
    std::string out = alternatives().text;
    if (i_ < p_.size()) error(p_[i_] == ')' ? "an unmatched ')'" : fmt::format("unexpected '{}'", p_[i_]));
    return out.empty() ? "\"\"" : out;
  }

 private:
  // A GBNF expression, and whether it matches the empty string (repeating such a thing would be
  // ambiguous without end, or left-recursive).
  struct Expr {
    std::string text;
    bool nullable = true;
  };

  [[noreturn]] void error(const std::string& what) const { fail("regex at offset {}: {}", i_, what); }
  bool at_end() const { return i_ >= p_.size(); }
  // Whether the rest of the pattern closes groups only ("(a|b$)" ends there; "(a$)b" could never match).
  bool only_closings_follow() const {
    return std::all_of(p_.begin() + static_cast<std::ptrdiff_t>(i_), p_.end(), [](char c) { return c == ')'; });
  }

  Expr alternatives() {
    std::vector<Expr> alts{sequence()};
    while (!at_end() && p_[i_] == '|') {
      ++i_;
      alts.push_back(sequence());
    }
    if (alts.size() == 1) return alts[0];
    Expr out{"(", false};
    for (size_t k = 0; k < alts.size(); ++k) {
      out.text += (k ? " | " : "") + (alts[k].text.empty() ? std::string("\"\"") : alts[k].text);
      out.nullable = out.nullable || alts[k].nullable;
    }
    out.text += ")";
    return out;
  }

  Expr sequence() {
    Expr out;
    while (!at_end() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$') {
        ++i_;
        if (!only_closings_follow() && !(depth_ == 0 && p_[i_] == '|')) error("'$' is supported only at the end");
        continue;
      }
      const Expr item = quantified(atom());
      out.text += (out.text.empty() ? "" : " ") + item.text;
      out.nullable = out.nullable && item.nullable;
    }
    return out;
  }

  Expr quantified(Expr atom) {
    if (at_end()) return atom;
    int64_t min = 1, max = 1;
    const char q = p_[i_];
    if (q == '*') min = 0, max = -1, ++i_;
    else if (q == '+') min = 1, max = -1, ++i_;
    else if (q == '?') min = 0, max = 1, ++i_;
    else if (q == '{' && i_ + 1 < p_.size() && std::isdigit(static_cast<unsigned char>(p_[i_ + 1]))) {
      ++i_;
      min = number();
      max = min;
      if (!at_end() && p_[i_] == ',') {
        ++i_;
        max = !at_end() && p_[i_] == '}' ? -1 : number();
      }
      if (at_end() || p_[i_] != '}') error("expected '}' closing a repetition");
      ++i_;
      if (max >= 0 && max < min) error("a repetition whose maximum is below its minimum");
    } else {
      return atom;
    }
    if (!at_end() && p_[i_] == '?') ++i_;  // lazy: the same language
    if (!at_end() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?')) error("a quantifier after a quantifier");
    if (atom.nullable && !(min == 0 && max == 1)) error("a repeated part that can match the empty string (such as (a|)* or (b?){2,})");
    const std::string a = "(" + atom.text + ")";
    const bool nullable = min == 0;
    if (min == 0 && max == 1) return {a + "?", true};
    if (min == 0 && max < 0) return {a + "*", true};
    if (min == 1 && max < 0) return {a + "+", false};
    return {repeat(a, min, max), nullable};
  }
  int64_t number() {
    int64_t n = 0;
    const size_t start = i_;
    while (!at_end() && std::isdigit(static_cast<unsigned char>(p_[i_]))) {
      n = n * 10 + (p_[i_++] - '0');
      if (n > kMaxCount) error(fmt::format("a repetition count above {}", kMaxCount));
    }
    if (i_ == start) error("expected a number");
    return n;
  }

  Expr atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (p_.substr(i_, 2) == "?:") i_ += 2;
      else if (p_.substr(i_, 2) == "?<" && p_.substr(i_, 3) != "?<=" && p_.substr(i_, 3) != "?<!") {
        const size_t end = p_.find('>', i_);
        if (end == std::string_view::npos) error("an unterminated group name");
        i_ = end + 1;
      } else if (!at_end() && p_[i_] == '?') {
        error("lookahead and lookbehind are not supported");
      }
      if (++depth_ > kMaxDepth) error(fmt::format("groups nest deeper than {} levels", kMaxDepth));
      const Expr inner = alternatives();
      if (at_end() || p_[i_] != ')') error("an unclosed '('");
      ++i_;
      --depth_;
      return {"(" + (inner.text.empty() ? std::string("\"\"") : inner.text) + ")", inner.nullable};
    }
    if (c == '[') return {chars(char_set(), ctx_), false};
    if (c == '.') {
      ++i_;
      // ECMAScript's line terminators: LF, CR, U+2028, U+2029.
      return {chars(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}), ctx_), false};
    }
    if (c == '^') error("'^' is supported only at the start");
    if (c == '*' || c == '+' || c == '?' || c == '{') error(fmt::format("'{}' repeats nothing", c));
    if (c == '\\') {
      const Ranges r = escape(false);
      return {chars(r, ctx_), false};
    }
    const uint32_t cp = utf8();
    return {chars({{cp, cp}}, ctx_), false};
  }

  uint32_t utf8() {
    const auto b = static_cast<uint8_t>(p_[i_]);
    const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + static_cast<size_t>(n) > p_.size()) error("invalid UTF-8");
    uint32_t cp = n == 1 ? b : b & (0x3F >> (n - 1));
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(p_[i_ + static_cast<size_t>(k)]) & 0x3F);
    i_ += static_cast<size_t>(n);
    return cp;
  }

  // At '\': the set it stands for. In a class, \b is a backspace.
  Ranges escape(bool in_class) {
    ++i_;
    if (at_end()) error("a '\\' at the end");
    const char e = p_[i_++];
    static const Ranges digit = {{'0', '9'}}, word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}},
                        space = {{'\t', '\r'}, {' ', ' '}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                                       {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
    switch (e) {
      case 'd': return digit;
      case 'D': return complement(digit);
      case 'w': return word;
      case 'W': return complement(word);
      case 's': return space;
      case 'S': return complement(space);
      case 'n': return {{'\n', '\n'}};
      case 'r': return {{'\r', '\r'}};
      case 't': return {{'\t', '\t'}};
      case 'f': return {{'\f', '\f'}};
      case 'v': return {{'\v', '\v'}};
      case '0': return {{0, 0}};
      case 'x': return single(hex(2));
      case 'u': return single(hex(4));
      case 'b':
        if (in_class) return {{'\b', '\b'}};
        error("word boundaries (\\b) are not supported");
      case 'B': error("\\B is not supported");
      default:
        if (e >= '1' && e <= '9') error("backreferences are not supported");
        if (std::isalnum(static_cast<unsigned char>(e))) error(fmt::format("unknown escape '\\{}'", e));
        return single(static_cast<uint8_t>(e));
    }
  }
  static Ranges single(uint32_t cp) { return {{cp, cp}}; }
  uint32_t hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (at_end() || !std::isxdigit(static_cast<unsigned char>(p_[i_]))) error(fmt::format("expected {} hexadecimal digits", digits));
      const char c = p_[i_++];
      v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return v;
  }

  Ranges char_set() {  // at '['
    ++i_;
    bool negated = false;
    if (!at_end() && p_[i_] == '^') negated = true, ++i_;
    Ranges set;
    bool first = true;
    while (true) {
      if (at_end()) error("an unclosed '['");
      if (p_[i_] == ']' && !first) break;
      first = false;
      Ranges item;
      if (p_[i_] == '\\') item = escape(true);
      else {
        const uint32_t cp = utf8();
        item = single(cp);
      }
      if (item.size() == 1 && item[0].first == item[0].second && i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        Ranges end = p_[i_] == '\\' ? escape(true) : Ranges{};
        const uint32_t hi = end.empty() ? utf8() : end[0].first;
        if (!end.empty() && (end.size() != 1 || end[0].first != end[0].second)) error("a range ending in a class");
        if (hi < item[0].first) error("a range whose end is below its start");
        item[0].second = hi;
      }
      set.insert(set.end(), item.begin(), item.end());
    }
    ++i_;
    set = normalize(set);
    return negated ? complement(set) : set;
  }

  std::string_view p_;
  CharContext ctx_;
  size_t i_ = 0;
  int depth_ = 0;  // groups open at i_
};

// ---------------------------------------------------------------------------------------------------
// Integer ranges as digit classes

// Equal-length decimal strings lo <= hi: the GBNF of every number between them (digit by digit).
std::string same_length(const std::string& lo, const std::string& hi) {
  if (lo == hi) return literal(lo);
  if (lo.size() == 1) return fmt::format("[{}-{}]", lo, hi);
  if (lo[0] == hi[0]) return literal(lo.substr(0, 1)) + " " + same_length(lo.substr(1), hi.substr(1));
  const size_t rest = lo.size() - 1;
  const std::string nines(rest, '9'), zeros(rest, '0');
  std::vector<std::string> alts;
  char first_full = lo[0], last_full = hi[0];  // leading digits whose every continuation is in range
  if (lo.substr(1) != zeros) {
    alts.push_back(literal(lo.substr(0, 1)) + " " + same_length(lo.substr(1), nines));
    ++first_full;
  }
  const bool hi_partial = hi.substr(1) != nines;
  if (hi_partial) --last_full;
  if (first_full <= last_full)
    alts.push_back((first_full == last_full ? literal(std::string(1, first_full)) : fmt::format("[{}-{}]", first_full, last_full)) +
                   " " + repeat("[0-9]", static_cast<int64_t>(rest), static_cast<int64_t>(rest)));
  if (hi_partial) alts.push_back(literal(hi.substr(0, 1)) + " " + same_length(zeros, hi.substr(1)));
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t k = 0; k < alts.size(); ++k) out += (k ? " | " : "") + alts[k];
  return out + ")";
}

// Non-negative integers lo..hi without leading zeros; "" when empty.
std::string natural_range(int64_t lo, int64_t hi) {
  if (lo > hi) return "";
  std::vector<std::string> alts;
  for (size_t len = std::to_string(lo).size(); len <= std::to_string(hi).size(); ++len) {
    const int64_t first = len == 1 ? 0 : static_cast<int64_t>(std::pow(10.0, static_cast<double>(len - 1)));
    const int64_t last = static_cast<int64_t>(std::pow(10.0, static_cast<double>(len))) - 1;
    const int64_t a = std::max(lo, first), b = std::min(hi, last);
    if (a <= b) alts.push_back(same_length(std::to_string(a), std::to_string(b)));
  }
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t k = 0; k < alts.size(); ++k) out += (k ? " | " : "") + alts[k];
  return out + ")";
}

// Integers lo..hi (either sign).
std::string integer_range(int64_t lo, int64_t hi) {
  std::vector<std::string> alts;
  if (lo < 0) {
    const std::string neg = natural_range(std::max<int64_t>(1, -hi), -lo);
    if (!neg.empty()) alts.push_back("\"-\" " + neg);
  }
  if (hi >= 0) {
    const std::string pos = natural_range(std::max<int64_t>(0, lo), hi);
    if (!pos.empty()) alts.push_back(pos);
  }
  if (alts.empty()) return "";
  return alts.size() == 1 ? alts[0] : "(" + alts[0] + " | " + alts[1] + ")";
}

// ---------------------------------------------------------------------------------------------------
// JSON Schema

const std::set<std::string> kIgnored = {"description", "title", "default", "examples", "$schema", "$id", "$comment",
                                        "strict", "deprecated", "readOnly", "writeOnly"};
const std::set<std::string> kSupported = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
    "$defs", "definitions", "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern",
    "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};

class SchemaCompiler {
 public:
  SchemaCompiler(const json& document, JsonSpelling spelling, std::string prefix)
      : doc_(document), gemma_(spelling == JsonSpelling::Gemma4), prefix_(std::move(prefix)) {}

  // The rule name of a value valid against `schema` (at `path` in the document).
  std::string value(const json& schema, const std::string& path, const std::string& name, int depth = 0) {
    // Gemma 4's parser takes values nested kMaxToolCallDepth (32) deep at most: less room for the schema.
    const int max_depth = gemma_ ? kMaxGemmaDepth : kMaxDepth;
    if (depth > max_depth) error(path, fmt::format("the schema nests deeper than {} levels", max_depth));
    if (schema.is_boolean()) {
      if (!schema.get<bool>()) error(path, "the schema 'false' allows no value");
      return any_value();
    }
    if (!schema.is_object()) error(path, "a schema must be an object or a boolean");
    for (const auto& [key, v] : schema.items())
      if (!kSupported.count(key) && !kIgnored.count(key))
        error(path, fmt::format("keyword '{}' is not supported; supported: type, properties, required, "
                                "additionalProperties, enum, const, anyOf, oneOf, allOf, $ref, items, prefixItems, "
                                "minItems, maxItems, minLength, maxLength, pattern, format (date, time, date-time, uuid), "
                                "minimum, maximum, exclusiveMinimum, exclusiveMaximum", key));
    return define(name, expression(schema, path, name, depth));
  }

  std::string any_value() {
    if (gemma_) {  // nested kGemmaAnyDepth deep at most, so that the tool-call parser takes it
      define("g-string", "<|\"|> [^<]* <|\"|>");
      define("g-key", "[A-Za-z_] [A-Za-z0-9_]{0,63} | g-string");
      std::string inner = define("g-value-0", "g-string | " + number() + " | \"true\" | \"false\" | \"null\"");
      for (int level = 1; level <= kGemmaAnyDepth; ++level) {
        const std::string object = define(fmt::format("g-object-{}", level),
                                          fmt::format("\"{{\" ( g-key \":\" {0} ( \",\" g-key \":\" {0} )* )? \"}}\"", inner));
        const std::string array = define(fmt::format("g-array-{}", level), fmt::format("\"[\" ( {0} ( \",\" {0} )* )? \"]\"", inner));
        inner = define(fmt::format("g-value-{}", level), fmt::format("{} | {} | g-value-0", object, array));
      }
      return inner;
    }
    string_rule();
    define("j-object", "\"{\" ( j-string \":\" j-value ( \",\" j-string \":\" j-value )* )? \"}\"");
    define("j-array", "\"[\" ( j-value ( \",\" j-value )* )? \"]\"");
    return define("j-value", "j-object | j-array | j-string | " + number() + " | \"true\" | \"false\" | \"null\"");
  }

  std::string grammar() const {
    std::string out;
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  static std::string pointer_token(const std::string& key) {  // RFC 6901: '~' and '/' escaped
    std::string out;
    for (const char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
    return out;
  }
  [[noreturn]] void error(const std::string& path, const std::string& what) const {
    fail("json_schema at '{}': {}", path, what);
  }

  std::string define(const std::string& name, const std::string& body) {
    if (!defined_.insert(name).second) return name;
    rules_.emplace_back(name, body);
    size_ += name.size() + body.size() + 6;
    if (size_ > kMaxGrammarBytes) fail("json_schema: the grammar it compiles to passes {} bytes; simplify the schema", kMaxGrammarBytes);
    return name;
  }
  std::string fresh(const std::string& base) {
    std::string clean;
    for (const char c : base) clean += std::isalnum(static_cast<unsigned char>(c)) || c == '-' ? c : '-';
    std::string name = clean.empty() ? prefix_ : clean;
    for (int k = 2; defined_.count(name) || reserved_.count(name); ++k) name = fmt::format("{}-{}", clean, k);
    reserved_.insert(name);
    return name;
  }

  std::string number() {
    return define("number", "\"-\"? ( \"0\" | [1-9] [0-9]{0,14} ) ( \".\" [0-9]{1,15} )? ( [eE] [-+]? [1-9] [0-9]? )?");
  }
  std::string string_rule() {
    define("j-char", "[^\"\\\\\\x00-\\x1F\\x7F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) )");
    return define("j-string", "\"\\\"\" j-char* \"\\\"\"");
  }
  // A string whose content is `content` (a GBNF expression in the spelling's string context).
  std::string quoted(const std::string& content) const {
    return gemma_ ? "<|\"|> " + content + " <|\"|>" : "\"\\\"\" " + content + " \"\\\"\"";
  }
  CharContext string_context() const { return gemma_ ? CharContext::GemmaString : CharContext::JsonString; }

  // A JSON value spelled as a grammar expression (enum and const).
  std::string constant(const json& v) const {
    if (!gemma_) return literal(v.dump());
    if (v.is_string()) return "<|\"|> " + literal(gemma_text(v.get<std::string>())) + " <|\"|>";
    if (v.is_object()) {
      std::string out = "\"{\"";
      bool first = true;
      for (const auto& [k, item] : v.items()) {
        out += (first ? " " : " \",\" ") + key(k) + " \":\" " + constant(item);
        first = false;
      }
      return out + " \"}\"";
    }
    if (v.is_array()) {
      std::string out = "\"[\"";
      for (size_t k = 0; k < v.size(); ++k) out += (k ? " \",\" " : " ") + constant(v[k]);
      return out + " \"]\"";
    }
    return literal(v.dump());
  }
  // Gemma strings end at the first <|"|>: text holding its spelling cannot be written.
  static const std::string& gemma_text(const std::string& text) {
    if (text.find("<|\"|>") != std::string::npos) fail("json_schema: the string {} holds <|\"|>, which ends a Gemma 4 string", json(text).dump());
    return text;
  }
  std::string key(const std::string& k) const {
    if (!gemma_) return literal(json(k).dump());
    const bool bare = !k.empty() && (std::isalpha(static_cast<unsigned char>(k[0])) || k[0] == '_') &&
                      std::all_of(k.begin(), k.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    return bare ? literal(k) : "<|\"|> " + literal(gemma_text(k)) + " <|\"|>";
  }

  std::string expression(const json& schema, const std::string& path, const std::string& name, int depth) {
    if (schema.contains("$ref")) {
      refuse_siblings(schema, path, "$ref", false);
      return ref(schema["$ref"], path);
    }
    for (const char* key : {"const", "enum"}) {
      if (!schema.contains(key)) continue;
      refuse_siblings(schema, path, key, true);
      const json e = std::string_view(key) == "const" ? json::array({schema[key]}) : schema[key];
      if (!e.is_array() || e.empty()) error(path + "/enum", "'enum' must be a non-empty list");
      std::string out;
      for (const json& v : e)
        if (has_type(schema, v)) out += (out.empty() ? "(" : " | ") + constant(v);
      if (out.empty()) error(path, fmt::format("no '{}' value has the 'type' {}", key, schema["type"].dump()));
      return out + ")";
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!schema.contains(key)) continue;
      refuse_siblings(schema, path, key, false);
      const json& list = schema[key];
      if (!list.is_array() || list.empty()) error(path + "/" + key, fmt::format("'{}' must be a non-empty list", key));
      std::string out = "(";
      for (size_t k = 0; k < list.size(); ++k)
        out += (k ? " | " : "") + value(list[k], fmt::format("{}/{}/{}", path, key, k), fresh(fmt::format("{}-{}", name, k)), depth + 1);
      return out + ")";
    }
    if (schema.contains("allOf")) return value(merged(schema, path), path, fresh(name + "-all"), depth + 1);
    const json* type = schema.contains("type") ? &schema["type"] : nullptr;
    if (type && type->is_array()) {
      if (type->empty()) error(path + "/type", "'type' must not be an empty list");
      std::string out = "(";
      for (size_t k = 0; k < type->size(); ++k) {
        json one = schema;
        one["type"] = (*type)[k];
        out += (k ? " | " : "") + value(one, path, fresh(fmt::format("{}-{}", name, (*type)[k].is_string() ? (*type)[k].get<std::string>() : "t")), depth + 1);
      }
      return out + ")";
    }
    std::string t = type ? (type->is_string() ? type->get<std::string>() : "") : "";
    if (type && t.empty()) error(path + "/type", "'type' must be a string or a list of strings");
    if (!type) {
      // No type: the one its constraints are about (any value would ignore them), a subset of the valid.
      if (schema.contains("properties") || schema.contains("additionalProperties") || schema.contains("required")) t = "object";
      else if (schema.contains("items") || schema.contains("prefixItems") || schema.contains("minItems") || schema.contains("maxItems")) t = "array";
      else if (schema.contains("pattern") || schema.contains("format") || schema.contains("minLength") || schema.contains("maxLength")) t = "string";
      else if (schema.contains("minimum") || schema.contains("maximum") || schema.contains("exclusiveMinimum") || schema.contains("exclusiveMaximum")) t = "number";
      else return any_value();
    }
    if (t == "string") return string_value(schema, path);
    if (t == "integer" || t == "number") return numeric(schema, path, t == "integer");
    if (t == "boolean") return "(\"true\" | \"false\")";
    if (t == "null") return "\"null\"";
    if (t == "object") return object(schema, path, name, depth);
    if (t == "array") return array(schema, path, name, depth);
    error(path + "/type", fmt::format("unknown type '{}'", t));
  }

  // A keyword written alone ($ref, const, enum, anyOf, oneOf) next to other constraints: dropping them
  // would let the grammar write values they forbid, so they are an error (enum and const may keep 'type').
  void refuse_siblings(const json& schema, const std::string& path, const char* keyword, bool type_allowed) const {
    for (const auto& [key, unused] : schema.items()) {
      if (key == keyword || key == "$defs" || key == "definitions" || kIgnored.count(key) || (type_allowed && key == "type")) continue;
      error(path, fmt::format("keyword '{}' next to '{}' is not supported; move it into the '{}' schemas", key, keyword, keyword));
    }
  }
  // Whether the constant `v` has one of the schema's types (true when it names none).
  static bool has_type(const json& schema, const json& v) {
    if (!schema.contains("type")) return true;
    const json types = schema["type"].is_array() ? schema["type"] : json::array({schema["type"]});
    return std::any_of(types.begin(), types.end(), [&](const json& t) {
      return (t == "string" && v.is_string()) || (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) ||
             (t == "null" && v.is_null()) || (t == "object" && v.is_object()) || (t == "array" && v.is_array()) ||
             (t == "integer" && v.is_number() && std::floor(v.get<double>()) == v.get<double>());
    });
  }

  std::string ref(const json& r, const std::string& path) {
    if (!r.is_string()) error(path + "/$ref", "'$ref' must be a string");
    const std::string target = r.get<std::string>();
    auto [it, added] = refs_.try_emplace(target, "");
    if (!added) return it->second;
    if (target == "#") {  // the whole document, named before compiling it: a recursive reference finds the name
      it->second = fresh(prefix_ + "-ref-root");
      value(doc_, "#", it->second);
      return it->second;
    }
    const json& definition = resolve(r, path + "/$ref");
    it->second = fresh(prefix_ + "-ref-" + target.substr(target.rfind('/') + 1));
    value(definition, target.substr(1), it->second);
    return it->second;
  }

  // allOf of object schemas: one object schema with the properties and requirements of all parts (the
  // schema's own included). Anything a part says beyond that would be lost in the merge: an error.
  json merged(const json& schema, const std::string& path) const {
    if (!schema["allOf"].is_array() || schema["allOf"].empty()) error(path + "/allOf", "'allOf' must be a non-empty list");
    std::vector<std::pair<const json*, std::string>> parts = {{&schema, path}};
    for (size_t k = 0; k < schema["allOf"].size(); ++k) {
      const json& part = schema["allOf"][k];
      const std::string at = fmt::format("{}/allOf/{}", path, k);
      parts.emplace_back(part.is_object() && part.contains("$ref") ? &resolve(part["$ref"], at) : &part, at);
    }
    json properties = json::object(), required = json::array();
    for (const auto& [part, at] : parts) {
      if (!part->is_object()) error(at, "only 'allOf' of object schemas is supported");
      for (const auto& [key, v] : part->items()) {
        const bool own = part == &schema && (key == "allOf" || key == "$defs" || key == "definitions");
        if (!own && !kIgnored.count(key) && key != "type" && key != "properties" && key != "required" && key != "additionalProperties")
          error(at, fmt::format("keyword '{}' in an 'allOf' part is not supported; supported there: type (object), properties, required, additionalProperties", key));
      }
      if (part->contains("type") && (*part)["type"] != "object") error(at + "/type", "only 'allOf' of object schemas is supported");
      if (part->contains("properties")) {
        if (!(*part)["properties"].is_object()) error(at + "/properties", "'properties' must be an object");
        for (const auto& [k, v] : (*part)["properties"].items()) {
          if (properties.contains(k) && properties[k] != v)
            error(at + "/properties/" + k, "a property that two 'allOf' parts define differently is not supported");
          properties[k] = v;
        }
      }
      if (part->contains("required")) {
        if (!(*part)["required"].is_array()) error(at + "/required", "'required' must be a list");
        required.insert(required.end(), (*part)["required"].begin(), (*part)["required"].end());
      }
    }
    // The merged object has no extra keys; a part that forbids some would also forbid the other parts' keys.
    for (const auto& [part, at] : parts) {
      if (!part->contains("additionalProperties") || (*part)["additionalProperties"] == json(true)) continue;
      for (const auto& [k, unused] : properties.items())
        if (!part->contains("properties") || !(*part)["properties"].contains(k))
          error(at + "/additionalProperties", fmt::format("this 'allOf' part forbids the property '{}' another part defines", k));
    }
    json out = json::object();
    out["type"] = "object";
    out["properties"] = properties;
    out["required"] = required;
    return out;
  }
  // The definition a local reference (#/$defs/NAME, #/definitions/NAME) names.
  const json& resolve(const json& r, const std::string& path) const {
    if (!r.is_string()) error(path, "'$ref' must be a string");
    const std::string target = r.get<std::string>();
    for (const std::string section : {"$defs", "definitions"}) {
      const std::string start = "#/" + section + "/";
      if (target.rfind(start, 0) != 0) continue;
      const std::string key = target.substr(start.size());
      const auto defs = doc_.is_object() ? doc_.find(section) : doc_.end();
      if (defs == doc_.end() || !defs->is_object() || !defs->contains(key)) error(path, fmt::format("'{}' names no definition", target));
      return (*defs)[key];
    }
    error(path, fmt::format("'{}': only local references (#, #/$defs/NAME, #/definitions/NAME) are supported", target));
  }

  int64_t count(const json& schema, const char* key, const std::string& path, int64_t fallback) const {
    if (!schema.contains(key)) return fallback;
    const json& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) error(path + "/" + key, fmt::format("'{}' must be a non-negative integer", key));
    if (v.get<int64_t>() > kMaxCount) error(path + "/" + key, fmt::format("'{}' above {} is not supported", key, kMaxCount));
    return v.get<int64_t>();
  }

  std::string string_value(const json& schema, const std::string& path) {
    const int64_t min = count(schema, "minLength", path, 0), max = count(schema, "maxLength", path, -1);
    if (max >= 0 && max < min) error(path, "'maxLength' is below 'minLength'");
    if (schema.contains("pattern")) {
      if (!schema["pattern"].is_string()) error(path + "/pattern", "'pattern' must be a string");
      if (schema.contains("minLength") || schema.contains("maxLength"))
        error(path, "'pattern' together with 'minLength'/'maxLength' is not supported; write the length into the pattern");
      try {
        return quoted(RegexCompiler(schema["pattern"].get<std::string>(), string_context()).compile());
      } catch (const Error& e) {
        error(path + "/pattern", e.what());
      }
    }
    if (schema.contains("format")) {
      if (schema.contains("minLength") || schema.contains("maxLength"))
        error(path, "'format' together with 'minLength'/'maxLength' is not supported");
      const std::string f = schema["format"].is_string() ? schema["format"].get<std::string>() : "";
      // Days as the month has them; February 29 in leap years only (divisible by 4, centuries by 400).
      define("f-date", "[0-9]{4} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | "
                       "( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) ) | "
                       "( [0-9]{2} ( \"0\" [48] | [2468] [048] | [13579] [26] ) | ( \"0\" [48] | [2468] [048] | [13579] [26] ) \"00\" | \"0000\" ) \"-02-29\"");
      define("f-time", "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )");
      if (f == "date") return quoted("f-date");
      if (f == "time") return quoted("f-time");
      if (f == "date-time") return quoted("f-date \"T\" f-time");
      if (f == "uuid") return quoted("[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}");
      error(path + "/format", fmt::format("format {} is not supported; supported: date, time, date-time, uuid", schema["format"].dump()));
    }
    const std::string c = gemma_ ? "[^<]" : (string_rule(), "j-char");
    if (min == 0 && max < 0) return quoted(c + "*");
    return quoted(repeat(c, min, max));
  }

  // Bounds as numbers, `inclusive` or exclusive.
  std::optional<std::pair<double, bool>> bound(const json& schema, const char* inclusive, const char* exclusive,
                                               const std::string& path) const {
    const bool lower = std::string_view(inclusive) == "minimum";
    std::optional<std::pair<double, bool>> out;
    for (const auto& [key, inc] : {std::pair{inclusive, true}, std::pair{exclusive, false}}) {
      if (!schema.contains(key)) continue;
      if (!schema[key].is_number()) error(path + "/" + key, fmt::format("'{}' must be a number", key));
      const double v = schema[key].get<double>();
      // Numbers are written with 15 digits at most: a bound past them on the open side bounds nothing
      // (e.g. JavaScript's safe-integer range), on the closed side it leaves nothing to write.
      const bool past = std::fabs(v) > static_cast<double>(kMaxMagnitude);
      if (past && (lower ? v < 0 : v > 0)) continue;
      if (past) error(path + "/" + key, fmt::format("'{}' {} is beyond the {} digits numbers are written with", key, schema[key].dump(), 15));
      if (!out) out = {v, inc};
      else if (lower ? v >= out->first : v <= out->first) out = {v, inc};  // both given: the stricter
    }
    return out;
  }

  std::string numeric(const json& schema, const std::string& path, bool integer) {
    const auto lo = bound(schema, "minimum", "exclusiveMinimum", path), hi = bound(schema, "maximum", "exclusiveMaximum", path);
    if (lo && hi && (lo->first > hi->first || (lo->first == hi->first && !(lo->second && hi->second))))
      error(path, fmt::format("'{}' {} {} '{}' {}", lo->second ? "minimum" : "exclusiveMinimum", lo->first,
                              lo->first > hi->first ? "above" : "meets", hi->second ? "maximum" : "exclusiveMaximum", hi->first));
    const double dmax = static_cast<double>(kMaxMagnitude);
    // The integers within the bounds.
    const int64_t ilo = lo ? static_cast<int64_t>(lo->second ? std::ceil(lo->first) : std::floor(lo->first) + 1) : -kMaxMagnitude;
    const int64_t ihi = hi ? static_cast<int64_t>(hi->second ? std::floor(hi->first) : std::ceil(hi->first) - 1) : kMaxMagnitude;
    if (integer) {
      if (!lo && !hi) return define("integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,14} )");
      const std::string r = integer_range(ilo, ihi);
      if (r.empty()) error(path, "no integer lies within the bounds");
      return r;
    }
    if (!lo && !hi) return number();
    // n.F lies strictly between n and n + 1 (or -n - 1 and -n): allowed where that whole interval is within.
    const double flo = lo ? lo->first : -dmax, fhi = hi ? hi->first : dmax;
    std::vector<std::string> alts;
    if (const std::string whole = integer_range(ilo, ihi); !whole.empty()) alts.push_back(whole);
    const std::string frac = " \".\" [0-9]{1,15}";
    // (An exclusive bound on an integer n: n.0 equals it, so the fractions start one further.)
    const bool lo_open = lo && !lo->second, hi_open = hi && !hi->second;
    const int64_t pos_lo = std::max<int64_t>(0, static_cast<int64_t>(lo_open ? std::floor(flo) + 1 : std::ceil(flo)));
    const int64_t pos_hi = static_cast<int64_t>(std::floor(fhi)) - 1;
    if (const std::string p = natural_range(pos_lo, std::min<int64_t>(pos_hi, kMaxMagnitude)); !p.empty()) alts.push_back(p + frac);
    // -n.F for n >= 0: needs -(n + 1) >= lo and -n <= hi.
    const int64_t neg_hi = static_cast<int64_t>(std::floor(-flo)) - 1;
    const int64_t neg_lo = std::max<int64_t>(0, static_cast<int64_t>(hi_open ? std::floor(-fhi) + 1 : std::ceil(-fhi)));
    if (const std::string n = natural_range(neg_lo, std::min<int64_t>(neg_hi, kMaxMagnitude)); !n.empty()) alts.push_back("\"-\" " + n + frac);
    if (alts.empty()) error(path, "no number the grammar can write lies within the bounds");
    std::string out = "(";
    for (size_t k = 0; k < alts.size(); ++k) out += (k ? " | " : "") + alts[k];
    return out + ")";
  }

  std::string object(const json& schema, const std::string& path, const std::string& name, int depth) {
    const json properties = schema.contains("properties") ? schema["properties"] : json::object();
    if (!properties.is_object()) error(path + "/properties", "'properties' must be an object");
    std::set<std::string> required;
    if (schema.contains("required")) {
      if (!schema["required"].is_array()) error(path + "/required", "'required' must be a list");
      for (const json& r : schema["required"]) {
        if (!r.is_string() || !properties.contains(r.get<std::string>()))
          error(path + "/required", fmt::format("'required' names {}, which 'properties' does not define", r.dump()));
        required.insert(r.get<std::string>());
      }
    }
    const json extra = schema.contains("additionalProperties") ? schema["additionalProperties"] : json(false);
    if (!extra.is_boolean() && !extra.is_object()) error(path + "/additionalProperties", "'additionalProperties' must be a boolean or a schema");
    if (properties.empty() && !(extra.is_boolean() && !extra.get<bool>()) ) {
      // Any object, its values valid against additionalProperties (absent: any).
      const std::string v = extra.is_object() ? value(extra, path + "/additionalProperties", fresh(name + "-value"), depth + 1) : any_value();
      const std::string k = gemma_ ? (any_value(), "g-key") : (string_rule(), "j-string");
      return "\"{\" ( " + k + " \":\" " + v + " ( \",\" " + k + " \":\" " + v + " )* )? \"}\"";
    }
    // rest(i, first): the members from property i on; `first`: none written yet (no comma before).
    std::vector<std::pair<std::string, std::string>> members;  // key text, value rule
    for (const auto& [k, v] : properties.items())
      members.emplace_back(k, value(v, path + "/properties/" + pointer_token(k), fresh(name + "-" + k), depth + 1));
    // rest(n, first), rest(n, !first): the extra members, if any.
    std::string later[2] = {"\"\"", "\"\""};
    if (!(extra.is_boolean() && !extra.get<bool>())) {
      const std::string v = extra.is_object() ? value(extra, path + "/additionalProperties", fresh(name + "-extra"), depth + 1) : any_value();
      std::set<std::string> declared;
      for (const auto& [k, unused] : properties.items()) declared.insert(k);
      const std::string pair = define(fresh(name + "-extra-pair"), other_key(declared, name) + " \":\" " + v);
      later[0] = define(fresh(name + "-more"), "( \",\" " + pair + " )*");
      later[1] = define(fresh(name + "-more-first"), "( " + pair + " " + later[0] + " )?");
    }
    for (size_t i = members.size(); i-- > 0;) {
      std::string now[2];
      for (int first = 0; first < 2; ++first) {
        const std::string member = (first ? "" : "\",\" ") + key(members[i].first) + " \":\" " + members[i].second + " " + later[0];
        std::string body = required.count(members[i].first) ? member : member + " | " + later[first];
        now[first] = define(fresh(fmt::format("{}-from-{}{}", name, i, first ? "-first" : "")), body);
      }
      later[0] = now[0];
      later[1] = now[1];
    }
    return "\"{\" " + later[1] + " \"}\"";
  }

  // A key none of `taken` (an extra key must not repeat a declared one: the parser keeps the last value
  // of a key, and a declared key's value must be valid against its own schema). Keys are written one way
  // only so that no other spelling of a taken key slips through: JSON strings without escapes other than
  // \" and \\, Gemma keys between <|"|> tokens. A trie of the taken keys, as rules: at each node, a character
  // leaving the trie (then anything), a child, or the end where no taken key ends.
  std::string other_key(const std::set<std::string>& taken, const std::string& name) {
    std::vector<std::vector<uint32_t>> words;
    for (const std::string& k : taken) words.push_back(code_points(k));
    const Ranges allowed = gemma_ ? complement({{'<', '<'}}) : complement({{0, 0x1F}, {0x7F, 0x7F}});
    const std::string base = fresh(name + "-key");
    size_t nodes = 0;
    return quoted(trie_rule(words, 0, allowed, base, nodes));
  }
  std::string trie_rule(const std::vector<std::vector<uint32_t>>& words, size_t at, const Ranges& allowed, const std::string& base,
                        size_t& nodes) {
    const std::string rule = nodes++ == 0 ? base : fresh(fmt::format("{}-{}", base, nodes));
    std::map<uint32_t, std::vector<std::vector<uint32_t>>> children;
    bool word_ends_here = false;
    for (const auto& w : words) {
      if (w.size() == at) word_ends_here = true;
      else if (contains(allowed, w[at])) children[w[at]].push_back(w);  // a key the grammar cannot spell needs no exclusion
    }
    const std::string any = chars(allowed, string_context()) + "*";
    Ranges leave = allowed;
    std::vector<std::string> alts;
    for (const auto& [cp, below] : children) {
      leave = subtract(leave, {{cp, cp}});
      alts.push_back(chars({{cp, cp}}, string_context()) + " " + trie_rule(below, at + 1, allowed, base, nodes));
    }
    if (!leave.empty()) alts.push_back(chars(leave, string_context()) + " " + any);
    std::string body = "(";
    for (size_t k = 0; k < alts.size(); ++k) body += (k ? " | " : " ") + alts[k];
    body += " )";
    return define(rule, word_ends_here ? body : body + "?");
  }
  static std::vector<uint32_t> code_points(const std::string& s) {
    std::vector<uint32_t> out;
    for (size_t i = 0; i < s.size();) {
      const auto b = static_cast<uint8_t>(s[i]);
      const size_t n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
      uint32_t cp = n == 1 ? b : b & (0x3F >> (n - 1));
      for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
      out.push_back(cp);
      i += n;
    }
    return out;
  }

  std::string array(const json& schema, const std::string& path, const std::string& name, int depth) {
    const int64_t min = count(schema, "minItems", path, 0), max = count(schema, "maxItems", path, -1);
    if (max >= 0 && max < min) error(path, "'maxItems' is below 'minItems'");
    std::vector<std::string> prefix;
    if (schema.contains("prefixItems")) {
      const json& p = schema["prefixItems"];
      if (!p.is_array()) error(path + "/prefixItems", "'prefixItems' must be a list");
      for (size_t k = 0; k < p.size(); ++k)
        prefix.push_back(value(p[k], fmt::format("{}/prefixItems/{}", path, k), fresh(fmt::format("{}-{}", name, k)), depth + 1));
    }
    const json items = schema.contains("items") ? schema["items"] : json(true);
    const bool more_allowed = !(items.is_boolean() && !items.get<bool>());
    const std::string item = more_allowed ? value(items, path + "/items", fresh(name + "-item"), depth + 1) : "";
    if (!prefix.empty()) {  // the prefix items in order, as many as minItems asks at least, then items
      const auto n = static_cast<int64_t>(prefix.size());
      if (n < min && !more_allowed) error(path, "'minItems' exceeds the 'prefixItems' with items false");
      if (max >= 0 && max < n) error(path, "'maxItems' below the number of 'prefixItems' is not supported");
      std::string next = more_allowed ? repeat("( \",\" " + item + " )", std::max<int64_t>(0, min - n), max < 0 ? -1 : max - n) : "";
      for (int64_t k = n - 1; k >= 0; --k) {
        const std::string rest = next.empty() ? "" : " " + (k + 1 < n && k + 1 >= min ? "( " + next + " )?" : next);
        next = (k ? "\",\" " : "") + prefix[static_cast<size_t>(k)] + rest;
      }
      return "\"[\" " + (min == 0 ? "( " + next + " )?" : next) + " \"]\"";
    }
    if (!more_allowed) {  // items false and no prefixItems: the empty array only
      if (min > 0) error(path, "'minItems' above 0 with 'items' false");
      return "\"[\" \"]\"";
    }
    if (max == 0) return "\"[\" \"]\"";
    const std::string rest = repeat("( \",\" " + item + " )", std::max<int64_t>(0, min - 1), max < 0 ? -1 : max - 1);
    if (min == 0) return "\"[\" ( " + item + " " + rest + " )? \"]\"";
    return "\"[\" " + item + " " + rest + " \"]\"";
  }

  const json& doc_;
  bool gemma_;
  std::string prefix_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::set<std::string> defined_, reserved_;
  std::map<std::string, std::string> refs_;
  size_t size_ = 0;
};

json parse_schema(std::string_view text) {
  json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded()) fail("json_schema: the schema is not valid JSON");
  return doc;
}

}  // namespace schema_grammar

std::string json_schema_to_gbnf(std::string_view schema, JsonSpelling spelling) {
  const auto doc = schema_grammar::parse_schema(schema);
  schema_grammar::SchemaCompiler c(doc, spelling, "root");
  const std::string top = c.value(doc, "#", "value");
  return "root ::= " + top + "\n" + c.grammar();
}

std::string regex_to_gbnf(std::string_view pattern) {
  return "root ::= " + schema_grammar::RegexCompiler(pattern, schema_grammar::CharContext::Raw).compile() + "\n";
}

std::string tool_call_gbnf(const std::vector<ToolGrammarFunction>& functions, bool parallel) {
  if (functions.empty()) fail("tool_call grammar: no functions");
  const schema_grammar::json any = {{"type", "object"}, {"additionalProperties", true}};
  std::string rules, calls;
  for (size_t i = 0; i < functions.size(); ++i) {
    const auto& f = functions[i];
    // The names parse_gemma4_tool_call reads: [A-Za-z0-9_.:/-]+.
    const bool name_ok = !f.name.empty() && std::all_of(f.name.begin(), f.name.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == ':' || c == '/';
    });
    if (!name_ok) fail("tool_call grammar: function name '{}': Gemma 4 tool calls take names of letters, digits and _ - . : / only", f.name);
    auto doc = f.parameters_schema.empty() ? any : schema_grammar::parse_schema(f.parameters_schema);
    // Arguments are an object: a schema that says nothing ({} or true) means any object.
    if (doc == schema_grammar::json(true) || doc == schema_grammar::json::object()) doc = any;
    if (doc.is_object() && doc.contains("type") && doc["type"] != "object")
      fail("the parameters of function '{}': json_schema at '#/type': tool parameters must be an object schema", f.name);
    // Rules get the function's own prefix: two functions may define the same $defs name differently.
    schema_grammar::SchemaCompiler c(doc, JsonSpelling::Gemma4, fmt::format("f{}", i));
    std::string args;
    try {
      args = c.value(doc, "#", fmt::format("f{}-args", i));
    } catch (const Error& e) {
      fail("the parameters of function '{}': {}", f.name, e.what());
    }
    std::string body = c.grammar();
    // Each function's rules get their own names (f<i>-...): rename the shared ones per function.
    calls += (i ? " | " : "") + schema_grammar::literal(f.name) + " " + args;
    rules += body;
  }
  // Rules shared between functions (j-/g- helpers, number) are defined once per compiler: keep the first.
  std::string unique;
  std::set<std::string> seen;
  size_t start = 0;
  while (start < rules.size()) {
    const size_t end = rules.find('\n', start);
    const std::string line = rules.substr(start, end - start);
    const std::string name = line.substr(0, line.find(' '));
    if (seen.insert(name).second) unique += line + "\n";
    start = end + 1;
  }
  // Each function's grammar is bounded; so is their sum (a request may list many tools).
  if (unique.size() + calls.size() > schema_grammar::kMaxGrammarBytes)
    fail("tool_call grammar: the {} functions' grammar passes {} bytes; pass fewer tools or simpler parameters", functions.size(),
         schema_grammar::kMaxGrammarBytes);
  const std::string call = "<|tool_call> \"call:\" ( " + calls + " ) <tool_call|>";
  return "root ::= " + std::string(parallel ? "call+" : "call") + "\ncall ::= " + call + "\n" + unique;
}

}  // namespace specula

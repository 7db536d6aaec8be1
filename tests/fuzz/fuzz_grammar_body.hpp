// What one fuzz input exercises for the GBNF engine (core/include/specula/core/grammar.hpp): the input is
// grammar text, a NUL, then a text to match. A grammar either parses or is refused with specula::Error;
// the matcher then reads the text, and each prefix of a text it takes must be taken too (the token masks
// rely on it). Anything else (a crash, a hang, UB, another exception) is a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "specula/core/grammar.hpp"
#include "specula/error.hpp"

namespace specula::fuzz {

inline bool grammar_one(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view text = input.substr(0, nul), sample = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  std::shared_ptr<const Grammar> g;
  try {
    g = parse_gbnf(text);
  } catch (const Error&) {
    return false;
  }
  try {
    const GrammarPrefix r = check_grammar_prefix(*g, sample);
    if (r.valid && !sample.empty() && !check_grammar_prefix(*g, sample.substr(0, sample.size() - 1)).valid) __builtin_trap();
  } catch (const Error&) {  // a grammar too ambiguous or too deep to follow: refused with a message
  }
  return true;
}

}  // namespace specula::fuzz

// What one fuzz input exercises for the JSON-schema and regex compilers (json_schema_grammar.hpp): the
// input is a schema (or, after a first byte 'r', a regular expression). It compiles or is refused with
// specula::Error; what it compiles to must be a grammar the GBNF parser takes (a refusal there would be a
// compiler bug reaching users as a confusing message) and whose start the matcher can read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "specula/core/grammar.hpp"
#include "specula/core/json_schema_grammar.hpp"
#include "specula/error.hpp"

namespace specula::fuzz {

inline bool json_schema_one(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  const bool regex = !input.empty() && input[0] == 'r';
  if (regex) input.remove_prefix(1);
  std::string gbnf;
  try {
    gbnf = regex ? regex_to_gbnf(input) : json_schema_to_gbnf(input);
  } catch (const Error&) {
    return false;
  }
  try {
    const auto g = parse_gbnf(gbnf);
    check_grammar_prefix(*g, regex ? "a" : "{\"");
  } catch (const Error&) {
    __builtin_trap();  // the compiler wrote a grammar the parser refuses, or one too ambiguous to read
  }
  return true;
}

}  // namespace specula::fuzz

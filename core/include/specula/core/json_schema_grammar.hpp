// Compilers to GBNF (grammar.hpp): JSON Schema documents, regular expressions and forced Gemma 4 tool
// calls. The rule they keep: every sentence of the grammar validates (against the schema, the pattern, the
// function's parameters); where a constraint cannot be written exactly (bounds on non-integers), the
// grammar allows a subset of the valid values, never a value outside them. What they cannot compile is a
// specula::Error naming the keyword and where it stands ("json_schema at '#/properties/x': ...").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace specula {

// Which JSON spelling the grammar writes: standard JSON, or Gemma 4's tool-call arguments (keys bare,
// strings between <|"|> tokens: {location:<|"|>Paris<|"|>,days:3,units:[<|"|>c<|"|>]}).
enum class JsonSpelling { Json, Gemma4 };

// GBNF whose sentences are JSON texts valid against `schema` (a JSON Schema document, as text).
std::string json_schema_to_gbnf(std::string_view schema, JsonSpelling spelling = JsonSpelling::Json);

// GBNF whose sentences are the strings `pattern` (ECMAScript syntax) matches as a whole.
std::string regex_to_gbnf(std::string_view pattern);

// GBNF for a forced Gemma 4 tool call, `<|tool_call>call:NAME{ARGS}<tool_call|>`: NAME one of the
// functions, ARGS its parameters schema in the Gemma4 spelling; `parallel`: one or more calls in a row.
struct ToolGrammarFunction {
  std::string name;
  std::string parameters_schema;  // JSON text; "" = any object
};
std::string tool_call_gbnf(const std::vector<ToolGrammarFunction>& functions, bool parallel);

}  // namespace specula

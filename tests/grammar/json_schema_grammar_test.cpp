// The JSON-schema, regex and tool-call compilers (json_schema_grammar.hpp), checked through the grammar
// engine: documents valid against a schema are sentences and invalid ones are not; random sentences of
// each grammar validate (a small validator of the supported keywords, written here, is the reference);
// regular expressions agree with std::regex (ECMAScript) whole-string matching; forced tool calls sampled
// over the real Gemma 4 vocabulary parse with the tool-call parser to arguments valid against the schema.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "specula/core/grammar.hpp"
#include "specula/core/json_schema_grammar.hpp"
#include "specula/error.hpp"
#include "specula/tool_calls.hpp"
#include "random_logits.hpp"
#include "vocab_fixture.hpp"

namespace specula {
namespace {

using json = nlohmann::json;

size_t code_points(const std::string& s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<uint8_t>(c) & 0xC0) != 0x80; }));
}

// The reference: whether `v` is valid against `s` for the keywords the compiler supports.
bool valid(const json& s, const json& v, const json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref")) {
    const std::string r = s["$ref"];
    const bool defs = r.rfind("#/$defs/", 0) == 0;
    return valid(root[defs ? "$defs" : "definitions"][r.substr(defs ? 8 : 14)], v, root);
  }
  if (s.contains("const") && v != s["const"]) return false;
  if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return false;
  for (const char* k : {"anyOf", "oneOf"})
    if (s.contains(k) && std::none_of(s[k].begin(), s[k].end(), [&](const json& sub) { return valid(sub, v, root); })) return false;
  if (s.contains("allOf") && !std::all_of(s["allOf"].begin(), s["allOf"].end(), [&](const json& sub) { return valid(sub, v, root); }))
    return false;
  if (s.contains("type")) {
    const json types = s["type"].is_array() ? s["type"] : json::array({s["type"]});
    const bool ok = std::any_of(types.begin(), types.end(), [&](const json& t) {
      return (t == "string" && v.is_string()) || (t == "integer" && v.is_number_integer()) ||
             (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) || (t == "null" && v.is_null()) ||
             (t == "object" && v.is_object()) || (t == "array" && v.is_array());
    });
    if (!ok) return false;
  }
  if (v.is_number()) {
    const double x = v.get<double>();
    if ((s.contains("minimum") && x < s["minimum"].get<double>()) || (s.contains("maximum") && x > s["maximum"].get<double>()) ||
        (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) ||
        (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()))
      return false;
  }
  if (v.is_string()) {
    const std::string t = v;
    if (s.contains("minLength") && code_points(t) < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && code_points(t) > s["maxLength"].get<size_t>()) return false;
    if (s.contains("pattern") && !std::regex_search(t, std::regex(s["pattern"].get<std::string>()))) return false;
    if (s.value("format", "") == "date" && !std::regex_match(t, std::regex(R"(\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01]))"))) return false;
    if (s.value("format", "") == "uuid" && !std::regex_match(t, std::regex("[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"))) return false;
  }
  if (v.is_object()) {
    const json props = s.value("properties", json::object());
    for (const json& r : s.value("required", json::array()))
      if (!v.contains(r.get<std::string>())) return false;
    for (const auto& [k, item] : v.items()) {
      if (props.contains(k)) {
        if (!valid(props[k], item, root)) return false;
      } else if (s.contains("additionalProperties") && !valid(s["additionalProperties"], item, root)) {
        return false;
      }
    }
  }
  if (v.is_array()) {
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
    const json prefix = s.value("prefixItems", json::array());
    for (size_t i = 0; i < v.size(); ++i) {
      const json& sub = i < prefix.size() ? prefix[i] : s.value("items", json(true));
      if (!valid(sub, v[i], root)) return false;
    }
  }
  return true;
}

// Sentences of a grammar: characters drawn at random among those the grammar takes next (ASCII and a few
// multi-byte ones), stopping at random once the text is complete.
std::string random_sentence(const Grammar& g, std::mt19937& rng) {
  std::vector<std::string> alphabet;
  for (char c = 0x20; c < 0x7F; ++c) alphabet.emplace_back(1, c);
  for (const char* m : {"é", "日", "😀", "\n"}) alphabet.emplace_back(m);
  std::string text;
  for (int step = 0; step < 3000; ++step) {
    if (check_grammar_prefix(g, text).complete && (rng() % 4 == 0 || text.size() > 300)) return text;
    std::shuffle(alphabet.begin(), alphabet.end(), rng);
    bool moved = false;
    for (const std::string& c : alphabet)
      if (check_grammar_prefix(g, text + c).valid) {
        text += c;
        moved = true;
        break;
      }
    if (!moved) break;
  }
  return text;
}

const char* const kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["name", "age"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]})",
    R"({"type": "object", "properties": {"kind": {"const": "king"}, "n": {"type": "integer", "minimum": -20, "maximum": 1234}}, "required": ["kind", "n"]})",
    R"({"type": "object", "properties": {"p": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["zip"]}}, "required": ["p"]})",
    R"({"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 1, "maxItems": 3})",
    R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 3}, "b": {"type": "boolean"}, "c": {"type": "null"}}, "required": ["b"]})",
    R"({"type": "object", "properties": {"x": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["x"]})",
    R"({"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 3}}, "required": ["x"]})",
    R"({"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20}}, "required": ["n"]})",
    R"({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2,3}-(\\d{2}|x)$"}}, "required": ["code"]})",
    R"({"type": "object", "properties": {"d": {"type": "string", "format": "date"}, "u": {"type": "string", "format": "uuid"}}, "required": ["d", "u"]})",
    R"({"type": "object", "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "string", "minLength": 1, "maxLength": 2}]}}, "required": ["v"]})",
    R"({"$defs": {"pt": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 5}}, "required": ["x"]}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}}, "required": ["a", "b"]})",
    R"({"$defs": {"tree": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9}, "kids": {"type": "array", "items": {"$ref": "#/$defs/tree"}, "maxItems": 2}}, "required": ["v"]}}, "$ref": "#/$defs/tree"})",
    R"({"type": "object", "properties": {"x": {"type": ["string", "null"], "maxLength": 5}}, "required": ["x"]})",
    R"({"type": "array", "prefixItems": [{"type": "integer", "minimum": 0, "maximum": 3}, {"enum": ["a", "b"]}], "items": false})",
    R"({"type": "object", "properties": {"t": {"type": "array", "items": {"enum": [1, "two", null, true]}, "maxItems": 4}}, "required": ["t"]})",
    R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 5}}, "required": ["a"]}, {"properties": {"b": {"type": "boolean"}}, "required": ["b"]}]})",
    R"({"type": "object", "properties": {"id": {"type": "integer"}, "score": {"type": "number"}}, "required": ["id", "score"]})",
    R"({"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}})",
    R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 2, "maxLength": 4}}, "required": ["s"], "additionalProperties": false})",
    // Extra keys next to declared ones: never a declared key again, no comma before the first member.
    R"({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "ab": {"type": "boolean"}}, "additionalProperties": {"type": "string", "maxLength": 3}})",
    R"({"type": "object", "properties": {"k": {"type": "integer", "minimum": 1, "maximum": 3}}, "additionalProperties": true})",
    // allOf next to the schema's own properties: both kept.
    R"({"type": "object", "properties": {"c": {"type": "null"}}, "required": ["c"], "allOf": [{"properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a"]}]})",
    R"({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 2, "maxItems": 2})",
    R"({"type": "object", "properties": {"t": {"type": "string", "format": "time"}, "dt": {"type": "string", "format": "date-time"}}, "required": ["t", "dt"]})",
    R"({"type": ["integer", "boolean", "null"], "minimum": 3, "maximum": 300})",
    R"({"type": "object", "properties": {"r": {"type": "number", "minimum": -1.5}, "s": {"type": "number", "exclusiveMaximum": 0.5}}, "required": ["r", "s"]})",
    R"({"type": "object", "properties": {"p": {"type": "string", "pattern": "^[\\t-~]{1,3}$"}, "d": {"type": "string", "format": "date"}}, "required": ["p", "d"]})",
    R"({"definitions": {"list": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"head": {"type": "integer", "minimum": 0, "maximum": 99}, "tail": {"$ref": "#/definitions/list"}}, "required": ["head", "tail"]}]}}, "$ref": "#/definitions/list"})",
};

TEST(JsonSchemaGrammar, RandomSentencesValidateAgainstTheirSchemas) {
  std::mt19937 rng(11);
  for (const char* text : kSchemas) {
    SCOPED_TRACE(text);
    const json schema = json::parse(text);
    std::string gbnf;
    ASSERT_NO_THROW(gbnf = json_schema_to_gbnf(text));
    std::shared_ptr<const Grammar> g;
    ASSERT_NO_THROW(g = parse_gbnf(gbnf)) << gbnf;
    for (int k = 0; k < 6; ++k) {
      const std::string s = random_sentence(*g, rng);
      ASSERT_TRUE(check_grammar_prefix(*g, s).complete) << "stuck at '" << s << "'\n" << gbnf;
      const json v = json::parse(s, nullptr, false);
      ASSERT_FALSE(v.is_discarded()) << s;
      EXPECT_TRUE(valid(schema, v, schema)) << s << "\n" << gbnf;
    }
  }
}

TEST(JsonSchemaGrammar, ValidDocumentsAreSentencesAndInvalidOnesAreNot) {
  struct Case {
    const char* schema;
    std::vector<const char*> good, bad;
  };
  const std::vector<Case> cases = {
      {kSchemas[0], {R"({"name":"Saul","age":40})", R"({"name":"","age":0})"},
       {R"({"name":"Saul"})", R"({"name":"Saul","age":151})", R"({"name":"Saul","age":-1})", R"({"name":"Saul","age":40,"x":1})",
        R"({"name":"Saul-the-king","age":40})", R"({"age":40,"name":"Saul"})"}},
      {kSchemas[2], {R"({"kind":"king","n":-20})", R"({"kind":"king","n":1234})", R"({"kind":"king","n":999})"},
       {R"({"kind":"kin","n":1})", R"({"kind":"king","n":1235})", R"({"kind":"king","n":-21})", R"({"kind":"king","n":01})"}},
      {kSchemas[3], {R"({"p":{"zip":"01234"}})"}, {R"({"p":{"zip":"1234"}})", R"({"p":{"zip":"12a45"}})"}},
      {kSchemas[6], {R"({"x":0})", R"({"x":1})", R"({"x":0.25})"}, {R"({"x":1.5})", R"({"x":-0.1})", R"({"x":2})"}},
      {kSchemas[7], {R"({"x":-2})", R"({"x":2.9})", R"({"x":-1.5})"}, {R"({"x":3})", R"({"x":-3})"}},
      {kSchemas[8], {R"({"n":11})", R"({"n":19})"}, {R"({"n":10})", R"({"n":20})"}},
      {kSchemas[9], {R"({"code":"AB-12"})", R"({"code":"ABC-x"})"}, {R"({"code":"A-12"})", R"({"code":"ABCD-12"})", R"({"code":"AB-1"})"}},
      {kSchemas[13], {R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"}, {R"({"v":1,"kids":[{"v":2},{"v":3},{"v":4}]})"}},
      {kSchemas[15], {R"([2,"b"])", R"([0])", R"([])"}, {R"([4,"a"])", R"([1,"a",3])"}},
      {kSchemas[19], {R"({})", R"({"a":1,"b":9})"}, {R"({"a":10})", R"({"a":"x"})"}},
  };
  for (const Case& c : cases) {
    const auto g = parse_gbnf(json_schema_to_gbnf(c.schema));
    for (const char* d : c.good) EXPECT_TRUE(check_grammar_prefix(*g, d).complete) << c.schema << "\n  " << d;
    for (const char* d : c.bad) EXPECT_FALSE(check_grammar_prefix(*g, d).complete) << c.schema << "\n  " << d;
  }
}

TEST(JsonSchemaGrammar, ExtraKeysNeverRepeatDeclaredOnes) {
  // The parser keeps a key's last value: an extra "a" would replace the declared one with a string.
  const auto g = parse_gbnf(json_schema_to_gbnf(kSchemas[21]));
  for (const char* d : {R"({})", R"({"a":1})", R"({"x":"s"})", R"({"a":1,"x":"s","abc":"t"})", R"({"ab":true,"b":"q"})",
                        R"({"":"e"})", R"({"a\"":"q"})", R"({"aa":"q","ab ":"r"})"})
    EXPECT_TRUE(check_grammar_prefix(*g, d).complete) << d;
  for (const char* d : {R"({,"x":"s"})", R"({"a":"s"})", R"({"a":1,"a":"s"})", R"({"ab":"zz"})", R"({"x":1})",
                        R"({"a":1,"ab":true,"ab":"s"})", R"({"x":"s","a":1})"})
    EXPECT_FALSE(check_grammar_prefix(*g, d).complete) << d;
  const auto open = parse_gbnf(json_schema_to_gbnf(kSchemas[22]));
  for (const char* d : {R"({})", R"({"k":2})", R"({"z":[1,{"q":null}]})", R"({"k":3,"z":"s","y":-1.5})"})
    EXPECT_TRUE(check_grammar_prefix(*open, d).complete) << d;
  for (const char* d : {R"({,"z":1})", R"({"k":"s"})", R"({"z":1,"k":2})", R"({"k":2,"k":"s"})"})
    EXPECT_FALSE(check_grammar_prefix(*open, d).complete) << d;
}

// enum values of another type than the schema's are left out; bounds wider than the 15 digits numbers
// are written with (JavaScript's safe integers) bound nothing.
TEST(JsonSchemaGrammar, ConstantsKeepTheirTypeAndWideBoundsAreClamped) {
  const auto typed = parse_gbnf(json_schema_to_gbnf(R"({"type": ["string", "null"], "enum": ["a", 1, null, true]})"));
  for (const char* d : {R"("a")", "null"}) EXPECT_TRUE(check_grammar_prefix(*typed, d).complete) << d;
  for (const char* d : {"1", "true"}) EXPECT_FALSE(check_grammar_prefix(*typed, d).complete) << d;
  const auto safe = parse_gbnf(json_schema_to_gbnf(R"({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991})"));
  for (const char* d : {"0", "-999999999999999", "999999999999999"}) EXPECT_TRUE(check_grammar_prefix(*safe, d).complete) << d;
  EXPECT_FALSE(check_grammar_prefix(*safe, "1000000000000000").complete);
}

// Dates exist (days per month, February 29 in leap years); patterns reach \n \r \t through their escapes.
TEST(JsonSchemaGrammar, DatesExistAndPatternsWriteControlCharactersEscaped) {
  const auto date = parse_gbnf(json_schema_to_gbnf(R"({"type": "string", "format": "date"})"));
  for (const char* d : {"2024-02-29", "2000-02-29", "1600-02-29", "2023-01-31", "2023-04-30", "0000-02-29", "2023-12-01"})
    EXPECT_TRUE(check_grammar_prefix(*date, fmt::format("\"{}\"", d)).complete) << d;
  for (const char* d : {"2023-02-29", "1900-02-29", "2024-02-30", "2023-04-31", "2023-13-01", "2023-00-10", "2023-01-00"})
    EXPECT_FALSE(check_grammar_prefix(*date, fmt::format("\"{}\"", d)).complete) << d;
  const auto lines = parse_gbnf(json_schema_to_gbnf(R"({"type": "string", "pattern": "^a\\nb\\t?$"})"));
  EXPECT_TRUE(check_grammar_prefix(*lines, R"("a\nb")").complete);
  EXPECT_TRUE(check_grammar_prefix(*lines, R"("a\nb\t")").complete);
  EXPECT_FALSE(check_grammar_prefix(*lines, "\"a\nb\"").complete);  // raw: not JSON
  EXPECT_FALSE(check_grammar_prefix(*lines, R"("a\u000ab")").complete);  // one spelling only
}

// items false without prefixItems: the empty array only; "$ref": "#" refers to the whole schema.
TEST(JsonSchemaGrammar, ItemsFalseAndRootReferences) {
  const auto short_list = parse_gbnf(json_schema_to_gbnf(R"({"maxItems": 1})"));  // no type: an array, not any value
  EXPECT_TRUE(check_grammar_prefix(*short_list, "[{}]").complete);
  EXPECT_FALSE(check_grammar_prefix(*short_list, "[1,2]").complete);
  const auto none = parse_gbnf(json_schema_to_gbnf(R"({"type": "array", "items": false})"));
  EXPECT_TRUE(check_grammar_prefix(*none, "[]").complete);
  EXPECT_FALSE(check_grammar_prefix(*none, "[,]").valid);
  const auto nest = parse_gbnf(json_schema_to_gbnf(R"({"type": "object", "properties": {"in": {"$ref": "#"}}})"));
  EXPECT_TRUE(check_grammar_prefix(*nest, R"({"in":{"in":{}}})").complete);
  EXPECT_FALSE(check_grammar_prefix(*nest, R"({"in":{"out":{}}})").complete);
}

TEST(JsonSchemaGrammar, AllOfKeepsTheSchemasOwnPropertiesAndRefusesWhatItWouldLose) {
  const auto g = parse_gbnf(json_schema_to_gbnf(kSchemas[23]));
  EXPECT_TRUE(check_grammar_prefix(*g, R"({"c":null,"a":4})").complete);
  EXPECT_FALSE(check_grammar_prefix(*g, R"({"a":4})").complete);
  EXPECT_FALSE(check_grammar_prefix(*g, R"({"c":null})").complete);
  const auto message = [](const char* schema) -> std::string {
    try {
      json_schema_to_gbnf(schema);
    } catch (const Error& e) {
      return e.what();
    }
    return "(compiled)";
  };
  EXPECT_EQ(message(R"({"allOf": [{"properties": {"a": {"type": "integer"}}}, {"anyOf": [{"required": ["a"]}]}]})"),
            "json_schema at '#/allOf/1': keyword 'anyOf' in an 'allOf' part is not supported; supported there: type (object), "
            "properties, required, additionalProperties");
  EXPECT_EQ(message(R"({"allOf": [{"properties": {"a": {"type": "integer"}}, "additionalProperties": false}, {"properties": {"b": {}}}]})"),
            "json_schema at '#/allOf/0/additionalProperties': this 'allOf' part forbids the property 'b' another part defines");
  EXPECT_EQ(message(R"({"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"a": {"type": "string"}}}]})"),
            "json_schema at '#/allOf/1/properties/a': a property that two 'allOf' parts define differently is not supported");
  EXPECT_EQ(message(R"({"type": "string", "format": "date", "maxLength": 4})"),
            "json_schema at '#': 'format' together with 'minLength'/'maxLength' is not supported");
}

TEST(JsonSchemaGrammar, RefusesWhatItCannotCompileSayingWhere) {
  const auto message = [](const char* schema) -> std::string {
    try {
      json_schema_to_gbnf(schema);
    } catch (const Error& e) {
      return e.what();
    }
    return "(compiled)";
  };
  EXPECT_EQ(message(R"({"type": "object", "properties": {"x": {"not": {}}}})").rfind("json_schema at '#/properties/x': keyword 'not' is not supported", 0), 0u);
  EXPECT_EQ(message(R"({"$ref": "https://example.com/s.json"})"),
            "json_schema at '#/$ref': 'https://example.com/s.json': only local references (#, #/$defs/NAME, #/definitions/NAME) are supported");
  EXPECT_EQ(message(R"({"$ref": "#/$defs/x"})"), "json_schema at '#/$ref': '#/$defs/x' names no definition");
  EXPECT_EQ(message(R"({"$ref": "#/definitions/x", "definitions": {"y": {}}})"), "json_schema at '#/$ref': '#/definitions/x' names no definition");
  EXPECT_EQ(message(R"({"type": "array", "items": false, "minItems": 1})"), "json_schema at '#': 'minItems' above 0 with 'items' false");
  EXPECT_EQ(message(R"({"type": "integer", "minimum": 5, "maximum": 4})"), "json_schema at '#': 'minimum' 5 above 'maximum' 4");
  EXPECT_EQ(message(R"({"properties": {"a/b": {"type": "number", "exclusiveMinimum": 1, "maximum": 1}}})"),
            "json_schema at '#/properties/a~1b': 'exclusiveMinimum' 1 meets 'maximum' 1");
  EXPECT_EQ(message(R"({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2})"), "json_schema at '#': no integer lies within the bounds");
  EXPECT_EQ(message(R"({"type": "number", "minimum": 1e20})"),
            "json_schema at '#/minimum': 'minimum' 1e+20 is beyond the 15 digits numbers are written with");
  EXPECT_EQ(message(R"({"type": "object", "properties": {"x": {"type": "integer"}}, "anyOf": [{"required": ["x"]}]})"),
            "json_schema at '#': keyword 'type' next to 'anyOf' is not supported; move it into the 'anyOf' schemas");
  EXPECT_EQ(message(R"({"$ref": "#/$defs/a", "maxLength": 3, "$defs": {"a": {"type": "string"}}})"),
            "json_schema at '#': keyword 'maxLength' next to '$ref' is not supported; move it into the '$ref' schemas");
  EXPECT_EQ(message(R"({"type": "string", "enum": [1, 2]})"), R"(json_schema at '#': no 'enum' value has the 'type' "string")");
  EXPECT_EQ(message(R"({"type": "string", "maxLength": 100000})"), "json_schema at '#/maxLength': 'maxLength' above 10000 is not supported");
  EXPECT_EQ(message(R"({"type": "object", "required": ["a"]})"), R"(json_schema at '#/required': 'required' names "a", which 'properties' does not define)");
  EXPECT_EQ(message(R"({"type": "string", "pattern": "(a)\\1"})"), "json_schema at '#/pattern': regex at offset 5: backreferences are not supported");
  EXPECT_EQ(message("{"), "json_schema: the schema is not valid JSON");
  EXPECT_EQ(message(R"({"type": "string", "format": "email"})"),
            R"(json_schema at '#/format': format "email" is not supported; supported: date, time, date-time, uuid)");
  // Nesting is bounded.
  std::string deep = R"({"type": "string"})";
  for (int i = 0; i < 80; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  EXPECT_NE(message(deep.c_str()).find("deeper than 64"), std::string::npos);
}

// Schemas of the wrong shape are specula::Error (a 400), never another exception or a crash.
TEST(JsonSchemaGrammar, MalformedSchemasAreErrors) {
  for (const char* bad : {R"({"type": "object", "properties": {"a": 1}})", R"({"enum": "x"})", R"({"enum": []})", R"({"minLength": "3"})",
                          R"({"maxItems": -1})", R"({"items": [{}]})", R"({"type": "object", "required": "a"})", R"({"properties": []})",
                          R"({"additionalProperties": 5})", R"({"prefixItems": {}})", R"({"allOf": [true]})", R"({"allOf": {}})",
                          R"({"type": "object", "properties": {"a": {}}, "required": [1]})", R"({"format": 5})", R"({"pattern": 5})",
                          R"({"$defs": 5, "$ref": "#/$defs/a"})", R"({"$ref": 5})", R"({"type": 5})", R"({"type": []})", R"({"type": "text"})",
                          R"({"anyOf": []})", R"({"oneOf": {}})", R"({"minimum": "1"})", R"({"type": "string", "pattern": "[z-a]"})", "false",
                          "[]", "5", R"({"allOf": [{"$ref": "#/nowhere"}]})", R"({"type": "number", "exclusiveMaximum": 0, "minimum": 0})"})
    EXPECT_THROW(json_schema_to_gbnf(bad), Error) << bad;
}

// Whether the grammar compiled from `pattern` takes all of `s`.
bool regex_whole(const char* pattern, const char* s) {
  return check_grammar_prefix(*parse_gbnf(regex_to_gbnf(pattern)), s).complete;
}

// For each pattern, every string: matched whole by its grammar exactly when std::regex (ECMAScript) does.
void expect_agreement_with_std_regex(const std::vector<std::pair<const char*, std::vector<const char*>>>& cases) {
  for (const auto& [pattern, strings] : cases) {
    const auto g = parse_gbnf(regex_to_gbnf(pattern));
    const std::regex re(pattern);
    for (const char* s : strings)
      EXPECT_EQ(check_grammar_prefix(*g, s).complete, std::regex_match(s, re)) << pattern << " on '" << s << "'";
  }
}

TEST(RegexGrammar, AgreesWithStdRegexOnWholeMatches) {
  const std::vector<std::pair<const char*, std::vector<const char*>>> cases = {
      {"^[A-Z]{3}-[0-9]{3}$", {"ABC-123", "AB-123", "ABC-12a", "abc-123", "ABC-1234"}},
      {"(19|20)\\d{2}-(0[1-9]|1[0-2])", {"1999-12", "2000-01", "2100-01", "1999-13", "1999-00"}},
      {"a+b*c?", {"a", "aaabbbc", "c", "ab", "abcc", ""}},
      {"(?:ab|cd){2,3}", {"abcd", "ababab", "ab", "abcdabcd", "cdcdcd"}},
      {"[^a-c]x", {"dx", "ax", "x"}},
      {"\\w+@\\w+\\.(com|org)", {"me@site.com", "me@site.net", "@site.com", "a_b@c1.org"}},
      {"\\s?\\S\\d\\D", {" a1b", "a11", "a1b", "  a1b"}},
      {"colou?r", {"color", "colour", "colouur"}},
      {"x{2}y{1,}z{0,2}", {"xxy", "xxyyzz", "xy", "xxyzzz"}},
      {"[.][\\]\\-]", {".]", ".-", "a]", "."}},
      {"a|b|", {"a", "b", "", "ab"}},
      {"[a-c-]", {"-", "b", "d"}},
      {"\\u0041\\x42", {"AB", "ab"}},
  };
  expect_agreement_with_std_regex(cases);
  // Where std::regex (bytes, no named groups) cannot be the reference: code points and named groups.
  EXPECT_TRUE(regex_whole("[^a-c]x", "éx"));
  EXPECT_TRUE(regex_whole("é+日", "éé日"));
  EXPECT_FALSE(regex_whole("é+日", "日"));
  EXPECT_TRUE(regex_whole("(?<year>\\d{4})", "2024"));
  EXPECT_FALSE(regex_whole("(?<year>\\d{4})", "202"));
  for (const char* bad : {"(a", "a)", "(?=a)", "a**", "[b-a]", "\\1", "x{3,2}", "a^b"})
    EXPECT_THROW(regex_to_gbnf(bad), Error) << bad;
}

TEST(RegexGrammar, MoreAgreementWithStdRegex) {
  const std::vector<std::pair<const char*, std::vector<const char*>>> cases = {
      {"^-?\\d+(\\.\\d+)?$", {"12", "-0.5", "1.", ".5", "--1", "3.14"}},
      {"[\\d\\s]+", {"1 2", " ", "1a", ""}},
      {"(ab)*c{1,3}?", {"c", "ababccc", "abcccc", "aba"}},
      {"[^\\w]+", {"--", "a-", "!?"}},
      {"a$|b", {"a", "b", "ab"}},
      {"(x|y$)", {"x", "y", "xy"}},
      {"[A-Fa-f0-9]{2}(:[A-Fa-f0-9]{2}){2}", {"0a:Bc:ff", "0a:Bc", "0g:00:00"}},
      {"\\/\\.\\-\\*", {"/.-*", "/.-"}},
  };
  expect_agreement_with_std_regex(cases);
  // ECMAScript's white space and line terminators beyond ASCII (std::regex reads bytes: no reference).
  EXPECT_TRUE(regex_whole("\\s", "\u3000"));
  EXPECT_FALSE(regex_whole("\\S", "\u3000"));
  EXPECT_FALSE(regex_whole("\\S", "\u00A0"));
  EXPECT_FALSE(regex_whole(".", "\u2028"));
  EXPECT_TRUE(regex_whole(".", "\u3000"));
  // '$' where something would have to follow it: a pattern that matches nothing there, refused.
  for (const char* bad : {"(a$)b", "(a$|b)c", "a$b"}) EXPECT_THROW(regex_to_gbnf(bad), Error) << bad;
  // Hostile nesting is bounded.
  EXPECT_THROW(regex_to_gbnf(std::string(100, '(') + "a" + std::string(100, ')')), Error);
  EXPECT_NO_THROW(regex_to_gbnf(std::string(60, '(') + "a" + std::string(60, ')')));
  EXPECT_THROW(regex_to_gbnf("a{1,10001}"), Error);
}

// Forced tool calls, sampled over the real vocabulary: the text parses as a Gemma 4 tool call whose
// arguments are valid against the function's parameters.
TEST(ToolCallGrammar, SampledCallsParseToArgumentsValidAgainstTheSchema) {
  const auto tok = test::gemma4_tokenizer();
  const json weather = json::parse(R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}, "unit": {"enum": ["c", "f"]}, "odd key": {"type": "boolean"}},
    "required": ["city", "days"], "additionalProperties": false})");
  // (Any object, "", is sampled by TextSentencesParseToArgumentsValidAgainstTheSchema: a random walk through
  // free keys and values need not end within a bound.)
  const json ping = json::parse(R"({"type": "object", "properties": {"host": {"type": "string", "maxLength": 6}}})");
  const std::vector<ToolGrammarFunction> functions = {{"get_weather", weather.dump()}, {"ping", ping.dump()}};
  const auto g = parse_gbnf(tool_call_gbnf(functions, true));
  std::mt19937 rng(5);
  test::RandomLogits random(static_cast<size_t>(tok->vocab_size()), 3.0f, rng);
  for (int run = 0; run < 12; ++run) {
    auto c = grammar_constraint(g, tok, {tok->eos()}, tok->vocab_size(), "tool_choice required");
    std::string text;
    for (int step = 0; step < 400 && !c->complete(); ++step) {
      const std::span<float> logits = random.next();
      c->mask(logits, {});
      const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      c->accept(best);
      text += tool_call_text(*tok, best);
    }
    ASSERT_TRUE(c->complete()) << text;
    size_t calls = 0;
    for (size_t at = text.find("<|tool_call>"); at != std::string::npos; at = text.find("<|tool_call>", at + 1)) {
      const size_t end = text.find("<tool_call|>", at);
      ASSERT_NE(end, std::string::npos) << text;
      const auto call = parse_gemma4_tool_call(std::string_view(text).substr(at + 12, end - at - 12));
      ASSERT_TRUE(call) << text;
      const json args = json::parse(call->arguments);
      if (call->name == "get_weather") EXPECT_TRUE(valid(weather, args, weather)) << text << " -> " << call->arguments;
      else EXPECT_TRUE(call->name == "ping" && valid(ping, args, ping)) << text << " -> " << call->arguments;
      ++calls;
    }
    EXPECT_GE(calls, 1u) << text;
  }
}

// The tool-call grammar with its special tokens spelled as text, so that check_grammar_prefix (which
// sees no special tokens) can walk it; the Gemma string content never holds '<', so the text stays unambiguous.
std::string tokens_as_text(std::string gbnf) {
  for (const auto& [token, text] : {std::pair<std::string, std::string>{"<|tool_call>", R"("<|tool_call>")"},
                                    {"<tool_call|>", R"("<tool_call|>")"}, {R"(<|"|>)", R"("<|\"|>")"}})
    for (size_t at = gbnf.find(token); at != std::string::npos; at = gbnf.find(token, at + text.size())) gbnf.replace(at, token.size(), text);
  return gbnf;
}

// A random sentence that, past `cap` bytes, tries the characters that close things first.
std::string closing_walk(const Grammar& g, std::mt19937& rng, size_t cap) {
  std::vector<std::string> alphabet;
  for (char c = 0x20; c < 0x7F; ++c) alphabet.emplace_back(1, c);
  for (const char* m : {"é", "日", "😀"}) alphabet.emplace_back(m);
  std::string text;
  for (int step = 0; step < 5000; ++step) {
    if (check_grammar_prefix(g, text).complete && (rng() % 3 == 0 || text.size() > cap)) return text;
    std::shuffle(alphabet.begin(), alphabet.end(), rng);
    if (text.size() > cap)
      std::stable_partition(alphabet.begin(), alphabet.end(), [](const std::string& c) { return std::string_view("}]<|>\"").find(c[0]) != std::string_view::npos; });
    bool moved = false;
    for (const std::string& c : alphabet)
      if (check_grammar_prefix(g, text + c).valid) {
        text += c;
        moved = true;
        break;
      }
    if (!moved) break;
  }
  return text;
}

const char* const kToolSchemas[] = {
    R"({"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}, "odd key": {"enum": ["a b", 3]}}, "required": ["city", "days"]})",
    R"({"$defs": {"x": {"type": "integer", "minimum": 0, "maximum": 9}}, "type": "object", "properties": {"v": {"$ref": "#/$defs/x"}}, "required": ["v"]})",
    R"({"$defs": {"x": {"type": "boolean"}}, "type": "object", "properties": {"v": {"$ref": "#/$defs/x"}, "w": {"type": "array", "items": {"$ref": "#/$defs/x"}, "maxItems": 3}}, "required": ["v"]})",
    "{}",
    R"({"type": "object", "properties": {"n": {"type": "number", "minimum": 0, "maximum": 10}}, "additionalProperties": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,4}$"}}})",
};

TEST(ToolCallGrammar, TextSentencesParseToArgumentsValidAgainstTheSchema) {
  std::vector<ToolGrammarFunction> functions;
  for (size_t i = 0; i < std::size(kToolSchemas); ++i) functions.push_back({fmt::format("fn_{}", i), kToolSchemas[i]});
  const std::string gbnf = tool_call_gbnf(functions, true);
  // Each rule is defined once: functions do not share rules that differ ($defs names alike).
  std::set<std::string> names;
  for (size_t at = 0; at < gbnf.size(); at = gbnf.find('\n', at) + 1) EXPECT_TRUE(names.insert(gbnf.substr(at, gbnf.find(' ', at) - at)).second) << gbnf;
  ASSERT_NO_THROW(parse_gbnf(gbnf)) << gbnf;
  const auto g = parse_gbnf(tokens_as_text(gbnf));
  std::mt19937 rng(17);
  std::map<std::string, int> seen;
  for (int run = 0; run < 40; ++run) {
    const std::string text = closing_walk(*g, rng, 120);
    ASSERT_TRUE(check_grammar_prefix(*g, text).complete) << "stuck at '" << text << "'";
    for (size_t at = text.find("<|tool_call>"); at != std::string::npos; at = text.find("<|tool_call>", at + 1)) {
      const size_t end = text.find("<tool_call|>", at);
      ASSERT_NE(end, std::string::npos) << text;
      const auto call = parse_gemma4_tool_call(std::string_view(text).substr(at + 12, end - at - 12));
      ASSERT_TRUE(call) << text;
      const json args = json::parse(call->arguments);
      ASSERT_TRUE(args.is_object()) << text;
      const json schema = json::parse(kToolSchemas[std::stoi(call->name.substr(3))]);
      EXPECT_TRUE(valid(schema, args, schema)) << text << " -> " << call->arguments;
      ++seen[call->name];
    }
  }
  EXPECT_GE(seen.size(), 4u);
  // Bounds hold in the spelling too; free values nest no deeper than the parser takes.
  const auto call = [&](const std::string& body) { return check_grammar_prefix(*g, "<|tool_call>call:" + body + "<tool_call|>").complete; };
  EXPECT_TRUE(call(R"(fn_1{v:9})"));
  EXPECT_FALSE(call(R"(fn_1{v:10})"));
  EXPECT_FALSE(call(R"(fn_1{v:true})"));
  EXPECT_TRUE(call(R"(fn_2{v:true,w:[false]})"));
  EXPECT_FALSE(call(R"(fn_2{v:1})"));
  EXPECT_TRUE(call(R"(fn_0{city:<|"|>Paris<|"|>,days:3,<|"|>odd key<|"|>:<|"|>a b<|"|>})"));
  EXPECT_FALSE(call(R"(fn_0{city:<|"|>Paris<|"|>,days:8})"));
  EXPECT_TRUE(call(R"(fn_3{a:[[[[[[[[1]]]]]]]]})"));
  EXPECT_FALSE(call(R"(fn_3{a:[[[[[[[[[1]]]]]]]]]})"));
  EXPECT_FALSE(call(R"(fn_3<|"|>x<|"|>)"));
  EXPECT_TRUE(call(R"(fn_4{n:2.5,<|"|>zz<|"|>:[<|"|>abc<|"|>]})"));
  EXPECT_FALSE(call(R"(fn_4{<|"|>n<|"|>:[<|"|>abc<|"|>]})"));
  EXPECT_FALSE(call(R"(fn_4{n:11})"));
}

TEST(ToolCallGrammar, RefusesNamesAndParametersItCannotWrite) {
  EXPECT_THROW(tool_call_gbnf({}, false), Error);
  EXPECT_THROW(tool_call_gbnf({{"get weather", ""}}, false), Error);
  EXPECT_THROW(tool_call_gbnf({{"f{", ""}}, false), Error);
  EXPECT_THROW(tool_call_gbnf({{"f", R"({"type": "string"})"}}, false), Error);
  EXPECT_THROW(tool_call_gbnf({{"f", R"({"type": "object", "properties": {"x": {"const": "a<|\"|>b"}}})"}}, false), Error);
  EXPECT_NO_THROW(tool_call_gbnf({{"f", R"({"type": "object", "properties": {"x": {"const": "a<|b"}}})"}}, false));
  EXPECT_THROW(tool_call_gbnf({{"f", R"({"type": "object", "properties": {"x": {"not": {}}}})"}}, false), Error);
  // Schemas nest less deep than in JSON: the parser's depth bound leaves room for free values.
  std::string deep = R"({"type": "integer"})";
  for (int i = 0; i < 30; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  EXPECT_NO_THROW(json_schema_to_gbnf(deep));
  EXPECT_THROW(tool_call_gbnf({{"f", R"({"type": "object", "properties": {"x": )" + deep + "}}"}}, false), Error);
  // Many tools together stay bounded too.
  std::string wide = R"({"type": "object", "properties": {)";
  for (int i = 0; i < 300; ++i) wide += fmt::format(R"({}"p{}": {{"type": "integer", "minimum": {}, "maximum": 987654}})", i ? ", " : "", i, i);
  wide += "}}";
  EXPECT_NO_THROW(tool_call_gbnf({{"f", wide}}, false));
  EXPECT_THROW(tool_call_gbnf(std::vector<ToolGrammarFunction>(20, {"f", wide}), false), Error);
  const std::string one = tool_call_gbnf({{"ns.tool/get-x:1", ""}}, false);
  EXPECT_EQ(one.rfind("root ::= call\ncall ::= <|tool_call> \"call:\" ( \"ns.tool/get-x:1\" ", 0), 0u) << one;
  EXPECT_EQ(tool_call_gbnf({{"f", ""}}, true).rfind("root ::= call+\n", 0), 0u);
}

}  // namespace
}  // namespace specula

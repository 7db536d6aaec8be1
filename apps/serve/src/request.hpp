// Reading an OpenAI-style request body (docs/serving.md): the JSON parsed with its nesting bounded while
// it is read, so that no later step (a copy, a dump, a destructor) recurses as deep as a body asks; every
// field type-checked and range-checked; errors as OpenAI's error objects that quote at most a short
// prefix of a value. No network and no loaded model here: what a request needs of the served model comes
// in a ServedModel, so that tests/fuzz (fuzz_http_request) drives this same code.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/api.hpp"

namespace specula::serve {

// An OpenAI-style error, {"error": {"message", "type", "param", "code"}}, with its HTTP status.
struct HttpError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" = null
  std::string code;   // "" = null
};

[[noreturn]] void bad_request(std::string message, std::string param = {}, std::string code = {});

// The error object's JSON text.
std::string error_body(const HttpError& e);

// Nesting deeper than this is refused while parsing (an OpenAI request nests 4 levels).
inline constexpr int kMaxJsonDepth = 64;
// Stop strings are matched against the text's tail at every token: their length bounds that work.
inline constexpr size_t kMaxStopBytes = 256;

// The body as a JSON object. HttpError 400 when it is not valid JSON, not an object, nests deeper than
// kMaxJsonDepth, or holds a number outside the double range (naming the field).
nlohmann::json parse_json_body(std::string_view body);

// What reading a request needs of the served model.
struct ServedModel {
  std::string name;  // the id in /v1/models and in requests' "model"
  int64_t vocab_size = 0;
  int64_t context_length = 0;
  int32_t bos = -1;
  api::SamplingConfig defaults;
  bool has_drafter = false;  // per-request speculative settings other than "off" need one
  // The conversation as prompt ids in the model's chat format, with tool declarations (`tools`: a JSON
  // array in OpenAI's form, "" for none); empty function: the model has none.
  std::function<std::vector<int32_t>(std::span<const ChatMessage>, std::optional<bool> enable_thinking,
                                     std::string_view tools)>
      chat_prompt;
  // Raw text as prompt ids, special tokens parsed (a completion prompt is written in the model's format).
  std::function<std::vector<int32_t>(std::string_view)> tokenize;
};

// A completion request (chat or plain), checked: what the scheduler runs and how to answer.
struct CompletionRequest {
  bool chat = true;
  std::vector<int32_t> prompt;
  api::SamplingConfig sampling;
  bool stream = false;
  bool include_usage = false;
  // Tool calling (chat): the declarations rendered into the prompt (a JSON array, "" for none), and
  // whether more than the first tool call the model writes is returned.
  std::string tools;
  bool parallel_tool_calls = true;
  bool asks_drafting = false;  // speculative.mode fixed/auto or speculative.n_max > 0: needs a drafter
  std::string format_field;    // the field that set sampling.response_format (for errors)
  int n = 1;                   // choices: each its own job, choice i with seed + i
};

inline constexpr int64_t kMaxChoices = 16;  // n

// Function names as OpenAI allows them (plus '.'): 1-64 of [A-Za-z0-9_.-].
inline constexpr size_t kMaxTools = 128;

// `unseeded`: the seed of a request that names none (each request draws its own; the caller passes it
// in so that reading stays deterministic).
// `raw_body`: the body's text, for the JSON schemas in it, whose keys keep the client's order there.
CompletionRequest read_completion(const nlohmann::json& body, bool chat, const ServedModel& model, uint64_t unseeded,
                                  std::string_view raw_body = {});

struct TokenizeRequest {
  std::vector<int32_t> tokens;
  bool with_pieces = false;
};
TokenizeRequest read_tokenize(const nlohmann::json& body, const ServedModel& model);
std::vector<int32_t> read_detokenize(const nlohmann::json& body, const ServedModel& model);

}  // namespace specula::serve

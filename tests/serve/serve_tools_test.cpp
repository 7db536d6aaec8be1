// Issue 38's request fields through `specula serve` on the tiny pair (drafter on): tools, tool_choice,
// tool messages and assistant tool_calls rendered into the prompt as the API renders them; stop_token_ids,
// ignore_eos and per-request speculative settings (speculative.n_max, speculative.mode); and the
// checkpoint's generation_config.json as the default of a request that sets no sampling field.
#include "serve_harness.hpp"
#include "specula/core/token_constraint.hpp"

#include "request.hpp"  // apps/serve/src
#include "specula/core/pipeline.hpp"

namespace {

using namespace serve_test;

const json kWeather = json::parse(R"({"type": "function", "function": {"name": "get_weather",
  "description": "Current weather for a city.", "parameters": {"type": "object",
  "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}}})");

json tool_history() {
  return json::array({{{"role", "user"}, {"content", "Weather in Paris?"}},
                      {{"role", "assistant"}, {"content", nullptr},
                       {"tool_calls", json::array({{{"id", "c1"}, {"type", "function"},
                                                    {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}}}}})}},
                      {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "21 C, clear"}}});
}

TEST(ServeTools, ToolsAndToolHistoryAreRenderedAsTheApiRendersThem) {
  Running s;
  json body = chat_body("", 4);
  body["messages"] = tool_history();
  body["tools"] = json::array({kWeather});
  body["tool_choice"] = "auto";
  body["parallel_tool_calls"] = true;
  const auto r = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  std::vector<specula::api::ChatMessage> m = {{"user", "Weather in Paris?"}, {"assistant", ""}, {"tool", "21 C, clear"}};
  m[1].tool_calls = json::array({{{"id", "c1"}, {"type", "function"},
                                  {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Paris"})"}}}}}).dump();
  m[2].tool_call_id = "c1";
  const std::string tools = json::array({kWeather}).dump();
  const auto prompt = tiny()->chat_prompt(m, {}, specula::api::ContentTokens::Text, tools);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], prompt.size());
  // The prompt ends inside the model's turn, after the tool's answer (the template's continuation).
  const std::string text = tiny()->render(m, {}, tools);
  EXPECT_NE(text.find("<|tool>declaration:get_weather{"), std::string::npos) << text;
  EXPECT_NE(text.find("<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|>"), std::string::npos) << text;
  EXPECT_TRUE(text.ends_with("<|tool_response>response:get_weather{value:<|\"|>21 C, clear<|\"|>}<tool_response|>")) << text;
  // A plain answer: no tool call was written, so no tool_calls and finish_reason is not "tool_calls".
  EXPECT_FALSE(r.body["choices"][0]["message"].contains("tool_calls"));
  EXPECT_NE(r.body["choices"][0]["finish_reason"], "tool_calls");

  // tool_choice "none": the tools are left out of the prompt.
  body["tool_choice"] = "none";
  const auto none = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(none.status, 200) << none.raw;
  EXPECT_EQ(none.body["usage"]["prompt_tokens"], tiny()->chat_prompt(m).size());
}

TEST(ServeTools, ToolRequestsThatCannotBeHonouredAre400) {
  Running s;
  auto expect_400 = [&](json body, const std::string& param) {
    const auto r = post(s, "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << body.dump() << " -> " << r.raw;
    EXPECT_EQ(r.body["error"]["param"], param) << r.raw;
  };
  json body = chat_body("Hi", 4);
  body["tools"] = json::array({kWeather});
  json b = body;
  b["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_time"}}}};  // not declared
  expect_400(b, "tool_choice");
  b = chat_body("Hi", 4);
  b["tool_choice"] = "required";  // no tools
  expect_400(b, "tool_choice");
  b = body;
  b["tool_choice"] = "sometimes";
  expect_400(b, "tool_choice");
  b = body;
  b["tools"][0]["function"]["name"] = "bad name<|turn>";
  expect_400(b, "tools[0].function.name");
  b = body;
  b["tools"][0]["type"] = "retrieval";
  expect_400(b, "tools[0].type");
  b = body;
  b["tools"][0]["function"]["parameters"] = {{"type", "object"}, {"not", json::object()}};
  b["tool_choice"] = "required";  // its schema is compiled: an unsupported keyword is a 400
  expect_400(b, "tools");
  // A tool message that answers no call.
  b = chat_body("Hi", 4);
  b["messages"].push_back({{"role", "tool"}, {"tool_call_id", "x"}, {"content", "1"}});
  expect_400(b, "messages[1]");
  b = chat_body("Hi", 4);
  b["messages"] = tool_history();
  b["messages"][2].erase("tool_call_id");
  expect_400(b, "messages[2].tool_call_id");
  b = chat_body("Hi", 4);
  b["messages"] = tool_history();
  b["messages"][1]["tool_calls"][0]["function"]["arguments"] = 5;
  expect_400(b, "messages[1].tool_calls[0].function.arguments");
}

TEST(ServeTools, StopTokenIdsIgnoreEosAndSpeculativeSettingsWithTheDrafterOn) {
  ASSERT_TRUE(tiny()->has_drafter());
  Running s;
  json body = chat_body("And God said", 16);
  const auto plain = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(plain.status, 200) << plain.raw;
  const std::string answer = plain.body["choices"][0]["message"]["content"];
  auto sampling = tiny()->default_sampling();
  sampling.temperature = 0;
  sampling.max_tokens = 16;
  const std::vector<specula::api::ChatMessage> m = {{"user", "And God said"}};
  const auto tokens = tiny()->generate(tiny()->chat_prompt(m), sampling).tokens;
  ASSERT_GE(tokens.size(), 4u);

  // stop_token_ids: generation ends at the fourth token (not shown), finish_reason "stop".
  json b = body;
  b["stop_token_ids"] = json::array({tokens[3]});
  auto r = post(s, "/v1/chat/completions", b);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
  const auto k = std::find(tokens.begin(), tokens.end(), tokens[3]) - tokens.begin();  // its first occurrence
  EXPECT_EQ(r.body["usage"]["completion_tokens"], k);
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], tiny()->detokenize(std::vector<int32_t>(tokens.begin(), tokens.begin() + k)));

  // ignore_eos: the answer runs to max_tokens.
  b = body;
  b["ignore_eos"] = true;
  b["max_tokens"] = 40;
  r = post(s, "/v1/chat/completions", b);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 40);

  // Drafting off, a fixed length, auto: greedy answers are the same; the drafter's work shows in /metrics.
  for (const json& fields : {json{{"speculative.n_max", 0}}, json{{"speculative.mode", "off"}},
                             json{{"speculative.n_max", 3}}, json{{"speculative.mode", "fixed"}, {"speculative.n_max", 2}},
                             json{{"speculative.mode", "auto"}}, json{{"speculative.mode", "auto"}, {"speculative.n_max", 4}}}) {
    b = body;
    b.update(fields);
    r = post(s, "/v1/chat/completions", b);
    ASSERT_EQ(r.status, 200) << fields.dump() << " " << r.raw;
    EXPECT_EQ(r.body["choices"][0]["message"]["content"], answer) << fields.dump();
  }
  for (const json& bad : {json{{"speculative.n_max", 17}}, json{{"speculative.n_max", -1}}, json{{"speculative.mode", "on"}},
                          json{{"speculative.mode", "auto"}, {"speculative.n_max", 0}}, json{{"stop_token_ids", 5}},
                          json{{"stop_token_ids", json::array({-1})}}, json{{"ignore_eos", "yes"}}}) {
    b = body;
    b.update(bad);
    r = post(s, "/v1/chat/completions", b);
    EXPECT_EQ(r.status, 400) << bad.dump() << " " << r.raw;
  }
}

// A served model for reading requests only: 100 tokens, a 64-token context, every text three tokens.
specula::serve::ServedModel stub_model() {
  specula::serve::ServedModel model;
  model.name = "m";
  model.vocab_size = 100;
  model.context_length = 64;
  model.tokenize = [](std::string_view) { return std::vector<int32_t>{1, 2, 3}; };
  return model;
}

// A request on a server without a drafter that asks for drafting is refused, not served without it.
TEST(ServeTools, SpeculativeSettingsWithoutADrafterAre400ExceptOff) {
  specula::serve::ServedModel model = stub_model();
  const json base = {{"prompt", "x"}, {"max_tokens", 4}};
  for (const json& f : {json{{"speculative.n_max", 2}}, json{{"speculative.mode", "auto"}}, json{{"speculative.mode", "fixed"}}}) {
    json b = base;
    b.update(f);
    EXPECT_THROW(specula::serve::read_completion(b, false, model, 1), specula::serve::HttpError) << f.dump();
  }
  json b = base;
  b["speculative.mode"] = "off";
  EXPECT_EQ(specula::serve::read_completion(b, false, model, 1).sampling.draft_tokens, 0);
  model.has_drafter = true;
  b = base;
  b["speculative.mode"] = "auto";
  b["speculative.n_max"] = 5;
  const auto r = specula::serve::read_completion(b, false, model, 1);
  EXPECT_EQ(r.sampling.draft_auto, true);
  EXPECT_EQ(r.sampling.draft_max, 5);
  b = base;
  b["speculative.n_max"] = 2;
  const auto fixed = specula::serve::read_completion(b, false, model, 1);
  EXPECT_EQ(fixed.sampling.draft_tokens, 2);
  EXPECT_EQ(fixed.sampling.draft_auto, false);
}

class GenerationConfigFile final : public specula::ModelFile {
 public:
  explicit GenerationConfigFile(json g) : md_({{"generation_config", std::move(g)}}) {}
  explicit GenerationConfigFile(json md, bool) : md_(std::move(md)) {}  // a GGUF's flat keys
  std::string format() const override { return "safetensors"; }
  std::filesystem::path path() const override { return "fixture"; }
  const json& metadata() const override { return md_; }
  const std::vector<specula::TensorInfo>& tensors() const override { return tensors_; }
  const specula::TensorInfo* find(const std::string&) const override { return nullptr; }

 private:
  json md_;
  std::vector<specula::TensorInfo> tensors_;
};

// generation_config.json fills what the pipeline leaves unset; a request without temperature gets the
// default, one with temperature 0 stays greedy.
TEST(ServeTools, GenerationConfigDefaultsApplyWhenNothingSetsThem) {
  const GenerationConfigFile file(json{{"do_sample", true}, {"temperature", 0.7}, {"top_k", 40}, {"top_p", 0.95},
                                       {"min_p", 5}, {"repetition_penalty", "x"}});
  const auto bare = specula::core::parse_pipeline("backend: {plugin: cpu}\ntarget: {model: m.gguf}\n", "t.yaml", ".");
  auto d = specula::core::generation_defaults(bare, &file);
  EXPECT_FLOAT_EQ(d.temperature, 0.7f);
  EXPECT_EQ(d.top_k, 40);
  EXPECT_FLOAT_EQ(d.top_p, 0.95f);
  EXPECT_FLOAT_EQ(d.min_p, 0.0f);              // out of range: ignored
  EXPECT_FLOAT_EQ(d.repetition_penalty, 1.0f); // not a number: ignored
  // The YAML's (or a command-line flag's) value wins over the checkpoint's.
  const auto yaml = specula::core::parse_pipeline("backend: {plugin: cpu}\ntarget: {model: m.gguf}\nsampler: {temperature: 0}\n",
                                                  "t.yaml", ".");
  d = specula::core::generation_defaults(yaml, &file);
  EXPECT_FLOAT_EQ(d.temperature, 0.0f);
  EXPECT_EQ(d.top_k, 40);
  const auto flag = specula::core::parse_pipeline("backend: {plugin: cpu}\ntarget: {model: m.gguf}\n", "t.yaml", ".",
                                                  {{"sampler.top_k", "7", "--top-k"}});
  EXPECT_EQ(specula::core::generation_defaults(flag, &file).top_k, 7);
  // do_sample false: greedy whatever the temperature.
  const GenerationConfigFile greedy(json{{"do_sample", false}, {"temperature", 0.7}});
  EXPECT_FLOAT_EQ(specula::core::generation_defaults(bare, &greedy).temperature, 0.0f);
  EXPECT_FLOAT_EQ(specula::core::generation_defaults(bare, nullptr).temperature, 0.0f);

  // A GGUF's general.sampling.* keys, as llama.cpp's converter writes them.
  const GenerationConfigFile gguf(json{{"general.sampling.temp", 0.6}, {"general.sampling.top_k", 64},
                                       {"general.sampling.top_p", 0.9}, {"general.sampling.min_p", 2.0}}, true);
  d = specula::core::generation_defaults(bare, &gguf);
  EXPECT_FLOAT_EQ(d.temperature, 0.6f);
  EXPECT_EQ(d.top_k, 64);
  EXPECT_FLOAT_EQ(d.top_p, 0.9f);
  EXPECT_FLOAT_EQ(d.min_p, 0.0f);  // out of range: ignored
  EXPECT_EQ(specula::core::generation_defaults(flag, &gguf).top_k, 7);

  // The server's defaults (Model::default_sampling from those params) reach a request that sets none.
  specula::serve::ServedModel model = stub_model();
  d = specula::core::generation_defaults(bare, &file);
  model.defaults.temperature = d.temperature;
  model.defaults.top_k = d.top_k;
  model.defaults.top_p = d.top_p;
  auto r = specula::serve::read_completion({{"prompt", "x"}, {"max_tokens", 4}}, false, model, 1);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.7f);
  EXPECT_EQ(r.sampling.top_k, 40);
  r = specula::serve::read_completion({{"prompt", "x"}, {"max_tokens", 4}, {"temperature", 0}}, false, model, 1);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_k, 40);
}

// The shipped default pipeline sets temperature 0 in its sampler section, and a GGUF carries no
// generation_config.json: the tiny pair stays greedy.
TEST(ServeTools, TheDefaultPipelineStaysGreedy) {
  EXPECT_FLOAT_EQ(tiny()->default_sampling().temperature, 0.0f);
  EXPECT_FLOAT_EQ(tiny()->built().sampling.temperature, 0.0f);
}

// presence_penalty, frequency_penalty and logit_bias reach the sampling settings; bad values are a 400
// naming the field.
TEST(ServeTools, PenaltiesAndLogitBiasAreReadAndBadValuesNameTheField) {
  specula::serve::ServedModel model = stub_model();
  const json base = {{"prompt", "x"}, {"max_tokens", 4}};
  json b = base;
  b["presence_penalty"] = 1.5;
  b["frequency_penalty"] = -0.5;
  b["logit_bias"] = {{"7", -100}, {"42", 2.5}};
  const auto r = specula::serve::read_completion(b, false, model, 1);
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 1.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  const std::vector<std::pair<int32_t, float>> bias{{42, 2.5f}, {7, -100.0f}};  // nlohmann orders keys as strings
  EXPECT_EQ(r.sampling.logit_bias, bias);
  EXPECT_EQ(specula::serve::read_completion(base, false, model, 1).sampling.presence_penalty, 0.0f);
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"presence_penalty", 2.5}, {"presence_penalty", "x"}, {"frequency_penalty", -3},
           {"logit_bias", json::array({1})}, {"logit_bias", {{"abc", 1}}}, {"logit_bias", {{"-1", 1}}},
           {"logit_bias", {{"100", 1}}}, {"logit_bias", {{"5", 101}}}, {"logit_bias", {{"5", "high"}}},
           {"logit_bias", {{"5x", 1}}}}) {
    json bad = base;
    bad[field] = value;
    try {
      specula::serve::read_completion(bad, false, model, 1);
      ADD_FAILURE() << bad.dump() << " was accepted";
    } catch (const specula::serve::HttpError& e) {
      EXPECT_EQ(e.status, 400) << bad.dump();
      EXPECT_EQ(e.param, field) << bad.dump() << ": " << e.message;
      EXPECT_NE(e.message.find(field), std::string::npos) << e.message;
    }
  }
}

}  // namespace

// response_format json_object through the server, drafter on: the answer parses as a JSON object (or, cut
// by max_tokens, is a prefix of one), streamed pieces add up to the same answer, usage says why rounds
// verified on the host and what the drafter proposed; unknown types are 400s that say so.
TEST(ServeTools, JsonObjectResponseFormatWithTheDrafterOn) {
  ASSERT_TRUE(tiny()->has_drafter());
  Running s;
  json body = chat_body("Answer in JSON: who was the first king?", 64);
  body["response_format"] = {{"type", "json_object"}};
  const auto r = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  const std::string content = r.body["choices"][0]["message"]["content"];
  const auto check = specula::check_json_object_prefix(content);
  EXPECT_TRUE(check.valid) << content;
  if (r.body["choices"][0]["finish_reason"] == "stop") {
    EXPECT_TRUE(json::parse(content).is_object()) << content;
  }
  EXPECT_NE(r.body["usage"].value("host_sampling_reason", "").find("json_object"), std::string::npos) << r.raw;
  EXPECT_TRUE(r.body["usage"].contains("completion_tokens_details")) << "the drafter kept drafting: " << r.raw;

  json streamed = body;
  streamed["stream"] = true;
  auto client = s.client();
  const auto sr = client.Post("/v1/chat/completions", streamed.dump(), "application/json");
  ASSERT_TRUE(sr);
  ASSERT_EQ(sr->status, 200) << sr->body;
  std::string pieces;
  for (const std::string& e : events(sr->body)) {
    if (e == "[DONE]") continue;
    const json c = json::parse(e);
    if (!c["choices"].empty() && c["choices"][0]["delta"].contains("content"))
      pieces += c["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_EQ(pieces, content);

  for (const json& bad : {json{{"type", "json_schema"}, {"json_schema", {{"name", "x"}}}},
                          json{{"type", "yaml"}}, json{{"type", "json_object"}, {"extra", 1}}}) {
    json b = body;
    b["response_format"] = bad;
    const auto e = post(s, "/v1/chat/completions", b);
    EXPECT_EQ(e.status, 400) << bad.dump() << " " << e.raw;
    EXPECT_NE(e.raw.find("response_format"), std::string::npos) << e.raw;
  }
}

// response_format json_schema and a forced tool call through the server, drafter on (the node tests ask
// the same through the openai client for 20 schemas; these run under the sanitizers too).
TEST(ServeTools, JsonSchemaAndForcedToolCallsWithTheDrafterOn) {
  Running s;
  const json schema = json::parse(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
    "tribe": {"enum": ["Judah", "Benjamin"]}, "years": {"type": "integer", "minimum": 1, "maximum": 99}},
    "required": ["name", "tribe", "years"], "additionalProperties": false})");
  json body = chat_body("Answer in JSON: who was the first king?", 200);
  body["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "king"}, {"schema", schema}}}};
  const auto r = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"][0]["finish_reason"], "stop") << r.raw;
  const json answer = json::parse(r.body["choices"][0]["message"]["content"].get<std::string>());
  EXPECT_LE(answer.at("name").get<std::string>().size(), 12u);
  EXPECT_TRUE(answer.at("tribe") == "Judah" || answer.at("tribe") == "Benjamin") << answer;
  EXPECT_GE(answer.at("years").get<int>(), 1);
  EXPECT_LE(answer.at("years").get<int>(), 99);
  EXPECT_EQ(answer.size(), 3u);
  EXPECT_NE(r.body["usage"].value("host_sampling_reason", "").find("json_schema"), std::string::npos) << r.raw;

  json call = chat_body("Weather in Paris?", 120);
  call["tools"] = json::array({kWeather});
  // Bounded: nothing but the model ends a free string, and this one knows nothing of cities.
  call["tools"][0]["function"]["parameters"]["properties"]["city"]["maxLength"] = 16;
  call["tool_choice"] = "required";
  const auto c = post(s, "/v1/chat/completions", call);
  ASSERT_EQ(c.status, 200) << c.raw;
  EXPECT_EQ(c.body["choices"][0]["finish_reason"], "tool_calls") << c.raw;
  const json& calls = c.body["choices"][0]["message"]["tool_calls"];
  ASSERT_GE(calls.size(), 1u) << c.raw;
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  const json args = json::parse(calls[0]["function"]["arguments"].get<std::string>());
  EXPECT_TRUE(args.at("city").is_string()) << args;
}

// n choices, plain and streamed (the node tests ask the same through the openai client; these run under
// the sanitizers too): indexes 0..n-1, each streamed choice its role, text and one finish chunk.
TEST(ServeTools, NChoicesPlainAndStreamed) {
  Running s;
  json body = chat_body("Who made the heaven and the earth?", 8);
  body["n"] = 3;
  body["temperature"] = 1;
  body["seed"] = 5;
  const auto r = post(s, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  ASSERT_EQ(r.body["choices"].size(), 3u) << r.raw;
  std::vector<std::string> texts;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.body["choices"][i]["index"], i);
    texts.push_back(r.body["choices"][i]["message"]["content"]);
  }
  EXPECT_LE(r.body["usage"]["completion_tokens"].get<int>(), 24);

  body["stream"] = true;
  auto client = s.client();
  const auto sr = client.Post("/v1/chat/completions", body.dump(), "application/json");
  ASSERT_TRUE(sr);
  ASSERT_EQ(sr->status, 200) << sr->body;
  std::vector<std::string> pieces(3);
  std::vector<int> roles(3, 0), finishes(3, 0);
  int done = 0;
  for (const std::string& e : events(sr->body)) {
    if (e == "[DONE]") {
      ++done;
      continue;
    }
    const json c = json::parse(e);
    for (const json& ch : c["choices"]) {
      const size_t i = ch["index"];
      ASSERT_LT(i, 3u) << e;
      if (ch["delta"].contains("role")) ++roles[i];
      if (ch["delta"].contains("content")) pieces[i] += ch["delta"]["content"].get<std::string>();
      if (!ch["finish_reason"].is_null()) ++finishes[i];
    }
  }
  EXPECT_EQ(done, 1);
  EXPECT_EQ(roles, std::vector<int>(3, 1));
  EXPECT_EQ(finishes, std::vector<int>(3, 1));
  EXPECT_EQ(pieces, texts);  // the same seed, the same choices

  body["n"] = 17;
  EXPECT_EQ(post(s, "/v1/chat/completions", body).status, 400);
}

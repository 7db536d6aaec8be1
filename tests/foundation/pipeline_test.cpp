// The YAML pipeline: schema, error messages (file, line, key, suggestion), ${ENV}, relative paths, and
// building a pipeline through the plugin host.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/expect_contains.hpp"
#include "specula/core/generator.hpp"
#include "specula/core/pipeline.hpp"
#include "specula/core/plugin_host.hpp"
#include "specula/error.hpp"
#include "test_util.hpp"
#include "toy.hpp"

using specula::core::load_pipeline;
using specula::core::parse_pipeline;

namespace {

std::string error_of(const std::string& yaml, const std::string& name = "p.yaml") {
  try {
    parse_pipeline(yaml, name, "/base");
  } catch (const specula::Error& e) {
    return e.what();
  }
  return "(no error)";
}


TEST(Pipeline, ParsesEverySection) {
  auto p = parse_pipeline(R"(
plugin_paths: [plugins, /abs/plugins]
backend:
  plugin: cpu
  options: {threads: 2, name: "x", fast: true, ratio: 0.5, list: [1, "2"], quoted: "7"}
target:
  model: models/t.gguf
  format: gguf
  plugin: gemma4
  context_length: 2048
drafter:
  model: ../d.gguf
  draft_tokens: 4
  convention: llamacpp
sampler:
  plugin: standard
  temperature: 0.7
  top_k: 40
  top_p: 0.9
  repetition_penalty: 1.1
  presence_penalty: 0.5
  frequency_penalty: -1.25
  logit_bias: {7: -100, 12: 2.5}
  penalty_window: 32
  min_length: 2
  seed: 42
  max_tokens: 100
chat:
  system: "Be brief."
  enable_thinking: true
  show_thoughts: false
)", "dir/p.yaml", "/base/dir");
  EXPECT_EQ(p.plugin_paths, (std::vector<std::filesystem::path>{"/base/dir/plugins", "/abs/plugins"}));
  EXPECT_EQ(p.backend.plugin, "cpu");
  EXPECT_EQ(p.backend.options["threads"], 2);
  EXPECT_EQ(p.backend.options["name"], "x");
  EXPECT_EQ(p.backend.options["fast"], true);
  EXPECT_DOUBLE_EQ(p.backend.options["ratio"].get<double>(), 0.5);
  EXPECT_EQ(p.backend.options["list"], nlohmann::json::parse(R"([1, "2"])"));
  EXPECT_EQ(p.backend.options["quoted"], "7");  // quoted scalars stay strings
  EXPECT_EQ(p.target.model, "/base/dir/models/t.gguf");
  EXPECT_EQ(p.target.format, "gguf");
  EXPECT_EQ(p.target.plugin, "gemma4");
  EXPECT_EQ(p.target.context_length, 2048);
  ASSERT_TRUE(p.drafter.has_value());
  EXPECT_EQ(p.drafter->model, "/base/d.gguf");
  EXPECT_EQ(p.drafter->draft_tokens, 4);
  EXPECT_EQ(p.drafter->convention, specula::core::DraftConvention::LlamaCpp);
  EXPECT_FLOAT_EQ(p.sampler.params.temperature, 0.7f);
  EXPECT_EQ(p.sampler.params.top_k, 40);
  EXPECT_FLOAT_EQ(p.sampler.params.top_p, 0.9f);
  EXPECT_FLOAT_EQ(p.sampler.params.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(p.sampler.params.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.sampler.params.frequency_penalty, -1.25f);
  EXPECT_EQ(p.sampler.params.logit_bias, (std::vector<std::pair<int32_t, float>>{{7, -100.0f}, {12, 2.5f}}));
  EXPECT_EQ(p.sampler.params.penalty_window, 32);
  EXPECT_EQ(p.sampler.params.min_length, 2);
  EXPECT_EQ(p.sampler.params.seed, 42u);
  EXPECT_EQ(p.sampler.max_tokens, 100);
  EXPECT_EQ(p.chat.system, "Be brief.");
  EXPECT_TRUE(p.chat.enable_thinking);
  EXPECT_FALSE(p.chat.show_thoughts);
}

TEST(Pipeline, DefaultsForOptionalSections) {
  auto p = parse_pipeline("backend: {plugin: cpu}\ntarget: {model: m.gguf}\n", "p.yaml", "/b");
  EXPECT_FALSE(p.drafter.has_value());
  EXPECT_EQ(p.sampler.plugin, "standard");
  EXPECT_EQ(p.sampler.params.temperature, 0.0f);
  EXPECT_EQ(p.sampler.max_tokens, 256);
  EXPECT_TRUE(p.backend.options.is_object());
}

TEST(Pipeline, UnknownKeyNamesFileLineAndSuggestsTheClosestKey) {
  std::string e = error_of("backend: {plugin: cpu}\ntarget: {model: m.gguf}\nsampler:\n  tempreature: 0.5\n");
  EXPECT_CONTAINS(e, "p.yaml:4:3:");
  EXPECT_CONTAINS(e, "unknown key 'tempreature' in section 'sampler'");
  EXPECT_CONTAINS(e, "did you mean 'temperature'?");
  e = error_of("backend: {plugin: cpu}\ntargte: {model: m.gguf}\n");
  EXPECT_CONTAINS(e, "p.yaml:2:1:");
  EXPECT_CONTAINS(e, "unknown key 'targte' at the top level; did you mean 'target'?");
  e = error_of("backend: {plugin: cpu}\ntarget: {model: m.gguf}\nzebra: 1\n");
  EXPECT_CONTAINS(e, "unknown key 'zebra'");
  EXPECT_EQ(e.find("did you mean"), std::string::npos) << "no suggestion for an unrelated word: " << e;
}

TEST(Pipeline, WrongTypesNameTheKeyAndWhatWasExpected) {
  const std::string head = "backend: {plugin: cpu}\ntarget: {model: m.gguf}\n";
  std::string e = error_of(head + "sampler:\n  top_k: lots\n");
  EXPECT_CONTAINS(e, "p.yaml:4:10:");
  EXPECT_CONTAINS(e, "key 'sampler.top_k' must be an integer, got 'lots'");
  e = error_of(head + "sampler: {temperature: [1, 2]}\n");
  EXPECT_CONTAINS(e, "key 'sampler.temperature' must be a number, got a list");
  e = error_of(head + "chat: {enable_thinking: maybe}\n");
  EXPECT_CONTAINS(e, "key 'chat.enable_thinking' must be true or false, got 'maybe'");
  e = error_of(head + "sampler: {top_p: 1.5}\n");
  EXPECT_CONTAINS(e, "key 'sampler.top_p' must be between 0 and 1, got 1.5");
  e = error_of("backend: cpu\ntarget: {model: m.gguf}\n");
  EXPECT_CONTAINS(e, "p.yaml:1:10:");
  EXPECT_CONTAINS(e, "'backend' must be a mapping of keys (plugin, options), not 'cpu'");
  e = error_of("backend: {plugin: cpu, options: 3}\ntarget: {model: m.gguf}\n");
  EXPECT_CONTAINS(e, "key 'backend.options' must be a mapping, got '3'");
}

TEST(Pipeline, MissingRequiredKeysAndSections) {
  std::string e = error_of("backend: {plugin: cpu}\ntarget: {format: gguf}\n");
  EXPECT_CONTAINS(e, "p.yaml:2:9:");
  EXPECT_CONTAINS(e, "missing required key 'model' in section 'target'");
  e = error_of("target: {model: m.gguf}\n");
  EXPECT_CONTAINS(e, "missing required key 'backend' at the top level");
  e = error_of("");
  EXPECT_CONTAINS(e, "p.yaml: the pipeline is empty");
  e = error_of("backend: {plugin: cpu\n");
  EXPECT_CONTAINS(e, "p.yaml:");
  EXPECT_CONTAINS(e, "not valid YAML");
}

TEST(Pipeline, MissingFileIsAClearError) {
  try {
    load_pipeline("/nonexistent/dir/pipeline.yaml");
    FAIL();
  } catch (const specula::Error& e) {
    EXPECT_CONTAINS(e.what(), "pipeline file /nonexistent/dir/pipeline.yaml cannot be read");
  }
}

TEST(Pipeline, ExpandsEnvironmentVariablesAndResolvesRelativePaths) {
  test::TempDir dir;
  setenv("SPECULA_TEST_MODELS", "/models", 1);
  setenv("SPECULA_TEST_TEMP", "0.25", 1);
  unsetenv("SPECULA_TEST_UNSET");
  auto file = test::write_file(dir / "sub/p.yaml", R"(
backend: {plugin: "${SPECULA_TEST_UNSET:-${SPECULA_TEST_ALSO_UNSET:-cpu}}"}
target: {model: "${SPECULA_TEST_MODELS}/t.gguf"}
drafter: {model: drafts/d.gguf}
sampler: {temperature: "${SPECULA_TEST_TEMP}"}
plugin_paths: ../plugins
)");
  auto p = load_pipeline(file);
  EXPECT_EQ(p.backend.plugin, "cpu");
  EXPECT_EQ(p.target.model, "/models/t.gguf");
  EXPECT_EQ(p.drafter->model, dir.path() / "sub/drafts/d.gguf");
  EXPECT_EQ(p.plugin_paths.at(0), dir.path() / "plugins");
  EXPECT_FLOAT_EQ(p.sampler.params.temperature, 0.25f);

  // A default is expanded only when used.
  EXPECT_EQ(specula::core::expand_env("${SPECULA_TEST_MODELS:-${SPECULA_TEST_UNSET}}/x", "w"), "/models/x");
  EXPECT_THROW(specula::core::expand_env("${SPECULA_TEST_MODELS", "w"), specula::Error);
  std::string e = error_of("backend: {plugin: cpu}\ntarget: {model: \"${SPECULA_TEST_UNSET}/m\"}\n");
  EXPECT_CONTAINS(e, "p.yaml:2:17:");
  EXPECT_CONTAINS(e, "environment variable 'SPECULA_TEST_UNSET' is not set");
}

TEST(Pipeline, ClosestMatch) {
  std::vector<std::string> keys = {"temperature", "top_k", "top_p", "seed"};
  EXPECT_EQ(specula::core::closest_match("temprature", keys), "temperature");
  EXPECT_EQ(specula::core::closest_match("topk", keys), "top_k");
  EXPECT_EQ(specula::core::closest_match("sed", keys), "seed");
  EXPECT_EQ(specula::core::closest_match("backend", keys), "");
}

TEST(Pipeline, BuildsThroughThePluginHostAndGenerates) {
  test::TempDir dir;
  test::write_file(dir / "t.toy", R"({"architecture": "toy", "vocab": 64, "context_length": 64, "end_tokens": []})");
  test::write_file(dir / "d.toy", R"({"architecture": "toy-drafter", "error_every": 3})");
  auto file = test::write_file(dir / "p.yaml", "plugin_paths: [" + test::plugin_dir("toy") + R"(]
backend: {plugin: toy}
target: {model: t.toy}
drafter: {model: d.toy, draft_tokens: 3}
sampler: {plugin: toy, max_tokens: 12}
)");
  auto p = load_pipeline(file);
  specula::core::PluginHost host;
  host.discover(specula::core::plugin_search_path(p.plugin_paths));
  auto built = specula::core::build_pipeline(p, host);
  ASSERT_NE(built.drafter, nullptr);
  specula::core::Generator gen(built.target, built.sampler, built.drafter);
  specula::core::GenerationOptions o;
  o.max_tokens = p.sampler.max_tokens;
  std::vector<int32_t> prompt = {3, 4, 5};
  auto r = gen.generate(prompt, o);
  toy::Config c;
  std::vector<int32_t> prefix = prompt, expect;
  for (int i = 0; i < 12; ++i) {
    expect.push_back(toy::argmax(toy::logits_after(prefix, 64, c.seed, c.sharpness)));
    prefix.push_back(expect.back());
  }
  EXPECT_EQ(r.tokens, expect);
  EXPECT_GT(r.stats.accepted_tokens, 0);

  // A failing section is named.
  auto bad = test::write_file(dir / "bad.yaml", "plugin_paths: [" + test::plugin_dir("toy") +
                                                    "]\nbackend: {plugin: nosuchbackend}\ntarget: {model: t.toy}\n");
  try {
    specula::core::build_pipeline(load_pipeline(bad), host);
    FAIL();
  } catch (const specula::Error& e) {
    EXPECT_CONTAINS(e.what(), "bad.yaml: section 'backend': no backend plugin named 'nosuchbackend' (backend plugins found: ");
  }
}

}  // namespace

namespace {

TEST(Pipeline, EveryShippedConfigParses) {
  int n = 0;
  for (const auto& item : std::filesystem::directory_iterator(std::string(SPECULA_SOURCE_DIR) + "/configs")) {
    if (item.path().extension() != ".yaml") continue;
    SCOPED_TRACE(item.path().string());
    auto p = load_pipeline(item.path());
    EXPECT_FALSE(p.target.model.empty());
    EXPECT_TRUE(p.target.model.is_absolute());
    ++n;
  }
  EXPECT_GE(n, 1);
}

}  // namespace

namespace {

std::string error_with(const std::string& yaml, const std::vector<specula::core::Override>& overrides) {
  try {
    parse_pipeline(yaml, "p.yaml", "/base", overrides);
  } catch (const specula::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// "onednn", the CPU backend's name before "cpu", still names it: in the YAML and in --backend, and the
// pipeline then builds the build's CPU backend plugin.
TEST(Pipeline, OnednnIsAnAliasOfTheCpuBackend) {
  const auto p = parse_pipeline("backend: {plugin: onednn, options: {threads: 1}}\ntarget: {model: m.gguf}\n", "p.yaml",
                                "/b");
  EXPECT_EQ(p.backend.plugin, "cpu");
  EXPECT_EQ(parse_pipeline("backend: {plugin: vulkan}\ntarget: {model: m.gguf}\n", "p.yaml", "/b",
                           {{"backend.plugin", "onednn", "command line (--backend)"}})
                .backend.plugin,
            "cpu");
  specula::core::PluginHost host;
  host.discover({std::filesystem::path(SPECULA_PLUGIN_DIR)});
  const auto backend = specula::core::make_backend(p, host);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "cpu");
}

TEST(Pipeline, DuplicateKeysAreErrorsNamingBothLines) {
  std::string e = error_of("backend: {plugin: cpu}\ntarget: {model: m.gguf}\nbackend:\n  plugin: vulkan\n");
  EXPECT_EQ(e, "p.yaml:3:1: duplicate key 'backend' (first at line 1, again at line 3); each key may appear once in a mapping");
  e = error_of("backend: {plugin: cpu}\ntarget:\n  model: m.gguf\n  options: {prefill_chunk: 4, prefill_chunk: 8}\n");
  EXPECT_EQ(e, "p.yaml:4:31: duplicate key 'prefill_chunk' (first at line 4, again at line 4); each key may appear once in a mapping");
}

TEST(Pipeline, CommandLineOverridesPassTheSameChecksAndNameTheFlag) {
  const std::string yaml = "backend: {plugin: cpu}\ntarget: {model: m.gguf}\nsampler: {temperature: 0.5}\n";
  EXPECT_EQ(error_with(yaml, {{"sampler.temperature", "abc", "command line (--temp)"}}),
            "command line (--temp): key 'sampler.temperature' must be a number, got 'abc'");
  EXPECT_EQ(error_with(yaml, {{"target.context_length", "-5", "command line (--ctx-size)"}}),
            "command line (--ctx-size): key 'target.context_length' must be between 0 and 2147483647, got -5");
  EXPECT_EQ(error_with(yaml, {{"drafter.draft_tokens", "4", "command line (--draft-max)"}}),
            "command line (--draft-max): needs a drafter (--drafter PATH or a drafter section in the pipeline)");
  EXPECT_EQ(error_with(yaml, {{"drafter.model", "/d.gguf", "command line (--drafter)"},
                              {"drafter.draft_tokens", "65", "command line (--draft-max)"}}),
            "command line (--draft-max): key 'drafter.draft_tokens' must be between 1 and 64, got 65");
  EXPECT_EQ(error_with(yaml, {{"drafter.model", "/d.gguf", "command line (--drafter)"},
                              {"drafter.draft_tokens", "0", "command line (--draft-max)"}}),
            "command line (--draft-max): key 'drafter.draft_tokens' must be between 1 and 64, got 0");

  EXPECT_EQ(error_with(yaml, {{"drafter.model", "/d.gguf", "command line (--drafter)"},
                              {"drafter.convention", "vllm", "command line (--mtp-convention)"}}),
            "command line (--mtp-convention): key 'drafter.convention' must be one of specula, llamacpp, got 'vllm'");
  EXPECT_EQ(error_with(yaml, {{"drafter.model", "/d.gguf", "command line (--drafter)"},
                              {"drafter.draft_tokens", "auto", "command line (--draft-max)"},
                              {"drafter.convention", "llamacpp", "command line (--mtp-convention)"}}),
            "command line (--mtp-convention): drafter.convention llamacpp drafts a fixed number of tokens per round, "
            "as llama.cpp does; give drafter.draft_tokens a number, not auto");

  auto p = parse_pipeline(yaml, "p.yaml", "/base",
                          {{"sampler.temperature", "0.9", "command line (--temp)"},
                           {"backend.options.threads", "4", "command line (--threads)"},
                           {"sampler.stop", "END", "command line (--stop)", true},
                           {"sampler.stop", "\n\n", "command line (--stop)", true}});
  EXPECT_FLOAT_EQ(p.sampler.params.temperature, 0.9f);
  EXPECT_EQ(p.backend.options, nlohmann::json::parse(R"({"threads": 4})"));  // typed as the YAML would be
  EXPECT_EQ(p.backend.options_at.at("threads"), "command line (--threads)");
  EXPECT_EQ(p.sampler.stop, (std::vector<std::string>{"END", "\n\n"}));
  // --stop adds to the pipeline's own stop strings, a single one or a list.
  for (const char* stop : {"stop: x", "stop: [x]"}) {
    auto q = parse_pipeline(std::string("backend: {plugin: cpu}\ntarget: {model: m.gguf}\nsampler: {") + stop + "}\n",
                            "p.yaml", "/base", {{"sampler.stop", "y", "command line (--stop)", true}});
    EXPECT_EQ(q.sampler.stop, (std::vector<std::string>{"x", "y"})) << stop;
  }

  // Without a YAML file: the default pipeline with the overrides.
  auto d = specula::core::default_pipeline({{"target.model", "/m.gguf", "command line (--model)"}});
  EXPECT_EQ(d.backend.plugin, "cpu");
  EXPECT_EQ(d.target.model, "/m.gguf");
  EXPECT_EQ(d.sampler.plugin, "standard");
  try {
    specula::core::default_pipeline({});
    FAIL();
  } catch (const specula::Error& e) {
    EXPECT_CONTAINS(e.what(), "no model: give a pipeline YAML");
  }
}

TEST(Pipeline, OptionLocationsStopStringsSeedAndContextFull) {
  auto p = parse_pipeline("backend:\n  plugin: cpu\n  options: {threads: 2}\ntarget: {model: m.gguf}\n"
                          "sampler: {seed: -1, stop: \"</s>\"}\nchat: {context_full: error}\n",
                          "p.yaml", "/b");
  EXPECT_EQ(p.backend.options_at.at("threads"), "p.yaml:3:13");
  EXPECT_EQ(p.backend.options_at.at(""), "p.yaml:3:12");
  EXPECT_TRUE(p.sampler.random_seed);
  EXPECT_EQ(p.sampler.stop, std::vector<std::string>{"</s>"});
  EXPECT_FALSE(p.chat.drop_old_turns);
  auto q = parse_pipeline("backend: {plugin: cpu}\ntarget: {model: m.gguf}\nsampler: {seed: 7, stop: [a, b]}\n", "p.yaml", "/b");
  EXPECT_FALSE(q.sampler.random_seed);
  EXPECT_EQ(q.sampler.params.seed, 7u);
  EXPECT_EQ(q.sampler.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(q.chat.drop_old_turns);
  EXPECT_CONTAINS(error_of("backend: {plugin: cpu}\ntarget: {model: m.gguf}\nsampler: {seed: -2}\n"),
                  "key 'sampler.seed' must be between -1 and");
  EXPECT_CONTAINS(error_of("backend: {plugin: cpu}\ntarget: {model: m.gguf}\nchat: {context_full: wrap}\n"),
                  "p.yaml:3:22: key 'chat.context_full' must be one of drop, error, got 'wrap'");
}

TEST(OptionSchema, ChecksNamesTypesAndRangesWithLocations) {
  const specula::OptionSchema schema = {
      {"threads", specula::OptionType::Integer, "threads", 0, 0, 1024, {}},
      {"isa", specula::OptionType::String, "kernels", "auto", std::nullopt, std::nullopt, {"auto", "avx2"}},
      {"profile", specula::OptionType::Bool, "profile", false, std::nullopt, std::nullopt, {}}};
  const specula::OptionLocations at = {{"", "p.yaml:3:12"}, {"thread", "p.yaml:3:13"}, {"threads", "p.yaml:3:13"}};
  auto error = [&](const char* json) {
    try {
      specula::check_options(schema, nlohmann::json::parse(json), "backend plugin 'x'", at);
    } catch (const specula::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_EQ(error(R"({"threads": 4, "isa": "avx2", "profile": true})"), "(no error)");
  EXPECT_EQ(error(R"({"thread": 4})"), "p.yaml:3:13: unknown option 'thread' of backend plugin 'x'; did you mean "
                                       "'threads'? (valid options: threads, isa, profile)");
  EXPECT_EQ(error(R"({"bogus_opt": 1})"),
            "p.yaml:3:12: unknown option 'bogus_opt' of backend plugin 'x' (valid options: threads, isa, profile)");
  EXPECT_EQ(error(R"({"threads": 1e9})"),
            "p.yaml:3:13: option 'threads' of backend plugin 'x' must be an integer between 0 and 1024, got 1000000000.0");
  EXPECT_EQ(error(R"({"threads": 2000})"),
            "p.yaml:3:13: option 'threads' of backend plugin 'x' must be an integer between 0 and 1024, got 2000");
  EXPECT_EQ(error(R"({"isa": "sse"})"), "p.yaml:3:12: option 'isa' of backend plugin 'x' must be one of auto, avx2, got \"sse\"");
  EXPECT_EQ(error(R"({"profile": 1})"), "p.yaml:3:12: option 'profile' of backend plugin 'x' must be true or false, got 1");
  try {
    specula::check_options({}, nlohmann::json::parse(R"({"a": 1})"), "sampler plugin 'standard'");
    FAIL();
  } catch (const specula::Error& e) {
    EXPECT_STREQ(e.what(), "unknown option 'a' of sampler plugin 'standard' (it takes no options)");
  }
}

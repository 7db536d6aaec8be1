// The `specula` binary: plugins, validate, run (with the toy plugin), and its dynamic dependencies.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "specula/plugin.hpp"

#include "test_util.hpp"
#include "toy.hpp"

namespace {

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

std::vector<int32_t> reference_greedy(std::vector<int32_t> prefix, int n, const toy::Config& c = {}) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(toy::argmax(toy::logits_after(prefix, c.vocab, c.seed, c.sharpness)));
    prefix.push_back(out.back());
  }
  return out;
}

// A toy target/drafter pair and a pipeline using them.
struct ToySetup {
  test::TempDir dir;
  std::filesystem::path pipeline;
  ToySetup(const std::string& extra = "", const std::string& tensors = "[]") {
    test::write_file(dir / "models/t.toy", R"({"architecture": "toy", "vocab": 64, "context_length": 256,
      "end_tokens": [], "tensors": )" + tensors + "}");
    test::write_file(dir / "models/d.toy", R"({"architecture": "toy-drafter", "error_every": 3})");
    pipeline = test::write_file(dir / "p.yaml", "plugin_paths: [" + test::plugin_dir("toy") + R"(]
backend: {plugin: toy}
target: {model: models/t.toy}
drafter: {model: models/d.toy, draft_tokens: 3}
sampler: {plugin: toy, max_tokens: 16}
chat: {system: "be nice"}
)" + extra);
  }
};

TEST(Cli, PluginsListsFoundAndRejectedWithReasons) {
  auto r = test::run_command(test::cli() + " plugins --json --plugin-path " + test::plugin_dir("first") +
                                 " --plugin-path " + test::plugin_dir("second") + " --plugin-path " +
                                 test::plugin_dir("bad"),
                             false);
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  // The build's own plugin directory is searched too; look at the test plugins only.
  nlohmann::json dups = nlohmann::json::array(), rejected = nlohmann::json::array();
  for (const auto& p : j["plugins"]) {
    if (p["name"] == "dup") dups.push_back(p);
  }
  for (const auto& r : j["rejected"]) {
    if (r["file"].get<std::string>().rfind(TEST_PLUGIN_ROOT, 0) == 0) rejected.push_back(r);
  }
  ASSERT_EQ(dups.size(), 1u) << r.output;
  EXPECT_EQ(dups[0]["version"], "1.0.0");
  EXPECT_EQ(dups[0]["kinds"], nlohmann::json::parse(R"(["sampler"])"));
  EXPECT_EQ(dups[0]["file"], test::plugin_dir("first") + "/libspecula-dup.so");
  ASSERT_EQ(rejected.size(), 4u) << r.output;  // shadowed dup, no entry, wrong ABI, wrong fingerprint
  std::string all = rejected.dump();
  EXPECT_CONTAINS(all, "shadowed");
  EXPECT_CONTAINS(all, "plugin ABI version 999");
  EXPECT_CONTAINS(all, "msvc-19");
  EXPECT_CONTAINS(all, "does not export the entry symbol");

  auto text = test::run_command(test::cli() + " plugins --plugin-path " + test::plugin_dir("bad"));
  EXPECT_EQ(text.status, 0);
  EXPECT_CONTAINS(text.output, "rejected (");
  EXPECT_CONTAINS(text.output, "libspecula-wrongabi.so: built for plugin ABI version 999");
}

TEST(Cli, RunGeneratesFromTokensWithAndWithoutTheDrafter) {
  ToySetup s;
  const auto expect = reference_greedy({7, 8, 9}, 16);
  for (std::string flags : {"", " --no-drafter"}) {
    auto r = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 7,8,9 --json" + flags, false);
    ASSERT_EQ(r.status, 0) << r.output;
    auto j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), expect) << flags;
    EXPECT_EQ(j["stop_reason"], "max_tokens");
    EXPECT_EQ(j["stats"]["speculative_steps"].get<int>() > 0, flags.empty());
    toy::Tokenizer tok(64);
    EXPECT_EQ(j["text"], tok.decode(expect, true));
  }
  // --model instead of a pipeline; flags override.
  auto r = test::run_command(test::cli() + " run --model " + (s.dir / "models/t.toy").string() +
                                 " --backend toy --sampler toy --plugin-path " + test::plugin_dir("toy") +
                                 " --tokens 7,8,9 --max-tokens 5 --json",
                             false);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(nlohmann::json::parse(r.output)["tokens"].get<std::vector<int32_t>>(),
            std::vector<int32_t>(expect.begin(), expect.begin() + 5));
}

TEST(Cli, RunRendersThePromptWithTheChatFormatAndStreams) {
  ToySetup s;
  auto r = test::run_command(test::cli() + " run " + s.pipeline.string() + " --prompt hello -q", false);
  ASSERT_EQ(r.status, 0) << r.output;
  toy::Tokenizer tok(64);
  // The toy chat format renders "s:be nice.u:hello.a:".
  auto prompt = tok.encode("s:be nice.u:hello.a:", false, true);
  EXPECT_EQ(r.output, tok.decode(reference_greedy(prompt, 16), true) + "\n");

  auto sampled = test::run_command(test::cli() + " run " + s.pipeline.string() +
                                   " --tokens 3,4 --temperature 0.8 --seed 5 --json", false);
  auto again = test::run_command(test::cli() + " run " + s.pipeline.string() +
                                 " --tokens 3,4 --temperature 0.8 --seed 5 --json --no-drafter", false);
  ASSERT_EQ(sampled.status, 0) << sampled.output;
  EXPECT_EQ(nlohmann::json::parse(sampled.output)["tokens"], nlohmann::json::parse(again.output)["tokens"]);
  EXPECT_NE(nlohmann::json::parse(sampled.output)["tokens"].get<std::vector<int32_t>>(), reference_greedy({3, 4}, 16));
}

TEST(Cli, RunReportsBadInputClearly) {
  ToySetup s;
  auto r = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 1,x");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.output, "'x' is not a token id");
  r = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 1,99");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.output, "id 99 is outside the vocabulary of 64 tokens");
  r = test::run_command(test::cli() + " run " + s.pipeline.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.output, "exactly one of --prompt TEXT and --tokens IDS");
  r = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 1 --context-length 200 --max-tokens 2");
  EXPECT_EQ(r.status, 0) << r.output;
  // Past the model's own context: refused before loading (validate gives the same message).
  r = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 1 --context-length 300 --max-tokens 2");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.output, "section 'target': context length 300 exceeds the model's 256 tokens");
  std::string long_prompt = "1";
  for (int i = 0; i < 40; ++i) long_prompt += ",2";
  r = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens " + long_prompt + " --context-length 32");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.output, "the prompt has 41 tokens but the context holds 32 tokens");
  ToySetup typo("samplr: {}\n");
  r = test::run_command(test::cli() + " run " + typo.pipeline.string() + " --tokens 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.output, "unknown key 'samplr' at the top level; did you mean 'sampler'?");
  r = test::run_command(test::cli() + " run --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_CONTAINS(r.output, "--temperature");
}

TEST(Cli, ValidateChecksPluginsFilesAndBackendSupport) {
  ToySetup good("", R"([{"name": "w", "type": "F16", "shape": [4, 4]}, {"name": "n", "type": "Q4_K", "shape": [256]}])");
  auto r = test::run_command(test::cli() + " validate " + good.pipeline.string());
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_CONTAINS(r.output, "backend 'toy' runs MatMul on F16 weights");
  EXPECT_CONTAINS(r.output, "pipeline is valid");

  ToySetup quantized("", R"([{"name": "w", "type": "Q4_K", "shape": [4, 256]}])");
  r = test::run_command(test::cli() + " validate " + quantized.pipeline.string());
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_CONTAINS(r.output, "FAIL  target: backend 'toy' runs MatMul on Q4_K weights: the toy backend has no kernels for Q4_K");

  test::write_file(quantized.dir / "q.yaml", "plugin_paths: [" + test::plugin_dir("toy") +
                                                 "]\nbackend: {plugin: toy}\ntarget: {model: nowhere.gguf}\nsampler: {plugin: nope}\n");
  r = test::run_command(test::cli() + " validate " + (quantized.dir / "q.yaml").string());
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.output, "nowhere.gguf does not exist");
  EXPECT_CONTAINS(r.output, "FAIL  sampler: plugin 'nope': no sampler plugin named 'nope' (sampler plugins found: toy");
}

TEST(Cli, TheBinaryLinksNoPlugin) {
  auto r = test::run_command("readelf -d " + test::cli(), false);
  ASSERT_EQ(r.status, 0) << r.output;
  int needed = 0;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find("(NEEDED)") == std::string::npos) continue;
    ++needed;
    EXPECT_EQ(line.find("specula"), std::string::npos) << "specula links a Specula library: " << line;
    EXPECT_EQ(line.find("dnnl"), std::string::npos) << line;
    EXPECT_EQ(line.find("vulkan"), std::string::npos) << line;
  }
  EXPECT_GT(needed, 0) << "readelf output had no NEEDED entries: " << r.output;
  auto v = test::run_command(test::cli() + " version");
  EXPECT_EQ(v.status, 0);
  EXPECT_CONTAINS(v.output, "plugin ABI " + std::to_string(SPECULA_PLUGIN_ABI_VERSION));
}

}  // namespace

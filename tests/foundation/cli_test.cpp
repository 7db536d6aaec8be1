// The `specula` binary: plugins, validate, run (with the toy plugin), and its dynamic dependencies.
#include <gtest/gtest.h>

#include <sstream>

#include <nlohmann/json.hpp>

#include "common/expect_contains.hpp"
#include "specula/plugin.hpp"

#include "test_util.hpp"
#include "toy.hpp"

namespace {


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
    // Acceptance by draft position (llama-server's per-position totals) and the mean accepted length.
    const auto& st = j["stats"];
    const auto by_pos = st["accepted_by_position"].get<std::vector<int64_t>>();
    const auto drafted_pos = st["drafted_by_position"].get<std::vector<int64_t>>();
    ASSERT_EQ(by_pos.size(), drafted_pos.size());
    int64_t sum = 0;
    for (size_t i = 0; i < by_pos.size(); ++i) {
      sum += by_pos[i];
      EXPECT_LE(by_pos[i], drafted_pos[i]);
      if (i > 0) {
        EXPECT_LE(by_pos[i], by_pos[i - 1]) << "an accepted draft follows accepted ones";
      }
    }
    EXPECT_EQ(sum, st["accepted_tokens"].get<int64_t>());
    const int64_t steps = st["speculative_steps"];
    EXPECT_DOUBLE_EQ(st["mean_accepted_length"].get<double>(), steps ? double(sum) / steps : 0.0);
  }
  // --trace-json: one line per speculative round and a summary that adds up to the same tokens.
  {
    auto r = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 7,8,9 --trace-json", false);
    ASSERT_EQ(r.status, 0) << r.output;
    std::istringstream lines(r.output);
    std::vector<nlohmann::json> trace;
    for (std::string line; std::getline(lines, line);) trace.push_back(nlohmann::json::parse(line));
    ASSERT_GE(trace.size(), 2u);
    const auto& sum = trace.back()["summary"];
    EXPECT_EQ(sum["generated"].get<std::vector<int32_t>>(), expect);
    EXPECT_EQ(sum["n_predict"], 16);
    EXPECT_EQ(static_cast<size_t>(sum["rounds"].get<int>()), trace.size() - 1);
    int64_t drafted = 0, accepted = 0;
    for (size_t i = 0; i + 1 < trace.size(); ++i) {
      const auto& t = trace[i];
      EXPECT_EQ(t["round"], static_cast<int>(i));
      EXPECT_EQ(t["ids"].size(), t["draft"].size() + 1);
      EXPECT_EQ(t["steps"].size(), t["draft"].size());
      for (const auto& st : t["steps"]) EXPECT_TRUE(st["top"].empty()) << "the toy drafter has no distribution";
      drafted += static_cast<int64_t>(t["draft"].size());
      accepted += t["n_accepted"].get<int64_t>();
    }
    EXPECT_EQ(sum["n_drafted"], drafted);
    EXPECT_EQ(sum["n_accept"], accepted);
    auto both = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 7,8 --trace-json --json");
    EXPECT_EQ(both.status, 1);
    EXPECT_CONTAINS(both.output, "--trace-json prints the drafter's rounds and a summary instead of the text; it "
                                 "cannot be combined with --json");
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
                                 " --tokens 3,4 --temperature 0.8 --seed 5 --json", false);
  ASSERT_EQ(sampled.status, 0) << sampled.output;
  // A seed repeats a sampled speculative run (drafting changes which tokens a seed gives, not their
  // distribution: tests/speculative).
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

namespace {

// What `run` says after "error: ", without the "FILE: section 'x': " that build_pipeline puts first.
std::string run_error(const std::string& output) {
  const std::string marker = "specula run: error: ";
  const size_t at = output.find(marker);
  if (at == std::string::npos) return "(no error in: " + output + ")";
  std::string message = output.substr(at + marker.size());
  message = message.substr(0, message.find('\n'));
  if (size_t s = message.find(": section '"); s != std::string::npos) message = message.substr(message.find("': ", s) + 3);
  return message;
}

}  // namespace

TEST(Cli, ValidateRefusesWhatRunRefusesWithTheSameMessage) {
  struct Case {
    std::string yaml_extra, tensors, flags, expected;
  };
  const std::vector<Case> cases = {
      {"backend:\n  plugin: toy\n", "[]", "", "duplicate key 'backend' (first at line 2, again at line 7)"},
      {"", "[]", " --draft-tokens 65", "command line (--draft-tokens): key 'drafter.draft_tokens' must be between 1 and 64, got 65"},
      {"", "[]", " --draft-max 0", "command line (--draft-max): key 'drafter.draft_tokens' must be between 1 and 64, got 0"},
      {"", "[]", " -t 1e9", "command line (--threads): option 'threads' of backend plugin 'toy' must be an integer between 0 and 1024, got 1000000000.0"},
      {"", "[]", " --threads 4 --temp abc", "command line (--temp): key 'sampler.temperature' must be a number, got 'abc'"},
      {"", "[]", " -c 300", "context length 300 exceeds the model's 256 tokens"},
      {"", "[]", " --drafter models/wide.toy", "the toy drafter's backbone is 2 but the target's hidden size is 1"},
      {"", "[]", " --model models/none.toy", "models/none.toy does not exist"},
      {"", "[]", " --sampler nope", "no sampler plugin named 'nope'"},
  };
  for (const auto& c : cases) {
    ToySetup s(c.yaml_extra, c.tensors);
    test::write_file(s.dir / "models/wide.toy", R"({"architecture": "toy-drafter", "backbone": 2})");
    const std::string common = " " + s.pipeline.string() + c.flags;
    const std::string in_dir = "cd " + test::quote(s.dir.path().string()) + " && ";
    auto run = test::run_command(in_dir + test::cli() + " run" + common + " --tokens 1 -q");
    EXPECT_EQ(run.status, 1) << c.flags << run.output;
    const std::string message = run_error(run.output);
    EXPECT_CONTAINS(message, c.expected);
    auto validate = test::run_command(in_dir + test::cli() + " validate" + common);
    EXPECT_EQ(validate.status, 1) << validate.output;
    EXPECT_CONTAINS(validate.output, message);
  }
  // Backend options: a typo gets the closest option, with the YAML line.
  ToySetup typo("", "[]");
  test::write_file(typo.pipeline, "plugin_paths: [" + test::plugin_dir("toy") + R"(]
backend:
  plugin: toy
  options: {thread: 2}
target: {model: models/t.toy}
)");
  auto r = test::run_command(test::cli() + " run " + typo.pipeline.string() + " --tokens 1");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.output, "p.yaml:4:13: unknown option 'thread' of backend plugin 'toy'; did you mean 'threads'? "
                            "(valid options: threads, isa)");
  EXPECT_CONTAINS(test::run_command(test::cli() + " validate " + typo.pipeline.string()).output, run_error(r.output));
}

TEST(Cli, PluginsOptionsPrintsTheSchema) {
  auto r = test::run_command(test::cli() + " plugins --plugin-path " + test::plugin_dir("toy") + " --options toy");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_CONTAINS(r.output, "backend plugin 'toy' (backend.options):\n  threads            an integer between 0 and 1024, default 0\n");
  EXPECT_CONTAINS(r.output, "model plugin 'toy' (target.options):\n  (no options)\n");
  EXPECT_CONTAINS(r.output, "drafter plugin 'toy' (drafter.options):\n  (no schema declared: the plugin checks its options itself)\n");
  r = test::run_command(test::cli() + " plugins --plugin-path " + test::plugin_dir("toy") + " --options toy --json", false);
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["backend"][1]["name"], "isa");
  EXPECT_EQ(j["backend"][1]["type"], "one of auto, avx2, avx512");
  EXPECT_EQ(j["backend"][1]["default"], "auto");
  r = test::run_command(test::cli() + " plugins --plugin-path " + test::plugin_dir("toy") + " --options tyo");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.output, "no plugin named 'tyo' (did you mean 'toy'?)");
}

TEST(Cli, FlagsFollowLlamaCppInEveryCommand) {
  ToySetup s;
  const auto expect = reference_greedy({7, 8, 9}, 16);
  // -n/--n-predict (and --max-tokens), -c/--ctx-size, --temp, --draft-max.
  for (std::string flags : {" -n 5", " --n-predict 5", " --max-tokens 5 -c 64", " --ctx-size 64 -n 5 --temp 0",
                            " --draft-max 2 -n 5", " --top-k 3 --top-p 0.9 --repeat-penalty 1 -n 5"}) {
    auto r = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 7,8,9 --json" + flags, false);
    ASSERT_EQ(r.status, 0) << flags << r.output;
    EXPECT_EQ(nlohmann::json::parse(r.output)["tokens"].get<std::vector<int32_t>>(),
              std::vector<int32_t>(expect.begin(), expect.begin() + 5)) << flags;
  }
  // --seed -1: a random seed, printed, and in --json; giving it back repeats the run.
  auto r = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 3,4 --temp 0.8 --seed -1 --json");
  ASSERT_EQ(r.status, 0) << r.output;
  const size_t at = r.output.find("specula info: seed: ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string seed = r.output.substr(at + 20, r.output.find(' ', at + 20) - at - 20);
  EXPECT_CONTAINS(r.output, "(drawn at random; --seed " + seed + " repeats it)");
  auto j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(std::to_string(j["seed"].get<uint64_t>()), seed);
  auto again = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 3,4 --temp 0.8 --json --seed " + seed, false);
  EXPECT_EQ(nlohmann::json::parse(again.output)["tokens"], j["tokens"]);
  // -s/--system and -f/--file.
  test::write_file(s.dir / "prompt.txt", "hello");
  toy::Tokenizer tok(64);
  auto sys = test::run_command(test::cli() + " run " + s.pipeline.string() + " -f " + (s.dir / "prompt.txt").string() +
                                   " -s terse -q", false);
  ASSERT_EQ(sys.status, 0) << sys.output;
  EXPECT_EQ(sys.output, tok.decode(reference_greedy(tok.encode("s:terse.u:hello.a:", false, true), 16), true) + "\n");
  auto minp = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 1 --min-p 2");
  EXPECT_EQ(minp.status, 1);
  EXPECT_CONTAINS(minp.output, "command line (--min-p): key 'sampler.min_p' must be between 0 and 1, got 2");
  EXPECT_EQ(test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 1 -n 2 --min-p 0.05 --temp 0.7").status, 0);
  // --version, help CMD, and an unknown command.
  auto v = test::run_command(test::cli() + " --version");
  EXPECT_EQ(v.status, 0);
  EXPECT_CONTAINS(v.output, "plugin ABI " + std::to_string(SPECULA_PLUGIN_ABI_VERSION));
  auto h = test::run_command(test::cli() + " help run");
  EXPECT_EQ(h.status, 0);
  EXPECT_CONTAINS(h.output, "--n-predict");
  EXPECT_CONTAINS(h.output, "--ctx-size");
  EXPECT_CONTAINS(h.output, "--threads");
  EXPECT_CONTAINS(test::run_command(test::cli() + " help validate").output, "--temp");
}

TEST(Cli, AModelFileWhereAPipelineGoesRunsTheDefaultPipeline) {
  ToySetup s;
  const std::string flags = " --backend toy --sampler toy --plugin-path " + test::plugin_dir("toy") + " --tokens 7,8,9 -n 4 --json";
  auto r = test::run_command(test::cli() + " run " + (s.dir / "models/t.toy").string() + flags, false);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto expect = reference_greedy({7, 8, 9}, 4);
  EXPECT_EQ(nlohmann::json::parse(r.output)["tokens"].get<std::vector<int32_t>>(), expect);
  auto both = test::run_command(test::cli() + " run " + (s.dir / "models/t.toy").string() + " --model x.toy" + flags);
  EXPECT_EQ(both.status, 1);
  EXPECT_CONTAINS(both.output, "t.toy and --model both name the model; give one");
  // Without a backend override the default pipeline's cpu backend is used (and named if absent).
  auto v = test::run_command(test::cli() + " validate " + (s.dir / "models/t.toy").string() + " --backend toy --sampler toy --plugin-path " +
                             test::plugin_dir("toy"));
  EXPECT_EQ(v.status, 0) << v.output;
  EXPECT_CONTAINS(v.output, "pipeline is valid");
}

TEST(Cli, WriteErrorsOnStdoutAreErrors) {
  ToySetup s;
  // (...) so that run_command's 2>&1 keeps stderr out of /dev/full.
  auto r = test::run_command("(" + test::cli() + " run " + s.pipeline.string() + " --tokens 7,8,9 -q > /dev/full)");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.output, "specula run: error: writing to stdout failed: No space left on device");
  r = test::run_command("(" + test::cli() + " run " + s.pipeline.string() + " --tokens 7,8,9 --json > /dev/full)");
  EXPECT_EQ(r.status, 1);
  // Even with stderr full too, the status says it failed.
  EXPECT_EQ(test::run_command(test::cli() + " version > /dev/full").status, 1);
  r = test::run_command("(" + test::cli() + " version > /dev/full)");
  EXPECT_EQ(r.status, 1);
  EXPECT_CONTAINS(r.output, "specula version: error: writing to stdout failed");
}

TEST(Cli, StopStringsEndGenerationBeforeThem) {
  ToySetup s;
  toy::Tokenizer tok(64);
  const std::string full = tok.decode(reference_greedy({7, 8, 9}, 16), true);
  const std::string stop = full.substr(5, 2);
  const std::string expected = full.substr(0, full.find(stop));
  auto r = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 7,8,9 --json --stop " + test::quote(stop) +
                                 " --stop zzzzzz", false);
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["text"], expected);
  EXPECT_EQ(j["stop_reason"], "stop_string");
  // Streamed the same (text that may begin a stop string is held back until it cannot).
  auto streamed = test::run_command(test::cli() + " run " + s.pipeline.string() + " --tokens 7,8,9 -q --stop " + test::quote(stop), false);
  EXPECT_EQ(streamed.output, expected + "\n");
}

TEST(Cli, CtrlCStopsGenerationAndKeepsTheResults) {
  test::TempDir dir;
  test::write_file(dir / "t.toy", R"({"architecture": "toy", "vocab": 64, "context_length": 4096, "end_tokens": [], "delay_ms": 20})");
  const std::string pipeline = test::write_file(dir / "p.yaml", "plugin_paths: [" + test::plugin_dir("toy") +
                                                                    "]\nbackend: {plugin: toy}\ntarget: {model: t.toy}\n"
                                                                    "sampler: {plugin: toy, max_tokens: 1000}\n").string();
  // 1000 tokens take 20 s; SIGINT after 0.5 s ends it with the text so far and a complete JSON object.
  const std::string out = (dir / "out.json").string();
  auto r = test::run_command(test::cli() + " run " + pipeline + " --tokens 1,2 --json > " + out + " & pid=$!; " + test::wait_for_sigint_handler() + "sleep 0.3; kill -INT $pid; wait $pid; echo rc=$?");
  EXPECT_CONTAINS(r.output, "rc=0");
  std::ifstream in(out);
  auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["stop_reason"], "interrupted");
  const auto n = j["tokens"].size();
  EXPECT_GT(n, 0u);
  EXPECT_LT(n, 1000u);
  EXPECT_EQ(j["stats"]["generated_tokens"], n);
  // Streaming: the statistics still come; a second Ctrl+C exits at once with 130.
  r = test::run_command("(" + test::cli() + " run " + pipeline + " --tokens 1,2 > /dev/null & pid=$!; " + test::wait_for_sigint_handler() + "sleep 0.3; kill -INT $pid; wait $pid; echo rc=$?)");
  EXPECT_CONTAINS(r.output, "stop: interrupted");
  EXPECT_CONTAINS(r.output, "rc=0");
  test::write_file(dir / "slow.toy", R"({"architecture": "toy", "vocab": 64, "context_length": 4096, "end_tokens": [], "delay_ms": 3000})");
  r = test::run_command(test::cli() + " run " + pipeline + " --model " + (dir / "slow.toy").string() +
                        " --tokens 1,2 > /dev/null & pid=$!; " + test::wait_for_sigint_handler() + "sleep 0.3; kill -INT $pid; sleep 0.2; kill -INT $pid; wait $pid; echo rc=$?");
  EXPECT_CONTAINS(r.output, "rc=130");
}

// Replays the kept fuzz corpus and the crash regressions through the same code the fuzzers run, in every
// build (and so under ASan/UBSan with SPECULA_SANITIZE=ON).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz_bodies.hpp"
#include "fuzz_http_body.hpp"
#include "fuzz_model_body.hpp"
#include "fuzz_text_bodies.hpp"
#include "fuzz_tool_call_body.hpp"
#include "fuzz_grammar_body.hpp"
#include "fuzz_json_schema_body.hpp"
#include "fuzz_json_object_body.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

const fs::path kRoot = fs::path(SPECULA_SOURCE_DIR) / "tests/fuzz";

using Body = bool (*)(const uint8_t*, size_t);

// Every kept input of one target must be accepted or refused with specula::Error; the seeds include
// valid inputs, so some must be accepted.
void replay(const std::string& target, Body body) {
  const auto files = files_in(kRoot / "corpus" / target);
  ASSERT_GE(files.size(), 5u) << "corpus/" << target << " missing";
  size_t accepted = 0;
  for (const auto& f : files) {
    const auto bytes = read(f);
    EXPECT_NO_THROW(accepted += body(bytes.data(), bytes.size())) << f;
  }
  EXPECT_GT(accepted, 0u) << target;
  std::printf("  %zu %s corpus inputs, %zu accepted\n", files.size(), target.c_str(), accepted);
}

const std::vector<std::pair<std::string, Body>> kTargets = {
    {"gguf", specula::fuzz::gguf_one},           {"safetensors", specula::fuzz::safetensors_one},
    {"tokenizer", specula::fuzz::tokenizer_one}, {"config", specula::fuzz::config_one},
    {"pipeline", specula::fuzz::pipeline_one},   {"model", specula::fuzz::model_one},
    {"http_request", specula::fuzz::http_request_one}, {"tool_call", specula::fuzz::tool_call_one},
    {"json_object", specula::fuzz::json_object_one}, {"grammar", specula::fuzz::grammar_one},
    {"json_schema", specula::fuzz::json_schema_one},
};

}  // namespace

TEST(FuzzCorpus, GgufInputsParseOrFailCleanly) { replay("gguf", specula::fuzz::gguf_one); }
TEST(FuzzCorpus, SafetensorsInputsParseOrFailCleanly) { replay("safetensors", specula::fuzz::safetensors_one); }
TEST(FuzzCorpus, TokenizerInputsLoadOrFailCleanly) { replay("tokenizer", specula::fuzz::tokenizer_one); }
TEST(FuzzCorpus, ConfigInputsReadOrFailCleanly) { replay("config", specula::fuzz::config_one); }
TEST(FuzzCorpus, PipelineInputsParseOrFailCleanly) { replay("pipeline", specula::fuzz::pipeline_one); }
TEST(FuzzCorpus, ModelInputsLoadOrFailCleanly) { replay("model", specula::fuzz::model_one); }
TEST(FuzzCorpus, HttpRequestInputsReadOrFailCleanly) { replay("http_request", specula::fuzz::http_request_one); }

TEST(FuzzCorpus, ToolCallInputsParseOrAreRefused) { replay("tool_call", specula::fuzz::tool_call_one); }
TEST(FuzzCorpus, JsonObjectInputsAreJudgedAsAStrictParserDoes) { replay("json_object", specula::fuzz::json_object_one); }
TEST(FuzzCorpus, GrammarInputsParseOrAreRefused) { replay("grammar", specula::fuzz::grammar_one); }
TEST(FuzzCorpus, JsonSchemaInputsCompileToGrammarsOrAreRefused) { replay("json_schema", specula::fuzz::json_schema_one); }

TEST(FuzzCorpus, CrashRegressions) {
  // regressions/<target>-<name>: inputs that once crashed a fuzzer; each must now fail cleanly or pass.
  size_t replayed = 0;
  for (const auto& f : files_in(kRoot / "regressions")) {
    const auto bytes = read(f);
    const std::string name = f.filename().string();
    bool known = false;
    for (const auto& [target, body] : kTargets) {
      if (name.rfind(target + "-", 0) != 0) continue;
      EXPECT_NO_THROW(body(bytes.data(), bytes.size())) << f;
      known = true;
      ++replayed;
    }
    EXPECT_TRUE(known) << f << " names no fuzz target";
  }
  EXPECT_GE(replayed, 2u);
}

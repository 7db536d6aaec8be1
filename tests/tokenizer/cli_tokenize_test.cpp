// `specula tokenize` end to end: the CLI opens the vocab GGUF through the gguf format plugin and must
// print exactly what the tokenizer computes.
#include <algorithm>
#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "vocab_fixture.hpp"

namespace specula {
namespace {

struct Run {
  int status;
  std::string out;
};

// Runs the CLI with `args` (already shell-quoted), capturing stdout and stderr.
Run run_cli(const std::string& args) {
  const std::string cmd = std::string("SPECULA_PLUGIN_PATH= '") + SPECULA_CLI + "' " + args + " 2>&1";
  Run r{-1, {}};
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  r.status = pclose(p);
  return r;
}

std::string vocab_arg() { return "--model '" + test::gemma4_vocab_path().string() + "'"; }

// Each run loads the 262144-token vocabulary, so the cases share runs.
TEST(TokenizeCli, JsonMatchesTheLibraryWithoutBosOrSpecials) {
  const auto tok = test::gemma4_tokenizer();
  const std::string text = " Hello World! Grüße 🦙\n\n  x<|turn>user";
  const auto r = run_cli("tokenize " + vocab_arg() + " --json -- '" + text + "'");
  ASSERT_EQ(r.status, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out);
  const auto ids = j["ids"].get<std::vector<int32_t>>();
  EXPECT_EQ(ids, tok->encode(text));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 105), 0);  // <|turn> stays text without --parse-special
  EXPECT_NE(ids[0], 2);                                     // no BOS without --bos
  ASSERT_EQ(j["pieces"].size(), j["ids"].size());
  EXPECT_EQ(j["pieces"][0], "\xE2\x96\x81Hello");
}

TEST(TokenizeCli, BosAndParseSpecialOnRequest) {
  auto special = nlohmann::json::parse(run_cli("tokenize " + vocab_arg() + " --json --bos --parse-special '<|turn>user'").out);
  EXPECT_EQ(special["ids"], (nlohmann::json{2, 105, 2364}));
}

TEST(TokenizeCli, TableAndErrors) {
  const auto table = run_cli("tokenize " + vocab_arg() + " 'Hello world'");
  ASSERT_EQ(table.status, 0) << table.out;
  EXPECT_NE(table.out.find("9259"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("2 tokens"), std::string::npos) << table.out;
  const auto missing = run_cli("tokenize --model /no/such/model.gguf x");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.out.find("/no/such/model.gguf"), std::string::npos) << missing.out;
  const auto no_text = run_cli("tokenize " + vocab_arg());
  EXPECT_NE(no_text.status, 0);
  EXPECT_NE(no_text.out.find("TEXT"), std::string::npos) << no_text.out;
}

}  // namespace
}  // namespace specula

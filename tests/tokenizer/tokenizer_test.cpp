// Gemma 4 tokenizer parity: llama.cpp's own test vectors for the real vocabulary, byte-exact.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "specula/core/token_constraint.hpp"
#include "specula/error.hpp"
#include "vocab_fixture.hpp"

namespace specula {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<std::string> split(const std::string& s, const std::string& sep) {
  std::vector<std::string> out;
  size_t i = 0;
  for (size_t j; (j = s.find(sep, i)) != std::string::npos; i = j + sep.size()) out.push_back(s.substr(i, j - i));
  out.push_back(s.substr(i));
  return out;
}

std::vector<int32_t> parse_ids(const std::string& line) {
  std::vector<int32_t> ids;
  std::istringstream in(line);
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

TEST(Gemma4Tokenizer, LlamaCppVectorsByteExact) {
  const auto tok = test::gemma4_tokenizer();
  const auto base = test::gemma4_vocab_path().string();
  const auto inputs = split(slurp(base + ".inp"), "\n__ggml_vocab_test__\n");
  auto outputs = split(slurp(base + ".out"), "\n");
  ASSERT_EQ(outputs.back(), "");
  outputs.pop_back();
  ASSERT_EQ(inputs.size(), 46u);
  ASSERT_EQ(outputs.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    EXPECT_EQ(tok->encode(inputs[i]), parse_ids(outputs[i])) << "case " << i << ": '" << inputs[i] << "'";
    // Decoding gives the text back (the vectors hold no special-token text).
    const auto ids = parse_ids(outputs[i]);
    EXPECT_EQ(tok->decode(ids), inputs[i]) << "case " << i;
  }
}

TEST(Gemma4Tokenizer, SpecialTokensBosAndParsing) {
  const auto tok = test::gemma4_tokenizer();
  EXPECT_EQ(tok->vocab_size(), 262144);
  EXPECT_EQ(tok->bos(), 2);
  EXPECT_EQ(tok->eos(), 1);
  EXPECT_EQ(tok->token_id("<|turn>"), 105);
  EXPECT_EQ(tok->token_id("<turn|>"), 106);
  EXPECT_EQ(tok->token_id("<|channel>"), 100);
  EXPECT_EQ(tok->token_id("<channel|>"), 101);
  EXPECT_EQ(tok->token_id("no such piece"), std::nullopt);
  EXPECT_TRUE(tok->is_special(105));
  EXPECT_TRUE(tok->is_special(100));
  EXPECT_FALSE(tok->is_special(107));
  EXPECT_FALSE(tok->is_special(238));  // <0x00>
  EXPECT_EQ(tok->token_bytes(238 + 0xF4), std::string("\xF4"));
  EXPECT_EQ(tok->piece(138), "\xE2\x96\x81\xE2\x96\x81");
  EXPECT_EQ(tok->token_bytes(138), "  ");
  EXPECT_THROW(tok->piece(262144), Error);
  EXPECT_THROW(tok->piece(-1), Error);
  // BOS only when asked.
  EXPECT_EQ(tok->encode("Hello world", true), (std::vector<int32_t>{2, 9259, 1902}));
  EXPECT_EQ(tok->encode("", true), (std::vector<int32_t>{2}));
  EXPECT_TRUE(tok->encode("").empty());
  // Control tokens are matched in text only with parse_special.
  const std::string text = "<bos><|turn>user\nHi<turn|>\n";
  std::vector<int32_t> expected{2, 105, 2364, 107};
  for (int32_t id : tok->encode("Hi")) expected.push_back(id);
  expected.insert(expected.end(), {106, 107});
  EXPECT_EQ(tok->encode(text, false, true), expected);
  const auto plain = tok->encode(text, false, false);
  for (int32_t id : plain) {
    EXPECT_NE(id, 2);
    EXPECT_NE(id, 105);
    EXPECT_NE(id, 106);
  }
  EXPECT_EQ(tok->decode(plain), text);
  // User-defined tokens (the channel and tool markers) are matched in any text, as llama.cpp does.
  EXPECT_EQ(tok->encode("<|channel>thought\n<channel|>", false, false),
            (std::vector<int32_t>{100, 45518, 107, 101}));
  // Decoding skips special tokens unless asked to keep them.
  const std::vector<int32_t> ids{2, 105, 9259, 106};
  EXPECT_EQ(tok->decode(ids), "Hello");
  EXPECT_EQ(tok->decode(ids, false), "<bos><|turn>Hello<turn|>");
  // Byte fallback (the U+10FFFD vector) and invalid UTF-8.
  EXPECT_EQ(tok->encode("\xF4\x8F\xBF\xBD"), (std::vector<int32_t>{482, 381, 429, 427}));
  // Invalid UTF-8 bytes are carried as byte tokens and come back unchanged.
  const std::string bad = "a\xFF" "b\xC3(\xE2\x82";
  EXPECT_EQ(tok->decode(tok->encode(bad)), bad);
  EXPECT_EQ(tok->encode("\xFF"), (std::vector<int32_t>{238 + 0xFF}));
}

TEST(Gemma4Tokenizer, MissingTokenizerIsAClearError) {
  test::MetadataFile empty("gguf", "/nowhere/model.gguf", nlohmann::json::object());
  try {
    make_tokenizer(empty);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nowhere/model.gguf"), std::string::npos) << e.what();
  }
  nlohmann::json md = {{"tokenizer.ggml.model", "gemma4"},
                        {"tokenizer.ggml.tokens", {"<pad>", "<eos>", "<bos>", "a", "b", "c", "d", "e"}},
                        {"tokenizer.ggml.token_type", {3, 3, 3, 1, 1, 1, 1, 9}},
                        {"tokenizer.ggml.merges", nlohmann::json::array()},
                        {"tokenizer.ggml.bos_token_id", 2},
                        {"tokenizer.ggml.eos_token_id", 1}};
  test::MetadataFile bad("gguf", "/x/bad.gguf", md);
  try {
    make_tokenizer(bad);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token_type[7]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// Random byte strings (invalid UTF-8, fragments of special tokens, spaces, newlines): encoding never
// fails and decoding with specials kept gives the bytes back, whether or not specials are parsed.
TEST(Gemma4Tokenizer, RandomBytesRoundTrip) {
  const auto tok = test::gemma4_tokenizer();
  std::mt19937 g(1234);
  const std::vector<std::string> parts = {"<|turn>", "<turn|>", "<|channel>", "<channel|>", "<bos>", "<|", "|>",
                                          " ", "  ", "\n", "\n\n", "\t", "\xF0\x9F\xA6\x99", "\xC3", "\xA4", "a",
                                          "Hello", "\xFF", std::string(1, '\0'), "<0x41>"};
  for (int n = 0; n < 1000; ++n) {
    std::string s;
    for (int k = std::uniform_int_distribution<int>(0, 30)(g); k > 0; --k) {
      if (g() % 3 == 0) s += static_cast<char>(g() & 0xFF);
      else s += parts[g() % parts.size()];
    }
    if (s.find("\xE2\x96\x81") != std::string::npos) continue;  // U+2581 decodes to a space by design
    for (bool special : {false, true}) {
      const auto ids = tok->encode(s, false, special);
      ASSERT_EQ(tok->decode(ids, false), s) << "parse_special=" << special;
    }
  }
}

std::filesystem::path write_temp(const std::string& name, const std::string& text) {
  const auto dir = std::filesystem::temp_directory_path() / ("specula_tok_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << text;
  return dir / name;
}

std::string error_of(const std::filesystem::path& json) {
  test::MetadataFile file("safetensors", json.parent_path(), {{"tokenizer_json_path", json.string()}});
  try {
    make_tokenizer(file);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Gemma4Tokenizer, BadTokenizerJsonIsAClearError) {
  const std::string norm = R"("normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"})";
  auto e = error_of(write_temp("trunc.json", R"({"model": {"type": "BPE", "vocab": {"a": 0)"));
  EXPECT_NE(e.find("trunc.json: not valid JSON"), std::string::npos) << e;
  e = error_of(write_temp("wordpiece.json", R"({"model": {"type": "WordPiece", "vocab": {}}, )" + norm + "}"));
  EXPECT_NE(e.find("model.type is \"WordPiece\""), std::string::npos) << e;
  e = error_of(write_temp("nfkc.json", R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {}, "merges": []},
      "normalizer": {"type": "NFKC"}})"));
  EXPECT_NE(e.find("normalizer"), std::string::npos) << e;
  e = error_of(write_temp("gap.json", R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {"a": 0, "b": 2},
      "merges": []}, )" + norm + "}"));
  EXPECT_NE(e.find("token id 1 is missing"), std::string::npos) << e;
  e = error_of(write_temp("nobytes.json", R"({"model": {"type": "BPE", "byte_fallback": true,
      "vocab": {"<bos>": 0, "<eos>": 1}, "merges": []}, )" + norm + "}"));
  EXPECT_NE(e.find("no byte-fallback token"), std::string::npos) << e;
  e = error_of("/no/such/tokenizer.json");
  EXPECT_NE(e.find("/no/such/tokenizer.json"), std::string::npos) << e;
}

}  // namespace
}  // namespace specula

// response_format json_object's mask over the real Gemma 4 vocabulary (262144 tokens): equal to trying
// every token's bytes after the text, and what a mask costs (printed: the benchmark figure lives in
// docs/serving.md; no timing is asserted).
TEST(JsonObjectConstraint, MaskOverTheGemma4Vocabulary) {
  const auto tok = specula::test::gemma4_tokenizer();
  const int64_t V = tok->vocab_size();
  const int32_t end = tok->eos();
  const auto t_trie = std::chrono::steady_clock::now();
  auto trie = specula::token_trie(tok);
  std::printf("[json_object] vocabulary trie built in %.1f ms\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_trie).count());
  {  // built once per tokenizer and kept while it lives, not once per request
    const std::weak_ptr<const specula::TokenTrie> kept = trie;
    trie.reset();
    EXPECT_FALSE(kept.expired());
    trie = specula::token_trie(tok);
    EXPECT_EQ(trie, kept.lock());
  }
  auto c = specula::json_object_constraint(trie, {end}, V);
  std::string text;
  for (const std::string& more : {std::string("{\"name\": \"Saul\", \"reign\": ["), std::string("\"")}) {
    SCOPED_TRACE("after '" + text + more + "'");
    for (const int32_t t : tok->encode(more, false, false)) c->accept(t);
    text += more;
    std::vector<float> logits(static_cast<size_t>(V), 0.0f);
    c->mask(logits, {});
    int64_t allowed = 0;
    for (int32_t id = 0; id < V; ++id) {
      const std::string bytes = tok->is_special(id) ? std::string() : tok->token_bytes(id);
      const bool want = !bytes.empty() && specula::check_json_object_prefix(text + bytes).valid;
      ASSERT_EQ(std::isinf(logits[static_cast<size_t>(id)]), !want) << "token " << id << " '" << bytes << "'";
      allowed += want;
    }
    EXPECT_GT(allowed, 10);
    // Inside a string nearly every token is allowed: the most a mask sets.
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 5; ++i) c->mask(logits, {});
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 5;
    std::printf("[json_object] mask over %lld tokens after '%s': %.2f ms, %lld allowed\n", static_cast<long long>(V),
                text.c_str(), ms, static_cast<long long>(allowed));
  }
}

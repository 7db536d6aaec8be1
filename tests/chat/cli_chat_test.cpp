// `specula chat` end to end with the foundation's toy plugin (tests/foundation/toy.hpp): a toy model
// whose logits depend on every token in its context, so a wrong KV-prefix reuse between turns changes
// the answer. Each turn must equal greedy decoding of the whole re-rendered conversation from scratch.
#include <gtest/gtest.h>

#include "test_util.hpp"
#include "toy.hpp"

namespace {

std::vector<int32_t> reference_greedy(std::vector<int32_t> prefix, int n) {
  const toy::Config c;
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(toy::argmax(toy::logits_after(prefix, c.vocab, c.seed, c.sharpness)));
    prefix.push_back(out.back());
  }
  return out;
}

struct ToyChat {
  test::TempDir dir;
  std::filesystem::path pipeline;
  ToyChat() {
    test::write_file(dir / "t.toy", R"({"architecture": "toy", "vocab": 64, "context_length": 512, "end_tokens": []})");
    test::write_file(dir / "d.toy", R"({"architecture": "toy-drafter", "error_every": 3})");
    pipeline = test::write_file(dir / "p.yaml", "plugin_paths: [" + test::plugin_dir("toy") + R"(]
backend: {plugin: toy}
target: {model: t.toy}
drafter: {model: d.toy, draft_tokens: 3}
sampler: {plugin: toy, max_tokens: 12}
chat: {system: "be nice"}
)");
  }
};

TEST(ChatCli, TurnsEqualFreshDecodingOfTheWholeConversation) {
  ToyChat s;
  const toy::Tokenizer tok(64);
  // The toy chat format renders role initial, ':', content, '.' per message, then "a:".
  const auto turn1 = reference_greedy(tok.encode("s:be nice.u:hello.a:", false, true), 12);
  const std::string history = "s:be nice.u:hello.a:" + tok.decode(turn1, false) + ".u:how are you.a:";
  const auto turn2 = reference_greedy(tok.encode(history, false, true), 12);
  const std::string expected = tok.decode(turn1, true) + "\n" + tok.decode(turn2, true) + "\n" + tok.decode(turn1, true) + "\n";
  for (std::string flags : {"", " --no-drafter"}) {
    const auto r = test::run_command("printf 'hello\\nhow are you\\n/reset\\nhello\\n/exit\\nignored\\n' | " + test::cli() +
                                         " chat " + s.pipeline.string() + " -q" + flags,
                                     false);
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(r.output, expected) << flags;
  }
}

TEST(ChatCli, SystemFlagAndEndOfInput) {
  ToyChat s;
  const toy::Tokenizer tok(64);
  const auto answer = reference_greedy(tok.encode("s:terse.u:hi.a:", false, true), 12);
  const auto r = test::run_command("printf 'hi' | " + test::cli() + " chat " + s.pipeline.string() + " --system terse -q", false);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, tok.decode(answer, true) + "\n");
}

}  // namespace

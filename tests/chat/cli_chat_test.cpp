// `specula chat` end to end with the foundation's toy plugin (tests/foundation/toy.hpp): a toy model
// whose logits depend on every token in its context, so a wrong KV-prefix reuse between turns changes
// the answer. Each turn must equal greedy decoding of the whole re-rendered conversation from scratch.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

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

namespace {

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST(ChatCli, HelpSystemAndSave) {
  ToyChat s;
  const toy::Tokenizer tok(64);
  const auto turn1 = reference_greedy(tok.encode("s:be nice.u:hi.a:", false, true), 12);
  // /system replaces the system message and keeps the conversation.
  const std::string history = "s:short.u:hi.a:" + tok.decode(turn1, false) + ".u:more.a:";
  const auto turn2 = reference_greedy(tok.encode(history, false, true), 12);
  const std::string saved = (s.dir / "conv.json").string();
  const auto r = test::run_command("printf 'hi\\n/help\\n/system short\\nmore\\n/save " + saved + "\\n/bogus\\n' | " + test::cli() +
                                   " chat " + s.pipeline.string() + " -q");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("/system TEXT   set the system message"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("/save FILE     write the conversation"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(system message set)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(saved 5 messages to " + saved + ")"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("specula chat: unknown command /bogus; /help lists them"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(tok.decode(turn2, true)), std::string::npos) << r.output;
  const auto j = nlohmann::json::parse(read_all(saved));
  ASSERT_EQ(j.size(), 5u);
  EXPECT_EQ(j[0], nlohmann::json::parse(R"({"role": "system", "content": "short"})"));
  EXPECT_EQ(j[1], nlohmann::json::parse(R"({"role": "user", "content": "hi"})"));
  EXPECT_EQ(j[3]["content"], "more");
  EXPECT_EQ(j[4]["role"], "assistant");
}

TEST(ChatCli, AFullContextDropsTheOldestTurns) {
  ToyChat s;
  const toy::Tokenizer tok(64);
  // 100 tokens of context, room for a 12-token reply: the third turn no longer fits with the first.
  const std::string input = "printf 'first message here\\nsecond message here\\nthird message here\\n' | ";
  const auto r = test::run_command(input + test::cli() + " chat " + s.pipeline.string() + " -q -c 100");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("(context full: dropped the 1 oldest exchange to make room)"), std::string::npos) << r.output;
  // The third answer is greedy decoding of the conversation without the first exchange.
  const std::string h1 = "s:be nice.u:first message here.a:";
  const auto turn1 = reference_greedy(tok.encode(h1, false, true), 12);
  const std::string h2 = h1 + tok.decode(turn1, false) + ".u:second message here.a:";
  const auto turn2 = reference_greedy(tok.encode(h2, false, true), 12);
  const std::string h3 = "s:be nice.u:second message here.a:" + tok.decode(turn2, false) + ".u:third message here.a:";
  const auto turn3 = reference_greedy(tok.encode(h3, false, true), 12);
  EXPECT_NE(r.output.find(tok.decode(turn3, true)), std::string::npos) << r.output;

  // chat.context_full: error refuses the turn instead, and the session goes on.
  test::write_file(s.dir / "e.yaml", "plugin_paths: [" + test::plugin_dir("toy") + R"(]
backend: {plugin: toy}
target: {model: t.toy}
sampler: {plugin: toy, max_tokens: 12}
chat: {system: "be nice", context_full: error}
)");
  const auto e = test::run_command(input + test::cli() + " chat " + (s.dir / "e.yaml").string() + " -q -c 100");
  EXPECT_EQ(e.status, 0) << e.output;
  EXPECT_NE(e.output.find("plus room for a reply but the context holds 100; /reset starts over"), std::string::npos) << e.output;
}

TEST(ChatCli, CtrlCStopsTheReplyAndKeepsTheSession) {
  test::TempDir dir;
  test::write_file(dir / "t.toy", R"({"architecture": "toy", "vocab": 64, "context_length": 4096, "end_tokens": [], "delay_ms": 20})");
  const std::string pipeline = test::write_file(dir / "p.yaml", "plugin_paths: [" + test::plugin_dir("toy") +
                                                                    "]\nbackend: {plugin: toy}\ntarget: {model: t.toy}\n"
                                                                    "sampler: {plugin: toy, max_tokens: 100}\n").string();
  // The first reply (100 tokens, 2 s) is interrupted after 0.5 s; the second line still gets a reply.
  const std::string out = (dir / "out.txt").string();
  const auto r = test::run_command("((echo one; sleep 1.5; echo two) | " + test::cli() + " chat " + pipeline + " > " + out +
                                   " & pid=$!; " + test::wait_for_sigint_handler() + "sleep 0.3; kill -INT $pid; wait $pid; echo rc=$?)");
  EXPECT_NE(r.output.find("rc=0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(reply interrupted)"), std::string::npos) << r.output;
  const std::string text = read_all(out);
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u) << text;
  EXPECT_LT(lines[0].size(), 60u);   // about 25 of 100 tokens
  EXPECT_GT(lines[1].size(), 80u);   // the whole reply (special tokens print nothing)
}

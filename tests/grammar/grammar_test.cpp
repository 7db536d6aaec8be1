// The GBNF engine: what the parser accepts and refuses, what the matcher reads, and token masks over the
// real Gemma 4 vocabulary checked token by token against the matcher reading the token's bytes.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "specula/core/grammar.hpp"
#include "specula/error.hpp"
#include "random_logits.hpp"
#include "vocab_fixture.hpp"

namespace specula {
namespace {

bool whole(const Grammar& g, std::string_view s) { return check_grammar_prefix(g, s).complete; }
bool prefix(const Grammar& g, std::string_view s) { return check_grammar_prefix(g, s).valid; }

TEST(Gbnf, ReadsRulesClassesRepetitionsAndComments) {
  const auto g = parse_gbnf(R"(# a small record
root   ::= "{" pair ("," pair)* "}"   # one or more pairs
pair   ::= key ":" value
key    ::= [a-z_] [a-z0-9_]{0,7}
value  ::= num | "\"" [^"\\\x00-\x1F]* "\"" | "true" | "null"?
num    ::= "-"? ([1-9] [0-9]{0,2} | "0")
)");
  EXPECT_TRUE(whole(*g, "{a:1}"));
  EXPECT_TRUE(whole(*g, "{a:-120,b_2:\"héllo 世界\",c:true,d:}"));  // "null"? may be empty
  EXPECT_TRUE(prefix(*g, "{abcdefgh"));
  EXPECT_FALSE(prefix(*g, "{abcdefghi"));  // 1 + at most 7 more
  EXPECT_FALSE(prefix(*g, "{a:1234"));     // at most 3 digits
  EXPECT_FALSE(prefix(*g, "{a:01"));
  EXPECT_FALSE(prefix(*g, "{A:1}"));
  EXPECT_FALSE(prefix(*g, "{a:\"\x01"));
  EXPECT_TRUE(prefix(*g, "{a:1,b:"));
  EXPECT_FALSE(whole(*g, "{a:1,b:\"x"));
  EXPECT_FALSE(whole(*g, "{}"));
  EXPECT_TRUE(whole(*g, "{x:0,y:0,z:0,w:0}"));
}

TEST(Gbnf, RepetitionCountsAreExact) {
  const auto g = parse_gbnf(R"(root ::= "a"{2,4} "b"{3} ("c" "d"){1,} "e"{0,})");
  EXPECT_FALSE(prefix(*g, "ab"));
  EXPECT_TRUE(whole(*g, "aabbbcd"));
  EXPECT_TRUE(whole(*g, "aaaabbbcdcdeee"));
  EXPECT_FALSE(prefix(*g, "aaaaa"));
  EXPECT_FALSE(prefix(*g, "aabbbb"));
  EXPECT_FALSE(whole(*g, "aabbbc"));
}

TEST(Gbnf, ReadsUtf8AsCodePoints) {
  const auto g = parse_gbnf(R"(root ::= [^a] [α-ω]+ "\u00e9" .)");
  EXPECT_TRUE(whole(*g, "ßαβé😀"));
  EXPECT_TRUE(prefix(*g, "ßα\xCE"));          // half of β: still possible
  EXPECT_FALSE(prefix(*g, "ßα\xD0"));         // U+0400..U+043F: no Greek small letter starts so
  EXPECT_FALSE(prefix(*g, "a"));
  EXPECT_FALSE(prefix(*g, "\xC0\x80"));       // overlong
  EXPECT_FALSE(prefix(*g, "\xED\xA0\x80"));   // a surrogate
  EXPECT_FALSE(prefix(*g, "\xFF"));
  EXPECT_FALSE(whole(*g, "ßαβé\xF0\x9F\x98"));  // the last character is not finished
}

TEST(Gbnf, NestsWithoutLeftRecursion) {
  const auto g = parse_gbnf("root ::= \"(\" root \")\" | \"x\"\n");
  EXPECT_TRUE(whole(*g, "((x))"));
  EXPECT_FALSE(prefix(*g, "(x))"));
  EXPECT_FALSE(whole(*g, "((x)"));
}

TEST(Gbnf, RefusesBadGrammarsSayingWhereAndWhy) {
  const auto message = [](std::string_view text) -> std::string {
    try {
      parse_gbnf(text);
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  EXPECT_EQ(message("root ::= item\n"), "grammar: rule 'item' is used but never defined");
  EXPECT_EQ(message("start ::= \"a\"\n"), "grammar: no rule 'root' (the start rule)");
  EXPECT_EQ(message("root ::= root \"a\" | \"b\"\n"),
            "grammar: rule 'root' is left-recursive (it can reach itself before reading a character)");
  EXPECT_EQ(message("root ::= x \"a\"\nx ::= \"\" | root\n"),
            "grammar: rule 'root' is left-recursive (it can reach itself before reading a character)");
  EXPECT_EQ(message("root ::= \"abc\n"), "grammar, line 1 column 14: unterminated string literal");
  EXPECT_EQ(message("root ::= \"a\"\n\nroot ::= \"b\"\n"), "grammar, line 3 column 5: rule 'root' is defined twice");
  EXPECT_EQ(message("root ::= \"\\q\""), "grammar, line 1 column 11: unknown escape '\\q'");
  EXPECT_EQ(message("root ::= \"a\"{3,2}"), "grammar, line 1 column 18: repetition {3,2}: the maximum is below the minimum");
  EXPECT_EQ(message("root ::= \"a\"{99999}"), "grammar, line 1 column 18: a repetition count above 10000");
  EXPECT_EQ(message("root ::= ( \"a\" "), "grammar, line 1 column 16: expected ')'");
  EXPECT_EQ(message("root ::= * \"a\""), "grammar, line 1 column 10: '*' repeats nothing");
  EXPECT_EQ(message("root ::= [z-a]"), "grammar, line 1 column 14: a character range whose end is below its start");
  EXPECT_EQ(message("root ::= \"a\" ) \"b\""), "grammar, line 1 column 14: unexpected ')'");
  // Unrolled repetitions are bounded: no grammar text makes the parser allocate without limit.
  std::string huge = "root ::=";
  for (int i = 0; i < 500; ++i) huge += " \"a\"{10000}";
  EXPECT_NE(message(huge).find("unrolls to more than"), std::string::npos);
}

// Every token of the real vocabulary: allowed by the mask exactly when the matcher takes the text so far
// followed by the token's bytes.
void expect_mask_matches_matcher(const Tokenizer& tok, const Grammar& g, const TokenConstraint& c, const std::string& text) {
  SCOPED_TRACE("after '" + text + "'");
  const int64_t V = tok.vocab_size();
  std::vector<float> logits(static_cast<size_t>(V), 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  c.mask(logits, {});
  std::printf("[grammar] first mask after '%s': %.1f ms (walks the trie for new stacks)\n", text.c_str(),
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  int64_t allowed = 0;
  for (int32_t id = 0; id < V; ++id) {
    const std::string bytes = tok.is_special(id) ? std::string() : tok.token_bytes(id);
    if (bytes.empty()) continue;
    const bool want = prefix(g, text + bytes);
    ASSERT_EQ(std::isinf(logits[static_cast<size_t>(id)]), !want) << "token " << id << " '" << bytes << "'";
    allowed += want;
  }
  EXPECT_GT(allowed, 0);
}

TEST(GrammarConstraint, MaskOverTheGemma4VocabularyEqualsTheMatcher) {
  const auto tok = test::gemma4_tokenizer();
  const auto g = parse_gbnf(R"(root ::= "{\"id\": \"" [A-Z]{3} "-" [0-9]{4} "\", \"note\": \"" char* "\"}"
char ::= [^"\\\x00-\x1F] | "\\" ["\\/bfnrtu]
)");
  auto c = grammar_constraint(g, tok, {tok->eos()}, tok->vocab_size(), "test grammar");
  std::string text;
  for (const std::string more : {"", "{\"id\": \"", "AB", "C-12", "34\", \"note\": \"", "hello wor"}) {
    for (const int32_t t : tok->encode(more, false, false)) c->accept(t);
    text += more;
    expect_mask_matches_matcher(*tok, *g, *c, text);
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<float> logits(static_cast<size_t>(tok->vocab_size()), 0.0f);
    for (int i = 0; i < 5; ++i) c->mask(logits, {});
    std::printf("[grammar] mask after '%s': %.3f ms (kept masks)\n", text.c_str(),
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 5);
  }
  EXPECT_FALSE(c->complete());
  for (const int32_t t : tok->encode("\"}", false, false)) c->accept(t);
  EXPECT_TRUE(c->complete());
  std::vector<float> logits(static_cast<size_t>(tok->vocab_size()), 0.0f);
  c->mask(logits, {});
  for (int32_t id = 0; id < tok->vocab_size(); ++id)
    EXPECT_EQ(std::isinf(logits[static_cast<size_t>(id)]), id != tok->eos()) << id;
}

TEST(GrammarConstraint, PendingDraftsMaskTheRowsAfterThem) {
  const auto tok = test::gemma4_tokenizer();
  const auto g = parse_gbnf(R"(root ::= "yes" | "no")");
  auto c = grammar_constraint(g, tok, {tok->eos()}, tok->vocab_size(), "test grammar");
  const auto yes = tok->encode("yes", false, false);
  ASSERT_EQ(yes.size(), 1u);
  std::vector<float> logits(static_cast<size_t>(tok->vocab_size()), 0.0f);
  c->mask(logits, yes);  // after the draft "yes": only the end
  for (int32_t id = 0; id < tok->vocab_size(); ++id)
    ASSERT_EQ(std::isinf(logits[static_cast<size_t>(id)]), id != tok->eos()) << id;
  EXPECT_FALSE(c->complete());  // a draft does not move the matcher
  const auto maybe = tok->encode("maybe", false, false);
  EXPECT_THROW(c->mask(logits, maybe), Error);
  EXPECT_THROW(c->accept(maybe[0]), Error);
}

TEST(GrammarConstraint, SpecialTokensAreMatchedById) {
  const auto tok = test::gemma4_tokenizer();
  const auto open = tok->token_id("<|tool_call>"), close = tok->token_id("<tool_call|>");
  ASSERT_TRUE(open && close);
  const auto g = parse_gbnf(R"(root ::= <|tool_call> "call:" [a-z]+ "{}" <tool_call|>)");
  auto c = grammar_constraint(g, tok, {tok->eos()}, tok->vocab_size(), "tool_choice required");
  std::vector<float> logits(static_cast<size_t>(tok->vocab_size()), 0.0f);
  c->mask(logits, {});
  for (int32_t id = 0; id < tok->vocab_size(); ++id)
    ASSERT_EQ(std::isinf(logits[static_cast<size_t>(id)]), id != *open) << id;
  c->accept(*open);
  for (const int32_t t : tok->encode("call:weather{}", false, false)) c->accept(t);
  std::fill(logits.begin(), logits.end(), 0.0f);
  c->mask(logits, {});
  EXPECT_FALSE(std::isinf(logits[static_cast<size_t>(*close)]));
  c->accept(*close);
  EXPECT_TRUE(c->complete());
  EXPECT_THROW(grammar_constraint(parse_gbnf("root ::= <|no_such_token|>"), tok, {}, tok->vocab_size(), "g"), Error);
}

// Random walks through the masks end in sentences of the grammar.
TEST(GrammarConstraint, SampledOutputsAreSentences) {
  const auto tok = test::gemma4_tokenizer();
  const auto g = parse_gbnf(R"(root ::= "[" item ("," item){0,3} "]"
item ::= "\"" [a-z ]{1,12} "\"" | [1-9] [0-9]{0,5} | "true"
)");
  std::mt19937 rng(7);
  test::RandomLogits random(static_cast<size_t>(tok->vocab_size()), 1.0f, rng);
  for (int run = 0; run < 20; ++run) {
    auto c = grammar_constraint(g, tok, {tok->eos()}, tok->vocab_size(), "test grammar");
    std::string text;
    for (int step = 0; step < 200; ++step) {
      const std::span<float> logits = random.next();
      try {
        c->mask(logits, {});
      } catch (const Error& e) {
        FAIL() << e.what() << " after '" << text << "'";
      }
      const auto best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (best == tok->eos()) break;
      c->accept(best);
      text += tok->token_bytes(best);
    }
    EXPECT_TRUE(whole(*g, text)) << text;
  }
}

}  // namespace
}  // namespace specula

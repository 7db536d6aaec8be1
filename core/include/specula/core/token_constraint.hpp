// Structured output: a constraint on the tokens a generation may produce, applied as a mask over the
// target's logits before the sampling rule sees them (vLLM's and llama.cpp's approach: the distribution
// is the target's renormalised over the allowed tokens). Under speculative decoding each verification
// row is masked with the state after the drafts before it, so a draft the constraint forbids has
// probability 0 and is rejected there; the matcher itself only advances on accepted tokens, so a
// rejected draft needs no rollback.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "specula/tokenizer.hpp"

namespace specula {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Sets to -infinity the logit of every token that may not follow the accepted tokens and then
  // `pending` (drafts not yet accepted, each allowed in its turn).
  virtual void mask(std::span<float> logits, std::span<const int32_t> pending) const = 0;
  // Advances past an accepted token; throws when the token was not allowed (a caller's bug).
  virtual void accept(int32_t token) = 0;
  // Whether what was accepted is complete (an end token is then allowed, and only it).
  virtual bool complete() const = 0;
  // For messages and statistics: "response_format json_object".
  virtual std::string name() const = 0;
};

// The vocabulary as a byte trie (each token's bytes; special tokens left out), built once per tokenizer
// (about a second for Gemma's 262144 tokens) and kept while the tokenizer lives, shared by every
// constraint over it.
class TokenTrie;
std::shared_ptr<const TokenTrie> token_trie(const std::shared_ptr<const Tokenizer>& tokenizer);

// OpenAI's response_format {"type": "json_object"}: the output is one JSON object, then one of
// `end_tokens`. RFC 8259 as strict parsers read it: strings with their escapes, valid UTF-8 and
// surrogates only in pairs; numbers of at most 20 integer digits and a two-digit exponent (always a
// finite double); literals; nesting up to 64 levels; at most 16 whitespace bytes in a row.
std::unique_ptr<TokenConstraint> json_object_constraint(std::shared_ptr<const TokenTrie> trie,
                                                        std::vector<int32_t> end_tokens, int64_t vocab);

// For tests and fuzzing: whether `text` is a prefix of a JSON object as the constraint accepts it, and
// whether it is a whole one.
struct JsonPrefix {
  bool valid = false;
  bool complete = false;
};
JsonPrefix check_json_object_prefix(std::string_view text);

}  // namespace specula

// The vocabulary as a byte trie, laid out flat (token_trie() builds it); shared by the token constraints.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace specula {

class TokenTrie {
 public:
  struct Node {
    uint32_t first_child = 0, children = 0;  // into edges
    uint32_t first_token = 0, tokens = 0;    // into ids: the tokens whose bytes end here
  };
  struct Edge {
    uint8_t byte = 0;
    uint32_t node = 0;
  };
  std::vector<Node> nodes;
  std::vector<Edge> edges;
  std::vector<int32_t> ids;
  std::vector<std::string> bytes;  // by token id; empty for the tokens left out
  int64_t vocab = 0;
  // Inside a JSON string (no character half read), a token that does not close the string is allowed or
  // not whatever surrounds the string: those allowed are listed once, and only the tokens that close it
  // are tried at each mask (a walk would visit nearly the whole trie there). Filled on first use.
  mutable std::once_flag strings_once;
  mutable std::vector<int32_t> string_inner;  // allowed, and stay inside the string
  mutable std::vector<int32_t> string_exit;   // leave it (a '"' that is not escaped): tried each time
};

}  // namespace specula

// Gemma's SentencePiece-style BPE with byte fallback (internal to the SDK). Built by make_tokenizer()
// from GGUF metadata or from tokenizer.json; both loaders fill a VocabSpec.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "specula/tokenizer.hpp"

namespace specula::detail {

enum class TokenKind : uint8_t { Normal, Control, UserDefined, Byte, Unused };

struct VocabSpec {
  std::string source;                         // for error messages: file and key
  std::vector<std::string> pieces;            // id -> vocabulary entry (spaces as U+2581)
  std::vector<TokenKind> kinds;               // id -> kind
  // Ids matched as whole strings in the raw text before BPE. `always`: even without parse_special
  // (llama.cpp USER_DEFINED tokens, HF added tokens with special=false); the rest only with it.
  std::vector<std::pair<int32_t, bool>> matched_in_text;
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  bool split_newline_runs = false;  // llama.cpp gemma4: runs of '\n' are their own words
  int32_t bos = -1, eos = -1, unk = -1;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};
using PieceMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(VocabSpec spec);

  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::string token_bytes(int32_t id) const override;
  std::string piece(int32_t id) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  bool is_special(int32_t id) const override;
  std::optional<int32_t> token_id(std::string_view piece) const override;
  int32_t bos() const override { return bos_; }
  int32_t eos() const override { return eos_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  // A byte trie over the strings matched in raw text; node 0 is the root.
  struct TrieNode {
    int32_t token = -1;
    bool always = false;
  };

  void check_id(int32_t id) const;
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void bpe(std::string_view text, std::vector<int32_t>& out) const;
  // Longest matched-in-text token starting at text[pos]: (id, length) or (-1, 0).
  std::pair<int32_t, size_t> match_special(std::string_view text, size_t pos, bool parse_special) const;

  std::string source_;
  std::vector<std::string> pieces_;
  std::vector<std::string> bytes_;  // id -> decoded bytes
  std::vector<TokenKind> kinds_;
  PieceMap piece_to_id_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left << 32 | right) -> merge
  int32_t byte_ids_[256];
  std::vector<TrieNode> trie_;
  std::unordered_map<uint64_t, int32_t> trie_edges_;  // (node << 8 | byte) -> node
  bool root_has_edge_[256] = {};
  bool split_newline_runs_ = false;
  int32_t bos_ = -1, eos_ = -1, unk_ = -1;
};

}  // namespace specula::detail

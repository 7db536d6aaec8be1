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
  // Merges in rank order, each as the merged text and the length of its left part ("ab", 1 for a+b).
  std::vector<std::pair<std::string, uint32_t>> merges;
  bool split_newline_runs = false;  // llama.cpp gemma4: runs of '\n' are their own words
  int32_t bos = -1, eos = -1, unk = -1;
};

// Open-addressing tables (linear probing, power-of-two sizes): the vocabulary and merge tables are
// hundreds of thousands of entries, and node-based maps spend most of their time on cache misses.
class PieceTable {
 public:
  void build(const std::vector<std::string>& pieces);  // first id wins on duplicate pieces
  int32_t find(std::string_view piece) const;          // -1 when absent
 private:
  const std::vector<std::string>* pieces_ = nullptr;
  std::vector<int32_t> slots_;  // id, or -1 for empty
  size_t mask_ = 0;
};

class MergeTable {
 public:
  struct Entry {
    uint64_t key = ~uint64_t{0};  // (left << 32 | right); all ones = empty
    int32_t rank = 0;
    int32_t result = 0;
  };
  void reserve(size_t n);
  void insert(uint64_t key, int32_t rank, int32_t result);  // keeps the first (lowest-rank) entry
  const Entry* find(uint64_t key) const;
 private:
  std::vector<Entry> slots_;
  size_t mask_ = 0;
};

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(VocabSpec spec);
  BpeTokenizer(const BpeTokenizer&) = delete;  // piece_to_id_ points into pieces_
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const override;
  std::vector<int32_t> encode_prompt(std::string_view text, std::span<const TextRange> literal) const override;
  std::string token_bytes(int32_t id) const override;
  std::string piece(int32_t id) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special) const override;
  bool is_special(int32_t id) const override;
  std::optional<int32_t> token_id(std::string_view piece) const override;
  int32_t bos() const override { return bos_; }
  int32_t eos() const override { return eos_; }

 private:
  // A byte trie over the strings matched in raw text; node 0 is the root.
  struct TrieNode {
    int32_t token = -1;
    bool always = false;
  };

  void check_id(int32_t id) const;
  // Both encodes: special tokens matched outside `literal`, only the always-matched ones inside.
  std::vector<int32_t> encode_outside(std::string_view text, bool add_bos, std::span<const TextRange> literal) const;
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  void bpe(std::string_view text, std::vector<int32_t>& out) const;
  // Longest matched-in-text token starting at text[pos]: (id, length) or (-1, 0). Special tokens (those
  // not always matched) only when they end at or before `special_end`.
  std::pair<int32_t, size_t> match_special(std::string_view text, size_t pos, size_t special_end) const;

  std::string source_;
  std::vector<std::string> pieces_;
  std::vector<std::string> bytes_;  // id -> decoded bytes
  std::vector<TokenKind> kinds_;
  PieceTable piece_to_id_;
  MergeTable merges_;
  int32_t byte_ids_[256];
  int32_t ascii_ids_[128];  // single ASCII characters (space as U+2581), -1 when not in the vocabulary
  std::vector<TrieNode> trie_;
  std::unordered_map<uint64_t, int32_t> trie_edges_;  // (node << 8 | byte) -> node
  bool root_has_edge_[256] = {};
  bool split_newline_runs_ = false;
  int32_t bos_ = -1, eos_ = -1, unk_ = -1;
};

}  // namespace specula::detail

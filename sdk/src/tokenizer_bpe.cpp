#include "tokenizer_bpe.hpp"

#include <algorithm>
#include <queue>

#include <fmt/format.h>

#include "specula/error.hpp"

namespace specula::detail {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Length of the UTF-8 character at s[i]; 1 for an invalid or truncated sequence, so any byte string
// tokenizes (invalid bytes end up as byte-fallback tokens).
size_t utf8_char_len(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}

// "<0x41>" -> 0x41, or -1.
int parse_byte_piece(std::string_view p) {
  if (p.size() != 6 || p.substr(0, 3) != "<0x" || p[5] != '>') return -1;
  int v = 0;
  for (char c : p.substr(3, 2)) {
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else return -1;
  }
  return v;
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string_view::npos; i = j + from.size()) {
    out.append(s.substr(i, j - i));
    out.append(to);
  }
  out.append(s.substr(i));
  return out;
}

uint64_t mix(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

size_t table_size(size_t n) {
  size_t size = 16;
  while (size < n * 2) size <<= 1;  // load factor <= 1/2
  return size;
}

}  // namespace

void PieceTable::build(const std::vector<std::string>& pieces) {
  pieces_ = &pieces;
  slots_.assign(table_size(pieces.size()), -1);
  mask_ = slots_.size() - 1;
  for (size_t id = 0; id < pieces.size(); ++id) {
    size_t i = std::hash<std::string_view>{}(pieces[id]) & mask_;
    for (; slots_[i] >= 0; i = (i + 1) & mask_)
      if (pieces[slots_[i]] == pieces[id]) break;
    if (slots_[i] < 0) slots_[i] = static_cast<int32_t>(id);
  }
}

int32_t PieceTable::find(std::string_view piece) const {
  for (size_t i = std::hash<std::string_view>{}(piece) & mask_; slots_[i] >= 0; i = (i + 1) & mask_)
    if ((*pieces_)[slots_[i]] == piece) return slots_[i];
  return -1;
}

void MergeTable::reserve(size_t n) {
  slots_.assign(table_size(n), Entry{});
  mask_ = slots_.size() - 1;
}

void MergeTable::insert(uint64_t key, int32_t rank, int32_t result) {
  size_t i = mix(key) & mask_;
  for (; slots_[i].key != ~uint64_t{0}; i = (i + 1) & mask_)
    if (slots_[i].key == key) return;
  slots_[i] = Entry{key, rank, result};
}

const MergeTable::Entry* MergeTable::find(uint64_t key) const {
  for (size_t i = mix(key) & mask_; slots_[i].key != ~uint64_t{0}; i = (i + 1) & mask_)
    if (slots_[i].key == key) return &slots_[i];
  return nullptr;
}

BpeTokenizer::BpeTokenizer(VocabSpec spec)
    : source_(std::move(spec.source)),
      pieces_(std::move(spec.pieces)),
      kinds_(std::move(spec.kinds)),
      split_newline_runs_(spec.split_newline_runs),
      bos_(spec.bos),
      eos_(spec.eos),
      unk_(spec.unk) {
  const auto n = static_cast<int32_t>(pieces_.size());
  if (n == 0) fail("{}: the vocabulary is empty", source_);
  if (kinds_.size() != pieces_.size())
    fail("{}: {} token kinds for {} tokens; expected one per token", source_, kinds_.size(), pieces_.size());
  for (int32_t id : {bos_, eos_})
    if (id < 0 || id >= n) fail("{}: BOS/EOS id {} is outside the vocabulary [0, {})", source_, id, n);

  piece_to_id_.build(pieces_);
  bytes_.resize(pieces_.size());
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  for (int32_t id = 0; id < n; ++id) {
    const std::string& p = pieces_[id];
    const int b = parse_byte_piece(p);
    if (kinds_[id] == TokenKind::Byte || (b >= 0 && kinds_[id] == TokenKind::Normal)) {
      if (b < 0) fail("{}: token {} '{}' is marked as a byte token but is not spelled <0xNN>", source_, id, p);
      kinds_[id] = TokenKind::Byte;
      bytes_[id] = std::string(1, static_cast<char>(b));
      if (byte_ids_[b] < 0) byte_ids_[b] = id;
    } else {
      bytes_[id] = replace_all(p, kSpaceMark, " ");
    }
  }
  for (int b = 0; b < 256; ++b)
    if (byte_ids_[b] < 0) fail("{}: the vocabulary has no byte-fallback token <0x{:02X}>", source_, b);

  merges_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const std::string_view merged = spec.merges[rank].first;
    const size_t split = spec.merges[rank].second;
    const std::string_view l = merged.substr(0, split), r = merged.substr(split);
    const int32_t li = piece_to_id_.find(l), ri = piece_to_id_.find(r), mi = piece_to_id_.find(merged);
    if (split == 0 || split >= merged.size() || li < 0 || ri < 0 || mi < 0)
      fail("{}: merge {} ('{}' '{}') names a token that is not in the vocabulary", source_, rank, l, r);
    merges_.insert(pair_key(li, ri), static_cast<int32_t>(rank), mi);
  }
  for (int c = 0; c < 128; ++c) {
    const std::string one(1, static_cast<char>(c));
    const int32_t id = piece_to_id_.find(c == ' ' ? kSpaceMark : std::string_view(one));
    ascii_ids_[c] = id >= 0 && kinds_[id] != TokenKind::Byte ? id : -1;
  }

  trie_.emplace_back();
  for (const auto& [id, always] : spec.matched_in_text) {
    if (id < 0 || id >= n) fail("{}: special token id {} is outside the vocabulary", source_, id);
    const std::string& text = pieces_[id];
    if (text.empty()) continue;
    int32_t node = 0;
    for (unsigned char c : text) {
      if (node == 0) root_has_edge_[c] = true;
      auto [it, added] = trie_edges_.try_emplace((static_cast<uint64_t>(node) << 8) | c,
                                                 static_cast<int32_t>(trie_.size()));
      if (added) trie_.emplace_back();
      node = it->second;
    }
    if (trie_[node].token < 0) trie_[node] = TrieNode{id, always};
  }
}

void BpeTokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(pieces_.size()))
    fail("token id {} is outside the vocabulary [0, {}) of {}", id, pieces_.size(), source_);
}

std::pair<int32_t, size_t> BpeTokenizer::match_special(std::string_view text, size_t pos,
                                                       size_t special_end) const {
  std::pair<int32_t, size_t> best{-1, 0};
  if (!root_has_edge_[static_cast<unsigned char>(text[pos])]) return best;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    auto it = trie_edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[i]));
    if (it == trie_edges_.end()) break;
    node = it->second;
    const TrieNode& t = trie_[node];
    if (t.token >= 0 && (t.always || i + 1 <= special_end)) best = {t.token, i + 1 - pos};
  }
  return best;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  const TextRange all{0, text.size()};
  return encode_outside(text, add_bos, parse_special ? std::span<const TextRange>() : std::span(&all, 1));
}

std::vector<int32_t> BpeTokenizer::encode_prompt(std::string_view text, std::span<const TextRange> literal) const {
  return encode_outside(text, false, literal);
}

std::vector<int32_t> BpeTokenizer::encode_outside(std::string_view text, bool add_bos,
                                                  std::span<const TextRange> literal) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos) out.push_back(bos_);
  size_t start = 0;
  size_t next = 0;  // the first literal range that does not end before pos
  for (size_t pos = 0; pos < text.size();) {
    while (next < literal.size() && literal[next].end <= pos) ++next;
    const bool inside = next < literal.size() && literal[next].begin <= pos;
    // A special token starts outside the literal ranges and ends before the next one begins.
    const size_t special_end = inside ? pos : next < literal.size() ? literal[next].begin : text.size();
    auto [id, len] = match_special(text, pos, special_end);
    if (id < 0) {
      ++pos;
      continue;
    }
    encode_segment(text.substr(start, pos - start), out);
    out.push_back(id);
    pos += len;
    start = pos;
  }
  encode_segment(text.substr(start), out);
  return out;
}

void BpeTokenizer::encode_segment(std::string_view text, std::vector<int32_t>& out) const {
  if (!split_newline_runs_) return bpe(text, out);
  // llama.cpp's gemma4 pre-tokenizer: [^\n]+|[\n]+, a newline run being one token when it exists.
  size_t i = 0;
  while (i < text.size()) {
    const bool nl = text[i] == '\n';
    size_t j = i;
    while (j < text.size() && (text[j] == '\n') == nl) ++j;
    const std::string_view word = text.substr(i, j - i);
    const int32_t id = nl ? piece_to_id_.find(word) : -1;
    if (id >= 0) out.push_back(id);
    else bpe(word, out);
    i = j;
  }
}

void BpeTokenizer::bpe(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  // Symbols: one per character (spaces as U+2581), or per byte for characters not in the vocabulary.
  struct Symbol {
    int32_t id, prev, next;
  };
  std::vector<Symbol> sym;
  sym.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t len = utf8_char_len(text, i);
    const auto c = static_cast<unsigned char>(text[i]);
    int32_t id = -1;
    if (c < 0x80) {
      id = ascii_ids_[c];
    } else {
      const int32_t found = piece_to_id_.find(text.substr(i, len));
      if (found >= 0 && kinds_[found] != TokenKind::Byte) id = found;
    }
    if (id >= 0) {
      sym.push_back({id, 0, 0});
    } else {
      // Byte fallback over what the normalizer produced (a space is already U+2581 there).
      const std::string_view chars = text[i] == ' ' ? kSpaceMark : text.substr(i, len);
      for (unsigned char b : chars) sym.push_back({byte_ids_[b], 0, 0});
    }
    i += len;
  }
  const auto count = static_cast<int32_t>(sym.size());
  for (int32_t k = 0; k < count; ++k) {
    sym[k].prev = k - 1;
    sym[k].next = k + 1 < count ? k + 1 : -1;
  }

  // Candidate merges, lowest rank first and leftmost among equal ranks (as HF's BPE). Entries go
  // stale when a neighbour merges; they are checked against the current symbols when popped.
  struct Candidate {
    int32_t rank, left, right, left_id, right_id, result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto push = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = sym[left].next;
    if (right < 0) return;
    if (const auto* m = merges_.find(pair_key(sym[left].id, sym[right].id)))
      queue.push({m->rank, left, right, sym[left].id, sym[right].id, m->result});
  };
  for (int32_t k = 0; k + 1 < count; ++k) push(k);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = sym[c.left];
    if (l.id != c.left_id || l.next != c.right || sym[c.right].id != c.right_id) continue;
    l.id = c.result;
    const int32_t after = sym[c.right].next;
    l.next = after;
    if (after >= 0) sym[after].prev = c.left;
    sym[c.right].id = -1;  // dead
    push(l.prev);
    push(c.left);
  }
  for (int32_t k = 0; k >= 0; k = sym[k].next) out.push_back(sym[k].id);
}

std::string BpeTokenizer::token_bytes(int32_t id) const {
  check_id(id);
  return bytes_[id];
}

std::string BpeTokenizer::piece(int32_t id) const {
  check_id(id);
  return pieces_[id];
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    check_id(id);
    if (skip_special && is_special(id)) continue;
    out += bytes_[id];
  }
  return out;
}

bool BpeTokenizer::is_special(int32_t id) const {
  check_id(id);
  return kinds_[id] == TokenKind::Control || kinds_[id] == TokenKind::UserDefined;
}

std::optional<int32_t> BpeTokenizer::token_id(std::string_view piece) const {
  const int32_t id = piece_to_id_.find(piece);
  if (id < 0) return std::nullopt;
  return id;
}

}  // namespace specula::detail

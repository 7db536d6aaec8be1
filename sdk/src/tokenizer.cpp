// make_tokenizer(): reads a checkpoint's tokenizer from GGUF metadata (tokenizer.ggml.*) or from the
// tokenizer.json + tokenizer_config.json next to a safetensors checkpoint, into one VocabSpec.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/metadata.hpp"
#include "specula/model_file.hpp"
#include "specula/tokenizer.hpp"
#include "tokenizer_bpe.hpp"

namespace specula {
namespace {

using detail::TokenKind;
using detail::VocabSpec;
using nlohmann::json;

const json& require(const json& obj, const std::string& key, const std::string& where) {
  auto it = obj.find(key);  // end() for a non-object too
  if (it == obj.end()) fail("{}: missing key '{}'", where, key);
  return *it;
}

// Checked reads of tokenizer.json values: a file of another shape ends in an error naming the value.
constexpr int64_t kMaxTokens = int64_t{1} << 30;

int64_t token_id_of(const json& v, std::string_view what, std::string_view key, const std::string& where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= kMaxTokens)
    fail("{}: {}{} is {}; expected a token id (an integer in [0, {}))", where, what, key, json_text(v),
         kMaxTokens);
  return v.get<int64_t>();
}
const std::string& string_of(const json& v, const std::string& what, const std::string& where) {
  if (!v.is_string()) fail("{}: {} is {}; expected a string", where, what, json_text(v));
  return v.get_ref<const std::string&>();
}
template <typename T>
T value_of(const json& obj, const char* key, T fallback, const std::string& where) {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    fail("{}: '{}' is {}, which is not the expected type", where, key, json_text(*it));
  }
}

// A merge written "left right", split at its first space after the first character (a token never
// contains a plain space; the first character may be anything), as (merged text, left length).
std::pair<std::string, uint32_t> split_merge(const std::string& m, const std::string& where, size_t rank) {
  const size_t sp = m.find(' ', 1);
  if (sp == std::string::npos)
    fail("{}: merge {} '{}' is not of the form 'left right'", where, rank, m);
  std::string merged;
  merged.reserve(m.size() - 1);
  merged.append(m, 0, sp).append(m, sp + 1);
  return {std::move(merged), static_cast<uint32_t>(sp)};
}

int32_t id_of(const json& md, const std::string& key, const std::string& where) {
  const json& v = require(md, key, where);
  if (!v.is_number_integer()) fail("{}: '{}' is {}; expected an integer token id", where, key, json_text(v));
  return v.get<int32_t>();
}

std::shared_ptr<const Tokenizer> from_gguf(const ModelFile& file) {
  const json& md = file.metadata();
  const std::string where = file.path().string();
  const std::string model = require(md, "tokenizer.ggml.model", where).get<std::string>();
  if (model != "gemma4")
    fail("{}: tokenizer.ggml.model is '{}'; this build reads the 'gemma4' BPE tokenizer", where, model);
  VocabSpec spec;
  spec.source = where + " (tokenizer.ggml.*)";
  spec.split_newline_runs = true;
  const json& tokens = require(md, "tokenizer.ggml.tokens", where);
  const json& types = require(md, "tokenizer.ggml.token_type", where);
  const json& merges = require(md, "tokenizer.ggml.merges", where);
  if (!tokens.is_array() || !types.is_array() || !merges.is_array())
    fail("{}: tokenizer.ggml.tokens, token_type and merges must be arrays", where);
  if (tokens.size() != types.size())
    fail("{}: tokenizer.ggml.token_type has {} entries for {} tokens", where, types.size(), tokens.size());
  spec.pieces.reserve(tokens.size());
  spec.kinds.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!tokens[i].is_string()) fail("{}: tokenizer.ggml.tokens[{}] is {}; expected a string", where, i, json_text(tokens[i]));
    if (!types[i].is_number_integer())
      fail("{}: tokenizer.ggml.token_type[{}] is {}; expected an integer", where, i, json_text(types[i]));
    spec.pieces.push_back(tokens[i].get_ref<const std::string&>());
    const int t = types[i].get<int>();
    // llama.cpp's token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    TokenKind kind;
    switch (t) {
      case 1: kind = TokenKind::Normal; break;
      case 2: case 3: kind = TokenKind::Control; break;
      case 4: kind = TokenKind::UserDefined; break;
      case 5: kind = TokenKind::Unused; break;
      case 6: kind = TokenKind::Byte; break;
      default: fail("{}: tokenizer.ggml.token_type[{}] is {}; expected 1..6", where, i, t);
    }
    spec.kinds.push_back(kind);
    // As llama.cpp: user-defined tokens are always matched in text, control tokens only on request.
    if (kind == TokenKind::Control || kind == TokenKind::UserDefined)
      spec.matched_in_text.emplace_back(static_cast<int32_t>(i), kind == TokenKind::UserDefined);
  }
  spec.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    if (!merges[r].is_string()) fail("{}: tokenizer.ggml.merges[{}] is {}; expected a string", where, r, json_text(merges[r]));
    spec.merges.push_back(split_merge(merges[r].get_ref<const std::string&>(), where, r));
  }
  spec.bos = id_of(md, "tokenizer.ggml.bos_token_id", where);
  spec.eos = id_of(md, "tokenizer.ggml.eos_token_id", where);
  if (md.contains("tokenizer.ggml.unknown_token_id")) spec.unk = id_of(md, "tokenizer.ggml.unknown_token_id", where);
  return std::make_shared<detail::BpeTokenizer>(std::move(spec));
}

// tokenizer_config.json names BOS/EOS either as a string or as {"content": ...}.
std::string token_text(const json& config, const std::string& key, const std::string& fallback) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return string_of((*it)["content"], key + ".content", "tokenizer_config.json");
  return fallback;
}

std::shared_ptr<const Tokenizer> from_tokenizer_json(const ModelFile& file) {
  const json& md = file.metadata();
  const std::string path = md["tokenizer_json_path"].get<std::string>();
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open {} (named by the checkpoint {})", path, file.path().string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  json tj;
  try {
    tj = json::parse(buffer.str());
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  const json& model = require(tj, "model", path);
  if (value_of(model, "type", std::string(), path) != "BPE")
    fail("{}: model.type is {}; expected \"BPE\" (Gemma's SentencePiece-style BPE)", path,
         model.contains("type") ? json_text(model["type"]) : "missing");
  if (!value_of(model, "byte_fallback", false, path)) fail("{}: model.byte_fallback is not true; Gemma's BPE needs it", path);
  // Gemma's normalizer turns spaces into U+2581 and does nothing else; anything else would be silently
  // mis-tokenized, so refuse it.
  const json& norm = require(tj, "normalizer", path);
  const bool gemma_norm = value_of(norm, "type", std::string(), path) == "Replace" &&
                          value_of(value_of(norm, "pattern", json(), path), "String", std::string(), path) == " " &&
                          value_of(norm, "content", std::string(), path) == "\xE2\x96\x81";
  if (!gemma_norm)
    fail("{}: normalizer is {}; expected Replace ' ' -> U+2581 (Gemma)", path, json_text(norm, 200));

  VocabSpec spec;
  spec.source = path;
  const json& vocab = require(model, "vocab", path);
  if (!vocab.is_object()) fail("{}: model.vocab is {}; expected an object of piece: id", path, json_text(vocab));
  const json added = value_of(tj, "added_tokens", json::array(), path);
  if (!added.is_array()) fail("{}: added_tokens is {}; expected a list", path, json_text(added));
  for (const json& a : added)
    if (!a.is_object() || !a.contains("id") || !a.contains("content"))
      fail("{}: added token {} has no id and content", path, json_text(a));
  // Ids must be contiguous from 0: checked on the ids themselves, before any table is sized by the
  // largest (a single entry with id 2^30 - 1 must not allocate a billion pieces).
  std::vector<int64_t> ids;
  ids.reserve(vocab.size() + added.size());
  for (const auto& [piece, id] : vocab.items()) ids.push_back(token_id_of(id, "model.vocab entry ", piece, path));
  for (const json& a : added) ids.push_back(token_id_of(a["id"], "the id of added token ", json_text(a["content"]), path));
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  if (ids.empty()) fail("{}: model.vocab and added_tokens are empty", path);
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] != static_cast<int64_t>(i))
      fail("{}: token id {} is missing (ids must be contiguous from 0 to {})", path, i, ids.back());
  const int64_t size = static_cast<int64_t>(ids.size());
  spec.pieces.assign(static_cast<size_t>(size), std::string());
  spec.kinds.assign(static_cast<size_t>(size), TokenKind::Unused);
  std::vector<bool> seen(static_cast<size_t>(size), false);
  for (const auto& [piece, id] : vocab.items()) {
    const auto i = id.get<size_t>();
    spec.pieces[i] = piece;
    spec.kinds[i] = TokenKind::Normal;
    seen[i] = true;
  }
  for (const json& a : added) {
    const auto i = a["id"].get<size_t>();
    spec.pieces[i] = string_of(a["content"], fmt::format("added token {}'s content", i), path);
    const bool special = value_of(a, "special", false, path);
    if (special) spec.kinds[i] = TokenKind::Control;
    else if (!seen[i]) spec.kinds[i] = TokenKind::Normal;
    seen[i] = true;
    if (value_of(a, "normalized", false, path))
      log_warn("{}: added token {} '{}' is marked normalized; it is matched on the raw text", path, i,
               spec.pieces[i]);
    // HF matches every added token in text; special ones only when asked here (see docs/tokenizer.md).
    spec.matched_in_text.emplace_back(static_cast<int32_t>(i), !special);
  }

  const json& merges = require(model, "merges", path);
  if (!merges.is_array()) fail("{}: model.merges is {}; expected a list", path, json_text(merges));
  spec.merges.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      const auto& l = m[0].get_ref<const std::string&>();
      spec.merges.emplace_back(l + m[1].get_ref<const std::string&>(), static_cast<uint32_t>(l.size()));
    } else if (m.is_string()) spec.merges.push_back(split_merge(m.get<std::string>(), path, r));
    else fail("{}: model.merges[{}] is {}; expected \"left right\" or [left, right]", path, r, json_text(m));
  }

  const json& config = md.value("tokenizer_config", json::object());
  auto find_id = [&](const std::string& text, const char* what) {
    for (size_t i = 0; i < spec.pieces.size(); ++i)
      if (spec.pieces[i] == text) return static_cast<int32_t>(i);
    fail("{}: the {} token '{}' (tokenizer_config.json) is not in the vocabulary", path, what, text);
  };
  spec.bos = find_id(token_text(config, "bos_token", "<bos>"), "BOS");
  spec.eos = find_id(token_text(config, "eos_token", "<eos>"), "EOS");
  return std::make_shared<detail::BpeTokenizer>(std::move(spec));
}

}  // namespace

std::shared_ptr<const Tokenizer> make_tokenizer(const ModelFile& file) {
  const nlohmann::json& md = file.metadata();
  if (md.contains("tokenizer.ggml.tokens")) return from_gguf(file);
  if (md.contains("tokenizer_json_path") && md["tokenizer_json_path"].is_string()) return from_tokenizer_json(file);
  fail("{} ({}) carries no tokenizer: expected GGUF keys tokenizer.ggml.* or a tokenizer.json next to it",
       file.path().string(), file.format());
}

}  // namespace specula

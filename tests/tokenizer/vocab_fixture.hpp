// The real Gemma 4 vocabulary (../shared/gemma4-vocab/ggml-vocab-gemma-4.gguf) as a ModelFile, for the
// tokenizer, chat and CLI tests. Until the project's GGUF reader plugin lands this reads the GGUF
// metadata with a minimal test-only reader (metadata only, no tensors; the file has none).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/model_file.hpp"
#include "specula/tokenizer.hpp"

namespace specula::test {

inline std::filesystem::path gemma4_vocab_path() {
  return std::filesystem::path(SPECULA_SHARED_DIR) / "gemma4-vocab" / "ggml-vocab-gemma-4.gguf";
}

class MetadataFile final : public ModelFile {
 public:
  MetadataFile(std::string format, std::filesystem::path path, nlohmann::json md)
      : format_(std::move(format)), path_(std::move(path)), md_(std::move(md)) {}
  std::string format() const override { return format_; }
  std::filesystem::path path() const override { return path_; }
  const nlohmann::json& metadata() const override { return md_; }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find(const std::string&) const override { return nullptr; }

 private:
  std::string format_;
  std::filesystem::path path_;
  nlohmann::json md_;
  std::vector<TensorInfo> tensors_;
};

// GGUF v3 key/value section to JSON (test-only; see the header comment).
inline nlohmann::json read_gguf_metadata_for_test(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::vector<char> d((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t o = 0;
  auto take = [&](auto& v) {
    if (o + sizeof(v) > d.size()) throw std::runtime_error("truncated GGUF");
    std::memcpy(&v, d.data() + o, sizeof(v));
    o += sizeof(v);
  };
  auto str = [&] {
    uint64_t n;
    take(n);
    if (o + n > d.size()) throw std::runtime_error("truncated GGUF string");
    std::string s(d.data() + o, n);
    o += n;
    return s;
  };
  std::function<nlohmann::json(uint32_t)> value = [&](uint32_t t) -> nlohmann::json {
    switch (t) {
      case 0: { uint8_t v; take(v); return v; }
      case 1: { int8_t v; take(v); return v; }
      case 2: { uint16_t v; take(v); return v; }
      case 3: { int16_t v; take(v); return v; }
      case 4: { uint32_t v; take(v); return v; }
      case 5: { int32_t v; take(v); return v; }
      case 6: { float v; take(v); return v; }
      case 7: { uint8_t v; take(v); return v != 0; }
      case 8: return str();
      case 9: {
        uint32_t at;
        uint64_t n;
        take(at);
        take(n);
        nlohmann::json a = nlohmann::json::array();
        for (uint64_t k = 0; k < n; ++k) a.push_back(value(at));
        return a;
      }
      case 10: { uint64_t v; take(v); return v; }
      case 11: { int64_t v; take(v); return v; }
      case 12: { double v; take(v); return v; }
    }
    throw std::runtime_error("bad GGUF value type");
  };
  uint32_t magic, version;
  uint64_t n_tensors, n_kv;
  take(magic);
  take(version);
  take(n_tensors);
  take(n_kv);
  if (std::memcmp(&magic, "GGUF", 4) != 0) throw std::runtime_error("not a GGUF file");
  nlohmann::json md = nlohmann::json::object();
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = str();
    uint32_t t;
    take(t);
    md[key] = value(t);
  }
  return md;
}

inline const MetadataFile& gemma4_vocab_file() {
  static const MetadataFile file("gguf", gemma4_vocab_path(), read_gguf_metadata_for_test(gemma4_vocab_path()));
  return file;
}

inline std::shared_ptr<const Tokenizer> gemma4_tokenizer() {
  static const std::shared_ptr<const Tokenizer> tok = make_tokenizer(gemma4_vocab_file());
  return tok;
}

}  // namespace specula::test

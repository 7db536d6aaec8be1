// The real Gemma 4 vocabulary (../shared/gemma4-vocab/ggml-vocab-gemma-4.gguf) as a ModelFile, for the
// tokenizer and chat tests; MetadataFile is a ModelFile made of metadata only (for bad-input cases and
// the tokenizer.json path).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/plugins.hpp"
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

// Opened through the gguf format plugin.
inline const ModelFile& gemma4_vocab_file() {
  static const std::shared_ptr<const ModelFile> file = specula_test::host().open_model(gemma4_vocab_path());
  return *file;
}

inline std::shared_ptr<const Tokenizer> gemma4_tokenizer() {
  static const std::shared_ptr<const Tokenizer> tok = make_tokenizer(gemma4_vocab_file());
  return tok;
}

}  // namespace specula::test

// Helpers the fuzz bodies share: splitting one input into several files, a scratch directory per
// process for the readers that take paths, a metadata-only ModelFile and a GGUF ModelFile in memory.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "gguf_io.hpp"  // plugins/gguf (specula_gguf_io)
#include "specula/log.hpp"
#include "specula/model_file.hpp"

namespace specula::fuzz {

// The first n - 1 NUL-terminated parts of the input, then the rest (missing parts are empty). JSON and
// YAML text never holds a raw NUL, so the separator cannot clash with the content.
inline std::vector<std::string_view> split_parts(const uint8_t* data, size_t size, size_t n) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> out;
  while (out.size() + 1 < n) {
    const size_t nul = rest.find('\0');
    out.push_back(rest.substr(0, nul));
    rest = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
  }
  out.push_back(rest);
  return out;
}

// Warnings about odd but accepted input would flood the fuzzer's output.
inline void quiet_logs() {
  static const bool once = [] {
    set_log_level(LogLevel::Error);
    return true;
  }();
  (void)once;
}

// A directory of this process (fuzzers and the replay test may run side by side), removed at exit.
struct ScratchDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("specula-fuzz-" + std::to_string(getpid()));
  ScratchDir() { std::filesystem::create_directories(path); }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
inline const std::filesystem::path& scratch_dir() {
  static const ScratchDir dir;
  return dir.path;
}

inline void write_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
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

// A GGUF image parsed in memory, as the gguf format plugin presents a file.
class GgufBytesFile final : public ModelFile {
 public:
  GgufBytesFile(const uint8_t* data, size_t size)
      : bytes_(reinterpret_cast<const std::byte*>(data), reinterpret_cast<const std::byte*>(data) + size),
        file_(gguf::parse(bytes_, "fuzz.gguf")) {
    for (size_t i = 0; i < file_.tensors.size(); ++i) index_.emplace(file_.tensors[i].name, i);
  }
  std::string format() const override { return "gguf"; }
  std::filesystem::path path() const override { return "fuzz.gguf"; }
  const nlohmann::json& metadata() const override { return file_.metadata; }
  const std::vector<TensorInfo>& tensors() const override { return file_.tensors; }
  const TensorInfo* find(const std::string& name) const override {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &file_.tensors[it->second];
  }

 private:
  std::vector<std::byte> bytes_;  // the tensors' spans point here
  gguf::File file_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace specula::fuzz

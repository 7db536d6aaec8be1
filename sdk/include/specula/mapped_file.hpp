// A read-only memory map of a whole file: the zero-copy backing of every ModelFile's tensor data.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <span>

namespace specula {

class MappedFile {
 public:
  // Maps `path` read-only; throws specula::Error naming the file when it cannot be opened or mapped.
  static std::shared_ptr<const MappedFile> open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  MappedFile() = default;
  std::filesystem::path path_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace specula

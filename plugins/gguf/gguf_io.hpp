// GGUF v3 (llama.cpp's container; gemma4-formats-spec §1): a validating zero-copy reader, split-file
// support and a writer that reproduces gguf-py's layout. Private to the `gguf` format plugin (the static
// library specula_gguf_io, which tests and fuzz targets may link too); everything else reads and writes
// GGUF through the plugin host (ModelFile::gguf_metadata, ModelFormat::write).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/gguf_metadata.hpp"
#include "specula/model_file.hpp"

namespace specula::gguf {

inline constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
inline constexpr uint32_t kDefaultAlignment = 32;

// One parsed GGUF file. Tensor `data` spans point into the bytes given to parse().
struct File {
  uint32_t version = 3;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_offset = 0;                              // start of the data section, from file start
  nlohmann::json metadata = nlohmann::json::object();    // key -> value (arrays as JSON arrays)
  std::vector<std::pair<std::string, KeyType>> keys;     // file order, with declared types
  std::vector<TensorInfo> tensors;                       // file order; shapes outermost-first
};

// Parses and validates a GGUF image held in memory (every count, length, type, offset and size is
// checked against the buffer before use). `name` (normally the file path) starts every error message.
File parse(std::span<const std::byte> bytes, const std::string& name);

// True when the file starts with the GGUF magic.
bool has_magic(const std::filesystem::path& path);

// Opens a GGUF file as a ModelFile (format "gguf"). A shard named `<stem>-0000i-of-0000N.gguf` opens all
// N shards as one model: metadata of the first shard, tensors of all.
std::unique_ptr<ModelFile> open(const std::filesystem::path& path);

// What the format plugin's write() does: a Writer with the alignment `metadata` states (general.alignment,
// else 32), every key of `metadata` in order, then `tensors` in order (held or streamed).
void write(const std::filesystem::path& path, const Metadata& metadata, const std::vector<TensorSpec>& tensors);

// Writes GGUF v3 files laid out as gguf-py does (§1.3): header, KV records in insertion order, tensor
// infos with offsets = running sum of sizes padded to `alignment`, zero padding, tensor data.
class Writer {
 public:
  explicit Writer(uint32_t alignment = kDefaultAlignment);

  // Sets (or replaces) a key. `value` must fit `type`; for ARRAY pass a JSON array and `elem`.
  void set(const std::string& key, ValueType type, nlohmann::json value, ValueType elem = ValueType::UINT8) {
    kv_.set(key, type, std::move(value), elem);
  }
  void set_string(const std::string& key, const std::string& v) { kv_.set_string(key, v); }
  void set_u32(const std::string& key, uint32_t v) { kv_.set_u32(key, v); }
  void set_i32(const std::string& key, int32_t v) { kv_.set_i32(key, v); }
  void set_f32(const std::string& key, float v) { kv_.set_f32(key, v); }
  void set_bool(const std::string& key, bool v) { kv_.set_bool(key, v); }
  void set_array(const std::string& key, ValueType elem, nlohmann::json values) {
    kv_.set_array(key, elem, std::move(values));
  }
  // Copies every key of a parsed file (of `m`) with its declared type, in order.
  void copy_metadata(const File& f);
  void copy_metadata(const Metadata& m);
  const Metadata& metadata() const { return kv_; }

  // `shape` is outermost-first (it is written reversed as GGUF ne); `data` is copied and must have
  // exactly the byte size of `type` x `shape`.
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape,
                  std::span<const std::byte> data);

  // Streaming: declares a tensor whose bytes the `fill` callback of write() produces later, so a
  // converter or quantizer holds one tensor at a time, never the model.
  void declare_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape);
  size_t tensor_count() const { return tensors_.size(); }
  uint64_t tensor_bytes(size_t index) const { return tensors_.at(index).bytes; }

  // Everything in memory; only for files without declared tensors.
  std::vector<std::byte> serialize() const;
  // Writes the file through `<path>.part`, renamed onto `path` only once complete (a reader never
  // sees half a file). Declared tensors get their bytes from `fill(index, put)`: it must call put
  // with exactly tensor_bytes(index) bytes in all, in as many pieces as it likes.
  using PutBytes = specula::PutBytes;
  using Fill = std::function<void(size_t index, const PutBytes& put)>;
  void write(const std::filesystem::path& path, const Fill& fill = {}) const;

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    uint64_t bytes = 0;
    bool declared = false;        // bytes come from write()'s fill
    std::vector<std::byte> data;  // otherwise held here
  };
  uint64_t checked_bytes(const std::string& name, DType type, const std::vector<int64_t>& shape) const;
  std::vector<std::byte> header() const;  // up to and including the padding before the data
  uint32_t alignment_;
  Metadata kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace specula::gguf

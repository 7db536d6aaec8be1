// Hugging Face safetensors and MLX checkpoints (gemma4-formats-spec §5, §6): a validating zero-copy
// reader for single files, sharded directories (model.safetensors.index.json) and MLX affine-quantized
// weights, plus a writer for fixtures. Private to the `safetensors` format plugin (the static library
// specula_safetensors_io, which tests and fuzz targets may link too); everything else opens checkpoints
// through the plugin host.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/model_file.hpp"

namespace specula::safetensors {

// Reference implementation's cap on the JSON header length.
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// "F32" <-> DType::F32 etc. (F32 F16 BF16 F64 I8 I16 I32 I64 U8 U32; BOOL reads as U8).
std::optional<DType> dtype_from_string(std::string_view s);
std::string_view dtype_to_string(DType t);

// One parsed .safetensors file; tensor `data` spans point into the bytes given to parse().
struct File {
  uint64_t header_bytes = 0;                    // N, the JSON header length (padding included)
  nlohmann::json metadata = nlohmann::json();   // "__metadata__" object, or null
  std::vector<TensorInfo> tensors;              // header order
};
// Validates the header (length, JSON, dtypes, shapes, offsets inside the buffer, no overlap, no hole).
// `name` (normally the path) starts every error message.
File parse(std::span<const std::byte> bytes, const std::string& name);

// A .safetensors file, or a directory holding model*.safetensors (with or without an index).
bool looks_like_checkpoint(const std::filesystem::path& path);

// Opens a checkpoint as a ModelFile. format() is "mlx" when MLX-quantized weights are present or the
// header metadata says {"format": "mlx"}, else "safetensors". MLX-quantized modules appear as ONE tensor
// `<path>.weight` of DType::MLX_AFFINE with the logical (unpacked) shape and QuantParams pointing at
// `<path>.scales` / `<path>.biases`, which are not listed separately.
std::unique_ptr<ModelFile> open(const std::filesystem::path& path);

// MLX quantization of one module, resolved from config.json (gemma4-chat.md precedence): per-module
// override `"quantization": {"<module path>": {"bits", "group_size"}}`, else the flat
// quantization_bits / quantization_group_size, then nested "quantization" (or "quantization_config")
// {"bits", "group_size"}, then a "quantization": "int8" label, then INT4 / 64. Each form is looked for in
// the root first, then in text_config. group_size 0 means "not stated" (the int8 label).
struct QuantChoice {
  uint32_t bits = 4;
  uint32_t group_size = 64;
  std::string source;  // where it came from, for error messages: "config.json quantization.bits", "default"
};
QuantChoice resolve_quantization(const nlohmann::json& config, const std::string& module_path);

// A Gemma-style config value: text_config.<key> when present, else the root <key>, else nullptr.
const nlohmann::json* text_config_value(const nlohmann::json& config, std::string_view key);

// Writes .safetensors files. Style::Rust = the Rust/PyTorch writer (tensors ordered by descending dtype
// size then name, header padded with spaces to a multiple of 8); Style::Mlx = MLX's writer (names in
// alphabetical order, no padding).
class Writer {
 public:
  enum class Style { Rust, Mlx };
  explicit Writer(Style style = Style::Rust) : style_(style) {}

  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // `shape` outermost-first; `data` is copied and must be exactly prod(shape) x dtype size bytes.
  void add_tensor(const std::string& name, DType type, const std::vector<int64_t>& shape,
                  std::span<const std::byte> data);
  // Quantizes `w` (outermost-first `shape`, innermost = K) with MLX's affine quantizer and adds
  // `<module>.weight` (U32), `<module>.scales` and `<module>.biases` (`scale_type`).
  void add_mlx_quantized(const std::string& module, const std::vector<int64_t>& shape, const float* w,
                         uint32_t bits, uint32_t group_size, DType scale_type = DType::BF16);

  uint64_t data_bytes() const;
  std::vector<std::string> names() const;
  std::vector<std::byte> serialize() const;
  void write(const std::filesystem::path& path) const;

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    std::vector<std::byte> data;
  };
  Style style_;
  nlohmann::json metadata_ = nlohmann::json::object();
  std::vector<Tensor> tensors_;
};

// Writes `dir/model.safetensors.index.json` for shards written by Writers (tensor -> file name).
void write_index(const std::filesystem::path& dir,
                 const std::vector<std::pair<std::string, const Writer*>>& shards);

}  // namespace specula::safetensors

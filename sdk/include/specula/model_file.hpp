// ModelFormat: opens a checkpoint (GGUF file, Hugging Face or MLX safetensors directory) and hands out
// its metadata and tensors zero-copy from a memory map; a format that can also write files (GGUF) does
// so from a gguf::Metadata and a list of TensorSpecs.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/dtype.hpp"
#include "specula/gguf_metadata.hpp"

namespace specula {

// MLX affine quantization of one weight: w = scale * q + bias per group of `group_size` values along
// the last (innermost) axis. `scales` and `biases` are [rows, cols / group_size] of `scale_type`.
struct QuantParams {
  uint32_t bits = 0;
  uint32_t group_size = 0;
  DType scale_type = DType::F16;
  std::span<const std::byte> scales;
  std::span<const std::byte> biases;
};

// One tensor of an opened checkpoint. Shapes are logical and outermost-first (numpy / PyTorch order:
// a Linear weight is {out_features, in_features}); the GGUF reader reverses GGUF's innermost-first `ne`.
// `data` points into the file mapping, which lives as long as the ModelFile.
struct TensorInfo {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;
  QuantParams quant;  // only for DType::MLX_AFFINE

  int64_t elements() const;
};

// An opened checkpoint. Metadata layout per format:
//  - gguf: {"<gguf key>": value, ...} exactly as in the file (arrays as JSON arrays);
//  - safetensors / mlx: {"config": config.json, "generation_config": ..., "tokenizer_config": ...,
//    "tokenizer_json_path": "<dir>/tokenizer.json" when present, "__metadata__": header metadata}.
class ModelFile {
 public:
  virtual ~ModelFile() = default;
  virtual std::string format() const = 0;                 // "gguf", "safetensors", "mlx"
  virtual std::filesystem::path path() const = 0;         // what was opened
  virtual const nlohmann::json& metadata() const = 0;
  // The architecture the checkpoint declares, for choosing a model plugin and for messages; "" when it
  // declares none. The default reads the layouts above (GGUF general.architecture, config.json
  // model_type); a format that stores it elsewhere overrides this.
  virtual std::string architecture() const;
  // The metadata with each key's declared GGUF type and order (what a writer needs to copy it), or
  // nullptr for formats without typed keys (safetensors, MLX). metadata() holds the same values.
  virtual const gguf::Metadata* gguf_metadata() const { return nullptr; }
  virtual const std::vector<TensorInfo>& tensors() const = 0;
  // The tensor with this exact name, or nullptr.
  virtual const TensorInfo* find(const std::string& name) const = 0;
};

// Receives a tensor's bytes, in as many pieces as the producer likes.
using PutBytes = std::function<void(std::span<const std::byte>)>;

// One tensor to write. Its bytes are either `bytes` (held by the caller until write() returns) or, when
// `fill` is set, streamed by it while the file is written, so that a converter or quantizer holds one
// tensor at a time, never the model: `fill` must put exactly the byte size of `type` x `shape` in all.
struct TensorSpec {
  std::string name;
  DType type = DType::F32;
  std::vector<int64_t> shape;             // outermost-first
  std::span<const std::byte> bytes;       // used when `fill` is empty
  std::function<void(const PutBytes& put)> fill;
};

// Plugin kind "format". Errors are thrown as specula::Error naming the file and the field.
class ModelFormat {
 public:
  virtual ~ModelFormat() = default;
  virtual std::string name() const = 0;
  // Cheap check (magic bytes, file names) whether this reader should open `path`.
  virtual bool can_open(const std::filesystem::path& path) const = 0;
  virtual std::unique_ptr<ModelFile> open(const std::filesystem::path& path) const = 0;
  // Whether write() is implemented.
  virtual bool can_write() const { return false; }
  // Writes `metadata` and `tensors` (in this order) as a file of this format. Every tensor is checked
  // (type, shape, byte count) before the file is created; the file appears under `path` only once
  // complete (nothing is left behind on failure). The default throws.
  virtual void write(const std::filesystem::path& path, const gguf::Metadata& metadata,
                     const std::vector<TensorSpec>& tensors) const;
};

}  // namespace specula

// Storage types of tensors: plain scalars, llama.cpp (ggml) quantized blocks, MLX affine quantization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace specula {

// Numeric values of the ggml block types equal GGML's type ids, so a GGUF type field maps directly.
enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  BF16 = 30,
  // Not ggml types: values above 1000 are Specula's own.
  U8 = 1001,
  U32 = 1002,
  // MLX affine quantization: packed uint32 words plus per-group scales and biases (see QuantParams).
  MLX_AFFINE = 1100,
};

// Layout of one dtype: `block_elems` logical values are stored in `block_bytes` bytes.
struct DTypeTraits {
  DType type;
  std::string_view name;     // "F32", "Q4_K", ... (ggml spelling)
  uint32_t block_elems;      // 1 for scalars
  uint32_t block_bytes;      // bytes of one block
  bool quantized;
};

// Traits of a type, or nullptr for a value that names no known type (e.g. read from a hostile file).
const DTypeTraits* dtype_traits(DType t);
const DTypeTraits* dtype_traits_from_ggml(uint32_t ggml_type);
std::optional<DType> dtype_from_name(std::string_view name);
std::string_view dtype_name(DType t);

// Bytes needed for `n` elements of `t`; nullopt when n is not a whole number of blocks or overflows.
std::optional<uint64_t> dtype_row_bytes(DType t, uint64_t n);

}  // namespace specula

#include "specula/dtype.hpp"

#include <array>
#include <limits>

namespace specula {
namespace {
constexpr std::array<DTypeTraits, 21> kTraits{{
    {DType::F32, "F32", 1, 4, false},
    {DType::F16, "F16", 1, 2, false},
    {DType::BF16, "BF16", 1, 2, false},
    {DType::F64, "F64", 1, 8, false},
    {DType::I8, "I8", 1, 1, false},
    {DType::I16, "I16", 1, 2, false},
    {DType::I32, "I32", 1, 4, false},
    {DType::I64, "I64", 1, 8, false},
    {DType::U8, "U8", 1, 1, false},
    {DType::U32, "U32", 1, 4, false},
    {DType::Q4_0, "Q4_0", 32, 18, true},
    {DType::Q4_1, "Q4_1", 32, 20, true},
    {DType::Q5_0, "Q5_0", 32, 22, true},
    {DType::Q5_1, "Q5_1", 32, 24, true},
    {DType::Q8_0, "Q8_0", 32, 34, true},
    {DType::Q4_K, "Q4_K", 256, 144, true},
    {DType::Q5_K, "Q5_K", 256, 176, true},
    {DType::Q6_K, "Q6_K", 256, 210, true},
    {DType::IQ4_NL, "IQ4_NL", 32, 18, true},
    {DType::IQ4_XS, "IQ4_XS", 256, 136, true},
    // Element size of the packed words; bits and groups live in QuantParams.
    {DType::MLX_AFFINE, "MLX_AFFINE", 1, 4, true},
}};
}  // namespace

const DTypeTraits* dtype_traits(DType t) {
  for (const auto& tr : kTraits)
    if (tr.type == t) return &tr;
  return nullptr;
}

const DTypeTraits* dtype_traits_from_ggml(uint32_t ggml_type) {
  if (ggml_type >= 1000) return nullptr;
  return dtype_traits(static_cast<DType>(ggml_type));
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& tr : kTraits)
    if (tr.name == name) return tr.type;
  return std::nullopt;
}

std::string_view dtype_name(DType t) {
  const DTypeTraits* tr = dtype_traits(t);
  return tr ? tr->name : std::string_view("unknown");
}

std::optional<uint64_t> dtype_row_bytes(DType t, uint64_t n) {
  const DTypeTraits* tr = dtype_traits(t);
  if (!tr || n % tr->block_elems != 0) return std::nullopt;
  uint64_t blocks = n / tr->block_elems;
  if (blocks > std::numeric_limits<uint64_t>::max() / tr->block_bytes) return std::nullopt;
  return blocks * tr->block_bytes;
}

}  // namespace specula

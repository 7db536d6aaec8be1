#include "convert.hpp"

#include "specula/error.hpp"

namespace specula::cpu {

bool can_decode(DType type) {
  // Floating-point storage only: integer tensors are ids and positions, never weights.
  const DTypeTraits* tr = dtype_traits(type);
  if (!tr || !(tr->quantized || type == DType::F32 || type == DType::F16 || type == DType::BF16)) return false;
  return type == DType::MLX_AFFINE || can_dequantize(type);
}

std::optional<size_t> row_bytes(DType type, int64_t cols, const QuantParams* quant) {
  if (type == DType::MLX_AFFINE) {
    if (!quant || !mlx_params_valid(quant->bits, quant->group_size) || cols % quant->group_size != 0)
      return std::nullopt;
    return static_cast<size_t>(cols) * quant->bits / 8;
  }
  auto b = dtype_row_bytes(type, static_cast<uint64_t>(cols));
  if (!b) return std::nullopt;
  return static_cast<size_t>(*b);
}

void decode_row(DType type, const std::byte* row_data, int64_t n, float* dst, const QuantParams* quant,
                int64_t row) {
  if (type == DType::MLX_AFFINE) {
    const MlxRowParams p{quant->bits, quant->group_size, quant->scale_type};
    const size_t scale_row = static_cast<size_t>(n / p.group_size) * dtype_traits(p.scale_type)->block_bytes;
    mlx_dequantize_row(p, row_data, quant->scales.data() + static_cast<size_t>(row) * scale_row,
                       quant->biases.data() + static_cast<size_t>(row) * scale_row, dst, n);
    return;
  }
  dequantize_row(type, row_data, dst, n);
}

void encode_row(DType type, const float* src, int64_t n, std::byte* dst) {
  if (type != DType::F32 && type != DType::F16 && type != DType::BF16)
    fail("CPU backend: cannot encode values as {}", dtype_name(type));
  quantize_row(type, src, dst, n);
}

}  // namespace specula::cpu

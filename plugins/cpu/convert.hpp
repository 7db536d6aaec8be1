// Row access for the CPU backend on top of the SDK's codecs (specula/quant.hpp), which are the single
// definition of every storage format. Kernels that decode on the fly are tested against them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "specula/dtype.hpp"
#include "specula/model_file.hpp"
#include "specula/quant.hpp"

namespace specula::cpu {

// Whether decode_row() can decode this type.
bool can_decode(DType type);

// Bytes of one stored row of `cols` values (MLX_AFFINE: the packed codes only, from `quant`);
// nullopt when cols is not a whole number of blocks.
std::optional<size_t> row_bytes(DType type, int64_t cols, const QuantParams* quant = nullptr);

// Decodes the first n values of row `row` of a tensor stored as `type` into F32. `row_data` points at
// the row's first byte; `quant` and `row` are only read for MLX_AFFINE (per-row scales and biases).
void decode_row(DType type, const std::byte* row_data, int64_t n, float* dst,
                const QuantParams* quant = nullptr, int64_t row = 0);

// Encodes n F32 values as `type` (F32, F16, BF16).
void encode_row(DType type, const float* src, int64_t n, std::byte* dst);

}  // namespace specula::cpu

// Scalar conversions and block codecs: turn stored rows (F16, BF16, ggml quantized blocks, MLX affine
// groups) into f32 and back. These are the reference implementations every backend is tested against;
// dequantization is bit-exact with llama.cpp (tests/formats/golden). All functions work on one row of
// `n` logical values; `n` must be a whole number of blocks of the type (see dtype_row_bytes), else they
// throw specula::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "specula/dtype.hpp"
#include "specula/model_file.hpp"

namespace specula {

// IEEE binary16 <-> binary32 (round to nearest even; NaN and infinities kept).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
// bfloat16 is the top half of a binary32; rounding is to nearest even, NaN stays NaN.
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

// Types dequantize_row / quantize_row accept: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K
// IQ4_NL IQ4_XS (plus the integer scalars I8/I16/I32/U8/U32 and F64 for dequantize_row only).
bool can_dequantize(DType t);
bool can_quantize(DType t);

// `src` holds dtype_row_bytes(t, n) bytes; writes n floats to dst.
void dequantize_row(DType t, const void* src, float* dst, int64_t n);
// Reference quantizers (llama.cpp's `quantize_row_*_ref` algorithms re-derived from its documentation
// and behaviour); writes dtype_row_bytes(t, n) bytes to dst.
void quantize_row(DType t, const float* src, void* dst, int64_t n);

// MLX affine quantization of one row of n values: `packed` is a little-endian bit stream of `bits`-bit
// codes (n*bits/32 uint32 words), `scales`/`biases` hold n/group_size values of `scale_type`
// (F16, BF16 or F32). w[c] = scales[c/gs] * q[c] + biases[c/gs], computed in f32.
struct MlxRowParams {
  uint32_t bits = 4;         // 2, 3, 4, 5, 6 or 8
  uint32_t group_size = 64;  // 32, 64 or 128
  DType scale_type = DType::BF16;
};
bool mlx_params_valid(uint32_t bits, uint32_t group_size);
void mlx_dequantize_row(const MlxRowParams& p, const void* packed, const void* scales, const void* biases,
                        float* dst, int64_t n);
// MLX's own affine quantizer (mlx/ops.cpp `affine_quantize`): per group, the larger-magnitude extreme
// becomes the bias and the scale may be negative.
void mlx_quantize_row(const MlxRowParams& p, const float* src, int64_t n, void* packed, void* scales,
                      void* biases);

// Whole tensor of a ModelFile to f32 (row by row; MLX_AFFINE uses its QuantParams). `dst` must hold
// t.elements() floats. Throws specula::Error naming the tensor for an unsupported type.
void dequantize_tensor(const TensorInfo& t, float* dst);
// Dequantize only rows [row_begin, row_end) of a tensor seen as [elements/last_dim, last_dim]
// (e.g. an embedding lookup); dst holds (row_end-row_begin)*last_dim floats.
void dequantize_rows(const TensorInfo& t, int64_t row_begin, int64_t row_end, float* dst);

}  // namespace specula

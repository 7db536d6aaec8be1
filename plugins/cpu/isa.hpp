// Instruction-set dispatch of the CPU backend's matrix kernels. The same kernel sources (qkernels*.cpp) are
// compiled once per instruction set; the backend picks the best set the CPU has when it is created, or
// the one an option or SPECULA_CPU_ISA asks for. Every set computes bit-identical results: integer block
// dots are exact, and float accumulation uses the same lanes and the same reduction order everywhere
// (AVX-512 keeps what AVX2 holds in two 8-lane accumulators in the two halves of one register).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace specula {
enum class DType : uint32_t;  // specula/dtype.hpp (the ISA objects are built without the SDK)
}

namespace specula::cpu {

enum class Isa { avx2, avx512 };

// Weight rows [0, nw) (row_bytes apart) times activation rows [0, nx) (quantized records or F32 rows,
// x_stride bytes apart): y[r * ldy + o].
using RowsKernel = void (*)(const std::byte* w, size_t row_bytes, int64_t nw, const std::byte* x, size_t x_stride,
                            int64_t nx, int64_t cols, float* y, int64_t ldy);
// One activation row of `cols` values to the record a RowsKernel of that weight type reads.
using QuantizeKernel = void (*)(const float* x, int64_t cols, std::byte* record);

struct QuantKernel {
  QuantizeKernel quantize = nullptr;
  size_t (*record_bytes)(int64_t cols) = nullptr;
  RowsKernel rows = nullptr;
  // For kPrefillRows activation rows and more (prompt chunks): repacks weight panels on the fly. Its rows
  // differ from those of `rows` in float rounding (the same on every set); below kPrefillRows (decode,
  // speculative verification) a row's result does not depend on how many rows share the call.
  RowsKernel prefill = nullptr;
  // Weights packed once into panels of kPanelRows rows (every quantized type; MLX's have their own): each
  // panel is panel_bytes(cols); pack(w, row_bytes, nw, cols, out) writes the panels of rows [0, nw) at out
  // (zeroed); `packed` is a RowsKernel taking the panels (their stride for row_bytes) in place of the rows.
  // It runs the same operations at every row count, so a row's bits never depend on the batch (Q8_0 / Q4_0:
  // the bits of `prefill`).
  size_t (*panel_bytes)(int64_t cols) = nullptr;
  void (*pack)(const std::byte* w, size_t row_bytes, int64_t nw, int64_t cols, std::byte* out) = nullptr;
  RowsKernel packed = nullptr;
};
inline constexpr int64_t kPrefillRows = 16;
inline constexpr int64_t kPanelRows = 16;
// The panels holding `rows` rows (the last one padded): a matrix's, or one expert's of a packed MatMulId.
inline constexpr int64_t panel_count(int64_t rows) { return (rows + kPanelRows - 1) / kPanelRows; }

// MLX affine weights (4 or 8 bits, groups of 32 / 64 / 128): rows of codes, and per-group scales and
// biases in arrays of their own; every pointer at the first row of the call.
struct AffineMatrix {
  const std::byte* codes = nullptr;
  size_t code_bytes = 0;  // per row
  const std::byte* scales = nullptr;
  const std::byte* biases = nullptr;
  size_t scale_bytes = 0;  // per row
  int group_size = 0;
  enum class Scale { f16, bf16, f32 } scale_type = Scale::f16;
};
using AffineRowsKernel = void (*)(const AffineMatrix& w, int64_t nw, const std::byte* x, size_t x_stride, int64_t nx,
                                  int64_t cols, float* y, int64_t ldy);
// MLX multiplies its quantized weights with float activations, and so do the tiles `rows`: `prepare`
// writes the record they read (the activations reordered as the codes are).
// 4 bits with f16 / bf16 scales also have packed panels (null for 8 bits): pack(w, nw, cols, out) writes
// the panels of rows [0, nw) at out (zeroed), panel_bytes(cols, group_size) each; `packed` multiplies
// them (w.codes: the panels, w.code_bytes: panel_bytes) with the 8-bit records `quantize` writes, as the
// GGUF types' packed panels do, at every row count with the same bits.
struct AffineKernel {
  QuantizeKernel prepare = nullptr;
  size_t (*record_bytes)(int64_t cols) = nullptr;
  AffineRowsKernel rows = nullptr;  // any row count (matmul uses them below gemm_min_rows)
  QuantizeKernel quantize = nullptr;
  size_t (*quantized_bytes)(int64_t cols) = nullptr;
  size_t (*panel_bytes)(int64_t cols, int group_size) = nullptr;
  void (*pack)(const AffineMatrix& w, int64_t nw, int64_t cols, std::byte* out) = nullptr;
  AffineRowsKernel packed = nullptr;
};

// What attention's inner kernel reads of Op::Attention (kernels.hpp's AttentionArgs has the rest).
struct AttendCache {
  const std::byte* k;  // [S, Hkv, D]
  const std::byte* v;  // [S, Hkv, Dv]
  int64_t Hkv, D, Dv;
  float scale;
};
// Query rows an attention work item takes at most: a verification's 2-9 in one, a prompt chunk's in blocks
// (bounds the scores an item keeps: rows x heads x slots).
constexpr int64_t kMaxAttentionRows = 16;
// Attention over one KV head for G of its query heads and R <= kMaxAttentionRows query rows
// (qkernels_attention.cpp): q and out hold R * G pointers, row by row; slots the n cache slots any of the
// rows sees, in slot order, and seen[r * n + j] whether row r sees slot j; p room for R * n * G scores.
using AttendHeads = void (*)(const AttendCache& a, int64_t R, const float* const* q, const int32_t* slots,
                             const uint8_t* seen, int64_t n, size_t k_row, size_t v_row, int64_t hk, float* p,
                             float* const* out);

struct KernelSet {
  const char* name;  // "avx2", "avx512"
  QuantKernel q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_xs, q4_k, q5_k, q6_k;
  RowsKernel f32, f16, bf16;  // x rows are F32, x_stride = cols * 4
  AffineKernel mlx4, mlx8;
  // Element-wise maps over n values (qkernels_map.cpp): the same bits on every set.
  void (*gelu_tanh)(const float* x, int64_t n, float* out);
  void (*softcap)(const float* x, int64_t n, float cap, float* out);
  // exp with std::exp's bits (the attention softmax's, exp8 in qkernels.hpp).
  void (*exp)(const float* x, int64_t n, float* out);
  // Attention by K cache type, V cache type (F32, F16, BF16) and heads an item (1, 2, 4, 8): the same bits
  // on every set, and for each row the bits it gets alone.
  AttendHeads attend_heads[3][3][4];
};

namespace avx2 {
const KernelSet& kernel_set();
}
namespace avx512 {
const KernelSet& kernel_set();
}

// The set's kernel for a quantized weight type, or null (then: F32 / F16 / BF16 rows or the generic path).
const QuantKernel* quant_kernel(const KernelSet& set, DType type);

// Instruction sets this CPU (and its OS) can run, best last.
std::vector<Isa> supported_isas();
const char* isa_name(Isa isa);
// The kernels for `requested` ("auto", "avx2", "avx512"; empty = SPECULA_CPU_ISA or auto). Fails naming
// what the CPU has when the requested set is unknown or not supported here.
const KernelSet& select_kernels(std::string_view requested);

}  // namespace specula::cpu

// Matrix products, dispatched by weight storage type:
//  - Quantized weights the backend has packed (Matrix::packed, CpuTensor::packed): the set's packed panels at any
//    row count (Q4_1 / Q5_1 below gemm_min_rows).
//  - Q8_0 / Q4_0 / Q5_0 / IQ4_NL / IQ4_XS / Q4_K / Q5_K / Q6_K at any row count, Q4_1 / Q5_1 and F32 / F16 / BF16 below
//    gemm_min_rows: the kernel set of this CPU (isa.hpp, qkernels*.cpp) streams each weight row once, never
//    materialising it in F32, and dots it with activation rows quantized on the fly to 8 bits (the
//    llama.cpp scheme): tiles for few rows, repacked panels for prompt chunks.
//  - MLX affine 4 bits (f16 / bf16 scales) the backend has packed: the set's packed panels at any row
//    count (8-bit activations, as for the GGUF types; MLX's form, scale · Σ q x + bias · Σ x).
//  - MLX affine 4 / 8 bits below gemm_min_rows: float tiles (MLX's own numerics: float activations), the
//    codes in place, scales and biases beside them.
//  - F32 / F16 / BF16 / Q4_1 / Q5_1 / MLX with many rows (prefill) and at least kGemmMinElements values:
//    weight rows decoded to F32 in tiles, oneDNN's GEMM.
//  - other types: matmul_generic (decode a row with the SDK codec, dot in F32).
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <limits>
#include <span>
#include <vector>

#include <immintrin.h>

#include "convert.hpp"
#include "kernels.hpp"
#include "specula/error.hpp"

namespace specula::cpu {

namespace {

inline __m256 load_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

RowsKernel float_kernel(const KernelSet& ks, DType type) {
  switch (type) {
    case DType::F32: return ks.f32;
    case DType::F16: return ks.f16;
    case DType::BF16: return ks.bf16;
    default: return nullptr;
  }
}

// A share of a product is at least this much work, in weight bytes at one activation row (a few
// microseconds). Splitting a product costs 1.5-2 microseconds (waking the other thread's share, claiming
// chunks from a shared counter, waiting for the last), so a small model's matrices (35-560 KB) run on
// one thread: on the tiny default model, 2 threads with 64 KB shares decoded 15 % slower and verified 2
// tokens at 1.4 decode steps instead of 1.2. On a VM whose two vCPUs share one core's time the other
// thread would only take that time away.
constexpr size_t kMinShareWork = size_t{256} << 10;

// One product of a pass: weight w against n activation rows at x, into y (w.rows floats a row). A pass
// is one product, or MatMulId's experts (all of one type and shape), each against its own rows.
struct Part {
  const Matrix* w;
  const std::byte* x;
  int64_t n;
  float* y;
};

// Each thread takes contiguous shares of the parts' weight rows (an expert's share ends at its last row)
// and streams each once per chunk of activation rows; a chunk is sized so that its records stay in the
// core's L2 cache. rows(part, o0, o1, x, nx, y) runs weight rows [o0, o1) of the part's weight against nx
// of its activation rows; shares start at multiples of `unit` rows (packed panels). Experts go in one
// pass: a pass each paid the pool's hand-over per selected expert (8-30 a layer on 26B-A4B) and split
// each small matrix between threads.
template <class Rows>
void over_weight_rows(ThreadPool& pool, std::span<const Part> parts, size_t x_stride, const Rows& rows,
                      int64_t unit = 1) {
  const int64_t O = parts.front().w->rows, per_part = (O + unit - 1) / unit;
  const int64_t units = per_part * static_cast<int64_t>(parts.size());
  const int64_t chunk = std::clamp<int64_t>(static_cast<int64_t>((size_t{512} << 10) / x_stride) / 4 * 4, 4, 256);
  // A second activation row costs about half a first: the weight bytes are streamed and decoded once.
  size_t work = 0;
  for (const Part& p : parts) work += p.w->row_bytes * static_cast<size_t>(O) * static_cast<size_t>(p.n + 1) / 2;
  const int64_t shares = std::max<int64_t>(1, static_cast<int64_t>(work / kMinShareWork));
  const int64_t grain = std::max<int64_t>((16 + unit - 1) / unit, (units + shares - 1) / shares);
  pool.parallel_for(units, grain, [&](int64_t u0, int64_t u1) {
    while (u0 < u1) {
      const Part& p = parts[static_cast<size_t>(u0 / per_part)];
      const int64_t s0 = u0 % per_part, s1 = std::min(per_part, s0 + (u1 - u0));
      const int64_t o0 = s0 * unit, o1 = std::min(O, s1 * unit);
      for (int64_t r0 = 0; r0 < p.n; r0 += chunk)
        rows(p, o0, o1, p.x + static_cast<size_t>(r0) * x_stride, std::min(chunk, p.n - r0), p.y + r0 * O + o0);
      u0 += s1 - s0;
    }
  });
}
template <class Rows>
void over_weight_rows(ThreadPool& pool, const Matrix& w, const std::byte* x, size_t x_stride, int64_t n, float* y,
                      const Rows& rows, int64_t unit = 1) {
  const Part part{&w, x, n, y};
  over_weight_rows(pool, std::span<const Part>(&part, 1), x_stride, rows, unit);
}

void matmul_rows(ThreadPool& pool, RowsKernel rows, const Matrix& w, const std::byte* x, size_t x_stride,
                 int64_t n, float* y) {
  over_weight_rows(pool, w, x, x_stride, n, y, [&](const Part&, int64_t o0, int64_t o1, const std::byte* xr, int64_t nx, float* yr) {
    rows(w.row(o0), w.row_bytes, o1 - o0, xr, x_stride, nx, w.cols, yr, w.rows);
  });
}

// The activation rows as the records a kernel reads, split between the threads sooner than the small
// ops (kMinShareValues): on one thread, 9 rows of 1536 made E2B's 9-row products 2-5 ms slower (not traced).
constexpr int64_t kMinRecordShare = 16384;
std::vector<std::byte> activation_records(ThreadPool& pool, QuantizeKernel write, size_t stride, const float* x,
                                          int64_t n, int64_t cols) {
  std::vector<std::byte> rec(stride * static_cast<size_t>(n));
  pool.parallel_for(n, rows_grain(4 * cols, kMinRecordShare), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) write(x + r * cols, cols, rec.data() + static_cast<size_t>(r) * stride);
  });
  return rec;
}

// Quantized activation records against each part's weights: packed ones (Matrix::packed) through the set's
// packed panels, in shares of whole panels; others through its row tiles (prompt chunks: its prefill
// panels). x holds the parts' activation rows one part after the other; each part's x is set here.
void matmul_quant(ThreadPool& pool, const QuantKernel& k, std::span<Part> parts, const float* x) {
  const int64_t cols = parts.front().w->cols;
  const size_t stride = k.record_bytes(cols);
  int64_t rows = 0;
  for (const Part& p : parts) rows += p.n;
  const std::vector<std::byte> qx = activation_records(pool, k.quantize, stride, x, rows, cols);
  bool packed = k.packed != nullptr;
  const std::byte* rec = qx.data();
  for (Part& p : parts) {
    p.x = rec;
    rec += static_cast<size_t>(p.n) * stride;
    packed = packed && p.w->packed;
  }
  if (packed) {
    const size_t panel_bytes = k.panel_bytes(cols);
    over_weight_rows(
        pool, parts, stride,
        [&](const Part& p, int64_t o0, int64_t o1, const std::byte* xr, int64_t nx, float* yr) {
          k.packed(p.w->packed + static_cast<size_t>(o0 / kPanelRows) * panel_bytes, panel_bytes, o1 - o0, xr, stride,
                   nx, cols, yr, p.w->rows);
        },
        kPanelRows);
    return;
  }
  // The kernel by each part's own row count, as a product of that part alone would choose it.
  over_weight_rows(pool, parts, stride, [&](const Part& p, int64_t o0, int64_t o1, const std::byte* xr, int64_t nx, float* yr) {
    const RowsKernel rows = p.n >= kPrefillRows && k.prefill ? k.prefill : k.rows;
    rows(p.w->row(o0), p.w->row_bytes, o1 - o0, xr, stride, nx, cols, yr, p.w->rows);
  });
}
void matmul_quant(ThreadPool& pool, const QuantKernel& k, const Matrix& w, const float* x, int64_t n, float* y) {
  Part part{&w, nullptr, n, y};
  matmul_quant(pool, k, std::span<Part>(&part, 1), x);
}

const AffineKernel* mlx_kernel(const KernelSet& ks, const Matrix& w) {
  return w.type == DType::MLX_AFFINE && w.quant ? mlx_kernel(ks, *w.quant) : nullptr;
}

// Packed MLX weights (every part's Matrix::packed: a matrix, or MatMulId's experts in one pass), as
// matmul_quant multiplies packed panels.
void matmul_mlx_packed(ThreadPool& pool, const AffineKernel& k, std::span<Part> parts, const float* x) {
  const Matrix& w0 = *parts.front().w;
  const size_t stride = k.quantized_bytes(w0.cols);
  int64_t rows = 0;
  for (const Part& p : parts) rows += p.n;
  const std::vector<std::byte> qx = activation_records(pool, k.quantize, stride, x, rows, w0.cols);
  const std::byte* rec = qx.data();
  for (Part& p : parts) {
    p.x = rec;
    rec += static_cast<size_t>(p.n) * stride;
  }
  AffineMatrix m = affine_rows(*w0.quant, nullptr, 0, w0.cols, 0);  // its group size and scale type
  m.code_bytes = k.panel_bytes(w0.cols, m.group_size);
  over_weight_rows(
      pool, parts, stride,
      [&](const Part& p, int64_t o0, int64_t o1, const std::byte* xr, int64_t nx, float* yr) {
        AffineMatrix part = m;
        part.codes = p.w->packed + static_cast<size_t>(o0 / kPanelRows) * m.code_bytes;
        k.packed(part, o1 - o0, xr, stride, nx, w0.cols, yr, p.w->rows);
      },
      kPanelRows);
}

// MLX weights: through the packed panels where the backend packed them (Matrix::packed), at every row count
// (8-bit activations, as the GGUF types' panels); else float tiles (MLX's own numerics) below
// gemm_min_rows, the codes in place.
void matmul_mlx(ThreadPool& pool, const AffineKernel& k, const Matrix& w, const float* x, int64_t n, float* y) {
  if (w.packed && k.packed) {
    Part part{&w, nullptr, n, y};
    return matmul_mlx_packed(pool, k, std::span<Part>(&part, 1), x);
  }
  const size_t stride = k.record_bytes(w.cols);
  const std::vector<std::byte> rec = activation_records(pool, k.prepare, stride, x, n, w.cols);
  const AffineMatrix m = affine_rows(*w.quant, w.data, w.row_bytes, w.cols, w.row_offset);
  over_weight_rows(pool, w, rec.data(), stride, n, y,
                   [&](const Part&, int64_t o0, int64_t o1, const std::byte* xr, int64_t nx, float* yr) {
                     AffineMatrix part = m;
                     part.codes = w.row(o0);
                     part.scales += static_cast<size_t>(o0) * m.scale_bytes;
                     part.biases += static_cast<size_t>(o0) * m.scale_bytes;
                     k.rows(part, o1 - o0, xr, stride, nx, w.cols, yr, w.rows);
                   });
}

// One weight row to F32: F16 / BF16 convert in registers, other types through the SDK codec.
void decode_tile_row(const Matrix& w, int64_t row, float* dst) {
  const int64_t I = w.cols;
  const auto* h = reinterpret_cast<const uint16_t*>(w.row(row));
  if (w.type == DType::BF16 || w.type == DType::F16) {
    int64_t i = 0;
    for (; i + 8 <= I; i += 8) _mm256_storeu_ps(dst + i, w.type == DType::BF16 ? load_bf16(h + i) : load_f16(h + i));
    for (; i < I; ++i) dst[i] = w.type == DType::BF16 ? bf16_to_fp32(h[i]) : fp16_to_fp32(h[i]);
    return;
  }
  decode_row(w.type, w.row(row), I, dst, w.quant, w.row_offset + row);
}

// Many activation rows: each thread takes a share of the weight rows, decodes them tile by tile to
// F32 (F32 weights are used in place) and runs a single-threaded oneDNN GEMM on the tile. Our pool
// does the threading so oneDNN's OpenMP team never competes with it for the cores.
void matmul_gemm(ThreadPool& pool, const Matrix& w, const float* x, int64_t n, float* y) {
  const int64_t O = w.rows, I = w.cols;
  constexpr int64_t kTile = 64;  // weight rows per tile: 64 x I floats stay in L2
  pool.parallel_for(O, kTile, [&](int64_t o0, int64_t o1) {
    omp_set_num_threads(1);
    std::vector<float> tile;
    for (int64_t t0 = o0; t0 < o1; t0 += kTile) {
      const int64_t rows = std::min(kTile, o1 - t0);
      const float* b;
      if (w.type == DType::F32) {
        b = reinterpret_cast<const float*>(w.row(t0));
      } else {
        tile.resize(static_cast<size_t>(rows * I));
        for (int64_t r = 0; r < rows; ++r) decode_tile_row(w, t0 + r, tile.data() + r * I);
        b = tile.data();
      }
      // Row-major: y[:, t0:t0+rows] = x[n, I] @ b[rows, I]^T.
      const dnnl_status_t st = dnnl_sgemm('N', 'T', n, rows, I, 1.0f, x, I, b, I, 0.0f, y + t0, O);
      if (st != dnnl_success) fail("CPU backend: oneDNN sgemm failed with status {}", static_cast<int>(st));
    }
  });
}

}  // namespace

// Activation rows from which F32 / F16 / BF16 weights go through the tiled oneDNN GEMM; the quantized
// types with a kernel never do (their int8 tiles win at any row count).
int64_t gemm_min_rows(DType type) {
  switch (type) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q5_0:
    case DType::IQ4_NL:
    case DType::IQ4_XS:
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
      return std::numeric_limits<int64_t>::max();
    default: return 16;
  }
}

namespace {
// oneDNN's GEMM generates its code on the first call, tens of milliseconds; a smaller matrix (a small
// model's) stays on this set's kernels at any row count, so its first prompt is not that much slower.
constexpr int64_t kGemmMinElements = int64_t{1} << 20;
bool uses_gemm(const Matrix& w, int64_t n) {
  return n >= gemm_min_rows(w.type) && w.rows * w.cols >= kGemmMinElements;
}
}  // namespace

// MLX affine weights with a kernel (4 and 8 bits, f16 / bf16 / f32 scales): the codes in place, scales
// and biases beside them (or the packed panels).
const AffineKernel* mlx_kernel(const KernelSet& ks, const QuantParams& q) {
  if (q.group_size % 32 != 0) return nullptr;
  if (q.scale_type != DType::F16 && q.scale_type != DType::BF16 && q.scale_type != DType::F32) return nullptr;
  return q.bits == 4 ? &ks.mlx4 : q.bits == 8 ? &ks.mlx8 : nullptr;
}

AffineMatrix affine_rows(const QuantParams& q, const std::byte* codes, size_t code_bytes, int64_t cols, int64_t row) {
  AffineMatrix m;
  m.code_bytes = code_bytes;
  m.codes = codes;
  m.group_size = static_cast<int>(q.group_size);
  m.scale_type = q.scale_type == DType::F16    ? AffineMatrix::Scale::f16
                 : q.scale_type == DType::BF16 ? AffineMatrix::Scale::bf16
                                               : AffineMatrix::Scale::f32;
  m.scale_bytes = static_cast<size_t>(cols / q.group_size) * (q.scale_type == DType::F32 ? 4 : 2);
  m.scales = q.scales.data() + static_cast<size_t>(row) * m.scale_bytes;
  m.biases = q.biases.data() + static_cast<size_t>(row) * m.scale_bytes;
  return m;
}

void matmul(ThreadPool& pool, const KernelSet& ks, const Matrix& w, const float* x, int64_t n, float* y) {
  const AffineKernel* mlx = mlx_kernel(ks, w);
  if (mlx && w.packed) return matmul_mlx(pool, *mlx, w, x, n, y);
  if (uses_gemm(w, n)) return matmul_gemm(pool, w, x, n, y);
  if (const QuantKernel* k = quant_kernel(ks, w.type)) return matmul_quant(pool, *k, w, x, n, y);
  if (mlx) return matmul_mlx(pool, *mlx, w, x, n, y);
  if (RowsKernel rows = float_kernel(ks, w.type))
    return matmul_rows(pool, rows, w, reinterpret_cast<const std::byte*>(x), static_cast<size_t>(w.cols) * 4, n, y);
  matmul_generic(pool, w, x, n, y);
}

void matmul_experts(ThreadPool& pool, const KernelSet& ks, const std::vector<Matrix>& w, const float* x,
                    const std::vector<int64_t>& first, float* y) {
  const Matrix& w0 = w.front();
  const QuantKernel* k = quant_kernel(ks, w0.type);
  std::vector<Part> parts;
  for (size_t i = 0; i < w.size(); ++i) parts.push_back({&w[i], nullptr, first[i + 1] - first[i], y + first[i] * w0.rows});
  const AffineKernel* mlx = mlx_kernel(ks, w0);
  if (mlx && mlx->packed && std::all_of(w.begin(), w.end(), [](const Matrix& m) { return m.packed != nullptr; }))
    return matmul_mlx_packed(pool, *mlx, parts, x);
  bool gemm = false;  // an expert that matmul() would send to the oneDNN GEMM (float and Q4_1 / Q5_1 prompts)
  for (size_t i = 0; i < w.size(); ++i) gemm = gemm || uses_gemm(w0, first[i + 1] - first[i]);
  if (!k || gemm) {
    for (size_t i = 0; i < w.size(); ++i)
      matmul(pool, ks, w[i], x + first[i] * w0.cols, first[i + 1] - first[i], y + first[i] * w0.rows);
    return;
  }
  matmul_quant(pool, *k, parts, x);
}

}  // namespace specula::cpu

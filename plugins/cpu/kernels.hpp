// Op kernels of the CPU backend. Each takes plain pointers and sizes, runs on the thread pool, and
// checks nothing the graph builder already checked; index operands (ids, positions) are checked here
// because their values are only known at run time.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "isa.hpp"
#include "specula/compute.hpp"
#include "thread_pool.hpp"

namespace specula::cpu {

// A row-major matrix of any storage type: `rows` rows of `cols` values, `row_bytes` apart.
struct Matrix {
  DType type = DType::F32;
  const std::byte* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  const QuantParams* quant = nullptr;  // MLX_AFFINE
  int64_t row_offset = 0;              // index of row 0 in the whole tensor (MLX scales)
  const std::byte* packed = nullptr;   // the rows as QuantKernel::pack panels (whole matrix), or null

  const std::byte* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

float dot_f32(const float* a, const float* b, int64_t n);

// Values of simple arithmetic a share of an op handles at least: handing a share to another thread costs
// its cache lines twice (the other core reads the input, the next op reads the output back), so the
// norms, adds and RoPE of a verification stay on one thread. On the Zen 5 VM, 16K here split RmsNorm over
// 5 rows x 2816 between the threads at 6.7 us a call against 3.6 on one; with 64K the small ops of a
// 9-row E2B pass took 5.5-5.7 ms against 6.1-6.3 and a 5-row 26B-A4B layer's 10 % less. rows_grain: the
// parallel_for grain for rows of `cost` such values each, shares of at least `min_share` values.
inline constexpr int64_t kMinShareValues = 65536;
inline int64_t rows_grain(int64_t cost, int64_t min_share = kMinShareValues) {
  return std::max<int64_t>(1, min_share / std::max<int64_t>(1, cost));
}

// MLX affine weight rows from `row` on: codes at `codes` (code_bytes a row), scales and biases from q.
AffineMatrix affine_rows(const QuantParams& q, const std::byte* codes, size_t code_bytes, int64_t cols, int64_t row);
// The AffineKernel for an MLX weight of these parameters, or null (then: the generic path).
const AffineKernel* mlx_kernel(const KernelSet& ks, const QuantParams& q);

// y[N, O] = x[N, I] @ W[O, I]^T.
void matmul(ThreadPool& pool, const KernelSet& kernels, const Matrix& w, const float* x, int64_t n, float* y);
// MatMulId's experts in one pass: y rows [first[i], first[i + 1]) = x rows [first[i], first[i + 1]) @ w[i]^T,
// every w[i] of one type and shape; each expert's rows get the bits matmul() gives them.
void matmul_experts(ThreadPool& pool, const KernelSet& kernels, const std::vector<Matrix>& w, const float* x,
                    const std::vector<int64_t>& first, float* y);
// Smallest activation row count for which matmul() uses the tiled oneDNN GEMM for this weight type.
int64_t gemm_min_rows(DType type);
// The reference path of matmul: decode each weight row, dot in F32. Used for types without a kernel.
void matmul_generic(ThreadPool& pool, const Matrix& w, const float* x, int64_t n, float* y);

// out[N*K, O]: row (i, k) = x[i, k or 0] @ experts[ids[i, k]]^T; experts = E stacked [O, I] matrices.
void matmul_id(ThreadPool& pool, const KernelSet& kernels, const Matrix& experts, int64_t num_experts, const float* x,
               bool x_shared, const int32_t* ids, int64_t n, int64_t k, float* y,
               const std::string& node_name);

void get_rows(ThreadPool& pool, const Matrix& table, const int32_t* ids, int64_t n, float* out,
              const std::string& node_name);

struct AttentionArgs {
  const float* q;        // [T, Hq, D]
  const std::byte* k;    // [S, Hkv, D] of k_type
  const std::byte* v;    // [S, Hkv, Dv] of v_type
  DType k_type = DType::F32, v_type = DType::F32;  // F32, F16 or BF16
  const int32_t* key_pos;
  const int32_t* query_pos;
  int64_t T, S, Hq, Hkv, D, Dv;  // S: the slots read (those in use)
  float scale;
  int64_t window;
  bool causal;
};
void attention(ThreadPool& pool, const KernelSet& kernels, const AttentionArgs& a, float* out);

// The cosines and sines of RoPE's angles by rotation and position, kept across ops and runs: a graph's
// layers share a few rotations (Gemma 4: its sliding and its global layers), so each position's angles are
// computed once, not once per layer and per q and k (some 20 values' time a pair). Bounded per rotation.
class RopeTables {
 public:
  struct Rotation {
    float theta, divisor, freq_scale;
    int64_t pairs;
    auto operator<=>(const Rotation&) const = default;
  };
  // out[t] = pos[t]'s pairs cosines, then its pairs sines; valid until the next call.
  void lookup(const Rotation& r, const int32_t* pos, int64_t T, const float** out);

 private:
  struct Table {
    std::vector<float> inv_freq;
    std::unordered_map<int32_t, std::vector<float>> at;  // by position
  };
  std::map<Rotation, Table> tables_;
};

void rope(ThreadPool& pool, RopeTables& tables, const float* x, const int32_t* pos, int64_t T, int64_t H, int64_t D,
          int64_t pairs, float theta, float divisor, float freq_scale, float* out);

void rms_norm(ThreadPool& pool, const float* x, const float* w, int64_t rows, int64_t cols, float eps,
              float* out);

// out = a (op) b with b broadcast (right-aligned, axes equal or 1) against a.
void binary(ThreadPool& pool, Op op, const float* a, const Shape& as, const float* b, const Shape& bs,
            float* out);

void gelu_tanh(ThreadPool& pool, const KernelSet& kernels, const float* x, int64_t n, float* out);
void softcap(ThreadPool& pool, const KernelSet& kernels, const float* x, int64_t n, float cap, float* out);
void scale(ThreadPool& pool, const float* x, int64_t n, float s, float* out);
void softmax(ThreadPool& pool, const float* x, int64_t rows, int64_t cols, float* out);
void top_k(const float* x, int64_t rows, int64_t cols, int64_t k, int32_t* out);

// The device sampler's ops (compute.hpp has their exact semantics); draw.cpp.
void clamp(const float* x, int64_t n, float lo, float hi, float* out);
void scatter(const float* a, int64_t n, const int32_t* ids, const float* values, int64_t m, float* out,
             const std::string& node_name);
int32_t top_p_draw(const float* logits, const int32_t* ids, int64_t k, float uniform, float inv_temperature,
                   float top_p, float min_p);
// AcceptDrafts: p [n + 1, vocab] with TopK rows p_top [n + 1, kp], q [n, vocab] with q_top [n, kq] -> out [n + 2].
struct DraftRows {
  const float* logits;
  const int32_t* top;
  int64_t k;
};
void accept_drafts(DraftRows p, DraftRows q, const int32_t* drafts, int64_t n, int64_t vocab, const float* uniforms,
                   float inv_temperature, float top_p, float min_p, int32_t* out, const std::string& node_name);

}  // namespace specula::cpu

#include "kernels.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include <immintrin.h>

#include "convert.hpp"
#include "hsum.hpp"
#include "specula/error.hpp"
#include "specula/sampling_rule.hpp"

namespace specula::cpu {

float dot_f32(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum_pairs(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void matmul_generic(ThreadPool& pool, const Matrix& w, const float* x, int64_t n, float* y) {
  const int64_t O = w.rows, I = w.cols;
  pool.parallel_for(O, 16, [&](int64_t o0, int64_t o1) {
    std::vector<float> row(static_cast<size_t>(I));
    for (int64_t o = o0; o < o1; ++o) {
      decode_row(w.type, w.row(o), I, row.data(), w.quant, w.row_offset + o);
      for (int64_t r = 0; r < n; ++r) y[r * O + o] = dot_f32(x + r * I, row.data(), I);
    }
  });
}

void matmul_id(ThreadPool& pool, const KernelSet& kernels, const Matrix& experts, int64_t num_experts, const float* x,
               bool x_shared, const int32_t* ids, int64_t n, int64_t k, float* y,
               const std::string& node_name) {
  const int64_t O = experts.rows / num_experts, I = experts.cols;
  // Group the (token, slot) pairs by expert so each expert's weights are streamed once.
  std::vector<std::vector<int64_t>> by_expert(static_cast<size_t>(num_experts));
  for (int64_t p = 0; p < n * k; ++p) {
    int32_t e = ids[p];
    if (e < 0 || e >= num_experts)
      fail("CPU backend: MatMulId '{}': expert id {} at [{}, {}] is outside [0, {})", node_name, e,
           p / k, p % k, num_experts);
    by_expert[static_cast<size_t>(e)].push_back(p);
  }
  // Packed experts (CpuTensor::packed with group_rows O): expert e's panels follow e whole experts'.
  size_t expert_panels_bytes = 0;
  if (experts.packed) {
    const QuantKernel* qk = quant_kernel(kernels, experts.type);
    const AffineKernel* ak = qk ? nullptr : mlx_kernel(kernels, *experts.quant);
    expert_panels_bytes = (qk ? qk->panel_bytes(I) : ak->panel_bytes(I, static_cast<int>(experts.quant->group_size))) *
                          static_cast<size_t>(panel_count(O));
  }
  // Each used expert's rows gathered in expert order, all multiplied in one pass, then scattered back.
  std::vector<Matrix> used;
  std::vector<int64_t> first{0};
  std::vector<float> xs;
  xs.reserve(static_cast<size_t>(n * k * I));
  for (int64_t e = 0; e < num_experts; ++e) {
    const auto& pairs = by_expert[static_cast<size_t>(e)];
    if (pairs.empty()) continue;
    for (const int64_t p : pairs) {
      const float* src = x + (x_shared ? p / k : p) * I;
      xs.insert(xs.end(), src, src + I);
    }
    Matrix w = experts;
    w.data = experts.row(e * O);
    w.rows = O;
    w.row_offset = experts.row_offset + e * O;
    w.packed = experts.packed ? experts.packed + static_cast<size_t>(e) * expert_panels_bytes : nullptr;
    used.push_back(w);
    first.push_back(first.back() + static_cast<int64_t>(pairs.size()));
  }
  if (used.empty()) return;
  std::vector<float> ys(static_cast<size_t>(first.back() * O));
  matmul_experts(pool, kernels, used, xs.data(), first, ys.data());
  const float* row = ys.data();
  for (const auto& pairs : by_expert)
    for (const int64_t p : pairs) {
      std::copy(row, row + O, y + p * O);
      row += O;
    }
}

void get_rows(ThreadPool& pool, const Matrix& table, const int32_t* ids, int64_t n, float* out,
              const std::string& node_name) {
  for (int64_t r = 0; r < n; ++r)
    if (ids[r] < 0 || ids[r] >= table.rows)
      fail("CPU backend: GetRows '{}': id {} at index {} is outside the table's {} rows", node_name,
           ids[r], r, table.rows);
  pool.parallel_for(n, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      decode_row(table.type, table.row(ids[r]), table.cols, out + r * table.cols, table.quant,
                 table.row_offset + ids[r]);
  });
}

namespace {

size_t type_size(DType t) { return t == DType::F32 ? 4 : 2; }

}  // namespace

void attention(ThreadPool& pool, const KernelSet& kernels, const AttentionArgs& a, float* out) {
  const int64_t group = a.Hq / a.Hkv, threads = pool.size();
  // A work item: a block of query rows, one KV head, G of its query heads; each item reads its KV head's
  // cache rows once. Fewest items first (the cache is read once per item: a verification of 9 rows read
  // it 9 times, one item a row, and at 2048 tokens of context its attention cost 5x a decode step's), as
  // long as they spread evenly over the threads (a decode step has one query row and, in Gemma 4, one KV
  // head; a verification of 5 rows in 5 items left one of 2 threads 3 of them), then the most heads an item
  // (each cache load serves them all in registers). Failing that, as before: one row an item.
  auto even = [&](int64_t items) {
    const int64_t most = (items + threads - 1) / threads;  // the busiest thread's items
    return items >= threads && 8 * most * threads <= 9 * items;
  };
  const int64_t R0 = std::min<int64_t>(a.T, kMaxAttentionRows), blocks0 = (a.T + R0 - 1) / R0;
  int G = 0;
  int64_t R = R0;
  for (int g = 8; g >= 1 && !G; g /= 2)  // fewer heads an item: more items
    if (group % g == 0 && even(blocks0 * a.Hkv * (group / g))) G = g;
  if (!G) {
    R = 1;
    G = 8;
    while (G > 1 && !(group % G == 0 && even(a.T * a.Hkv * (group / G)))) G /= 2;
  }
  auto type_index = [](DType t) { return t == DType::F16 ? 1 : t == DType::BF16 ? 2 : 0; };
  const AttendHeads attend = kernels.attend_heads[type_index(a.k_type)][type_index(a.v_type)][std::countr_zero(static_cast<unsigned>(G))];
  const AttendCache cache{a.k, a.v, a.Hkv, a.D, a.Dv, a.scale};
  const size_t k_row = static_cast<size_t>(a.D) * type_size(a.k_type);
  const size_t v_row = static_cast<size_t>(a.Dv) * type_size(a.v_type);
  // The slots each row sees, found once per row, not once per head; then per block of rows their union (in
  // slot order) and which row sees which.
  const int64_t blocks = (a.T + R - 1) / R;
  std::vector<std::vector<int32_t>> block_slots(static_cast<size_t>(blocks));
  std::vector<std::vector<uint8_t>> block_seen(static_cast<size_t>(blocks));
  int64_t visible_total = 0;
  std::vector<uint8_t> row_sees(static_cast<size_t>(R * a.S));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t t0 = b * R, rows = std::min(R, a.T - t0);
    std::fill(row_sees.begin(), row_sees.end(), uint8_t{0});
    auto& slots = block_slots[static_cast<size_t>(b)];
    for (int64_t s = 0; s < a.S; ++s) {
      const int64_t kp = a.key_pos[s];
      bool any = false;
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t qp = a.query_pos[t0 + r];
        if (kp < 0 || (a.causal && kp > qp) || (a.window > 0 && std::abs(qp - kp) >= a.window)) continue;
        row_sees[static_cast<size_t>(r * a.S + s)] = 1;
        any = true;
        ++visible_total;
      }
      if (any) slots.push_back(static_cast<int32_t>(s));
    }
    const int64_t n = static_cast<int64_t>(slots.size());
    auto& seen = block_seen[static_cast<size_t>(b)];
    seen.assign(static_cast<size_t>(R * n), uint8_t{0});
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j) seen[static_cast<size_t>(r * n + j)] = row_sees[static_cast<size_t>(r * a.S + slots[static_cast<size_t>(j)])];
  }
  const int64_t items_per_block = a.Hq / G;
  const int64_t visible_per_item = visible_total / blocks;  // (row, slot) pairs a block's item reads
  pool.parallel_for(blocks * items_per_block, rows_grain(visible_per_item * (a.D + a.Dv) * G), [&](int64_t b0, int64_t b1) {
    std::vector<float> p;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t blk = b / items_per_block, h0 = (b % items_per_block) * G, hk = h0 / group;
      const int64_t t0 = blk * R, rows = std::min(R, a.T - t0);
      const auto& slots = block_slots[static_cast<size_t>(blk)];
      const int64_t n = static_cast<int64_t>(slots.size());
      const float* q[kMaxAttentionRows * 8];
      float* o[kMaxAttentionRows * 8];
      for (int64_t r = 0; r < rows; ++r)
        for (int h = 0; h < G; ++h) {
          q[r * G + h] = a.q + ((t0 + r) * a.Hq + h0 + h) * a.D;
          o[r * G + h] = out + ((t0 + r) * a.Hq + h0 + h) * a.Dv;
        }
      if (n == 0) {  // nothing visible: zeros
        for (int64_t r = 0; r < rows * G; ++r) std::fill(o[r], o[r] + a.Dv, 0.0f);
        continue;
      }
      p.resize(static_cast<size_t>(rows * G * n));
      // (A row of the block that sees no slot sums none: zeros, as alone.)
      attend(cache, rows, q, slots.data(), block_seen[static_cast<size_t>(blk)].data(), n, k_row, v_row, hk, p.data(), o);
    }
  });
}

void RopeTables::lookup(const Rotation& r, const int32_t* pos, int64_t T, const float** out) {
  constexpr size_t kMaxPositions = 8192;  // 8 MB a rotation of 128 pairs
  Table& table = tables_[r];
  if (table.inv_freq.empty()) {
    // inv_freq in F32 as transformers computes it: 1 / theta^(2k / divisor), then the frequency scale.
    table.inv_freq.resize(static_cast<size_t>(r.pairs));
    for (int64_t k = 0; k < r.pairs; ++k)
      table.inv_freq[static_cast<size_t>(k)] =
          (1.0f / std::pow(r.theta, static_cast<float>(2 * k) / r.divisor)) * r.freq_scale;
  }
  if (table.at.size() + static_cast<size_t>(T) > kMaxPositions) table.at.clear();  // never under out's feet
  for (int64_t t = 0; t < T; ++t) {
    auto [it, fresh] = table.at.try_emplace(pos[t]);
    std::vector<float>& cs = it->second;
    if (fresh) {
      cs.resize(static_cast<size_t>(2 * r.pairs));
      for (int64_t k = 0; k < r.pairs; ++k) {
        const float angle = static_cast<float>(pos[t]) * table.inv_freq[static_cast<size_t>(k)];
        cs[static_cast<size_t>(k)] = static_cast<float>(std::cos(static_cast<double>(angle)));
        cs[static_cast<size_t>(r.pairs + k)] = static_cast<float>(std::sin(static_cast<double>(angle)));
      }
    }
    out[t] = cs.data();
  }
}

void rope(ThreadPool& pool, RopeTables& tables, const float* x, const int32_t* pos, int64_t T, int64_t H, int64_t D,
          int64_t pairs, float theta, float divisor, float freq_scale, float* out) {
  std::vector<const float*> angles(static_cast<size_t>(T));
  tables.lookup({theta, divisor, freq_scale, pairs}, pos, T, angles.data());
  const int64_t half = D / 2;
  pool.parallel_for(T, rows_grain(H * D), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* c = angles[static_cast<size_t>(t)];
      const float* s = c + pairs;
      for (int64_t h = 0; h < H; ++h) {
        const float* xi = x + (t * H + h) * D;
        float* yo = out + (t * H + h) * D;
        if (yo != xi) std::copy(xi, xi + D, yo);
        for (int64_t k = 0; k < pairs; ++k) {
          const float x0 = xi[k], x1 = xi[k + half];
          yo[k] = x0 * c[k] - x1 * s[k];
          yo[k + half] = x1 * c[k] + x0 * s[k];
        }
      }
    }
  });
}

void rms_norm(ThreadPool& pool, const float* x, const float* w, int64_t rows, int64_t cols, float eps,
              float* out) {
  pool.parallel_for(rows, rows_grain(2 * cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xi = x + r * cols;
      float* yo = out + r * cols;
      const float ms = dot_f32(xi, xi, cols) / static_cast<float>(cols);
      const float inv = 1.0f / std::sqrt(ms + eps);
      if (w)
        for (int64_t c = 0; c < cols; ++c) yo[c] = xi[c] * inv * w[c];
      else
        for (int64_t c = 0; c < cols; ++c) yo[c] = xi[c] * inv;
    }
  });
}

void binary(ThreadPool& pool, Op op, const float* a, const Shape& as, const float* b, const Shape& bs,
            float* out) {
  const size_t rank = as.size();
  // b's shape left-padded with 1s, and its strides with 0 on broadcast axes.
  std::vector<int64_t> bdim(rank, 1), bstride(rank, 0);
  for (size_t k = 0; k < bs.size(); ++k) bdim[rank - bs.size() + k] = bs[k];
  int64_t stride = 1;
  for (size_t k = rank; k-- > 0;) {
    bstride[k] = bdim[k] == 1 ? 0 : stride;
    stride *= bdim[k];
  }
  const int64_t cols = as.back();
  int64_t rows = 1;
  for (size_t k = 0; k + 1 < rank; ++k) rows *= as[k];
  const bool row_b = bdim.back() == cols;  // b varies along the last axis
  pool.parallel_for(rows, rows_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int64_t boff = 0, rem = r;
      for (size_t k = rank - 1; k-- > 0;) {
        boff += (rem % as[k]) * bstride[k];
        rem /= as[k];
      }
      const float* ar = a + r * cols;
      const float* br = b + boff;
      float* o = out + r * cols;
      if (op == Op::Add) {
        if (row_b) for (int64_t c = 0; c < cols; ++c) o[c] = ar[c] + br[c];
        else for (int64_t c = 0; c < cols; ++c) o[c] = ar[c] + br[0];
      } else if (op == Op::Div) {
        if (row_b) for (int64_t c = 0; c < cols; ++c) o[c] = ar[c] / br[c];
        else for (int64_t c = 0; c < cols; ++c) o[c] = ar[c] / br[0];
      } else {
        if (row_b) for (int64_t c = 0; c < cols; ++c) o[c] = ar[c] * br[c];
        else for (int64_t c = 0; c < cols; ++c) o[c] = ar[c] * br[0];
      }
    }
  });
}

void gelu_tanh(ThreadPool& pool, const KernelSet& ks, const float* x, int64_t n, float* out) {
  pool.parallel_for(n, 4096, [&](int64_t i0, int64_t i1) { ks.gelu_tanh(x + i0, i1 - i0, out + i0); });
}

void softcap(ThreadPool& pool, const KernelSet& ks, const float* x, int64_t n, float cap, float* out) {
  pool.parallel_for(n, 4096, [&](int64_t i0, int64_t i1) { ks.softcap(x + i0, i1 - i0, cap, out + i0); });
}

void scale(ThreadPool& pool, const float* x, int64_t n, float s, float* out) {
  pool.parallel_for(n, kMinShareValues, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) out[i] = x[i] * s;
  });
}

void softmax(ThreadPool& pool, const float* x, int64_t rows, int64_t cols, float* out) {
  pool.parallel_for(rows, rows_grain(4 * cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xi = x + r * cols;
      float* yo = out + r * cols;
      const float m = *std::max_element(xi, xi + cols);
      float sum = 0.0f;
      for (int64_t c = 0; c < cols; ++c) sum += (yo[c] = std::exp(xi[c] - m));
      const float inv = 1.0f / sum;
      for (int64_t c = 0; c < cols; ++c) yo[c] *= inv;
    }
  });
}

void top_k(const float* x, int64_t rows, int64_t cols, int64_t k, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r)
    top_k_order(std::span<const float>(x + r * cols, static_cast<size_t>(cols)), k, out + r * k);
}

}  // namespace specula::cpu

// The CPU compute backend (plugin "cpu"): weights stay in the checkpoint's memory map, graphs run
// op by op on a thread pool, with quantized matrix-vector kernels and oneDNN for large float GEMMs.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include <nlohmann/json.hpp>

#include "isa.hpp"
#include "specula/compute.hpp"
#include "thread_pool.hpp"

namespace specula::cpu {

struct AlignedFree {
  size_t mapped = 0;  // bytes of an anonymous mapping (munmap), 0 for the heap (free)
  void operator()(std::byte* p) const;
};
using AlignedBytes = std::unique_ptr<std::byte[], AlignedFree>;
// Zeroed, 64-byte aligned. From 2 MB on, an anonymous mapping: the kernel supplies zero pages as they are
// first touched, so a context's KV cache costs time and memory only for the slots it uses (a 128K-token
// cache zero-filled up front took seconds and its whole size in RSS).
AlignedBytes aligned_alloc_bytes(size_t bytes);

class CpuTensor final : public BackendTensor {
 public:
  CpuTensor(std::string name, DType type, Shape shape) : name_(std::move(name)), type_(type), shape_(std::move(shape)) {}
  DType type() const override { return type_; }
  const Shape& shape() const override { return shape_; }
  const std::string& name() const override { return name_; }

  const std::byte* data = nullptr;   // first byte (mapped weight or owned storage)
  std::byte* mutable_data = nullptr;  // null for read-only (mapped) weights
  size_t bytes = 0;
  QuantParams quant;                  // MLX_AFFINE only
  AlignedBytes owned;

  // The tensor decoded to F32, built on first use by elementwise ops (norm weights, scales).
  const float* as_f32();
  // The tensor as `cols`-column rows in the panels of k.pack, built on first use by a matrix product;
  // null when the kernel has no packed form or the tensor was first packed with other columns or groups.
  // group_rows > 0 packs each group of that many rows (an expert's matrix of a MatMulId) into panels of its
  // own, the last one padded with zero rows: group g's panels start at g * ceil(group_rows / kPanelRows)
  // panels (the whole-matrix layout where group_rows is a multiple of kPanelRows, and then the same copy as
  // group_rows 0). 0: one group.
  const std::byte* packed(const QuantKernel& k, int64_t cols, ThreadPool& pool, int64_t group_rows = 0);
  // MLX affine 4 bits (f16 / bf16 scales) as k.pack's panels, the same way; null for other MLX weights.
  const std::byte* packed(const AffineKernel& k, int64_t cols, ThreadPool& pool, int64_t group_rows = 0);

 private:
  std::string name_;
  DType type_;
  Shape shape_;
  std::once_flag f32_once_;
  std::vector<float> f32_;
  // pack(row, n, out): rows [row, row + n) (row_bytes each in `data`) as panels at out.
  const std::byte* packed_with(size_t panel_bytes, size_t row_bytes, int64_t cols, ThreadPool& pool, int64_t group_rows,
                               const std::function<void(int64_t, int64_t, std::byte*)>& pack);
  std::once_flag packed_once_;
  AlignedBytes packed_;
  int64_t packed_cols_ = 0;
  int64_t packed_group_rows_ = 0;
};

int64_t elements(const Shape& s);

std::unique_ptr<ComputeBackend> make_cpu_backend(const nlohmann::json& options);

}  // namespace specula::cpu

#include "cpu_backend.hpp"

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <thread>
#include <unordered_map>

#include "convert.hpp"
#include "kernels.hpp"
#include "specula/op_profile.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"

namespace specula::cpu {

void AlignedFree::operator()(std::byte* p) const {
  if (mapped)
    munmap(p, mapped);
  else
    std::free(p);
}

AlignedBytes aligned_alloc_bytes(size_t bytes) {
  constexpr size_t kMapFrom = size_t{2} << 20;
  if (bytes >= kMapFrom) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t len = (bytes + page - 1) / page * page;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail("CPU backend: out of memory mapping {} bytes", len);
    return AlignedBytes(static_cast<std::byte*>(p), AlignedFree{len});
  }
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
  if (!p) fail("CPU backend: out of memory allocating {} bytes", rounded);
  std::memset(p, 0, rounded);
  return AlignedBytes(p);
}

int64_t elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

const float* CpuTensor::as_f32() {
  std::call_once(f32_once_, [&] {
    const int64_t cols = shape_.back(), rows = elements(shape_) / cols;
    const size_t row_bytes = *cpu::row_bytes(type_, cols, &quant);
    f32_.resize(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      decode_row(type_, data + static_cast<size_t>(r) * row_bytes, cols, f32_.data() + r * cols, &quant, r);
  });
  return f32_.data();
}

namespace {

// Whether [p, p + n) lies in one read-only mapping of a file (/proc/self/maps).
bool in_read_only_file_mapping(const std::byte* p, size_t n) {
  std::FILE* maps = std::fopen("/proc/self/maps", "r");
  if (!maps) return false;
  const auto a = reinterpret_cast<uintptr_t>(p), b = a + n;
  bool found = false;
  char line[512];
  while (std::fgets(line, sizeof line, maps)) {
    unsigned long lo = 0, hi = 0, inode = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s %*s %*s %lu", &lo, &hi, perms, &inode) != 4) continue;
    if (a >= lo && a < hi) {
      found = b <= hi && inode != 0 && perms[1] == '-';
      break;
    }
  }
  std::fclose(maps);
  return found;
}

}  // namespace

const std::byte* CpuTensor::packed(const QuantKernel& k, int64_t cols, ThreadPool& pool, int64_t group_rows) {
  if (!k.pack) return nullptr;
  const size_t row_bytes = *cpu::row_bytes(type_, cols, &quant);
  return packed_with(k.panel_bytes(cols), row_bytes, cols, pool, group_rows, [&](int64_t row, int64_t n, std::byte* out) {
    k.pack(data + static_cast<size_t>(row) * row_bytes, row_bytes, n, cols, out);
  });
}

const std::byte* CpuTensor::packed(const AffineKernel& k, int64_t cols, ThreadPool& pool, int64_t group_rows) {
  if (!k.pack || quant.bits != 4 || quant.scale_type == DType::F32) return nullptr;
  const size_t row_bytes = static_cast<size_t>(cols) / 2;
  return packed_with(k.panel_bytes(cols, static_cast<int>(quant.group_size)), row_bytes, cols, pool, group_rows,
                     [&](int64_t row, int64_t n, std::byte* out) {
                       k.pack(affine_rows(quant, data + static_cast<size_t>(row) * row_bytes, row_bytes, cols, row), n,
                              cols, out);
                     });
}

const std::byte* CpuTensor::packed_with(size_t panel_bytes, size_t row_bytes, int64_t cols, ThreadPool& pool,
                                        int64_t group_rows,
                                        const std::function<void(int64_t, int64_t, std::byte*)>& pack) {
  const int64_t rows = elements(shape_) / cols;
  // Groups of whole panels are the whole matrix's layout: a tensor both MatMul and MatMulId multiply (a
  // centroid head's table) shares one packed copy.
  if (group_rows <= 0 || group_rows % kPanelRows == 0) group_rows = rows;
  if (rows % group_rows != 0) return nullptr;
  std::call_once(packed_once_, [&] {
    const int64_t group_panels = panel_count(group_rows);
    const int64_t panels = rows / group_rows * group_panels;
    // Matrices of a megabyte and more in 2 MB pages where the kernel allows: decode streams the panels,
    // and 4 KB pages stop the hardware prefetcher at every page. (Smaller ones would waste most of a page.)
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t need = panel_bytes * static_cast<size_t>(panels);
    const bool huge = need >= kHuge / 2;
    const size_t align = huge ? kHuge : 64, size = (need + align - 1) / align * align;
    auto* p = static_cast<std::byte*>(std::aligned_alloc(align, size));
    if (!p) fail("CPU backend: out of memory packing weight '{}' ({} bytes)", name_, size);
    if (huge) madvise(p, size, MADV_HUGEPAGE);
    packed_ = AlignedBytes(p);
    // The mapped rows are read again only by GetRows (a tied embedding). In a read-only file mapping (the
    // checkpoint's) their pages leave the process as they are packed (MADV_DONTNEED: a later read faults
    // the page back in from the page cache), so the packed copy replaces them in the resident set instead
    // of doubling it, even while the matrix is packed (a 26B-A4B expert tensor is 540 MB as Q8_0, its tied
    // embedding 784 MB). Memory that is not such a mapping would lose its contents that way: there the
    // pages are only marked cold.
    const int advice = in_read_only_file_mapping(data, bytes) ? MADV_DONTNEED : MADV_COLD;
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    auto drop = [&](const std::byte* from, const std::byte* to) {  // the whole pages in [from, to)
      const uintptr_t a = (reinterpret_cast<uintptr_t>(from) + page - 1) / page * page;
      const uintptr_t b = reinterpret_cast<uintptr_t>(to) / page * page;
      if (b > a) madvise(reinterpret_cast<void*>(a), b - a, advice);
    };
    // Panel q's rows start here (a group's last panel holds its last rows only).
    auto first_row = [&](int64_t q) { return q / group_panels * group_rows + q % group_panels * kPanelRows; };
    constexpr int64_t kStep = 64;  // panels packed before their rows' pages are dropped: about 3 MB of Q8_0 rows of 2816
    pool.parallel_for(panels, 4, [&](int64_t p0, int64_t p1) {
      for (int64_t s0 = p0; s0 < p1; s0 += kStep) {
        const int64_t s1 = std::min(p1, s0 + kStep);
        std::memset(p + static_cast<size_t>(s0) * panel_bytes, 0, static_cast<size_t>(s1 - s0) * panel_bytes);
        for (int64_t q = s0; q < s1;) {  // group by group
          const int64_t g = q / group_panels, first = q - g * group_panels;
          const int64_t end = std::min(s1, (g + 1) * group_panels) - g * group_panels;
          pack(first_row(q), std::min(group_rows, end * kPanelRows) - first * kPanelRows,
               p + static_cast<size_t>(q) * panel_bytes);
          q += end - first;
        }
        // Rows [first_row(s0), first_row(s1)) are this step's alone.
        drop(data + static_cast<size_t>(first_row(s0)) * row_bytes, data + static_cast<size_t>(first_row(s1)) * row_bytes);
      }
    });
    packed_group_rows_ = group_rows;
    packed_cols_ = cols;
    drop(data, data + bytes);  // the pages the steps shared
  });
  return packed_cols_ == cols && packed_group_rows_ == group_rows ? packed_.get() : nullptr;
}

namespace {

size_t plain_size(DType t) {
  const DTypeTraits* tr = dtype_traits(t);
  return tr && !tr->quantized ? tr->block_bytes : 0;
}

// Intermediate buffers, reused across nodes and runs (best fit by capacity).
class BufferPool {
 public:
  int acquire(size_t bytes) {
    int best = -1;
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const Buffer& b = buffers_[i];
      if (!b.busy && b.capacity >= bytes &&
          (best < 0 || b.capacity < buffers_[static_cast<size_t>(best)].capacity))
        best = static_cast<int>(i);
    }
    if (best < 0) {
      const size_t cap = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
      buffers_.push_back({aligned_alloc_bytes(cap), cap, false});
      best = static_cast<int>(buffers_.size() - 1);
    }
    buffers_[static_cast<size_t>(best)].busy = true;
    return best;
  }
  void release(int i) { buffers_[static_cast<size_t>(i)].busy = false; }
  void release_all() {
    for (auto& b : buffers_) b.busy = false;
  }
  std::byte* data(int i) { return buffers_[static_cast<size_t>(i)].data.get(); }

 private:
  struct Buffer {
    AlignedBytes data;
    size_t capacity;
    bool busy;
  };
  std::vector<Buffer> buffers_;
};

// MLX affine weights: valid bits/group size, and scales/biases covering every group of every row.
void check_mlx(const TensorInfo& info, int64_t rows, int64_t cols) {
  const QuantParams& q = info.quant;
  if (!mlx_params_valid(q.bits, q.group_size))
    fail("CPU backend: MLX weight '{}': bits {} / group size {} is not a supported combination", info.name,
         q.bits, q.group_size);
  if (cols % q.group_size != 0)
    fail("CPU backend: MLX weight '{}': {} columns are not whole groups of {}", info.name, cols, q.group_size);
  const DTypeTraits* st = dtype_traits(q.scale_type);
  if (!st || (q.scale_type != DType::F32 && q.scale_type != DType::F16 && q.scale_type != DType::BF16))
    fail("CPU backend: MLX weight '{}': scales must be F32, F16 or BF16, not {}", info.name, dtype_name(q.scale_type));
  const size_t want = static_cast<size_t>(rows * (cols / q.group_size)) * st->block_bytes;
  if (q.scales.size() != want || q.biases.size() != want)
    fail("CPU backend: MLX weight '{}': scales ({} bytes) and biases ({} bytes) must each have {} bytes", info.name,
         q.scales.size(), q.biases.size(), want);
}

class CpuPlan;

class CpuBackend final : public ComputeBackend {
 public:
  CpuBackend(int threads, const KernelSet& kernels, bool profile, bool pack_weights)
      : pool_(threads),
        kernels_(kernels),
        profile_(profile ? std::make_unique<OpProfile>() : nullptr),
        pack_weights_(pack_weights) {}
  ~CpuBackend() override {
    if (profile_) std::fputs(profile_->report().c_str(), stderr);
  }

  std::string name() const override { return "cpu"; }

  DeviceInfo device() const override {
    DeviceInfo d;
    d.name = fmt::format("CPU ({} threads, {} kernels)", pool_.size(), kernels_.name);
    d.memory_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    d.unified_memory = true;
    return d;
  }

  Support supports(Op op, DType type) const override {
    const DTypeTraits* tr = dtype_traits(type);
    if (!tr) return Support::no(fmt::format("unknown dtype {}", static_cast<uint32_t>(type)));
    const bool plain_float = type == DType::F32 || type == DType::F16 || type == DType::BF16;
    switch (op) {
      case Op::Input:
        if (tr->quantized) return Support::no(fmt::format("inputs hold plain values, not {}", tr->name));
        return Support::yes();
      case Op::Constant:
        return Support::yes();
      case Op::Argmax:
      case Op::TopK:
      case Op::Slice:
      case Op::Concat:
      case Op::Reshape:
        if (type == DType::F32 || type == DType::I32 || (op == Op::Reshape && can_decode(type)))
          return Support::yes();
        if (op == Op::Argmax || op == Op::TopK) break;
        return Support::no(fmt::format("{} takes F32 or I32 values on the CPU backend, not {}",
                                       op_name(op), tr->name));
      case Op::GetRows:
        if (type == DType::I32) return Support::yes();  // ids of ids
        break;
      case Op::Attention:
        if (plain_float) return Support::yes();
        return Support::no(fmt::format("the CPU backend keeps K/V caches as F32, F16 or BF16, not {}", tr->name));
      case Op::WriteRows:
        if (plain_float || type == DType::I32) return Support::yes();
        return Support::no(fmt::format("the CPU backend writes rows into F32, F16, BF16 or I32 tensors, not {}", tr->name));
      case Op::Copy:
        if (plain_float) return Support::yes();
        return Support::no(fmt::format("Copy converts to F32, F16 or BF16 only, not {}", tr->name));
      default:
        break;
    }
    if (can_decode(type)) return Support::yes();
    return Support::no(fmt::format("the CPU backend has no decoder for {} values ({} on {})", tr->name,
                                   op_name(op), tr->name));
  }

  BackendTensorPtr load_weight(const TensorInfo& info) override {
    const DTypeTraits* tr = dtype_traits(info.type);
    if (!tr) fail("CPU backend: weight '{}' has unknown dtype {}", info.name, static_cast<uint32_t>(info.type));
    if (info.shape.empty())
      fail("CPU backend: weight '{}' has no shape", info.name);
    for (int64_t d : info.shape)
      if (d <= 0) fail("CPU backend: weight '{}' has shape {}; every axis must be positive", info.name, shape_str(info.shape));
    const int64_t cols = info.shape.back(), rows = elements(info.shape) / cols;
    if (info.type == DType::MLX_AFFINE) check_mlx(info, rows, cols);
    const auto rb = row_bytes(info.type, cols, &info.quant);
    if (!rb)
      fail("CPU backend: weight '{}' {} {}: rows of {} values are not whole {}-value blocks", info.name,
           tr->name, shape_str(info.shape), cols, tr->block_elems);
    if (info.data.size() != *rb * static_cast<uint64_t>(rows))
      fail("CPU backend: weight '{}' {} {} needs {} bytes but has {}", info.name, tr->name,
           shape_str(info.shape), *rb * static_cast<uint64_t>(rows), info.data.size());
    auto t = std::make_shared<CpuTensor>(info.name, info.type, info.shape);
    t->data = info.data.data();  // zero-copy: the caller keeps the ModelFile (and its mapping) alive
    t->bytes = info.data.size();
    t->quant = info.quant;
    return t;
  }

  BackendTensorPtr allocate(const std::string& name, DType type, const Shape& shape) override {
    const size_t es = plain_size(type);
    if (es == 0)
      fail("CPU backend: cannot allocate '{}' as {}; persistent tensors hold plain values", name, dtype_name(type));
    if (shape.empty()) fail("CPU backend: tensor '{}' needs a shape", name);
    for (int64_t d : shape)
      if (d <= 0) fail("CPU backend: tensor '{}' has shape {}; every axis must be positive", name, shape_str(shape));
    auto t = std::make_shared<CpuTensor>(name, type, shape);
    t->bytes = static_cast<size_t>(elements(shape)) * es;
    t->owned = aligned_alloc_bytes(t->bytes);
    t->data = t->owned.get();
    t->mutable_data = t->owned.get();
    return t;
  }

  std::unique_ptr<CompiledGraph> compile(const Graph& graph) override;
  void read(const BackendTensor& tensor, std::span<std::byte> dst) override;
  void write(BackendTensor& tensor, std::span<const std::byte> src) override;
  const OpProfile* profile() const override { return profile_.get(); }

 private:
  struct Slot {
    const std::byte* data = nullptr;
    std::byte* mut = nullptr;
    int buffer = -1;
    CpuTensor* tensor = nullptr;  // the persistent tensor this value is (Constant, WriteRows, reshapes of them)
  };

  friend class CpuPlan;
  void run(CpuPlan& plan, const RunInputs& inputs);
  const float* floats(const Graph& g, int32_t id);
  Matrix matrix(const Graph& g, int32_t id, int64_t rows, int64_t cols);
  std::byte* output(const Node& n, int32_t id);
  // The panels of a read-only weight multiplied whole (packed once: the first product pays for it), each
  // group of group_rows rows (a MatMulId's expert) in panels of its own; null where it stays unpacked.
  const std::byte* packed(const Slot& ws, DType type, int64_t cols, int64_t group_rows);
  void execute(const Graph& g, int32_t id);

  ThreadPool pool_;
  const KernelSet& kernels_;
  RopeTables rope_tables_;
  std::unique_ptr<OpProfile> profile_;
  bool pack_weights_;
  BufferPool buffers_;
  std::vector<Slot> slots_;
  std::vector<std::vector<float>> scratch_;  // conversions for the node being executed
  CpuPlan* running_ = nullptr;               // the plan run() is executing: its outputs go to its buffers
};

// A graph with its buffer liveness worked out once, and the outputs of its last run: the values they are
// written in place into buffers the plan owns, so that running other graphs (intermediates share the
// backend's buffers) leaves them readable; read() converts to F32/I32.
class CpuPlan final : public CompiledGraph {
 public:
  CpuPlan(CpuBackend& backend, const Graph& graph);
  void run(const RunInputs& inputs) override { backend_.run(*this, inputs); }
  void read(Value output, std::span<std::byte> dst) const override;

 private:
  friend class CpuBackend;
  CpuBackend& backend_;
  const Graph& graph_;
  size_t nodes_;                                // the graph's size when compiled: it must not change
  std::vector<int32_t> root_, last_use_;        // per node: the value it reshapes; the last node reading it
  // The buffers of the values the outputs are (reshapes of): written by the run in place, kept after it.
  struct Owned {
    AlignedBytes data;
    size_t capacity = 0;
  };
  std::unordered_map<int32_t, Owned> owned_;
  // Where each output's data lies after a run: an owned buffer, or a persistent tensor's current contents.
  struct Out {
    const std::byte* data = nullptr;
    const CpuTensor* tensor = nullptr;
  };
  std::unordered_map<int32_t, Out> outputs_;
  bool ran_ = false;
};

CpuPlan::CpuPlan(CpuBackend& backend, const Graph& graph)
    : backend_(backend), graph_(graph), nodes_(graph.nodes().size()), root_(nodes_), last_use_(nodes_) {
  // Liveness: a buffer is released after the last node that reads it (through reshapes).
  const auto& nodes = graph.nodes();
  const int32_t count = static_cast<int32_t>(nodes_);
  for (int32_t i = 0; i < count; ++i) {
    const Node& n = nodes[static_cast<size_t>(i)];
    root_[static_cast<size_t>(i)] = n.op == Op::Reshape ? root_[static_cast<size_t>(n.src[0])] : i;
    last_use_[static_cast<size_t>(i)] = i;
    for (int32_t s : n.src)
      if (s >= 0) last_use_[static_cast<size_t>(root_[static_cast<size_t>(s)])] = i;
  }
  for (int32_t o : graph.outputs()) last_use_[static_cast<size_t>(root_[static_cast<size_t>(o)])] = count;
}

void CpuPlan::read(Value output, std::span<std::byte> dst) const {
  const Node& n = graph_.node(output);
  if (!ran_) fail("CPU backend: read: '{}' before the graph has run", n.name);
  const auto it = outputs_.find(output.id);
  if (it == outputs_.end())
    fail("CPU backend: read: '{}' was not marked as an output of the graph (Graph::mark_output)", n.name);
  const size_t want = static_cast<size_t>(elements(n.shape)) * 4;
  if (dst.size() != want)
    fail("CPU backend: read: '{}' {} {} needs {} bytes ({} as {}) but the destination has {}", n.name,
         dtype_name(n.type), shape_str(n.shape), want, elements(n.shape), n.type == DType::I32 ? "I32" : "F32", dst.size());
  const Out& o = it->second;
  if (n.type == DType::F32 || n.type == DType::I32) {
    std::memcpy(dst.data(), o.data, want);
    return;
  }
  const int64_t cols = n.shape.back(), rows = elements(n.shape) / cols;
  const QuantParams* quant = o.tensor ? &o.tensor->quant : nullptr;
  const size_t rb = *row_bytes(n.type, cols, quant);
  for (int64_t r = 0; r < rows; ++r)
    decode_row(n.type, o.data + static_cast<size_t>(r) * rb, cols, reinterpret_cast<float*>(dst.data()) + r * cols,
               quant, r);
}

std::unique_ptr<CompiledGraph> CpuBackend::compile(const Graph& graph) {
  return std::make_unique<CpuPlan>(*this, graph);
}

CpuTensor& cpu_tensor(const BackendTensor& t) {
  auto* c = dynamic_cast<const CpuTensor*>(&t);
  if (!c) fail("CPU backend: tensor '{}' belongs to another backend", t.name());
  return const_cast<CpuTensor&>(*c);
}

const float* CpuBackend::floats(const Graph& g, int32_t id) {
  const Node& n = g.nodes()[static_cast<size_t>(id)];
  const Slot& s = slots_[static_cast<size_t>(id)];
  if (n.type == DType::F32) return reinterpret_cast<const float*>(s.data);
  // Read-only weights keep their decoded form; anything mutable is decoded afresh.
  if (s.tensor && !s.tensor->mutable_data) return s.tensor->as_f32();
  const int64_t cols = n.shape.back(), rows = elements(n.shape) / cols;
  const size_t rb = *row_bytes(n.type, cols, s.tensor ? &s.tensor->quant : nullptr);
  auto& buf = scratch_.emplace_back(static_cast<size_t>(rows * cols));
  pool_.parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      decode_row(n.type, s.data + static_cast<size_t>(r) * rb, cols, buf.data() + r * cols,
                 s.tensor ? &s.tensor->quant : nullptr, r);
  });
  return buf.data();
}

Matrix CpuBackend::matrix(const Graph& g, int32_t id, int64_t rows, int64_t cols) {
  const Node& n = g.nodes()[static_cast<size_t>(id)];
  const Slot& s = slots_[static_cast<size_t>(id)];
  Matrix m;
  m.type = n.type;
  m.data = s.data;
  m.rows = rows;
  m.cols = cols;
  m.quant = s.tensor ? &s.tensor->quant : nullptr;
  m.row_bytes = *row_bytes(n.type, cols, m.quant);
  return m;
}

const std::byte* CpuBackend::packed(const Slot& ws, DType type, int64_t cols, int64_t group_rows) {
  if (!pack_weights_ || !ws.tensor || ws.tensor->mutable_data || ws.data != ws.tensor->data) return nullptr;
  if (const QuantKernel* k = quant_kernel(kernels_, type)) return ws.tensor->packed(*k, cols, pool_, group_rows);
  if (type == DType::MLX_AFFINE)
    if (const AffineKernel* k = mlx_kernel(kernels_, ws.tensor->quant))
      return ws.tensor->packed(*k, cols, pool_, group_rows);
  return nullptr;
}

std::byte* CpuBackend::output(const Node& n, int32_t id) {
  Slot& s = slots_[static_cast<size_t>(id)];
  const size_t bytes = static_cast<size_t>(elements(n.shape)) * plain_size(n.type);
  if (running_ && running_->last_use_[static_cast<size_t>(id)] == static_cast<int32_t>(running_->nodes_)) {
    // An output: into the plan's own buffer, which outlives this run.
    CpuPlan::Owned& o = running_->owned_[id];
    if (o.capacity < bytes) {
      o.data = aligned_alloc_bytes(bytes);
      o.capacity = bytes;
    }
    s.mut = o.data.get();
  } else {
    s.buffer = buffers_.acquire(bytes);
    s.mut = buffers_.data(s.buffer);
  }
  s.data = s.mut;
  return s.mut;
}

void CpuBackend::run(CpuPlan& plan, const RunInputs& inputs) {
  const Graph& graph = plan.graph_;
  const auto& nodes = graph.nodes();
  if (nodes.size() != plan.nodes_)
    fail("CPU backend: a graph of {} nodes was compiled, it has {} now; compile it again after changing it",
         plan.nodes_, nodes.size());
  const int32_t count = static_cast<int32_t>(nodes.size());
  plan.ran_ = false;
  running_ = &plan;
  const std::unique_ptr<CpuBackend, void (*)(CpuBackend*)> done(this, [](CpuBackend* b) { b->running_ = nullptr; });
  buffers_.release_all();
  slots_.assign(nodes.size(), Slot{});

  // Host inputs: each Input node given exactly once, with the right size.
  for (const auto& [value, bytes] : inputs.inputs) {
    const Node& n = graph.node(value);
    if (n.op != Op::Input) fail("CPU backend: run: node '{}' is a {}, not an Input", n.name, op_name(n.op));
    const size_t want = static_cast<size_t>(elements(n.shape)) * plain_size(n.type);
    if (bytes.size() != want)
      fail("CPU backend: input '{}' {} {} needs {} bytes but was given {}", n.name, dtype_name(n.type),
           shape_str(n.shape), want, bytes.size());
    Slot& s = slots_[static_cast<size_t>(value.id)];
    if (s.data) fail("CPU backend: input '{}' was given twice", n.name);
    s.data = bytes.data();
    if (!s.data) s.data = reinterpret_cast<const std::byte*>("");  // zero-size spans still count as given
  }

  for (int32_t i = 0; i < count; ++i) {
    const Node& n = nodes[static_cast<size_t>(i)];
    if (n.op == Op::Input && !slots_[static_cast<size_t>(i)].data)
      fail("CPU backend: input '{}' {} {} was not given to run()", n.name, dtype_name(n.type), shape_str(n.shape));
  }
  const std::vector<int32_t>& root = plan.root_;
  const std::vector<int32_t>& last_use = plan.last_use_;

  if (profile_) profile_->begin_run(graph);
  for (int32_t i = 0; i < count; ++i) {
    if (profile_) {
      const auto t0 = std::chrono::steady_clock::now();
      execute(graph, i);
      const Node& n = nodes[static_cast<size_t>(i)];
      const bool weighted = (n.op == Op::MatMul || n.op == Op::MatMulId || n.op == Op::GetRows) &&
                            nodes[static_cast<size_t>(n.src[0])].op == Op::Constant;
      const CpuTensor* w = weighted ? slots_[static_cast<size_t>(n.src[0])].tensor : nullptr;
      // Weight bytes read: the whole matrix, the gathered rows of a table, or the selected experts.
      std::vector<int32_t> experts;
      if (n.op == Op::MatMulId) {
        const Node& ids = nodes[static_cast<size_t>(n.src[2])];
        const auto* id = reinterpret_cast<const int32_t*>(slots_[static_cast<size_t>(n.src[2])].data);
        experts.assign(id, id + elements(ids.shape));
        std::sort(experts.begin(), experts.end());
        experts.erase(std::unique(experts.begin(), experts.end()), experts.end());
      }
      const size_t bytes = !w ? 0
                           : n.op == Op::GetRows ? w->bytes / static_cast<size_t>(w->shape()[0]) *
                                                       static_cast<size_t>(elements(nodes[static_cast<size_t>(n.src[1])].shape))
                           : n.op == Op::MatMulId ? w->bytes / static_cast<size_t>(w->shape()[0]) * experts.size()
                                                  : w->bytes;
      profile_->record(graph, i, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                       w ? w->name() : std::string(), bytes, experts);
    } else {
      execute(graph, i);
    }
    scratch_.clear();
    const Node& n = nodes[static_cast<size_t>(i)];
    auto release = [&](int32_t v) {
      const int32_t r = root[static_cast<size_t>(v)];
      Slot& s = slots_[static_cast<size_t>(r)];
      if (last_use[static_cast<size_t>(r)] == i && s.buffer >= 0) {
        buffers_.release(s.buffer);
        s.buffer = -1;
      }
    };
    for (int32_t s : n.src)
      if (s >= 0) release(s);
    release(i);
  }
  // Where the outputs lie; an Input's bytes are the caller's, so they are copied.
  for (int32_t o : graph.outputs()) {
    const int32_t r = root[static_cast<size_t>(o)];
    const Slot& s = slots_[static_cast<size_t>(r)];
    if (nodes[static_cast<size_t>(r)].op == Op::Input) {
      CpuPlan::Owned& own = plan.owned_[r];
      const size_t bytes = static_cast<size_t>(elements(nodes[static_cast<size_t>(r)].shape)) *
                           plain_size(nodes[static_cast<size_t>(r)].type);
      if (own.capacity < bytes) {
        own.data = aligned_alloc_bytes(bytes);
        own.capacity = bytes;
      }
      std::memcpy(own.data.get(), s.data, bytes);
      plan.outputs_[o] = {own.data.get(), nullptr};
    } else {
      plan.outputs_[o] = {s.data, s.tensor};
    }
  }
  plan.ran_ = true;
}

void CpuBackend::execute(const Graph& g, int32_t id) {
  const Node& n = g.nodes()[static_cast<size_t>(id)];
  Slot& slot = slots_[static_cast<size_t>(id)];
  auto src = [&](int k) -> const Node& { return g.nodes()[static_cast<size_t>(n.src[static_cast<size_t>(k)])]; };
  auto ints = [&](int k) { return reinterpret_cast<const int32_t*>(slots_[static_cast<size_t>(n.src[static_cast<size_t>(k)])].data); };
  auto fsrc = [&](int k) { return floats(g, n.src[static_cast<size_t>(k)]); };
  switch (n.op) {
    case Op::Input:
      return;
    case Op::Constant: {
      CpuTensor& t = cpu_tensor(*n.tensor);
      slot.data = t.data;
      slot.mut = t.mutable_data;
      slot.tensor = &t;
      return;
    }
    case Op::Reshape: {
      const Slot& s = slots_[static_cast<size_t>(n.src[0])];
      slot.data = s.data;
      slot.mut = s.mut;
      slot.tensor = s.tensor;
      return;
    }
    case Op::GetRows: {
      const Node& t = src(0);
      if (t.type == DType::I32) {  // ids of ids: rows copied as they are
        const int64_t R = t.shape[0], C = t.shape[1], N = elements(src(1).shape);
        const auto* table = reinterpret_cast<const int32_t*>(slots_[static_cast<size_t>(n.src[0])].data);
        const int32_t* ids = ints(1);
        auto* out = reinterpret_cast<int32_t*>(output(n, id));
        for (int64_t r = 0; r < N; ++r) {
          if (ids[r] < 0 || ids[r] >= R)
            fail("CPU backend: GetRows '{}': row id {} at index {} is outside the table's rows [0, {})", n.name, ids[r], r, R);
          std::memcpy(out + r * C, table + static_cast<int64_t>(ids[r]) * C, static_cast<size_t>(C) * 4);
        }
        return;
      }
      get_rows(pool_, matrix(g, n.src[0], t.shape[0], t.shape[1]), ints(1), elements(src(1).shape),
               reinterpret_cast<float*>(output(n, id)), n.name);
      return;
    }
    case Op::MatMul: {
      const Node& w = src(0);
      const float* x = fsrc(1);
      const int64_t I = w.shape[1];
      Matrix m = matrix(g, n.src[0], w.shape[0], I);
      // A read-only weight multiplied whole is packed once (the first product pays for it).
      const Slot& ws = slots_[static_cast<size_t>(n.src[0])];
      m.packed = packed(ws, m.type, I, 0);
      matmul(pool_, kernels_, m, x, elements(src(1).shape) / I, reinterpret_cast<float*>(output(n, id)));
      return;
    }
    case Op::MatMulId: {
      const Node& e = src(0);
      const Node& x = src(1);
      const int64_t E = e.shape[0], O = e.shape[1], I = e.shape[2];
      Matrix m = matrix(g, n.src[0], E * O, I);
      // Packed as MatMul's weights are, each expert in panels of its own (CpuTensor::packed).
      const Slot& ws = slots_[static_cast<size_t>(n.src[0])];
      m.packed = packed(ws, m.type, I, O);
      matmul_id(pool_, kernels_, m, E, fsrc(1), x.shape[1] == 1 && n.shape[1] != 1, ints(2), n.shape[0], n.shape[1],
                reinterpret_cast<float*>(output(n, id)), n.name);
      return;
    }
    case Op::Add:
    case Op::Mul:
    case Op::Div: {
      const float* a = fsrc(0);
      const float* b = fsrc(1);
      binary(pool_, n.op, a, src(0).shape, b, src(1).shape, reinterpret_cast<float*>(output(n, id)));
      return;
    }
    case Op::Scale:
      scale(pool_, fsrc(0), elements(n.shape), n.f[0], reinterpret_cast<float*>(output(n, id)));
      return;
    case Op::RmsNorm: {
      const float* x = fsrc(0);
      const float* w = n.src[1] >= 0 ? fsrc(1) : nullptr;
      const int64_t cols = n.shape.back();
      rms_norm(pool_, x, w, elements(n.shape) / cols, cols, n.f[0], reinterpret_cast<float*>(output(n, id)));
      return;
    }
    case Op::GeluTanh:
      gelu_tanh(pool_, kernels_, fsrc(0), elements(n.shape), reinterpret_cast<float*>(output(n, id)));
      return;
    case Op::Softcap:
      softcap(pool_, kernels_, fsrc(0), elements(n.shape), n.f[0], reinterpret_cast<float*>(output(n, id)));
      return;
    case Op::Rope:
      rope(pool_, rope_tables_, fsrc(0), ints(1), n.shape[0], n.shape[1], n.shape[2], n.i[0], n.f[0], n.f[1], n.f[2],
           reinterpret_cast<float*>(output(n, id)));
      return;
    case Op::Attention: {
      const Node& q = src(0);
      const Node& k = src(1);
      const Node& v = src(2);
      AttentionArgs a{};
      a.q = fsrc(0);
      // K and V are read in their stored type (a cache is usually F16/BF16).
      a.k = slots_[static_cast<size_t>(n.src[1])].data;
      a.v = slots_[static_cast<size_t>(n.src[2])].data;
      a.k_type = k.type;
      a.v_type = v.type;
      a.key_pos = ints(3);
      a.query_pos = ints(4);
      a.T = q.shape[0];
      a.Hq = q.shape[1];
      a.D = q.shape[2];
      a.S = k.shape[0];
      if (n.src[5] >= 0) a.S = std::clamp<int64_t>(ints(5)[0], 0, a.S);  // slots in use: the rest are empty
      a.Hkv = k.shape[1];
      a.Dv = v.shape[2];
      a.scale = n.f[0];
      a.window = n.i[0];
      a.causal = n.i[1] != 0;
      attention(pool_, kernels_, a, reinterpret_cast<float*>(output(n, id)));
      return;
    }
    case Op::Softmax: {
      const int64_t cols = n.shape.back();
      softmax(pool_, fsrc(0), elements(n.shape) / cols, cols, reinterpret_cast<float*>(output(n, id)));
      return;
    }
    case Op::TopK:
    case Op::Argmax: {
      const int64_t cols = src(0).shape.back();
      const int64_t k = n.op == Op::TopK ? n.i[0] : 1;
      top_k(fsrc(0), elements(n.shape) / k, cols, k, reinterpret_cast<int32_t*>(output(n, id)));
      return;
    }
    case Op::Slice: {
      const Node& x = src(0);
      const auto* in = reinterpret_cast<const uint32_t*>(slots_[static_cast<size_t>(n.src[0])].data);
      auto* out = reinterpret_cast<uint32_t*>(output(n, id));
      const int64_t cols = x.shape.back(), len = n.i[1], rows = elements(x.shape) / cols;
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(out + r * len, in + r * cols + n.i[0], static_cast<size_t>(len) * 4);
      return;
    }
    case Op::Concat: {
      const auto* a = reinterpret_cast<const uint32_t*>(slots_[static_cast<size_t>(n.src[0])].data);
      const auto* b = reinterpret_cast<const uint32_t*>(slots_[static_cast<size_t>(n.src[1])].data);
      auto* out = reinterpret_cast<uint32_t*>(output(n, id));
      const int64_t ca = src(0).shape.back(), cb = src(1).shape.back(), rows = elements(n.shape) / (ca + cb);
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(out + r * (ca + cb), a + r * ca, static_cast<size_t>(ca) * 4);
        std::memcpy(out + r * (ca + cb) + ca, b + r * cb, static_cast<size_t>(cb) * 4);
      }
      return;
    }
    case Op::WriteRows: {
      CpuTensor& t = cpu_tensor(*n.tensor);
      if (!t.mutable_data)
        fail("CPU backend: WriteRows '{}': '{}' is a read-only weight; write into a tensor from allocate()", n.name, t.name());
      const int64_t R = t.shape()[0], cols = elements(t.shape()) / R;
      const int64_t N = src(2).shape[0];
      const int32_t* ids = ints(2);
      for (int64_t r = 0; r < N; ++r)
        if (ids[r] < 0 || ids[r] >= R)
          fail("CPU backend: WriteRows '{}': row id {} at index {} is outside '{}' rows [0, {})", n.name, ids[r], r, t.name(), R);
      const size_t row_bytes = static_cast<size_t>(cols) * plain_size(t.type());
      if (t.type() == DType::I32) {
        const auto* in = slots_[static_cast<size_t>(n.src[1])].data;
        for (int64_t r = 0; r < N; ++r)
          std::memcpy(t.mutable_data + static_cast<size_t>(ids[r]) * row_bytes, in + static_cast<size_t>(r * cols) * 4, static_cast<size_t>(cols) * 4);
      } else {
        const float* in = fsrc(1);
        for (int64_t r = 0; r < N; ++r)
          encode_row(t.type(), in + r * cols, cols, t.mutable_data + static_cast<size_t>(ids[r]) * row_bytes);
      }
      slot.data = t.data;
      slot.mut = t.mutable_data;
      slot.tensor = &t;
      return;
    }
    case Op::Clamp:
      clamp(fsrc(0), elements(n.shape), n.f[0], n.f[1], reinterpret_cast<float*>(output(n, id)));
      return;
    case Op::Scatter:
      scatter(fsrc(0), n.shape[0], ints(1), fsrc(2), src(1).shape[0], reinterpret_cast<float*>(output(n, id)), n.name);
      return;
    case Op::TopPDraw:
      *reinterpret_cast<int32_t*>(output(n, id)) =
          top_p_draw(fsrc(0), ints(2), src(0).shape[0], *fsrc(1), n.f[3], n.f[1], n.f[2]);
      return;
    case Op::AcceptDrafts:
      accept_drafts({fsrc(0), ints(1), src(1).shape[1]}, {fsrc(2), ints(3), src(3).shape[1]}, ints(4),
                    src(4).shape[0], src(0).shape[1], fsrc(5), n.f[3], n.f[1], n.f[2],
                    reinterpret_cast<int32_t*>(output(n, id)), n.name);
      return;
    case Op::Copy: {
      const float* x = fsrc(0);
      const int64_t cols = n.shape.back(), rows = elements(n.shape) / cols;
      std::byte* out = output(n, id);
      const size_t row_bytes = static_cast<size_t>(cols) * plain_size(n.type);
      pool_.parallel_for(rows, 16, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) encode_row(n.type, x + r * cols, cols, out + static_cast<size_t>(r) * row_bytes);
      });
      return;
    }
  }
  fail("CPU backend: node '{}' has unknown op {}", n.name, static_cast<uint32_t>(n.op));
}

void CpuBackend::read(const BackendTensor& tensor, std::span<std::byte> dst) {
  CpuTensor& t = cpu_tensor(tensor);
  const int64_t cols = t.shape().back(), rows = elements(t.shape()) / cols;
  const size_t want = static_cast<size_t>(rows * cols) * 4;
  if (dst.size() != want)
    fail("CPU backend: read: tensor '{}' {} {} needs {} bytes but the destination has {}", t.name(),
         dtype_name(t.type()), shape_str(t.shape()), want, dst.size());
  if (t.type() == DType::I32 || t.type() == DType::F32 || t.type() == DType::U32) {
    std::memcpy(dst.data(), t.data, want);
    return;
  }
  if (!can_decode(t.type()))
    fail("CPU backend: read: tensor '{}' is {}, which the CPU backend cannot decode", t.name(), dtype_name(t.type()));
  const size_t rb = *row_bytes(t.type(), cols, &t.quant);
  for (int64_t r = 0; r < rows; ++r)
    decode_row(t.type(), t.data + static_cast<size_t>(r) * rb, cols,
               reinterpret_cast<float*>(dst.data()) + r * cols, &t.quant, r);
}

void CpuBackend::write(BackendTensor& tensor, std::span<const std::byte> src) {
  CpuTensor& t = cpu_tensor(tensor);
  if (!t.mutable_data) fail("CPU backend: write: '{}' is a read-only weight", t.name());
  if (src.size() == t.bytes) {
    std::memcpy(t.mutable_data, src.data(), src.size());
    return;
  }
  const int64_t n = elements(t.shape());
  const bool is_float = t.type() == DType::F16 || t.type() == DType::BF16;
  if (is_float && src.size() == static_cast<size_t>(n) * 4) {
    encode_row(t.type(), reinterpret_cast<const float*>(src.data()), n, t.mutable_data);
    return;
  }
  fail("CPU backend: write: '{}' {} {} takes {} bytes ({}){} but was given {}", t.name(), dtype_name(t.type()),
       shape_str(t.shape()), t.bytes, dtype_name(t.type()),
       is_float ? fmt::format(" or {} bytes (F32)", n * 4) : std::string(), src.size());
}

// Logits of a verification (K + 1 rows of a 262144-token vocabulary: 1 MB a row) come back in vectors a
// forward allocates and frees (BatchedModel, the context's caller). glibc serves such sizes from fresh
// mmaps, each page faulting in again on every forward (its threshold adapts, but trimming undoes it):
// E2B MLX, 9 tokens, 134-140 ms against 84-87 with these settings. Kept in the heap instead, up to 64 MB
// a block, and 256 MB of free heap top are kept for the next forward. Process-wide, once.
void keep_large_blocks_in_the_heap() {
  static const bool done = [] {
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    return true;
  }();
  (void)done;
}

}  // namespace

std::unique_ptr<ComputeBackend> make_cpu_backend(const nlohmann::json& options) {
  keep_large_blocks_in_the_heap();
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (options.is_object() && options.contains("threads")) {
    const auto& v = options["threads"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1024)
      fail("cpu backend: option 'threads' = {} must be an integer in [0, 1024] (0 = all cores)", v.dump());
    if (v.get<int>() > 0) threads = v.get<int>();
  }
  std::string isa;
  if (options.is_object() && options.contains("isa")) {
    const auto& v = options["isa"];
    if (!v.is_string())
      fail("cpu backend: option 'isa' = {} must be a string: auto, avx2 or avx512", v.dump());
    isa = v.get<std::string>();
  }
  const KernelSet& kernels = select_kernels(isa);
  bool profile = false;
  if (options.is_object() && options.contains("profile")) {
    if (!options["profile"].is_boolean())
      fail("cpu backend: option 'profile' = {} must be true or false", options["profile"].dump());
    profile = options["profile"].get<bool>();
  }
  bool pack_weights = true;
  if (options.is_object() && options.contains("pack_weights")) {
    if (!options["pack_weights"].is_boolean())
      fail("cpu backend: option 'pack_weights' = {} must be true or false", options["pack_weights"].dump());
    pack_weights = options["pack_weights"].get<bool>();
  }
  log_debug("cpu backend: {} threads, {} kernels, weights {}packed", threads, kernels.name, pack_weights ? "" : "not ");
  return std::make_unique<CpuBackend>(threads, kernels, profile, pack_weights);
}

}  // namespace specula::cpu

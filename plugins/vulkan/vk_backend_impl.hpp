// The Vulkan backend's internals shared by its source files: a compiled graph's plan (arena, dispatches,
// descriptor sets, the recorded command buffer) and the backend class. vk_backend.cpp holds the
// interface (capabilities, weights, tensors, pipelines), vk_lower.cpp lowers each op to dispatches,
// vk_record.cpp records and runs plans; vk_device.* the device and memory.
#pragma once

#include <algorithm>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "specula/log.hpp"
#include "specula/op_profile.hpp"
#include "vk_device.hpp"

namespace specula::vulkan::detail {

// First-fit offsets inside a plan's arena, with neighbouring free ranges merged.
class Arena {
 public:
  explicit Arena(VkDeviceSize align) : align_(align) {}
  VkDeviceSize alloc(VkDeviceSize size) {
    size = (std::max<VkDeviceSize>(size, 4) + align_ - 1) / align_ * align_;
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < size) continue;
      const VkDeviceSize off = it->first;
      if (it->second > size) free_[off + size] = it->second - size;
      free_.erase(it);
      return off;
    }
    // Grow: a free range at the end is extended.
    VkDeviceSize off = end_;
    if (!free_.empty() && free_.rbegin()->first + free_.rbegin()->second == end_) {
      off = free_.rbegin()->first;
      free_.erase(std::prev(free_.end()));
    }
    end_ = off + size;
    return off;
  }
  void release(VkDeviceSize off, VkDeviceSize size) {
    size = (std::max<VkDeviceSize>(size, 4) + align_ - 1) / align_ * align_;
    auto [it, ok] = free_.emplace(off, size);
    auto next = std::next(it);
    if (next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
    }
  }
  VkDeviceSize size() const { return end_; }

 private:
  VkDeviceSize align_;
  VkDeviceSize end_ = 0;
  std::map<VkDeviceSize, VkDeviceSize> free_;  // offset -> size
};

// Where a value lives: a persistent tensor's buffer, or a range of the plan's arena.
struct Loc {
  VkTensor* tensor = nullptr;
  VkDeviceSize off = 0, size = 0;  // arena range (tensor: whole buffer)
  bool valid() const { return tensor || size > 0; }
};

struct Dispatch {
  std::string shader;
  std::array<Loc, 7> bind{};  // operands 0-4, the result, operand 5 (bindings 0-5 and 7; 6 is the error record)
  std::array<uint32_t, 32> pc{};
  uint64_t groups = 0;
  int32_t node = -1;
};

// A graph compiled for this device (ComputeBackend::compile), replayed by every run.
struct Plan {
  std::shared_ptr<Device> dev;
  std::vector<Loc> loc;                // per node
  std::vector<Dispatch> dispatches;
  struct InputCopy {
    int32_t node;
    VkDeviceSize staging_off, arena_off, bytes;
  };
  std::vector<InputCopy> inputs;
  std::vector<uint8_t> consts;  // host data copied with the inputs (rope frequencies)
  VkDeviceSize consts_staging = 0, consts_arena = 0;
  std::unordered_map<int32_t, VkDeviceSize> readback_off;  // output node -> offset in readback
  std::vector<int64_t> id_bound;                           // per node: the range ids are checked against
  std::unique_ptr<Buffer> arena, staging, readback, err;
  VkDescriptorPool pool = VK_NULL_HANDLE;
  VkCommandBuffer cmd = VK_NULL_HANDLE;
  VkQueryPool timestamps = VK_NULL_HANDLE;  // profiling: one before the first dispatch, one after each

  ~Plan() {
    if (timestamps) vkDestroyQueryPool(dev->dev, timestamps, nullptr);
    if (pool) vkDestroyDescriptorPool(dev->dev, pool, nullptr);
    if (cmd) vkFreeCommandBuffers(dev->dev, dev->cmd_pool, 1, &cmd);
  }
};

// Splits a workgroup count into x (at most 65535) and y; shaders linearise with wg_linear().
inline std::pair<uint32_t, uint32_t> grid(uint64_t groups) {
  const uint64_t x = std::min<uint64_t>(groups, 65535);
  return {static_cast<uint32_t>(x), static_cast<uint32_t>((groups + x - 1) / x)};
}

inline uint32_t u32(int64_t v) { return static_cast<uint32_t>(v); }
inline uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

class VulkanBackend;

// A graph with its Plan: buffers, descriptor sets and a recorded command buffer, and the host-visible
// readback of its outputs, which runs of other graphs leave alone.
class VkCompiled final : public CompiledGraph {
 public:
  VkCompiled(VulkanBackend& backend, const Graph& graph, std::unique_ptr<Plan> plan)
      : backend_(backend), graph_(graph), nodes_(graph.nodes().size()), plan_(std::move(plan)) {}
  void run(const RunInputs& inputs) override;
  void read(Value output, std::span<std::byte> dst) const override;

 private:
  friend class VulkanBackend;
  VulkanBackend& backend_;
  const Graph& graph_;
  size_t nodes_;  // the graph's size when compiled: it must not change
  std::unique_ptr<Plan> plan_;
  bool ran_ = false;
};

class VulkanBackend final : public ComputeBackend {
 public:
  VulkanBackend(std::shared_ptr<Device> dev, bool profile)
      : dev_(std::move(dev)), profile_(profile ? std::make_unique<OpProfile>() : nullptr) {
    create_layouts();
  }
  ~VulkanBackend() override {
    if (profile_) std::fputs(profile_->report().c_str(), stderr);
    VkDevice d = dev_->dev;
    vkDeviceWaitIdle(d);
    for (auto& [name, p] : pipelines_) vkDestroyPipeline(d, p, nullptr);
    if (playout_) vkDestroyPipelineLayout(d, playout_, nullptr);
    if (set_layout_) vkDestroyDescriptorSetLayout(d, set_layout_, nullptr);
  }

  std::string name() const override { return "vulkan"; }

  DeviceInfo device() const override {
    DeviceInfo info;
    const auto& p = dev_->props;
    info.name = fmt::format("{} (Vulkan {}.{}; {})", p.deviceName, VK_API_VERSION_MAJOR(p.apiVersion),
                            VK_API_VERSION_MINOR(p.apiVersion), dev_->capabilities);
    for (uint32_t i = 0; i < dev_->mem_props.memoryHeapCount; ++i)
      if (dev_->mem_props.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
        info.memory_bytes += dev_->mem_props.memoryHeaps[i].size;
    info.unified_memory = p.deviceType != VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU;
    return info;
  }

  Support supports(Op op, DType type) const override {
    const DTypeTraits* tr = dtype_traits(type);
    if (!tr) return Support::no(fmt::format("unknown dtype {}", static_cast<uint32_t>(type)));
    if (type == DType::MLX_AFFINE) {
      if (op == Op::Constant || op == Op::Reshape || op == Op::GetRows || op == Op::MatMul || op == Op::MatMulId)
        return Support::yes();
      return Support::no(fmt::format(
          "the Vulkan backend decodes MLX affine weights only as the weight of MatMul, MatMulId and GetRows, not in {}",
          op_name(op)));
    }
    switch (op) {
      case Op::Input:
        if (tr->quantized) return Support::no(fmt::format("inputs hold plain values, not {}", tr->name));
        return Support::yes();
      case Op::Constant:
      case Op::Reshape:
        return Support::yes();
      case Op::Attention:
        if (plain_float(type)) return Support::yes();
        return Support::no(fmt::format("the Vulkan backend reads K/V caches as F32, F16 or BF16, not {}", tr->name));
      case Op::WriteRows:
        if (plain_float(type) || type == DType::I32) return Support::yes();
        return Support::no(fmt::format("the Vulkan backend writes rows into F32, F16, BF16 or I32 tensors, not {}", tr->name));
      case Op::Copy:
        if (plain_float(type)) return Support::yes();
        return Support::no(fmt::format("Copy converts to F32, F16 or BF16 only, not {}", tr->name));
      case Op::Slice:
      case Op::Concat:
        if (type == DType::F32 || type == DType::I32) return Support::yes();
        return Support::no(fmt::format("{} takes F32 or I32 values on the Vulkan backend, not {}", op_name(op), tr->name));
      case Op::TopPDraw:
        if (type == DType::F32) return Support::yes();  // the SDK's float32 rule (top_p_draw.comp)
        return Support::no(fmt::format("TopPDraw takes F32 logits, not {}", tr->name));
      case Op::AcceptDrafts:
        if (type == DType::F32) return Support::yes();  // the SDK's float32 rule (accept_drafts.comp)
        return Support::no(fmt::format("AcceptDrafts takes F32 logits, not {}", tr->name));
      case Op::Scatter:
        if (type == DType::F32) return Support::yes();
        return Support::no(fmt::format("Scatter takes F32 values, not {}", tr->name));
      case Op::GetRows:
        if (type == DType::I32) return Support::yes();  // ids of ids (the copy shader's gather)
        [[fallthrough]];
      case Op::Div: case Op::Clamp:
      case Op::MatMul: case Op::MatMulId: case Op::Add: case Op::Mul: case Op::Scale:
      case Op::RmsNorm: case Op::GeluTanh: case Op::Softcap: case Op::Rope: case Op::Softmax: case Op::TopK:
      case Op::Argmax:
        if (decodable(type)) return Support::yes();
        return Support::no(fmt::format(
            "the Vulkan backend decodes F32, F16, BF16 and the GGUF block types Q8_0, Q4_0, Q4_1, Q5_0, "
            "Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS, not {} ({} on {})", tr->name,
            op_name(op), tr->name));
      default:
        return Support::no(fmt::format("the Vulkan backend does not implement {}", op_name(op)));
    }
  }

  BackendTensorPtr load_weight(const TensorInfo& info) override {
    const DTypeTraits* tr = dtype_traits(info.type);
    if (!tr) fail("Vulkan backend: weight '{}' has unknown dtype {}", info.name, static_cast<uint32_t>(info.type));
    if (info.shape.empty()) fail("Vulkan backend: weight '{}' has no shape", info.name);
    for (int64_t d : info.shape)
      if (d <= 0) fail("Vulkan backend: weight '{}' has shape {}; every axis must be positive", info.name, shape_str(info.shape));
    const int64_t cols = info.shape.back(), rows = elements(info.shape) / cols;
    if (info.type == DType::MLX_AFFINE) return load_mlx(info, rows, cols);
    const auto rb = dtype_row_bytes(info.type, static_cast<uint64_t>(cols));
    if (!rb)
      fail("Vulkan backend: weight '{}' {} {}: rows of {} values are not whole {}-value blocks", info.name, tr->name,
           shape_str(info.shape), cols, tr->block_elems);
    if (info.data.size() != *rb * static_cast<uint64_t>(rows))
      fail("Vulkan backend: weight '{}' {} {} needs {} bytes but has {}", info.name, tr->name, shape_str(info.shape),
           *rb * static_cast<uint64_t>(rows), info.data.size());
    auto t = std::make_shared<VkTensor>(info.name, info.type, info.shape);
    t->bytes = info.data.size();
    t->weight = true;
    t->buf = dev_->weight_buffer((t->bytes + 3) / 4 * 4, "weight '" + info.name + "'", dev_);
    upload(*t->buf, info.data.data(), t->bytes);
    return t;
  }

  BackendTensorPtr allocate(const std::string& name, DType type, const Shape& shape) override {
    const size_t es = plain_size(type);
    if (es == 0)
      fail("Vulkan backend: cannot allocate '{}' as {}; persistent tensors hold plain values", name, dtype_name(type));
    if (shape.empty()) fail("Vulkan backend: tensor '{}' needs a shape", name);
    for (int64_t d : shape)
      if (d <= 0) fail("Vulkan backend: tensor '{}' has shape {}; every axis must be positive", name, shape_str(shape));
    auto t = std::make_shared<VkTensor>(name, type, shape);
    t->bytes = static_cast<uint64_t>(elements(shape)) * es;
    t->buf = dev_->buffer((t->bytes + 3) / 4 * 4, false, "tensor '" + name + "'", dev_);
    VkBuffer b = t->buf->buf;
    dev_->submit_now([&](VkCommandBuffer cb) { vkCmdFillBuffer(cb, b, 0, VK_WHOLE_SIZE, 0); });
    return t;
  }

  std::unique_ptr<CompiledGraph> compile(const Graph& graph) override {
    log_debug("vulkan backend: a plan for a graph of {} nodes", graph.nodes().size());
    return std::make_unique<VkCompiled>(*this, graph, build(graph));
  }
  void read(const BackendTensor& tensor, std::span<std::byte> dst) override;
  void write(BackendTensor& tensor, std::span<const std::byte> src) override;

 private:
  friend class VkCompiled;
  void run(VkCompiled& c, const RunInputs& inputs);
  void read(const VkCompiled& c, Value output, std::span<std::byte> dst);
  void create_layouts();
  VkPipeline pipeline(const std::string& shader);
  std::unique_ptr<Plan> build(const Graph& g);
  void record(Plan& p, const std::vector<Node>& graph_nodes);
  // Profiling: each dispatch's GPU time (from the timestamp before it to the one after) added to its node.
  void record_profile(const Plan& p, const Graph& graph);
  // Calls chunk_fn(staging, offset, length) for each staging-sized chunk of `bytes`, holding staging_mu_.
  void through_staging(uint64_t bytes, const std::function<void(Buffer&, uint64_t, uint64_t)>& chunk_fn);
  void upload(Buffer& dst, const void* data, uint64_t bytes, VkDeviceSize dst_off = 0);
  void download(const Buffer& src, void* data, uint64_t bytes);
  Buffer& staging(uint64_t bytes);

 public:
  uint64_t memory_allocations() const { return dev_->allocations; }
  bool cooperative_matrix() const { return dev_->coopmat; }

 private:
  static constexpr uint64_t kStagingChunk = 64ull << 20;
  std::mutex staging_mu_;
  std::unique_ptr<Buffer> staging_;  // reads and writes of persistent tensors (staging())

  // An MLX affine weight (QuantParams in model_file.hpp): its codes, scales and biases in one buffer, each
  // section at an offset that can be bound on its own (MatMul/GetRows bind them at bindings 0, 3 and 4).
  BackendTensorPtr load_mlx(const TensorInfo& info, int64_t rows, int64_t cols) {
    const QuantParams& q = info.quant;
    if (!mlx_params_valid(q.bits, q.group_size))
      fail("Vulkan backend: MLX weight '{}': bits {} / group size {} is not supported (bits 2, 3, 4, 5, 6 or 8; "
           "groups of 32, 64 or 128)", info.name, q.bits, q.group_size);
    if (cols % q.group_size != 0)
      fail("Vulkan backend: MLX weight '{}' {}: rows of {} values are not whole groups of {}", info.name,
           shape_str(info.shape), cols, q.group_size);
    if (q.scale_type != DType::F32 && q.scale_type != DType::F16 && q.scale_type != DType::BF16)
      fail("Vulkan backend: MLX weight '{}': scales and biases must be F32, F16 or BF16, not {}", info.name,
           dtype_name(q.scale_type));
    auto t = std::make_shared<VkTensor>(info.name, info.type, info.shape);
    t->weight = true;
    t->mlx = {q.bits, q.group_size, q.scale_type, {}, {}};
    t->code_row = static_cast<uint64_t>(cols) * q.bits / 8;  // whole words: a group is 32+ values
    t->scale_row = static_cast<uint64_t>(cols / q.group_size) * (q.scale_type == DType::F32 ? 4 : 2);
    const uint64_t n = static_cast<uint64_t>(rows);
    if (info.data.size() != t->code_row * n)
      fail("Vulkan backend: MLX weight '{}' {} of {} bits needs {} bytes of codes but has {}", info.name,
           shape_str(info.shape), q.bits, t->code_row * n, info.data.size());
    if (q.scales.size() != t->scale_row * n || q.biases.size() != t->scale_row * n)
      fail("Vulkan backend: MLX weight '{}' {}: scales ({} bytes) and biases ({} bytes) must each have {} bytes",
           info.name, shape_str(info.shape), q.scales.size(), q.biases.size(), t->scale_row * n);
    const VkDeviceSize align = std::max<VkDeviceSize>(dev_->props.limits.minStorageBufferOffsetAlignment, 16);
    auto round = [](VkDeviceSize v, VkDeviceSize a) { return (v + a - 1) / a * a; };
    t->section_bytes[0] = round(info.data.size(), 4);
    t->section_bytes[1] = t->section_bytes[2] = round(q.scales.size(), 4);
    t->scales_off = round(t->section_bytes[0], align);
    t->biases_off = round(t->scales_off + t->section_bytes[1], align);
    t->bytes = t->biases_off + t->section_bytes[2];
    t->buf = dev_->weight_buffer(t->bytes, "weight '" + info.name + "'", dev_);
    upload(*t->buf, info.data.data(), info.data.size());
    upload(*t->buf, q.scales.data(), q.scales.size(), t->scales_off);
    upload(*t->buf, q.biases.data(), q.biases.size(), t->biases_off);
    return t;
  }

  std::shared_ptr<Device> dev_;
  VkDescriptorSetLayout set_layout_ = VK_NULL_HANDLE;
  VkPipelineLayout playout_ = VK_NULL_HANDLE;
  std::unordered_map<std::string, VkPipeline> pipelines_;
  std::unique_ptr<Buffer> dummy_;
  std::unique_ptr<OpProfile> profile_;  // option `profile`
};

}  // namespace specula::vulkan::detail

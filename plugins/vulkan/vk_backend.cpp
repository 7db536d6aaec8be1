#include "vk_backend.hpp"

#include <dlfcn.h>
#include <link.h>
#include <vulkan/vulkan.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "shaders.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/quant.hpp"

namespace specula::vulkan {
namespace {

int64_t elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) fail("Vulkan backend: {} failed (VkResult {})", what, static_cast<int>(r));
}

// Types the shaders decode (common.glsl decode_chunk / load*).
bool decodable(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0: case DType::Q4_1:
    case DType::Q5_0: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::IQ4_NL:
    case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}
bool plain_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

size_t plain_size(DType t) {
  const DTypeTraits* tr = dtype_traits(t);
  return tr && !tr->quantized ? tr->block_bytes : 0;
}

// Bytes of a value of `shape` stored as `t` (whole rows of blocks), rounded up to 4 for word access.
uint64_t value_bytes(DType t, const Shape& shape) {
  const int64_t cols = shape.back(), rows = elements(shape) / cols;
  const auto rb = dtype_row_bytes(t, static_cast<uint64_t>(cols));
  if (!rb) fail("Vulkan backend: {} rows of {} values are not whole blocks", dtype_name(t), cols);
  return (*rb * static_cast<uint64_t>(rows) + 3) / 4 * 4;
}

struct Device;

// One vkAllocateMemory that weights share (Device::weight_buffer), freed with its last buffer.
struct MemoryBlock {
  std::shared_ptr<Device> dev;
  VkDeviceMemory mem = VK_NULL_HANDLE;
  VkDeviceSize size = 0, used = 0;
  uint32_t type = 0;
  ~MemoryBlock();
};

struct Buffer {
  std::shared_ptr<Device> dev;
  VkBuffer buf = VK_NULL_HANDLE;
  VkDeviceMemory mem = VK_NULL_HANDLE;        // its own memory, or null when bound inside `block`
  std::shared_ptr<MemoryBlock> block;
  VkDeviceSize size = 0;
  void* map = nullptr;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();
};

// The instance, device and queue, shared by the backend and every buffer (tensors may outlive the
// backend object).
struct Device {
  VkInstance instance = VK_NULL_HANDLE;
  VkPhysicalDevice phys = VK_NULL_HANDLE;
  VkDevice dev = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  uint32_t queue_family = 0;
  VkPhysicalDeviceProperties props{};
  VkPhysicalDeviceMemoryProperties mem_props{};
  VkCommandPool cmd_pool = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  VkDeviceSize max_binding = 0;  // maxStorageBufferRange, or the lower `max_binding_bytes` option
  std::atomic<uint64_t> allocations{0};  // vkAllocateMemory calls (vulkan_memory_allocations)
  std::mutex blocks_mu;
  std::weak_ptr<MemoryBlock> open_block;  // where the next weight goes
  VkDeviceSize next_block = 32ull << 20;  // blocks double up to 256 MiB as a model loads

  ~Device() {
    if (dev) {
      vkDeviceWaitIdle(dev);
      if (fence) vkDestroyFence(dev, fence, nullptr);
      if (cmd_pool) vkDestroyCommandPool(dev, cmd_pool, nullptr);
      vkDestroyDevice(dev, nullptr);
    }
    if (instance) vkDestroyInstance(instance, nullptr);
  }

  // A memory type allowed by `bits` with all of `need`, preferring one with `want` too.
  uint32_t memory_type(uint32_t bits, VkMemoryPropertyFlags need, VkMemoryPropertyFlags want) const {
    int fallback = -1;
    for (uint32_t i = 0; i < mem_props.memoryTypeCount; ++i) {
      if (!(bits & (1u << i))) continue;
      const VkMemoryPropertyFlags f = mem_props.memoryTypes[i].propertyFlags;
      if ((f & need) != need) continue;
      if ((f & want) == want) return i;
      if (fallback < 0) fallback = static_cast<int>(i);
    }
    if (fallback < 0) fail("Vulkan backend: the device has no memory type with properties {:#x}", need);
    return static_cast<uint32_t>(fallback);
  }

  // Device-local storage (also a copy source/destination), or host-visible coherent staging.
  std::unique_ptr<Buffer> buffer(VkDeviceSize size, bool host, const std::string& what,
                                 const std::shared_ptr<Device>& self) {
    auto b = std::make_unique<Buffer>();
    b->dev = self;
    b->size = std::max<VkDeviceSize>(size, 16);
    VkBufferCreateInfo ci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    ci.size = b->size;
    ci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    ci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    check(vkCreateBuffer(dev, &ci, nullptr, &b->buf), "vkCreateBuffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, b->buf, &req);
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.allocationSize = req.size;
    ai.memoryTypeIndex = host ? memory_type(req.memoryTypeBits, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
                                            VK_MEMORY_PROPERTY_HOST_CACHED_BIT)
                              : memory_type(req.memoryTypeBits, 0, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    b->mem = allocate(ai, host ? "host-visible" : "device", what);
    check(vkBindBufferMemory(dev, b->buf, b->mem, 0), "vkBindBufferMemory");
    if (host) check(vkMapMemory(dev, b->mem, 0, VK_WHOLE_SIZE, 0, &b->map), "vkMapMemory");
    return b;
  }

  VkDeviceMemory allocate(const VkMemoryAllocateInfo& ai, const char* kind, const std::string& what) {
    VkDeviceMemory mem = VK_NULL_HANDLE;
    const VkResult r = vkAllocateMemory(dev, &ai, nullptr, &mem);
    if (r != VK_SUCCESS)
      fail("Vulkan backend: out of {} memory allocating {} bytes for {} (VkResult {})", kind, ai.allocationSize, what,
           static_cast<int>(r));
    ++allocations;
    return mem;
  }

  // A device-local buffer for a weight, bound inside a shared block: drivers allow a few thousand
  // allocations at most, and a model has hundreds of weights. Weights larger than a quarter of a block
  // get their own allocation.
  std::unique_ptr<Buffer> weight_buffer(VkDeviceSize size, const std::string& what, const std::shared_ptr<Device>& self) {
    auto b = std::make_unique<Buffer>();
    b->dev = self;
    b->size = std::max<VkDeviceSize>(size, 16);
    VkBufferCreateInfo ci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    ci.size = b->size;
    ci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    ci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    check(vkCreateBuffer(dev, &ci, nullptr, &b->buf), "vkCreateBuffer");
    VkMemoryRequirements req;
    vkGetBufferMemoryRequirements(dev, b->buf, &req);
    const uint32_t type = memory_type(req.memoryTypeBits, 0, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    constexpr VkDeviceSize kMaxBlock = 256ull << 20;
    VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    ai.memoryTypeIndex = type;
    if (req.size > kMaxBlock / 4) {
      ai.allocationSize = req.size;
      b->mem = allocate(ai, "device", what);
      check(vkBindBufferMemory(dev, b->buf, b->mem, 0), "vkBindBufferMemory");
      return b;
    }
    std::lock_guard<std::mutex> lock(blocks_mu);
    std::shared_ptr<MemoryBlock> block = open_block.lock();
    VkDeviceSize off = block ? (block->used + req.alignment - 1) / req.alignment * req.alignment : 0;
    if (!block || block->type != type || off + req.size > block->size) {
      block = std::make_shared<MemoryBlock>();
      block->dev = self;
      block->type = type;
      block->size = ai.allocationSize = std::max(next_block, req.size);
      next_block = std::min(next_block * 2, kMaxBlock);
      block->mem = allocate(ai, "device", what);
      open_block = block;
      off = 0;
    }
    check(vkBindBufferMemory(dev, b->buf, block->mem, off), "vkBindBufferMemory");
    block->used = off + req.size;
    b->block = std::move(block);
    return b;
  }

  // Records commands into a one-time command buffer, submits it and waits.
  template <typename F>
  void submit_now(F&& record) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = cmd_pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    VkCommandBuffer cb;
    check(vkAllocateCommandBuffers(dev, &ai, &cb), "vkAllocateCommandBuffers");
    VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    vkBeginCommandBuffer(cb, &bi);
    record(cb);
    vkEndCommandBuffer(cb);
    try {
      submit_wait(cb);
    } catch (...) {
      vkFreeCommandBuffers(dev, cmd_pool, 1, &cb);
      throw;
    }
    vkFreeCommandBuffers(dev, cmd_pool, 1, &cb);
  }

  void submit_wait(VkCommandBuffer cb) {
    VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
    si.commandBufferCount = 1;
    si.pCommandBuffers = &cb;
    check(vkResetFences(dev, 1, &fence), "vkResetFences");
    check(vkQueueSubmit(queue, 1, &si, fence), "vkQueueSubmit");
    check(vkWaitForFences(dev, 1, &fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  }
};

Buffer::~Buffer() {
  if (!dev) return;
  if (buf) vkDestroyBuffer(dev->dev, buf, nullptr);
  if (mem) vkFreeMemory(dev->dev, mem, nullptr);
}

MemoryBlock::~MemoryBlock() {
  if (dev && mem) vkFreeMemory(dev->dev, mem, nullptr);
}

// Every barrier the host needs before reading or after writing a buffer: all prior device work.
void full_barrier(VkCommandBuffer cb, VkAccessFlags src, VkAccessFlags dst, VkPipelineStageFlags src_stage,
                  VkPipelineStageFlags dst_stage) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = src;
  mb.dstAccessMask = dst;
  vkCmdPipelineBarrier(cb, src_stage, dst_stage, 0, 1, &mb, 0, nullptr, 0, nullptr);
}

class VkTensor final : public BackendTensor {
 public:
  VkTensor(std::string name, DType type, Shape shape) : name_(std::move(name)), type_(type), shape_(std::move(shape)) {}
  DType type() const override { return type_; }
  const Shape& shape() const override { return shape_; }
  const std::string& name() const override { return name_; }

  std::unique_ptr<Buffer> buf;
  uint64_t bytes = 0;     // stored bytes (before rounding to words)
  bool weight = false;    // read-only checkpoint weight
  // MLX_AFFINE: the buffer holds the packed codes (rows of code_row bytes, whole words), then the scales
  // and then the biases (rows of scale_row bytes), each section at an offset aligned for binding.
  QuantParams mlx;                         // bits, group size and scale type (the spans are not kept)
  uint64_t code_row = 0, scale_row = 0;
  VkDeviceSize scales_off = 0, biases_off = 0, section_bytes[3] = {};  // sizes rounded up to words

 private:
  std::string name_;
  DType type_;
  Shape shape_;
};

VkTensor& vk_tensor(const BackendTensor& t) {
  auto* v = dynamic_cast<const VkTensor*>(&t);
  if (!v) fail("Vulkan backend: tensor '{}' belongs to another backend", t.name());
  return const_cast<VkTensor&>(*v);
}

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

  ~Plan() {
    if (pool) vkDestroyDescriptorPool(dev->dev, pool, nullptr);
    if (cmd) vkFreeCommandBuffers(dev->dev, dev->cmd_pool, 1, &cmd);
  }
};

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
  VulkanBackend(std::shared_ptr<Device> dev) : dev_(std::move(dev)) { create_layouts(); }
  ~VulkanBackend() override {
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
    info.name = fmt::format("{} (Vulkan {}.{})", p.deviceName, VK_API_VERSION_MAJOR(p.apiVersion),
                            VK_API_VERSION_MINOR(p.apiVersion));
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
  void upload(Buffer& dst, const void* data, uint64_t bytes, VkDeviceSize dst_off = 0);
  void download(const Buffer& src, void* data, uint64_t bytes);
  Buffer& staging(uint64_t bytes);

 public:
  uint64_t memory_allocations() const { return dev_->allocations; }

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
};

void VulkanBackend::create_layouts() {
  std::array<VkDescriptorSetLayoutBinding, 8> b{};
  for (uint32_t i = 0; i < 8; ++i) {
    b[i].binding = i;
    b[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    b[i].descriptorCount = 1;
    b[i].stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
  }
  VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  li.bindingCount = 8;
  li.pBindings = b.data();
  check(vkCreateDescriptorSetLayout(dev_->dev, &li, nullptr, &set_layout_), "vkCreateDescriptorSetLayout");
  VkPushConstantRange pr{VK_SHADER_STAGE_COMPUTE_BIT, 0, 128};
  VkPipelineLayoutCreateInfo pi{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pi.setLayoutCount = 1;
  pi.pSetLayouts = &set_layout_;
  pi.pushConstantRangeCount = 1;
  pi.pPushConstantRanges = &pr;
  check(vkCreatePipelineLayout(dev_->dev, &pi, nullptr, &playout_), "vkCreatePipelineLayout");
  dummy_ = dev_->buffer(256, false, "unused bindings", dev_);
}

VkPipeline VulkanBackend::pipeline(const std::string& shader) {
  auto it = pipelines_.find(shader);
  if (it != pipelines_.end()) return it->second;
  const auto code = shader_spirv(shader);
  if (code.empty()) fail("Vulkan backend: no embedded shader '{}'", shader);
  VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mi.codeSize = code.size() * 4;
  mi.pCode = code.data();
  VkShaderModule mod;
  check(vkCreateShaderModule(dev_->dev, &mi, nullptr, &mod), "vkCreateShaderModule");
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = mod;
  ci.stage.pName = "main";
  ci.layout = playout_;
  VkPipeline p;
  const VkResult r = vkCreateComputePipelines(dev_->dev, VK_NULL_HANDLE, 1, &ci, nullptr, &p);
  vkDestroyShaderModule(dev_->dev, mod, nullptr);
  check(r, "vkCreateComputePipelines");
  pipelines_[shader] = p;
  return p;
}

// One host-visible staging buffer, kept and grown to the largest transfer (at most 64 MiB: larger ones
// go in chunks), so reads and writes allocate nothing once it has grown. Callers hold staging_mu_.
Buffer& VulkanBackend::staging(uint64_t bytes) {
  if (!staging_ || staging_->size < bytes) {
    staging_.reset();
    staging_ = dev_->buffer(std::max<uint64_t>(bytes, 1ull << 20), true, "transfer staging", dev_);
  }
  return *staging_;
}

void VulkanBackend::upload(Buffer& dst, const void* data, uint64_t bytes, VkDeviceSize dst_off) {
  if (bytes == 0) return;
  const uint64_t chunk = std::min<uint64_t>(bytes, kStagingChunk);
  std::lock_guard<std::mutex> lock(staging_mu_);
  Buffer& st = staging(chunk);
  for (uint64_t done = 0; done < bytes; done += chunk) {
    const uint64_t n = std::min(chunk, bytes - done);
    std::memcpy(st.map, static_cast<const std::byte*>(data) + done, n);
    dev_->submit_now([&](VkCommandBuffer cb) {
      VkBufferCopy c{0, dst_off + done, n};
      vkCmdCopyBuffer(cb, st.buf, dst.buf, 1, &c);
    });
  }
}

void VulkanBackend::download(const Buffer& src, void* data, uint64_t bytes) {
  if (bytes == 0) return;
  const uint64_t chunk = std::min<uint64_t>(bytes, kStagingChunk);
  std::lock_guard<std::mutex> lock(staging_mu_);
  Buffer& st = staging(chunk);
  for (uint64_t done = 0; done < bytes; done += chunk) {
    const uint64_t n = std::min(chunk, bytes - done);
    dev_->submit_now([&](VkCommandBuffer cb) {
      full_barrier(cb, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_TRANSFER_READ_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT);
      VkBufferCopy c{done, 0, n};
      vkCmdCopyBuffer(cb, src.buf, st.buf, 1, &c);
      full_barrier(cb, VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_HOST_READ_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                   VK_PIPELINE_STAGE_HOST_BIT);
    });
    std::memcpy(static_cast<std::byte*>(data) + done, st.map, n);
  }
}

// Splits a workgroup count into x (at most 65535) and y; shaders linearise with wg_linear().
std::pair<uint32_t, uint32_t> grid(uint64_t groups) {
  const uint64_t x = std::min<uint64_t>(groups, 65535);
  return {static_cast<uint32_t>(x), static_cast<uint32_t>((groups + x - 1) / x)};
}

uint32_t u32(int64_t v) { return static_cast<uint32_t>(v); }
uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::unique_ptr<Plan> VulkanBackend::build(const Graph& g) {
  const auto& nodes = g.nodes();
  const int32_t count = static_cast<int32_t>(nodes.size());
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  p.dev = dev_;
  p.loc.assign(nodes.size(), Loc{});
  p.id_bound.assign(nodes.size(), 0);
  const VkDeviceSize align = std::max<VkDeviceSize>(dev_->props.limits.minStorageBufferOffsetAlignment, 16);
  Arena arena(align);

  // Liveness through reshapes, as the CPU backend: a range is released after its last reader.
  std::vector<int32_t> root(nodes.size()), last_use(nodes.size());
  for (int32_t i = 0; i < count; ++i) {
    const Node& n = nodes[static_cast<size_t>(i)];
    root[static_cast<size_t>(i)] = n.op == Op::Reshape ? root[static_cast<size_t>(n.src[0])] : i;
    last_use[static_cast<size_t>(i)] = i;
    for (int32_t s : n.src)
      if (s >= 0) last_use[static_cast<size_t>(root[static_cast<size_t>(s)])] = i;
  }
  for (int32_t o : g.outputs()) last_use[static_cast<size_t>(root[static_cast<size_t>(o)])] = count;

  // Inputs first and never released: the run copies them in before the first dispatch.
  VkDeviceSize staging_size = 0;
  for (int32_t i = 0; i < count; ++i) {
    const Node& n = nodes[static_cast<size_t>(i)];
    if (n.op != Op::Input) continue;
    const size_t es = plain_size(n.type);
    if (es == 0) fail("Vulkan backend: input '{}' is {}; inputs hold plain values", n.name, dtype_name(n.type));
    const VkDeviceSize bytes = static_cast<VkDeviceSize>(elements(n.shape)) * es;
    const VkDeviceSize off = arena.alloc(bytes);
    p.loc[static_cast<size_t>(i)] = {nullptr, off, (bytes + 3) / 4 * 4};
    p.inputs.push_back({i, staging_size, off, bytes});
    staging_size += (bytes + 15) / 16 * 16;
    last_use[static_cast<size_t>(i)] = count;
  }

  // Rope frequency tables, exactly as the CPU backend computes them (F32 pow on the host): one arena
  // range allocated before any intermediate, copied in with the inputs.
  std::vector<VkDeviceSize> rope_off(nodes.size(), 0);
  for (int32_t i = 0; i < count; ++i) {
    const Node& n = nodes[static_cast<size_t>(i)];
    if (n.op != Op::Rope) continue;
    const int64_t pairs = std::min<int64_t>(n.i[0], n.shape[2] / 2);
    std::vector<float> inv(static_cast<size_t>(std::max<int64_t>(pairs, 1)));
    for (int64_t k = 0; k < pairs; ++k)
      inv[static_cast<size_t>(k)] = (1.0f / std::pow(n.f[0], static_cast<float>(2 * k) / n.f[1])) * n.f[2];
    rope_off[static_cast<size_t>(i)] = p.consts.size();
    p.consts.resize(p.consts.size() + (inv.size() * 4 + 255) / 256 * 256);
    std::memcpy(p.consts.data() + rope_off[static_cast<size_t>(i)], inv.data(), inv.size() * 4);
  }
  if (!p.consts.empty()) {
    p.consts_arena = arena.alloc(p.consts.size());
    p.consts_staging = staging_size;
    staging_size += p.consts.size();
  }

  auto src_node = [&](const Node& n, int k) -> const Node& { return nodes[static_cast<size_t>(n.src[static_cast<size_t>(k)])]; };
  auto loc_of = [&](int32_t id) { return p.loc[static_cast<size_t>(id)]; };
  auto release_if_done = [&](int32_t v, int32_t i) {
    const int32_t r = root[static_cast<size_t>(v)];
    Loc& l = p.loc[static_cast<size_t>(r)];
    if (last_use[static_cast<size_t>(r)] == i && !l.tensor && l.size > 0) arena.release(l.off, l.size);
  };
  std::vector<std::pair<VkDeviceSize, VkDeviceSize>> temps;  // conversions of this node's operands

  // Operand k of node n as F32 (decoding a stored F16/BF16/quantized value first when needed).
  auto as_f32 = [&](const Node& n, int32_t i, int k, bool allow_i32) -> Loc {
    const int32_t s = n.src[static_cast<size_t>(k)];
    const Node& sn = nodes[static_cast<size_t>(s)];
    if (sn.type == DType::F32 || (allow_i32 && sn.type == DType::I32)) return loc_of(s);
    const Support ok = supports(n.op, sn.type);
    if (!ok.ok || !decodable(sn.type))
      fail("Vulkan backend: {} '{}': operand '{}' is {}, which the Vulkan backend cannot read here: {}", op_name(n.op),
           n.name, sn.name, dtype_name(sn.type),
           !ok.ok ? ok.reason
           : sn.type == DType::MLX_AFFINE
               ? "MLX affine weights are decoded only as the weight (first operand) of MatMul, MatMulId and GetRows"
               : "not a decodable type");
    const int64_t cols = sn.shape.back(), rows = elements(sn.shape) / cols;
    const VkDeviceSize bytes = static_cast<VkDeviceSize>(rows * cols) * 4;
    const VkDeviceSize off = arena.alloc(bytes);
    temps.emplace_back(off, bytes);
    Dispatch d;
    d.shader = "get_rows";
    d.node = i;
    d.bind[0] = loc_of(s);
    d.bind[5] = {nullptr, off, bytes};
    d.pc[0] = static_cast<uint32_t>(sn.type);
    d.pc[1] = u32(rows);
    d.pc[2] = u32(cols);
    d.pc[3] = u32(rows);
    d.pc[4] = 1;
    d.pc[5] = u32(i);
    d.groups = (static_cast<uint64_t>(rows) * static_cast<uint64_t>((cols + 31) / 32) + 63) / 64;
    p.dispatches.push_back(d);
    return d.bind[5];
  };
  // Row windows [first, end) of a weight that fit maxStorageBufferRange at an aligned offset (one
  // window when it fits whole); `unit` rows move together (an expert's O rows).
  const VkDeviceSize max_range = dev_->max_binding;
  // An MLX weight's tensor (its codes, scales and biases are bound as three sections, windowed alike).
  auto mlx_tensor = [&](const Loc& w, const Node& wn, int64_t cols) -> const VkTensor& {
    if (!w.tensor || w.tensor->type() != DType::MLX_AFFINE || w.tensor->shape().back() != cols)
      fail("Vulkan backend: MLX weight '{}' {} must be used as loaded, with rows of its {} values", wn.name,
           shape_str(wn.shape), w.tensor ? w.tensor->shape().back() : cols);
    return *w.tensor;
  };
  auto windows = [&](const Loc& w, const Node& wn, int64_t rows, int64_t cols, int64_t unit) {
    std::vector<std::pair<int64_t, int64_t>> out;
    const DType type = wn.type;
    const VkTensor* mlx = type == DType::MLX_AFFINE ? &mlx_tensor(w, wn, cols) : nullptr;
    // MLX: the codes are the largest section; scale windows start at the same rows.
    if ((mlx ? mlx->section_bytes[0] : w.size) <= max_range) return std::vector<std::pair<int64_t, int64_t>>{{0, rows}};
    const uint64_t rb = (mlx ? mlx->code_row : *dtype_row_bytes(type, static_cast<uint64_t>(cols))) *
                        static_cast<uint64_t>(unit);
    const uint64_t sb = mlx ? mlx->scale_row * static_cast<uint64_t>(unit) : 0;
    uint64_t step = std::max<uint64_t>(1, (max_range - 4) / rb);
    while (step > 1 && ((step * rb) % align != 0 || (step * sb) % align != 0)) --step;
    if ((step * rb) % align != 0 || (step * sb) % align != 0 || step * rb > max_range)
      fail("Vulkan backend: weight '{}': rows of {} bytes cannot be bound in windows of at most {} bytes", wn.name, rb,
           max_range);
    const int64_t units = rows / unit;
    for (int64_t u = 0; u < units; u += static_cast<int64_t>(step))
      out.emplace_back(u * unit, std::min<int64_t>(units, u + static_cast<int64_t>(step)) * unit);
    return out;
  };
  auto window_loc = [&](const Loc& w, DType type, int64_t cols, std::pair<int64_t, int64_t> win) {
    if (w.size <= max_range) return w;
    const uint64_t rb = *dtype_row_bytes(type, static_cast<uint64_t>(cols));
    Loc l = w;
    l.off = w.off + static_cast<VkDeviceSize>(win.first) * rb;
    l.size = std::min<VkDeviceSize>((static_cast<VkDeviceSize>(win.second - win.first) * rb + 3) / 4 * 4, w.size - (l.off - w.off));
    return l;
  };
  // Binds window `win` of weight `wn` (at `w`) for get_rows / matmul: at binding 0; for MLX, the codes
  // there, the scales and biases at bindings 3 and 4 and the parameters in pc[24..26] (common.glsl).
  // After d.pc is set.
  auto bind_weight = [&](Dispatch& d, const Loc& w, const Node& wn, int64_t cols, std::pair<int64_t, int64_t> win) {
    if (wn.type != DType::MLX_AFFINE) {
      d.bind[0] = window_loc(w, wn.type, cols, win);
      return;
    }
    const VkTensor& t = mlx_tensor(w, wn, cols);
    const VkDeviceSize first = static_cast<VkDeviceSize>(win.first), count = static_cast<VkDeviceSize>(win.second - win.first);
    auto section = [&](int k, VkDeviceSize start, uint64_t row) {
      const VkDeviceSize off = first * row;
      return Loc{w.tensor, start + off, std::min<VkDeviceSize>((count * row + 3) / 4 * 4, t.section_bytes[k] - off)};
    };
    d.bind[0] = section(0, 0, t.code_row);
    d.bind[3] = section(1, t.scales_off, t.scale_row);
    d.bind[4] = section(2, t.biases_off, t.scale_row);
    d.pc[24] = t.mlx.bits;
    d.pc[25] = t.mlx.group_size;
    d.pc[26] = static_cast<uint32_t>(t.mlx.scale_type);
  };
  auto need_weight = [&](const Node& n, int k) {
    const Node& w = src_node(n, k);
    const Support ok = supports(n.op, w.type);
    if (!ok.ok) fail("Vulkan backend: {} '{}': weight '{}' is {}: {}", op_name(n.op), n.name, w.name, dtype_name(w.type), ok.reason);
  };

  for (int32_t i = 0; i < count; ++i) {
    const Node& n = nodes[static_cast<size_t>(i)];
    Loc& out = p.loc[static_cast<size_t>(i)];
    temps.clear();
    auto result = [&](VkDeviceSize extra = 0) {
      const VkDeviceSize bytes = value_bytes(n.type, n.shape);
      out = {nullptr, arena.alloc(bytes + extra), bytes + extra};
      return out;
    };
    Dispatch d;
    d.node = i;
    switch (n.op) {
      case Op::Input:
        break;
      case Op::Constant: {
        VkTensor& t = vk_tensor(*n.tensor);
        out = {&t, 0, t.buf->size};
        break;
      }
      case Op::Reshape:
        out = loc_of(n.src[0]);
        break;
      case Op::GetRows: {
        const Node& t = src_node(n, 0);
        if (t.type == DType::I32) {  // ids of ids: a gather of 32-bit words, from any value
          const int64_t R = t.shape[0], C = t.shape[1];
          const uint64_t words = static_cast<uint64_t>(elements(n.shape));
          d.shader = "copy";
          d.bind[0] = as_f32(n, i, 0, true);
          d.bind[1] = loc_of(n.src[1]);
          d.bind[5] = result();
          d.pc = {5, u32(static_cast<int64_t>(words)), u32(C), u32(R), 0, 0, 0, u32(i)};
          d.groups = (words + 255) / 256;
          p.id_bound[static_cast<size_t>(i)] = R;
          break;
        }
        need_weight(n, 0);
        const int64_t R = t.shape[0], C = t.shape[1], rows = elements(src_node(n, 1).shape);
        d.shader = "get_rows";
        d.bind[1] = loc_of(n.src[1]);
        d.bind[5] = result();
        d.groups = (static_cast<uint64_t>(rows) * static_cast<uint64_t>((C + 31) / 32) + 63) / 64;
        p.id_bound[static_cast<size_t>(i)] = R;
        const Loc table = loc_of(n.src[0]);
        for (auto win : windows(table, t, R, C, 1)) {
          d.pc = {static_cast<uint32_t>(t.type), u32(R), u32(C), u32(rows), 0, u32(i), u32(win.first), u32(win.second)};
          bind_weight(d, table, t, C, win);
          p.dispatches.push_back(d);
        }
        d.shader.clear();
        break;
      }
      case Op::MatMul:
      case Op::MatMulId: {
        need_weight(n, 0);
        const Node& w = src_node(n, 0);
        d.shader = "matmul";
        d.bind[1] = as_f32(n, i, 1, false);
        d.bind[5] = result();
        const Loc wl = loc_of(n.src[0]);
        const int64_t chunks = (w.shape.back() + 31) / 32;
        uint32_t tpr = 1;  // threads per weight row
        while (tpr < 64 && tpr < chunks) tpr *= 2;
        const uint64_t rpw = 64 / tpr;
        d.pc[11] = tpr;
        if (n.op == Op::MatMul) {
          const int64_t O = w.shape[0], I = w.shape[1], N = elements(src_node(n, 1).shape) / I;
          for (auto win : windows(wl, w, O, I, 1)) {
            d.pc = {static_cast<uint32_t>(w.type), u32(O), u32(I), u32(N), 0};
            d.pc[8] = u32(i);
            d.pc[9] = u32(win.first);
            d.pc[10] = u32(win.second - win.first);
            d.pc[11] = tpr;
            bind_weight(d, wl, w, I, win);
            d.groups = (static_cast<uint64_t>(win.second - win.first) + rpw - 1) / rpw * static_cast<uint64_t>((N + 7) / 8);
            p.dispatches.push_back(d);
          }
        } else {
          const int64_t E = w.shape[0], O = w.shape[1], I = w.shape[2], N = n.shape[0], K = n.shape[1];
          d.bind[2] = loc_of(n.src[2]);
          const bool shared = src_node(n, 1).shape[1] == 1 && K != 1;
          for (auto win : windows(wl, w, E * O, I, O)) {
            d.pc = {static_cast<uint32_t>(w.type), u32(O), u32(I), u32(N * K), 1, u32(K), shared ? 1u : 0u, u32(E), u32(i),
                    u32(win.first / O), u32(win.second / O), tpr};
            bind_weight(d, wl, w, I, win);
            d.groups = (static_cast<uint64_t>(O) + rpw - 1) / rpw * static_cast<uint64_t>((N * K + 7) / 8);
            p.dispatches.push_back(d);
          }
          p.id_bound[static_cast<size_t>(i)] = E;
        }
        d.shader.clear();
        break;
      }
      case Op::Add:
      case Op::Mul:
      case Op::Div:
      case Op::Scale:
      case Op::GeluTanh:
      case Op::Softcap:
      case Op::Clamp: {
        d.shader = "elementwise";
        d.bind[0] = as_f32(n, i, 0, false);
        d.pc[1] = u32(elements(n.shape));
        if (n.op == Op::Add || n.op == Op::Mul || n.op == Op::Div) {
          d.bind[1] = as_f32(n, i, 1, false);
          const Shape& as = n.shape;
          const Shape& bs = src_node(n, 1).shape;
          if (as.size() > 6) fail("Vulkan backend: {} '{}': rank {} is above the 6 axes the shader handles", op_name(n.op), n.name, as.size());
          std::array<int64_t, 6> adim{1, 1, 1, 1, 1, 1}, bdim{1, 1, 1, 1, 1, 1}, bstride{};
          for (size_t k = 0; k < as.size(); ++k) adim[6 - as.size() + k] = as[k];
          for (size_t k = 0; k < bs.size(); ++k) bdim[6 - bs.size() + k] = bs[k];
          int64_t stride = 1;
          for (int k = 5; k >= 0; --k) {
            bstride[static_cast<size_t>(k)] = bdim[static_cast<size_t>(k)] == 1 ? 0 : stride;
            stride *= bdim[static_cast<size_t>(k)];
          }
          d.pc[0] = n.op == Op::Add ? 0 : n.op == Op::Mul ? 1 : 5;
          for (int k = 0; k < 6; ++k) {
            d.pc[static_cast<size_t>(3 + k)] = u32(adim[static_cast<size_t>(k)]);
            d.pc[static_cast<size_t>(9 + k)] = u32(bstride[static_cast<size_t>(k)]);
          }
        } else {
          d.pc[0] = n.op == Op::Scale ? 2 : n.op == Op::GeluTanh ? 3 : n.op == Op::Softcap ? 4 : 6;
          d.pc[15] = fbits(n.f[0]);
          d.pc[16] = fbits(n.f[1]);
        }
        d.bind[5] = result();
        d.groups = (static_cast<uint64_t>(elements(n.shape)) + 255) / 256;
        break;
      }
      case Op::RmsNorm:
      case Op::Softmax: {
        d.shader = "rows";
        d.bind[0] = as_f32(n, i, 0, false);
        const bool has_w = n.op == Op::RmsNorm && n.src[1] >= 0;
        if (has_w) d.bind[1] = as_f32(n, i, 1, false);
        const int64_t C = n.shape.back();
        d.pc = {n.op == Op::RmsNorm ? 0u : 1u, u32(C), fbits(n.f[0]), has_w ? 1u : 0u};
        d.bind[5] = result();
        d.groups = static_cast<uint64_t>(elements(n.shape) / C);
        break;
      }
      case Op::Rope: {
        d.shader = "rope";
        d.bind[0] = as_f32(n, i, 0, false);
        d.bind[1] = loc_of(n.src[1]);
        const int64_t T = n.shape[0], H = n.shape[1], D = n.shape[2], pairs = std::min<int64_t>(n.i[0], D / 2);
        d.bind[2] = {nullptr, p.consts_arena + rope_off[static_cast<size_t>(i)],
                     static_cast<VkDeviceSize>(std::max<int64_t>(pairs, 1)) * 4};
        d.pc = {u32(T), u32(H), u32(D), u32(pairs)};
        d.bind[5] = result();
        d.groups = (static_cast<uint64_t>(T * H * (D / 2)) + 63) / 64;
        break;
      }
      case Op::Attention: {
        const Node& q = src_node(n, 0);
        const Node& k = src_node(n, 1);
        const Node& v = src_node(n, 2);
        for (const Node* kv : {&k, &v})
          if (!plain_float(kv->type))
            fail("Vulkan backend: Attention '{}': '{}' is {}; {}", n.name, kv->name, dtype_name(kv->type),
                 supports(Op::Attention, kv->type).reason);
        const int64_t T = q.shape[0], Hq = q.shape[1], S = k.shape[0];
        d.shader = "attention";
        d.bind[0] = as_f32(n, i, 0, false);
        d.bind[1] = loc_of(n.src[1]);
        d.bind[2] = loc_of(n.src[2]);
        d.bind[3] = loc_of(n.src[3]);
        d.bind[4] = loc_of(n.src[4]);
        const bool in_use = n.src[5] >= 0;  // slots in use: the shader reads only those
        if (in_use) d.bind[6] = loc_of(n.src[5]);
        d.bind[5] = result();
        d.pc = {u32(T), u32(Hq), u32(q.shape[2]), u32(S), u32(k.shape[1]), u32(v.shape[2]), fbits(n.f[0]),
                u32(n.i[0]), n.i[1] != 0 ? 1u : 0u, static_cast<uint32_t>(k.type), static_cast<uint32_t>(v.type),
                in_use ? 1u : 0u};
        if (v.shape[2] > 1024)
          fail("Vulkan backend: Attention '{}': V head dim {} is above the 1024 the shader accumulates", n.name, v.shape[2]);
        d.groups = static_cast<uint64_t>(T * Hq);
        break;
      }
      case Op::TopK:
      case Op::Argmax: {
        d.shader = "topk";
        d.bind[0] = as_f32(n, i, 0, false);
        const int64_t C = src_node(n, 0).shape.back(), K = n.op == Op::TopK ? n.i[0] : 1;
        d.pc = {u32(C), u32(K)};
        d.bind[5] = result();
        d.groups = static_cast<uint64_t>(elements(n.shape) / K);
        break;
      }
      case Op::Slice:
      case Op::Concat: {
        d.shader = "copy";
        d.bind[0] = as_f32(n, i, 0, true);
        const uint64_t words = static_cast<uint64_t>(elements(n.shape));
        if (n.op == Op::Slice) {
          d.pc = {0, u32(static_cast<int64_t>(words)), u32(src_node(n, 0).shape.back()), u32(n.i[0]), u32(n.i[1])};
        } else {
          d.bind[1] = as_f32(n, i, 1, true);
          d.pc = {1, u32(static_cast<int64_t>(words)), u32(src_node(n, 0).shape.back()), u32(src_node(n, 1).shape.back())};
        }
        d.bind[5] = result();
        d.groups = (words + 255) / 256;
        break;
      }
      case Op::TopPDraw: {
        d.shader = "top_p_draw";
        d.bind[0] = as_f32(n, i, 0, false);
        d.bind[1] = as_f32(n, i, 1, false);
        d.bind[2] = loc_of(n.src[2]);
        d.bind[5] = result();
        d.pc = {u32(src_node(n, 0).shape[0]), std::bit_cast<uint32_t>(n.f[1]), std::bit_cast<uint32_t>(n.f[2]),
                std::bit_cast<uint32_t>(n.f[3])};
        d.groups = 1;
        break;
      }
      case Op::Scatter: {
        // A copy of a, then the scattered values (the barrier between them comes from the overlap).
        const int64_t N = n.shape[0], M = src_node(n, 1).shape[0];
        Dispatch c;
        c.shader = "copy";
        c.node = i;
        c.bind[0] = as_f32(n, i, 0, false);
        c.bind[5] = result();
        c.pc = {0, u32(N), u32(N), 0, u32(N)};
        c.groups = (static_cast<uint64_t>(N) + 255) / 256;
        p.dispatches.push_back(c);
        d.shader = "copy";
        d.bind[1] = loc_of(n.src[1]);
        d.bind[2] = as_f32(n, i, 2, false);
        d.bind[5] = out;
        d.pc = {4, u32(M), 0, u32(N), 0, 0, 0, u32(i)};
        d.groups = (static_cast<uint64_t>(M) + 255) / 256;
        p.id_bound[static_cast<size_t>(i)] = N;
        break;
      }
      case Op::Copy: {
        if (!plain_float(n.type))
          fail("Vulkan backend: Copy '{}' to {}: {}", n.name, dtype_name(n.type), supports(Op::Copy, n.type).reason);
        d.shader = "copy";
        d.bind[0] = as_f32(n, i, 0, false);
        const int64_t cnt = elements(n.shape);
        const uint64_t words = n.type == DType::F32 ? static_cast<uint64_t>(cnt) : static_cast<uint64_t>(cnt + 1) / 2;
        d.pc = {2, u32(static_cast<int64_t>(words)), 0, 0, 0, static_cast<uint32_t>(n.type), 0, u32(i), u32(cnt)};
        d.bind[5] = result();
        d.groups = (words + 255) / 256;
        break;
      }
      case Op::WriteRows: {
        VkTensor& t = vk_tensor(*n.tensor);
        if (t.weight)
          fail("Vulkan backend: WriteRows '{}': '{}' is a read-only weight; write into a tensor from allocate()", n.name, t.name());
        const Support ok = supports(Op::WriteRows, t.type());
        if (!ok.ok) fail("Vulkan backend: WriteRows '{}' into '{}': {}", n.name, t.name(), ok.reason);
        const int64_t R = t.shape()[0], C = elements(t.shape()) / R, N = src_node(n, 2).shape[0];
        const bool wide = t.type() == DType::F32 || t.type() == DType::I32;
        if (!wide && C % 2 != 0)
          fail("Vulkan backend: WriteRows '{}': rows of {} {} values are not whole 32-bit words (odd row length)", n.name,
               C, dtype_name(t.type()));
        d.shader = "copy";
        d.bind[0] = as_f32(n, i, 1, t.type() == DType::I32);
        d.bind[2] = loc_of(n.src[2]);
        out = {&t, 0, t.buf->size};
        d.bind[5] = out;
        const uint64_t words = static_cast<uint64_t>(N) * static_cast<uint64_t>(wide ? C : C / 2);
        d.pc = {3, u32(static_cast<int64_t>(words)), u32(C), u32(R), 0, static_cast<uint32_t>(t.type()), u32(N), u32(i)};
        d.groups = (words + 255) / 256;
        p.id_bound[static_cast<size_t>(i)] = R;
        break;
      }
      default:
        fail("Vulkan backend: node '{}' is {}, which the Vulkan backend does not implement", n.name, op_name(n.op));
    }
    if (!d.shader.empty() && d.groups > 0) p.dispatches.push_back(d);
    for (auto [off, size] : temps) arena.release(off, size);
    for (int32_t s : n.src)
      if (s >= 0) release_if_done(s, i);
    release_if_done(i, i);
  }

  VkDeviceSize readback_size = 0;
  for (int32_t o : g.outputs()) {
    // A persistent tensor (a cache after WriteRows) is read from its buffer when asked: copying it out
    // every run would cost its whole size (a KV cache: the allocated context) per step.
    if (p.readback_off.count(o) || p.loc[static_cast<size_t>(o)].tensor) continue;
    p.readback_off[o] = readback_size;
    readback_size += (value_bytes(nodes[static_cast<size_t>(o)].type, nodes[static_cast<size_t>(o)].shape) + 15) / 16 * 16;
  }
  p.arena = dev_->buffer(std::max<VkDeviceSize>(arena.size(), 16), false, "graph intermediates", dev_);
  p.staging = dev_->buffer(std::max<VkDeviceSize>(staging_size, 16), true, "graph inputs", dev_);
  p.readback = dev_->buffer(std::max<VkDeviceSize>(readback_size, 16), true, "graph outputs", dev_);
  p.err = dev_->buffer(16, true, "error record", dev_);
  if (!p.consts.empty()) std::memcpy(static_cast<std::byte*>(p.staging->map) + p.consts_staging, p.consts.data(), p.consts.size());
  for (const Dispatch& d : p.dispatches)
    for (const Loc& l : d.bind)
      if (l.valid() && l.size > max_range)
        fail("Vulkan backend: {} '{}' binds {} bytes{}, above the binding limit of {} bytes (maxStorageBufferRange)",
             op_name(nodes[static_cast<size_t>(d.node)].op), nodes[static_cast<size_t>(d.node)].name, l.size,
             l.tensor ? " of '" + l.tensor->name() + "'" : std::string(), max_range);
  record(p, nodes);
  return plan;
}

void VulkanBackend::record(Plan& p, const std::vector<Node>& graph_nodes) {
  VkDevice d = dev_->dev;
  const uint32_t sets = static_cast<uint32_t>(std::max<size_t>(p.dispatches.size(), 1));
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, sets * 8};
  VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  pi.maxSets = sets;
  pi.poolSizeCount = 1;
  pi.pPoolSizes = &ps;
  check(vkCreateDescriptorPool(d, &pi, nullptr, &p.pool), "vkCreateDescriptorPool");
  std::vector<VkDescriptorSetLayout> layouts(sets, set_layout_);
  std::vector<VkDescriptorSet> ds(sets);
  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = p.pool;
  ai.descriptorSetCount = sets;
  ai.pSetLayouts = layouts.data();
  check(vkAllocateDescriptorSets(d, &ai, ds.data()), "vkAllocateDescriptorSets");

  auto info = [&](const Loc& l) -> VkDescriptorBufferInfo {
    if (l.tensor) return {l.tensor->buf->buf, l.off, l.size};
    if (l.size > 0) return {p.arena->buf, l.off, l.size};
    return {dummy_->buf, 0, VK_WHOLE_SIZE};
  };
  for (size_t k = 0; k < p.dispatches.size(); ++k) {
    std::array<VkDescriptorBufferInfo, 8> bi;
    for (size_t b = 0; b < 6; ++b) bi[b] = info(p.dispatches[k].bind[b]);
    bi[6] = {p.err->buf, 0, VK_WHOLE_SIZE};
    bi[7] = info(p.dispatches[k].bind[6]);
    VkWriteDescriptorSet w{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    w.dstSet = ds[k];
    w.descriptorCount = 8;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = bi.data();
    vkUpdateDescriptorSets(d, 1, &w, 0, nullptr);
  }

  VkCommandBufferAllocateInfo ci{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ci.commandPool = dev_->cmd_pool;
  ci.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ci.commandBufferCount = 1;
  check(vkAllocateCommandBuffers(d, &ci, &p.cmd), "vkAllocateCommandBuffers");
  VkCommandBuffer cb = p.cmd;
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  vkBeginCommandBuffer(cb, &bi);
  // Earlier submissions (weight uploads, writes, previous runs) complete before anything here.
  full_barrier(cb, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT,
               VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
               VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
               VK_PIPELINE_STAGE_TRANSFER_BIT);
  vkCmdFillBuffer(cb, p.err->buf, 0, VK_WHOLE_SIZE, 0);
  std::vector<VkBufferCopy> copies;
  for (const auto& in : p.inputs)
    if (in.bytes > 0) copies.push_back({in.staging_off, in.arena_off, in.bytes});
  if (!p.consts.empty()) copies.push_back({p.consts_staging, p.consts_arena, p.consts.size()});
  if (!copies.empty()) vkCmdCopyBuffer(cb, p.staging->buf, p.arena->buf, static_cast<uint32_t>(copies.size()), copies.data());
  full_barrier(cb, VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT,
               VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT,
               VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);

  // A barrier only where a dispatch touches a range written since the last one, or writes a range
  // read since then (arena ranges are reused).
  struct Range {
    VkBuffer b;
    VkDeviceSize off, size;
  };
  auto range = [&](const Loc& l) -> Range {
    if (l.tensor) return {l.tensor->buf->buf, l.off, l.size};
    return {p.arena->buf, l.off, l.size};
  };
  auto overlaps = [](const std::vector<Range>& v, const Range& r) {
    for (const Range& x : v)
      if (x.b == r.b && x.off < r.off + r.size && r.off < x.off + x.size) return true;
    return false;
  };
  std::vector<Range> written, read;
  VkPipeline bound = VK_NULL_HANDLE;
  for (size_t k = 0; k < p.dispatches.size(); ++k) {
    const Dispatch& dp = p.dispatches[k];
    bool need = false;
    const Range w = range(dp.bind[5]);
    for (size_t b : {0, 1, 2, 3, 4, 6})
      if (dp.bind[b].valid() && overlaps(written, range(dp.bind[b]))) need = true;
    if (overlaps(written, w) || overlaps(read, w)) need = true;
    if (need) {
      full_barrier(cb, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT,
                   VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
      written.clear();
      read.clear();
    }
    for (size_t b : {0, 1, 2, 3, 4, 6})
      if (dp.bind[b].valid()) read.push_back(range(dp.bind[b]));
    written.push_back(w);
    VkPipeline pl = pipeline(dp.shader);
    if (pl != bound) vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl);
    bound = pl;
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, playout_, 0, 1, &ds[k], 0, nullptr);
    vkCmdPushConstants(cb, playout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, 128, dp.pc.data());
    const auto [x, y] = grid(dp.groups);
    vkCmdDispatch(cb, x, y, 1);
  }
  full_barrier(cb, VK_ACCESS_SHADER_WRITE_BIT, VK_ACCESS_TRANSFER_READ_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
               VK_PIPELINE_STAGE_TRANSFER_BIT);
  for (const auto& [node, off] : p.readback_off) {
    const Loc& l = p.loc[static_cast<size_t>(node)];
    const Node& n = graph_nodes[static_cast<size_t>(node)];
    if (!l.valid()) continue;
    const Range r = range(l);
    VkBufferCopy c{r.off, off, std::min<VkDeviceSize>(value_bytes(n.type, n.shape), r.size)};
    vkCmdCopyBuffer(cb, r.b, p.readback->buf, 1, &c);
  }
  full_barrier(cb, VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT, VK_ACCESS_HOST_READ_BIT,
               VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT);
  check(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
}

void VkCompiled::run(const RunInputs& inputs) { backend_.run(*this, inputs); }
void VkCompiled::read(Value output, std::span<std::byte> dst) const { backend_.read(*this, output, dst); }

void VulkanBackend::run(VkCompiled& c, const RunInputs& inputs) {
  const Graph& graph = c.graph_;
  const auto& nodes = graph.nodes();
  if (nodes.size() != c.nodes_)
    fail("Vulkan backend: a graph of {} nodes was compiled, it has {} now; compile it again after changing it",
         c.nodes_, nodes.size());
  c.ran_ = false;
  // Inputs: each Input node given exactly once, with the right size (checked before any device work).
  std::vector<const std::span<const std::byte>*> given(nodes.size(), nullptr);
  for (const auto& in : inputs.inputs) {
    const Node& n = graph.node(in.first);
    if (n.op != Op::Input) fail("Vulkan backend: run: node '{}' is a {}, not an Input", n.name, op_name(n.op));
    const size_t want = static_cast<size_t>(elements(n.shape)) * plain_size(n.type);
    if (in.second.size() != want)
      fail("Vulkan backend: input '{}' {} {} needs {} bytes but was given {}", n.name, dtype_name(n.type),
           shape_str(n.shape), want, in.second.size());
    if (given[static_cast<size_t>(in.first.id)]) fail("Vulkan backend: input '{}' was given twice", n.name);
    given[static_cast<size_t>(in.first.id)] = &in.second;
  }
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].op == Op::Input && !given[i])
      fail("Vulkan backend: input '{}' {} {} was not given to run()", nodes[i].name, dtype_name(nodes[i].type),
           shape_str(nodes[i].shape));

  Plan& p = *c.plan_;
  for (const auto& in : p.inputs)
    if (in.bytes > 0) std::memcpy(static_cast<std::byte*>(p.staging->map) + in.staging_off, given[static_cast<size_t>(in.node)]->data(), in.bytes);
  dev_->submit_wait(p.cmd);
  const auto* err = static_cast<const uint32_t*>(p.err->map);
  if (err[0] != 0) {
    const Node& n = nodes[std::min<size_t>(err[1], nodes.size() - 1)];
    fail("Vulkan backend: {} '{}': id {} at index {} is outside [0, {})", op_name(n.op), n.name,
         static_cast<int32_t>(err[2]), err[3], p.id_bound[std::min<size_t>(err[1], nodes.size() - 1)]);
  }
  c.ran_ = true;
}

void VulkanBackend::read(const VkCompiled& c, Value output, std::span<std::byte> dst) {
  const Plan& p = *c.plan_;
  const Node& n = c.graph_.node(output);
  if (!c.ran_) fail("Vulkan backend: read: '{}' before the graph has run", n.name);
  const int64_t count = elements(n.shape);
  const size_t want = static_cast<size_t>(count) * 4;
  if (dst.size() != want)
    fail("Vulkan backend: read: '{}' {} {} needs {} bytes ({} as {}) but the destination has {}", n.name,
         dtype_name(n.type), shape_str(n.shape), want, count, n.type == DType::I32 ? "I32" : "F32", dst.size());
  const Loc& l = p.loc[static_cast<size_t>(output.id)];
  const std::byte* src = nullptr;
  std::vector<std::byte> host;
  auto ro = p.readback_off.find(output.id);
  if (ro != p.readback_off.end()) {
    src = static_cast<const std::byte*>(p.readback->map) + ro->second;
  } else if (l.tensor) {
    read(*l.tensor, dst);  // a persistent tensor: its current contents
    return;
  } else if (n.op == Op::Input) {
    for (const auto& in : p.inputs)
      if (in.node == output.id) src = static_cast<const std::byte*>(p.staging->map) + in.staging_off;
  }
  if (!src) fail("Vulkan backend: read: '{}' was not marked as an output of the graph (Graph::mark_output)", n.name);
  if (n.type == DType::F32 || n.type == DType::I32 || n.type == DType::U32) {
    std::memcpy(dst.data(), src, want);
    return;
  }
  if (!can_dequantize(n.type))
    fail("Vulkan backend: read: '{}' is {}, which cannot be read as F32", n.name, dtype_name(n.type));
  const int64_t cols = n.shape.back(), rows = count / cols;
  const uint64_t rb = *dtype_row_bytes(n.type, static_cast<uint64_t>(cols));
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(n.type, src + static_cast<size_t>(r) * rb, reinterpret_cast<float*>(dst.data()) + r * cols, cols);
}

void VulkanBackend::read(const BackendTensor& tensor, std::span<std::byte> dst) {
  VkTensor& t = vk_tensor(tensor);
  const int64_t cols = t.shape().back(), rows = elements(t.shape()) / cols;
  const size_t want = static_cast<size_t>(rows * cols) * 4;
  if (dst.size() != want)
    fail("Vulkan backend: read: tensor '{}' {} {} needs {} bytes but the destination has {}", t.name(),
         dtype_name(t.type()), shape_str(t.shape()), want, dst.size());
  if (t.type() == DType::I32 || t.type() == DType::F32 || t.type() == DType::U32) {
    download(*t.buf, dst.data(), want);
    return;
  }
  if (!can_dequantize(t.type()))
    fail("Vulkan backend: read: tensor '{}' is {}, which cannot be read as F32", t.name(), dtype_name(t.type()));
  std::vector<std::byte> raw(t.bytes);
  download(*t.buf, raw.data(), t.bytes);
  const uint64_t rb = *dtype_row_bytes(t.type(), static_cast<uint64_t>(cols));
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(t.type(), raw.data() + static_cast<size_t>(r) * rb, reinterpret_cast<float*>(dst.data()) + r * cols, cols);
}

void VulkanBackend::write(BackendTensor& tensor, std::span<const std::byte> src) {
  VkTensor& t = vk_tensor(tensor);
  if (t.weight) fail("Vulkan backend: write: '{}' is a read-only weight", t.name());
  if (src.size() == t.bytes) {
    upload(*t.buf, src.data(), src.size());
    return;
  }
  const int64_t n = elements(t.shape());
  const bool is_float = t.type() == DType::F16 || t.type() == DType::BF16;
  if (is_float && src.size() == static_cast<size_t>(n) * 4) {
    std::vector<std::byte> enc(t.bytes);
    quantize_row(t.type(), reinterpret_cast<const float*>(src.data()), enc.data(), n);
    upload(*t.buf, enc.data(), enc.size());
    return;
  }
  fail("Vulkan backend: write: '{}' {} {} takes {} bytes ({}){} but was given {}", t.name(), dtype_name(t.type()),
       shape_str(t.shape()), t.bytes, dtype_name(t.type()),
       is_float ? fmt::format(" or {} bytes (F32)", n * 4) : std::string(), src.size());
}

const char* type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return "discrete GPU";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return "integrated GPU";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return "virtual GPU";
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return "CPU";
    default: return "other";
  }
}

int type_rank(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 4;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 3;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 1;
    default: return 0;
  }
}

// The shared objects mapped into the process, by path.
std::set<std::string> loaded_objects() {
  std::set<std::string> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        if (info->dlpi_name && *info->dlpi_name) static_cast<std::set<std::string>*>(data)->insert(info->dlpi_name);
        return 0;
      },
      &out);
  return out;
}

// Keeps the libraries the Vulkan loader mapped for the driver (the ICD, and LLVM for lavapipe) mapped
// until exit, as the host keeps plugins: a driver unloaded by vkDestroyInstance takes with it the static
// data that still points at its allocations (LeakSanitizer then reports them) and may leave handlers.
void keep_mapped_since(const std::set<std::string>& before) {
  for (const std::string& name : loaded_objects())
    if (!before.count(name)) dlopen(name.c_str(), RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
}

}  // namespace

uint64_t vulkan_memory_allocations(const ComputeBackend& backend) {
  const auto* vk = dynamic_cast<const VulkanBackend*>(&backend);
  if (!vk) fail("vulkan_memory_allocations: backend '{}' is not the Vulkan backend", backend.name());
  return vk->memory_allocations();
}

std::unique_ptr<ComputeBackend> make_vulkan_backend(const nlohmann::json& options) {
  nlohmann::json device_opt;
  uint64_t max_binding = 0;
  if (options.is_object()) {
    for (const auto& [key, value] : options.items()) {
      if (key == "device") {
        device_opt = value;
      } else if (key == "max_binding_bytes") {
        if (!value.is_number_integer() || value.get<int64_t>() < 4096)
          fail("vulkan backend: option 'max_binding_bytes' = {} must be an integer >= 4096", value.dump());
        max_binding = value.get<uint64_t>();
      } else {
        fail("vulkan backend: unknown option '{}' (known: device, max_binding_bytes)", key);
      }
    }
  } else if (!options.is_null()) {
    fail("vulkan backend: options must be a mapping, got {}", options.dump());
  }
  if (!device_opt.is_null() && !device_opt.is_string() && !(device_opt.is_number_integer() && device_opt.get<int64_t>() >= 0))
    fail("vulkan backend: option 'device' = {} must be a device index (0, 1, ...) or a name substring", device_opt.dump());

  const char* no_device = "no Vulkan device: install mesa-vulkan-drivers for the CPU implementation, or a GPU driver";
  auto dev = std::make_shared<Device>();
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO};
  app.pApplicationName = "specula";
  app.apiVersion = VK_API_VERSION_1_2;
  VkInstanceCreateInfo ii{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
  ii.pApplicationInfo = &app;
  const std::set<std::string> before = loaded_objects();
  const VkResult ir = vkCreateInstance(&ii, nullptr, &dev->instance);
  if (ir != VK_SUCCESS) fail("vulkan backend: {} (vkCreateInstance: VkResult {})", no_device, static_cast<int>(ir));
  uint32_t count = 0;
  vkEnumeratePhysicalDevices(dev->instance, &count, nullptr);
  std::vector<VkPhysicalDevice> phys(count);
  if (count) vkEnumeratePhysicalDevices(dev->instance, &count, phys.data());
  keep_mapped_since(before);
  std::vector<VkPhysicalDeviceProperties> props(count);
  std::string listing;
  for (uint32_t i = 0; i < count; ++i) {
    vkGetPhysicalDeviceProperties(phys[i], &props[i]);
    listing += fmt::format("{}{}: {} ({})", i ? ", " : "", i, props[i].deviceName, type_name(props[i].deviceType));
  }
  if (count == 0) fail("vulkan backend: {}", no_device);

  int pick = -1;
  if (device_opt.is_number_integer()) {
    const int64_t idx = device_opt.get<int64_t>();
    if (idx >= count) fail("vulkan backend: option 'device' = {} but there are {} Vulkan devices ({})", idx, count, listing);
    pick = static_cast<int>(idx);
  } else if (device_opt.is_string()) {
    const std::string want = device_opt.get<std::string>();
    for (uint32_t i = 0; i < count && pick < 0; ++i)
      if (std::string(props[i].deviceName).find(want) != std::string::npos) pick = static_cast<int>(i);
    if (pick < 0) fail("vulkan backend: option 'device' = '{}' names none of the Vulkan devices ({})", want, listing);
  } else {
    for (uint32_t i = 0; i < count; ++i)
      if (props[i].apiVersion >= VK_API_VERSION_1_2 &&
          (pick < 0 || type_rank(props[i].deviceType) > type_rank(props[static_cast<size_t>(pick)].deviceType)))
        pick = static_cast<int>(i);
    if (pick < 0) fail("vulkan backend: no device supports Vulkan 1.2 ({})", listing);
  }
  dev->phys = phys[static_cast<size_t>(pick)];
  dev->props = props[static_cast<size_t>(pick)];
  if (dev->props.apiVersion < VK_API_VERSION_1_2)
    fail("vulkan backend: device {} ({}) supports Vulkan {}.{}, below the 1.2 this backend needs", pick,
         dev->props.deviceName, VK_API_VERSION_MAJOR(dev->props.apiVersion), VK_API_VERSION_MINOR(dev->props.apiVersion));
  vkGetPhysicalDeviceMemoryProperties(dev->phys, &dev->mem_props);
  dev->max_binding = dev->props.limits.maxStorageBufferRange;
  if (max_binding > 0) dev->max_binding = std::min<VkDeviceSize>(dev->max_binding, max_binding);

  uint32_t qcount = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(dev->phys, &qcount, nullptr);
  std::vector<VkQueueFamilyProperties> qf(qcount);
  vkGetPhysicalDeviceQueueFamilyProperties(dev->phys, &qcount, qf.data());
  int family = -1;
  for (uint32_t i = 0; i < qcount && family < 0; ++i)
    if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = static_cast<int>(i);
  if (family < 0) fail("vulkan backend: device {} ({}) has no compute queue", pick, dev->props.deviceName);
  dev->queue_family = static_cast<uint32_t>(family);
  const float prio = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = dev->queue_family;
  qi.queueCount = 1;
  qi.pQueuePriorities = &prio;
  VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  check(vkCreateDevice(dev->phys, &di, nullptr, &dev->dev), "vkCreateDevice");
  vkGetDeviceQueue(dev->dev, dev->queue_family, 0, &dev->queue);
  VkCommandPoolCreateInfo ci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  ci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  ci.queueFamilyIndex = dev->queue_family;
  check(vkCreateCommandPool(dev->dev, &ci, nullptr, &dev->cmd_pool), "vkCreateCommandPool");
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(vkCreateFence(dev->dev, &fi, nullptr, &dev->fence), "vkCreateFence");
  log_debug("vulkan backend: device {} of [{}]", pick, listing);
  return std::make_unique<VulkanBackend>(std::move(dev));
}

}  // namespace specula::vulkan

// The Vulkan backend's device and memory: the instance, device and queue (Device), buffers and the shared
// blocks weights are bound in, persistent tensors (VkTensor), and choosing the device. Internal to the
// plugin (vk_backend.hpp is its interface).
#pragma once

#include <vulkan/vulkan.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "specula/compute.hpp"
#include "specula/error.hpp"
#include "specula/quant.hpp"

namespace specula::vulkan::detail {

inline int64_t elements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

inline void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) fail("Vulkan backend: {} failed (VkResult {})", what, static_cast<int>(r));
}

// Types the shaders decode (common.glsl decode_chunk / load*).
inline bool decodable(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0: case DType::Q4_1:
    case DType::Q5_0: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: case DType::IQ4_NL:
    case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}
inline bool plain_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }

inline size_t plain_size(DType t) {
  const DTypeTraits* tr = dtype_traits(t);
  return tr && !tr->quantized ? tr->block_bytes : 0;
}

// Bytes of a value of `shape` stored as `t` (whole rows of blocks), rounded up to 4 for word access.
inline uint64_t value_bytes(DType t, const Shape& shape) {
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
  bool subgroup_shuffle = false;  // compute shaders may shuffle within a subgroup (and the option allows it)
  uint32_t subgroup_size = 0;
  // Cooperative matrices (VK_NV_cooperative_matrix, fp16 inputs and fp32 sums, subgroup scope): enabled
  // when the device has them and the option allows; the tile shape the matmul shaders use.
  bool coopmat = false;
  uint32_t coopmat_m = 0, coopmat_n = 0, coopmat_k = 0;
  std::string capabilities;  // for people: what the device offers the shaders (DeviceInfo, logs)
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

  // A storage buffer (also a copy source and destination) of `size` bytes with no memory bound yet, and
  // what its memory must be.
  std::unique_ptr<Buffer> unbound_buffer(VkDeviceSize size, const std::shared_ptr<Device>& self,
                                         VkMemoryRequirements& req) {
    auto b = std::make_unique<Buffer>();
    b->dev = self;
    b->size = std::max<VkDeviceSize>(size, 16);
    VkBufferCreateInfo ci{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    ci.size = b->size;
    ci.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    ci.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    check(vkCreateBuffer(dev, &ci, nullptr, &b->buf), "vkCreateBuffer");
    vkGetBufferMemoryRequirements(dev, b->buf, &req);
    return b;
  }

  // Device-local storage, or host-visible coherent staging.
  std::unique_ptr<Buffer> buffer(VkDeviceSize size, bool host, const std::string& what,
                                 const std::shared_ptr<Device>& self) {
    VkMemoryRequirements req;
    auto b = unbound_buffer(size, self, req);
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
    VkMemoryRequirements req;
    auto b = unbound_buffer(size, self, req);
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

// Every barrier the host needs before reading or after writing a buffer: all prior device work.
void full_barrier(VkCommandBuffer cb, VkAccessFlags src, VkAccessFlags dst, VkPipelineStageFlags src_stage,
                  VkPipelineStageFlags dst_stage);

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

inline VkTensor& vk_tensor(const BackendTensor& t) {
  auto* v = dynamic_cast<const VkTensor*>(&t);
  if (!v) fail("Vulkan backend: tensor '{}' belongs to another backend", t.name());
  return const_cast<VkTensor&>(*v);
}

// Choosing a device: a readable name and a preference rank per device type (discrete GPU first).
const char* type_name(VkPhysicalDeviceType t);
int type_rank(VkPhysicalDeviceType t);
// The shared objects mapped into the process, and keeping those mapped since `before` until exit.
std::set<std::string> loaded_objects();
void keep_mapped_since(const std::set<std::string>& before);

}  // namespace specula::vulkan::detail

#include "vk_device.hpp"

#include <dlfcn.h>
#include <link.h>

namespace specula::vulkan::detail {

Buffer::~Buffer() {
  if (!dev) return;
  if (buf) vkDestroyBuffer(dev->dev, buf, nullptr);
  if (mem) vkFreeMemory(dev->dev, mem, nullptr);
}

MemoryBlock::~MemoryBlock() {
  if (dev && mem) vkFreeMemory(dev->dev, mem, nullptr);
}

void full_barrier(VkCommandBuffer cb, VkAccessFlags src, VkAccessFlags dst, VkPipelineStageFlags src_stage,
                  VkPipelineStageFlags dst_stage) {
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  mb.srcAccessMask = src;
  mb.dstAccessMask = dst;
  vkCmdPipelineBarrier(cb, src_stage, dst_stage, 0, 1, &mb, 0, nullptr, 0, nullptr);
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

}  // namespace specula::vulkan::detail

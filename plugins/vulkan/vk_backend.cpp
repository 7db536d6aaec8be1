#include "vk_backend.hpp"

#include <dlfcn.h>

#include <cmath>
#include <cstring>

#include "shaders.hpp"
#include "specula/log.hpp"
#include "vk_backend_impl.hpp"

namespace specula::vulkan {
namespace detail {

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

void VulkanBackend::through_staging(uint64_t bytes, const std::function<void(Buffer&, uint64_t, uint64_t)>& chunk_fn) {
  if (bytes == 0) return;
  const uint64_t chunk = std::min<uint64_t>(bytes, kStagingChunk);
  std::lock_guard<std::mutex> lock(staging_mu_);
  Buffer& st = staging(chunk);
  for (uint64_t done = 0; done < bytes; done += chunk) chunk_fn(st, done, std::min(chunk, bytes - done));
}

void VulkanBackend::upload(Buffer& dst, const void* data, uint64_t bytes, VkDeviceSize dst_off) {
  through_staging(bytes, [&](Buffer& st, uint64_t done, uint64_t n) {
    std::memcpy(st.map, static_cast<const std::byte*>(data) + done, n);
    dev_->submit_now([&](VkCommandBuffer cb) {
      VkBufferCopy c{0, dst_off + done, n};
      vkCmdCopyBuffer(cb, st.buf, dst.buf, 1, &c);
    });
  });
}

void VulkanBackend::download(const Buffer& src, void* data, uint64_t bytes) {
  through_staging(bytes, [&](Buffer& st, uint64_t done, uint64_t n) {
    dev_->submit_now([&](VkCommandBuffer cb) {
      full_barrier(cb, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_TRANSFER_READ_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT);
      VkBufferCopy c{done, 0, n};
      vkCmdCopyBuffer(cb, src.buf, st.buf, 1, &c);
      full_barrier(cb, VK_ACCESS_TRANSFER_WRITE_BIT, VK_ACCESS_HOST_READ_BIT, VK_PIPELINE_STAGE_TRANSFER_BIT,
                   VK_PIPELINE_STAGE_HOST_BIT);
    });
    std::memcpy(static_cast<std::byte*>(data) + done, st.map, n);
  });
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

}  // namespace detail

using namespace detail;

uint64_t vulkan_memory_allocations(const ComputeBackend& backend) {
  const auto* vk = dynamic_cast<const VulkanBackend*>(&backend);
  if (!vk) fail("vulkan_memory_allocations: backend '{}' is not the Vulkan backend", backend.name());
  return vk->memory_allocations();
}

namespace {
struct DeviceFeatures {
  bool coopmat = false;
  uint32_t m = 0, n = 0, k = 0;
  std::string description;  // ", fp16, ..., cooperative matrices fp16 16x8x16 16x16x16"
};

// What the device offers the shaders beyond Vulkan 1.2's core, and whether matmuls may use cooperative
// matrices: VK_NV_cooperative_matrix with fp16 A and B, fp32 C and D at subgroup scope (the tile shape:
// 16x16x16 where listed, else 16x8x16), fp16 shader
// arithmetic, and `allowed` (option cooperative_matrix).
DeviceFeatures device_features(VkInstance instance, VkPhysicalDevice phys, bool allowed) {
  DeviceFeatures out;
  uint32_t n_ext = 0;
  vkEnumerateDeviceExtensionProperties(phys, nullptr, &n_ext, nullptr);
  std::vector<VkExtensionProperties> exts(n_ext);
  if (n_ext) vkEnumerateDeviceExtensionProperties(phys, nullptr, &n_ext, exts.data());
  auto has = [&](const char* name) {
    return std::any_of(exts.begin(), exts.end(), [&](const VkExtensionProperties& e) { return std::strcmp(e.extensionName, name) == 0; });
  };
  VkPhysicalDeviceCooperativeMatrixFeaturesNV cm{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceFeatures2 f2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
  f2.pNext = &f11;
  f11.pNext = &f12;
  const bool has_cm = has(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
  if (has_cm) f12.pNext = &cm;
  vkGetPhysicalDeviceFeatures2(phys, &f2);
  std::string& d = out.description;
  if (f12.shaderFloat16) d += ", fp16 arithmetic";
  if (f12.shaderInt8) d += ", int8 arithmetic";
  if (f11.storageBuffer16BitAccess) d += ", 16-bit storage";
  if (f12.storageBuffer8BitAccess) d += ", 8-bit storage";
  if (has("VK_KHR_shader_integer_dot_product")) d += ", integer dot products";
  if (has("VK_KHR_cooperative_matrix")) d += ", VK_KHR_cooperative_matrix";
  if (has("VK_NV_cooperative_matrix2")) d += ", VK_NV_cooperative_matrix2";
  if (!has_cm || !cm.cooperativeMatrix) return out;
  auto list = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  if (!list) return out;
  uint32_t count = 0;
  list(phys, &count, nullptr);
  std::vector<VkCooperativeMatrixPropertiesNV> shapes(count, {VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV});
  if (count) list(phys, &count, shapes.data());
  std::string listed;
  for (const auto& s : shapes) {
    if (s.AType != VK_COMPONENT_TYPE_FLOAT16_NV || s.BType != VK_COMPONENT_TYPE_FLOAT16_NV ||
        s.CType != VK_COMPONENT_TYPE_FLOAT32_NV || s.DType != VK_COMPONENT_TYPE_FLOAT32_NV || s.scope != VK_SCOPE_SUBGROUP_NV)
      continue;
    listed += fmt::format(" {}x{}x{}", s.MSize, s.NSize, s.KSize);
    const bool usable = s.KSize == 16 && s.MSize == 16 && (s.NSize == 16 || s.NSize == 8);  // the shaders' builds
    const bool better = !out.m || (s.MSize == 16 && s.NSize == 16);
    if (usable && better) out.m = s.MSize, out.n = s.NSize, out.k = s.KSize;
  }
  if (listed.empty()) return out;
  d += ", VK_NV_cooperative_matrix fp16->fp32" + listed;
  out.coopmat = allowed && f12.shaderFloat16 && out.m;
  if (out.coopmat) d += fmt::format(" (prompt matmuls on {}x{}x{} tiles)", out.m, out.n, out.k);
  else if (!allowed) d += " (off: option cooperative_matrix)";
  return out;
}

// The backend's options (docs/backends.md), checked.
struct BackendOptions {
  nlohmann::json device;     // an index, a name substring, or null: the best device
  uint64_t max_binding = 0;  // 0: the device's maxStorageBufferRange
  bool subgroups = true, profile = false, coopmat = true;
};

BackendOptions parse_options(const nlohmann::json& options) {
  BackendOptions o;
  if (options.is_object()) {
    for (const auto& [key, value] : options.items()) {
      if (key == "device") {
        o.device = value;
      } else if (key == "max_binding_bytes") {
        if (!value.is_number_integer() || value.get<int64_t>() < 4096)
          fail("vulkan backend: option 'max_binding_bytes' = {} must be an integer >= 4096", value.dump());
        o.max_binding = value.get<uint64_t>();
      } else if (key == "subgroups") {
        if (!value.is_boolean()) fail("vulkan backend: option 'subgroups' = {} must be true or false", value.dump());
        o.subgroups = value.get<bool>();
      } else if (key == "cooperative_matrix") {
        if (!value.is_boolean())
          fail("vulkan backend: option 'cooperative_matrix' = {} must be true or false", value.dump());
        o.coopmat = value.get<bool>();
      } else if (key == "profile") {
        if (!value.is_boolean()) fail("vulkan backend: option 'profile' = {} must be true or false", value.dump());
        o.profile = value.get<bool>();
      } else {
        fail("vulkan backend: unknown option '{}' (known: device, max_binding_bytes, subgroups, cooperative_matrix, profile)", key);
      }
    }
  } else if (!options.is_null()) {
    fail("vulkan backend: options must be a mapping, got {}", options.dump());
  }
  if (!o.device.is_null() && !o.device.is_string() && !(o.device.is_number_integer() && o.device.get<int64_t>() >= 0))
    fail("vulkan backend: option 'device' = {} must be a device index (0, 1, ...) or a name substring", o.device.dump());
  return o;
}

// The device option `want` names (an index or a name substring), else the best type with Vulkan 1.2.
int pick_device(const nlohmann::json& want, const std::vector<VkPhysicalDeviceProperties>& props, const std::string& listing) {
  const uint32_t count = static_cast<uint32_t>(props.size());
  int pick = -1;
  if (want.is_number_integer()) {
    const int64_t idx = want.get<int64_t>();
    if (idx >= count) fail("vulkan backend: option 'device' = {} but there are {} Vulkan devices ({})", idx, count, listing);
    pick = static_cast<int>(idx);
  } else if (want.is_string()) {
    const std::string name = want.get<std::string>();
    for (uint32_t i = 0; i < count && pick < 0; ++i)
      if (std::string(props[i].deviceName).find(name) != std::string::npos) pick = static_cast<int>(i);
    if (pick < 0) fail("vulkan backend: option 'device' = '{}' names none of the Vulkan devices ({})", name, listing);
  } else {
    for (uint32_t i = 0; i < count; ++i)
      if (props[i].apiVersion >= VK_API_VERSION_1_2 &&
          (pick < 0 || type_rank(props[i].deviceType) > type_rank(props[static_cast<size_t>(pick)].deviceType)))
        pick = static_cast<int>(i);
    if (pick < 0) fail("vulkan backend: no device supports Vulkan 1.2 ({})", listing);
  }
  return pick;
}

// What the shaders may use on dev.phys: the binding limit, subgroup shuffles, cooperative matrices.
void read_capabilities(Device& dev, const BackendOptions& o) {
  vkGetPhysicalDeviceMemoryProperties(dev.phys, &dev.mem_props);
  dev.max_binding = dev.props.limits.maxStorageBufferRange;
  if (o.max_binding > 0) dev.max_binding = std::min<VkDeviceSize>(dev.max_binding, o.max_binding);
  VkPhysicalDeviceSubgroupProperties sub{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
  VkPhysicalDeviceProperties2 props2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
  props2.pNext = &sub;
  vkGetPhysicalDeviceProperties2(dev.phys, &props2);
  dev.subgroup_shuffle = o.subgroups && (sub.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                         (sub.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) && sub.subgroupSize >= 2;
  dev.subgroup_size = sub.subgroupSize;
  const DeviceFeatures features = device_features(dev.instance, dev.phys, o.coopmat);
  dev.coopmat = features.coopmat;
  dev.coopmat_m = features.m;
  dev.coopmat_n = features.n;
  dev.coopmat_k = features.k;
  dev.capabilities = fmt::format("subgroups of {}{}", sub.subgroupSize, features.description);
}

// The logical device on dev.phys (device `pick`) with one compute queue, its command pool and fence.
void create_device(Device& dev, int pick, bool profile) {
  uint32_t qcount = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(dev.phys, &qcount, nullptr);
  std::vector<VkQueueFamilyProperties> qf(qcount);
  vkGetPhysicalDeviceQueueFamilyProperties(dev.phys, &qcount, qf.data());
  int family = -1;
  for (uint32_t i = 0; i < qcount && family < 0; ++i)
    if (qf[i].queueFlags & VK_QUEUE_COMPUTE_BIT) family = static_cast<int>(i);
  if (family < 0) fail("vulkan backend: device {} ({}) has no compute queue", pick, dev.props.deviceName);
  dev.queue_family = static_cast<uint32_t>(family);
  if (profile && (qf[static_cast<size_t>(family)].timestampValidBits == 0 || dev.props.limits.timestampPeriod <= 0))
    fail("vulkan backend: option 'profile' needs GPU timestamps, which device {} ({}) does not have on its compute "
         "queue; profile on the CPU backend instead", pick, dev.props.deviceName);
  const float prio = 1.0f;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
  qi.queueFamilyIndex = dev.queue_family;
  qi.queueCount = 1;
  qi.pQueuePriorities = &prio;
  VkDeviceCreateInfo di{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
  di.queueCreateInfoCount = 1;
  di.pQueueCreateInfos = &qi;
  // Cooperative matrices: the extension, its feature and fp16 arithmetic in shaders.
  VkPhysicalDeviceVulkan12Features enable12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV enable_cm{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
  const char* cm_ext = VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME;
  if (dev.coopmat) {
    enable12.shaderFloat16 = VK_TRUE;
    enable12.pNext = &enable_cm;
    enable_cm.cooperativeMatrix = VK_TRUE;
    di.pNext = &enable12;
    di.enabledExtensionCount = 1;
    di.ppEnabledExtensionNames = &cm_ext;
  }
  check(vkCreateDevice(dev.phys, &di, nullptr, &dev.dev), "vkCreateDevice");
  vkGetDeviceQueue(dev.dev, dev.queue_family, 0, &dev.queue);
  VkCommandPoolCreateInfo ci{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  ci.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  ci.queueFamilyIndex = dev.queue_family;
  check(vkCreateCommandPool(dev.dev, &ci, nullptr, &dev.cmd_pool), "vkCreateCommandPool");
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(vkCreateFence(dev.dev, &fi, nullptr, &dev.fence), "vkCreateFence");
}
}  // namespace

bool vulkan_cooperative_matrix(const ComputeBackend& backend) {
  const auto* vk = dynamic_cast<const VulkanBackend*>(&backend);
  if (!vk) fail("vulkan_cooperative_matrix: backend '{}' is not the Vulkan backend", backend.name());
  return vk->cooperative_matrix();
}

std::unique_ptr<ComputeBackend> make_vulkan_backend(const nlohmann::json& options) {
  const BackendOptions opts = parse_options(options);
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

  const int pick = pick_device(opts.device, props, listing);
  dev->phys = phys[static_cast<size_t>(pick)];
  dev->props = props[static_cast<size_t>(pick)];
  if (dev->props.apiVersion < VK_API_VERSION_1_2)
    fail("vulkan backend: device {} ({}) supports Vulkan {}.{}, below the 1.2 this backend needs", pick,
         dev->props.deviceName, VK_API_VERSION_MAJOR(dev->props.apiVersion), VK_API_VERSION_MINOR(dev->props.apiVersion));
  read_capabilities(*dev, opts);
  create_device(*dev, pick, opts.profile);
  log_debug("vulkan backend: device {} of [{}]; subgroup shuffles {}; {}", pick, listing,
            dev->subgroup_shuffle ? "on" : "off", dev->capabilities);
  return std::make_unique<VulkanBackend>(std::move(dev), opts.profile);
}

}  // namespace specula::vulkan

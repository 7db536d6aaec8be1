// The Vulkan compute backend (plugin "vulkan"): weights and persistent tensors live in device-local
// buffers (uploaded through host-visible staging), and each graph is compiled once into a plan — an
// arena of intermediates, descriptor sets and one recorded command buffer — that every later run of a
// graph with the same structure replays with one vkQueueSubmit and one fence wait.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "specula/compute.hpp"

namespace specula::vulkan {

// Options (plugin.cpp lists them): {"device": N or "name substring", "cooperative_matrix": bool, ...}. Throws specula::Error when no Vulkan device exists, the
// option names no device, or an option is unknown.
std::unique_ptr<ComputeBackend> make_vulkan_backend(const nlohmann::json& options);

// vkAllocateMemory calls made so far on this backend's device (weights share blocks, transfers reuse
// one staging buffer): for tests.
uint64_t vulkan_memory_allocations(const ComputeBackend& backend);

// Whether this backend multiplies prompt-sized matrices on cooperative matrices (fp16 tensor cores):
// the device has them and the option `cooperative_matrix` did not turn them off. For tests.
bool vulkan_cooperative_matrix(const ComputeBackend& backend);

}  // namespace specula::vulkan

// SPIR-V of plugins/vulkan/shaders/*.comp, compiled by glslc at build time (embed_spirv.cmake).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

namespace specula::vulkan {
// Words of the shader "<name>.comp", empty when there is none.
std::span<const uint32_t> shader_spirv(std::string_view name);
}  // namespace specula::vulkan

#include "specula/core/version.hpp"

#include "specula/plugin.hpp"

namespace specula::core {
std::string version() { return SPECULA_VERSION; }
std::string abi_fingerprint() { return SPECULA_ABI_FINGERPRINT; }
unsigned plugin_abi_version() { return SPECULA_PLUGIN_ABI_VERSION; }
}  // namespace specula::core

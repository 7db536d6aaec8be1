#pragma once
#include <string>

namespace specula::core {
std::string version();          // semantic version of this build
std::string abi_fingerprint();  // compiler / standard library / C++ standard of this build
unsigned plugin_abi_version();
}  // namespace specula::core

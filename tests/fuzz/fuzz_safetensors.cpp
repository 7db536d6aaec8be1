// libFuzzer target: the safetensors header parser (build with clang and -DSPECULA_FUZZ=ON).
#include "fuzz_bodies.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specula::fuzz::safetensors_one(data, size);
  return 0;
}

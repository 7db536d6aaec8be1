// libFuzzer target: the GGUF parser (build with clang and -DSPECULA_FUZZ=ON; see docs/formats.md).
#include "fuzz_bodies.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specula::fuzz::gguf_one(data, size);
  return 0;
}

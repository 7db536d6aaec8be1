// libFuzzer target: config.json + generation_config.json of a Gemma 4 target or assistant (MLX quantization rules included)
// (build with clang and -DSPECULA_FUZZ=ON; see docs/fuzzing.md).
#include "fuzz_text_bodies.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specula::fuzz::config_one(data, size);
  return 0;
}

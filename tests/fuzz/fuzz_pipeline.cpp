// libFuzzer target: the pipeline YAML parser with command-line overrides, and the option checks
// (build with clang and -DSPECULA_FUZZ=ON; see docs/fuzzing.md).
#include "fuzz_text_bodies.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specula::fuzz::pipeline_one(data, size);
  return 0;
}

// libFuzzer target: GGUF model loading (gemma4, gemma4-assistant) up to the first graph, under a memory cap
// (build with clang and -DSPECULA_FUZZ=ON; see docs/fuzzing.md).
#include "fuzz_model_body.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specula::fuzz::model_one(data, size);
  return 0;
}

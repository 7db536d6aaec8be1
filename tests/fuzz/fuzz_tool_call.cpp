// libFuzzer target: Gemma 4's tool-call parser (build with clang and -DSPECULA_FUZZ=ON; see docs/fuzzing.md).
#include "fuzz_tool_call_body.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specula::fuzz::tool_call_one(data, size);
  return 0;
}

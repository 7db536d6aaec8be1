// libFuzzer target: `specula serve`'s request bodies read, checked and rendered into prompts
// (build with clang and -DSPECULA_FUZZ=ON; see docs/fuzzing.md).
#include "fuzz_http_body.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specula::fuzz::http_request_one(data, size);
  return 0;
}

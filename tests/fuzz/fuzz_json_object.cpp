// libFuzzer target: the response_format json_object recognizer (build with clang and -DSPECULA_FUZZ=ON;
// see docs/fuzzing.md).
#include "fuzz_json_object_body.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specula::fuzz::json_object_one(data, size);
  return 0;
}

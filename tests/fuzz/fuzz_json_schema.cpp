// libFuzzer target: the JSON-schema and regex compilers to GBNF (build with clang and -DSPECULA_FUZZ=ON;
// see docs/fuzzing.md).
#include "fuzz_json_schema_body.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specula::fuzz::json_schema_one(data, size);
  return 0;
}

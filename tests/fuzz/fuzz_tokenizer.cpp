// libFuzzer target: tokenizer.json + tokenizer_config.json loading, encoding and decoding
// (build with clang and -DSPECULA_FUZZ=ON; see docs/fuzzing.md).
#include "fuzz_text_bodies.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specula::fuzz::tokenizer_one(data, size);
  return 0;
}

// libFuzzer target: the GBNF parser and matcher (build with clang and -DSPECULA_FUZZ=ON; see
// docs/fuzzing.md).
#include "fuzz_grammar_body.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  specula::fuzz::grammar_one(data, size);
  return 0;
}

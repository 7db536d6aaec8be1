// The "avx2:" runs of the ALSO_AVX2 suites (tests/CMakeLists.txt) force the CPU backend's AVX2 kernels
// with SPECULA_CPU_ISA=avx2. Where AVX2 is already this CPU's best set, the unprefixed run has tested
// exactly those kernels: the copy is skipped rather than run twice (the copy was 13 % of the plain suite's
// test time on a 2-core VM).
#include <cstdlib>
#include <string_view>

#include <gtest/gtest.h>

#include "isa.hpp"

namespace {

class ForcedKernelSet : public testing::Environment {
 public:
  void SetUp() override {
    const char* forced = std::getenv("SPECULA_CPU_ISA");
    if (forced == nullptr || std::string_view(forced) != "avx2") return;
    // The set the backend picks by itself (isa.cpp), not a second copy of its rule.
    if (std::string_view(specula::cpu::select_kernels("auto").name) == "avx2")
      GTEST_SKIP() << "AVX2 is this CPU's best kernel set: the run without SPECULA_CPU_ISA tested it";
  }
};

const testing::Environment* const registered = testing::AddGlobalTestEnvironment(new ForcedKernelSet);

}  // namespace

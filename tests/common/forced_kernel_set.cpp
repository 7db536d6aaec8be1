// The "avx2:" runs of the ALSO_AVX2 suites (tests/CMakeLists.txt) force the CPU backend's AVX2 kernels
// with SPECULA_CPU_ISA=avx2. Where AVX2 is already this CPU's best set, the unprefixed run has tested
// exactly those kernels: the copy is skipped rather than run twice (a sixth of CI's test time on such CPUs).
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
    const auto have = specula::cpu::supported_isas();
    if (!have.empty() && have.back() == specula::cpu::Isa::avx2)
      GTEST_SKIP() << "AVX2 is this CPU's best kernel set: the run without SPECULA_CPU_ISA tested it";
  }
};

const testing::Environment* const registered = testing::AddGlobalTestEnvironment(new ForcedKernelSet);

}  // namespace

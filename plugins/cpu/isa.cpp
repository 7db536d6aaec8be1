#include "isa.hpp"

#include <cstdlib>

#include "specula/dtype.hpp"
#include "specula/error.hpp"

namespace specula::cpu {

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the registers (XCR0).
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) out.push_back(Isa::avx2);
  if (!out.empty() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni"))
    out.push_back(Isa::avx512);
  return out;
}

const QuantKernel* quant_kernel(const KernelSet& ks, DType type) {
  switch (type) {
    case DType::Q8_0: return &ks.q8_0;
    case DType::Q4_0: return &ks.q4_0;
    case DType::Q4_1: return &ks.q4_1;
    case DType::Q5_0: return &ks.q5_0;
    case DType::Q5_1: return &ks.q5_1;
    case DType::IQ4_NL: return &ks.iq4_nl;
    case DType::IQ4_XS: return &ks.iq4_xs;
    case DType::Q4_K: return &ks.q4_k;
    case DType::Q5_K: return &ks.q5_k;
    case DType::Q6_K: return &ks.q6_k;
    default: return nullptr;
  }
}

const char* isa_name(Isa isa) { return isa == Isa::avx512 ? "avx512" : "avx2"; }

const KernelSet& select_kernels(std::string_view requested) {
  std::string want(requested);
  if (want.empty()) {
    const char* env = std::getenv("SPECULA_CPU_ISA");
    want = env && *env ? env : "auto";
  }
  const std::vector<Isa> have = supported_isas();
  std::string list;
  for (Isa i : have) list += (list.empty() ? "" : ", ") + std::string(isa_name(i));
  if (have.empty())
    fail("CPU backend: this CPU lacks AVX2 and FMA, the least the CPU backend needs; use another backend");
  auto set = [](Isa i) -> const KernelSet& { return i == Isa::avx512 ? avx512::kernel_set() : avx2::kernel_set(); };
  if (want == "auto") return set(have.back());
  for (Isa i : have)
    if (want == isa_name(i)) return set(i);
  if (want == "avx2" || want == "avx512")
    fail("CPU backend: kernel set '{}' needs instructions this CPU lacks (it runs: {})", want, list);
  fail("CPU backend: unknown kernel set '{}' (option 'isa' or SPECULA_CPU_ISA): expected auto, avx2 or avx512", want);
}

}  // namespace specula::cpu

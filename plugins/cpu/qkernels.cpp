// Matrix kernels of the CPU backend for few-to-many activation rows, compiled once per instruction set
// (isa.hpp): SPECULA_ISA_NS names the namespace, the compiler flags decide which branches exist. The
// kernels live in one file per weight family (qkernels_x32.cpp, qkernels_kquant.cpp, qkernels_float.cpp,
// with helpers and the tiling in qkernels.hpp); this file assembles the set.
//
// Quantized weights are read in place. Activations are quantized once per product to 8 bits per 32
// values (Q8_0 / Q4_0 / ...) or per 256 (K-quants), the llama.cpp scheme, and each weight block is
// unpacked once per tile of activation rows (MLX affine keeps float activations, as MLX does). Where
// AVX-512 works on 16 lanes, AVX2 works on two halves of 8 with the same lanes, so the sums, their order
// and the final reduction are the same on both sets, and so are the bits.
//
// Nothing here may instantiate a template that other translation units use too (std containers,
// std::function): the linker would keep one copy, possibly the one with AVX-512 instructions.
#include "qkernels.hpp"

namespace specula::cpu::SPECULA_ISA_NS {

const KernelSet& kernel_set() {
  // Tiles: 32 (AVX-512) or 16 (AVX2) registers hold the accumulators and the unpacked weight rows.
  // One weight row per tile for the quantized types: a few interleaved rows of a mapped file stream
  // slower than one, and the work per (weight, activation) pair is the same either way.
  static const KernelSet set = [] {
    KernelSet s{};
    s.name = SPECULA_WIDE ? "avx512" : "avx2";
    add_x32_kernels(s);
    add_kquant_kernels(s);
    add_float_kernels(s);
    add_map_kernels(s);
    add_attention_kernels(s);
    return s;
  }();
  return set;
}

}  // namespace specula::cpu::SPECULA_ISA_NS

// What one fuzz input exercises; shared by the libFuzzer targets and the corpus replay gtest.
// Bad input must end in specula::Error; anything else (another exception, a crash, a read outside the
// buffer under ASan) is a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gguf_io.hpp"  // plugins/gguf (specula_gguf_io)
#include "safetensors_io.hpp"  // plugins/safetensors (specula_safetensors_io)
#include "specula/error.hpp"
#include "specula/quant.hpp"

namespace specula::fuzz {

// Reads every byte of every tensor and decodes small ones, so spans outside the buffer are caught.
inline uint64_t touch(const std::vector<TensorInfo>& tensors) {
  uint64_t sum = 0;
  std::vector<float> out;
  for (const auto& t : tensors) {
    for (std::byte b : t.data) sum += static_cast<uint8_t>(b);
    if (t.elements() > 0 && t.elements() <= 4096 && can_dequantize(t.type)) {
      out.resize(static_cast<size_t>(t.elements()));
      dequantize_tensor(t, out.data());
      for (float f : out) sum += f == f;
    }
  }
  return sum;
}

// Returns true when the input parsed, false when it was refused with specula::Error.
inline bool gguf_one(const uint8_t* data, size_t size) {
  try {
    const gguf::File f = gguf::parse({reinterpret_cast<const std::byte*>(data), size}, "fuzz.gguf");
    touch(f.tensors);
    // A file we accept must re-serialize to one we accept with the same keys.
    gguf::Writer w(static_cast<uint32_t>(f.alignment));
    w.copy_metadata(f);
    const auto again = gguf::parse(w.serialize(), "fuzz-rewritten.gguf");
    if (again.keys.size() != f.keys.size() || again.alignment != f.alignment) __builtin_trap();
    return true;
  } catch (const Error&) {
    return false;
  }
}

inline bool safetensors_one(const uint8_t* data, size_t size) {
  try {
    const safetensors::File f = safetensors::parse({reinterpret_cast<const std::byte*>(data), size}, "fuzz.safetensors");
    touch(f.tensors);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace specula::fuzz

// The gemma4 plugin's converter (plugin kind "converter"): Hugging Face / MLX Gemma 4 text models to GGUF.
#pragma once

#include <memory>

#include "specula/convert.hpp"

namespace specula::gemma4 {

std::unique_ptr<Converter> make_converter();

}  // namespace specula::gemma4

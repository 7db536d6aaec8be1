// The gemma4-assistant plugin's converter (plugin kind "converter"): drafter checkpoints to GGUF.
#pragma once

#include <memory>

#include "specula/convert.hpp"

namespace specula::gemma4_assistant {

std::unique_ptr<Converter> make_converter();

}  // namespace specula::gemma4_assistant

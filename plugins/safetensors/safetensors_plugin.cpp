// Format plugin "safetensors": a .safetensors file or a checkpoint directory (HF or MLX).
#include "safetensors_io.hpp"
#include "specula/plugin.hpp"

namespace {

class SafetensorsFormat final : public specula::ModelFormat {
 public:
  std::string name() const override { return "safetensors"; }
  bool can_open(const std::filesystem::path& path) const override {
    return specula::safetensors::looks_like_checkpoint(path);
  }
  std::unique_ptr<specula::ModelFile> open(const std::filesystem::path& path) const override {
    return specula::safetensors::open(path);
  }
};

std::unique_ptr<specula::ModelFormat> make_format(const nlohmann::json&) {
  return std::make_unique<SafetensorsFormat>();
}

const specula::PluginFactories* factories() {
  static const specula::PluginFactories f{.format = &make_format};
  return &f;
}

}  // namespace

SPECULA_PLUGIN("safetensors", "format", "1.0.0",
               "Hugging Face safetensors and MLX affine-quantized checkpoints (single, sharded)", factories)

// Plugin entry: the gemma4 model loader.
#include "converter.hpp"
#include "model.hpp"
#include "specula/plugin.hpp"

namespace {

class Gemma4Loader final : public specula::ModelLoader {
 public:
  std::string architecture() const override { return "gemma4"; }
  bool accepts(const specula::ModelFile& file) const override { return specula::gemma4::is_gemma4(file); }
  specula::ModelInfo check(const specula::ModelFile& file, const specula::ComputeBackend& backend,
                           const nlohmann::json& options) const override {
    return specula::gemma4::check(file, backend, options);
  }
  std::shared_ptr<specula::Model> load(std::shared_ptr<const specula::ModelFile> file,
                                       std::shared_ptr<specula::ComputeBackend> backend,
                                       const nlohmann::json& options, const specula::ModelParts& parts) const override {
    return specula::gemma4::load_model(std::move(file), std::move(backend), options, parts);
  }
};

const specula::PluginFactories* factories() {
  static const specula::PluginFactories f = [] {
    specula::PluginFactories x;
    x.model = [](const nlohmann::json&) -> std::unique_ptr<specula::ModelLoader> {
      return std::make_unique<Gemma4Loader>();
    };
    x.model_options = &specula::gemma4::option_schema();
    x.converter = [] { return specula::gemma4::make_converter(); };
    return x;
  }();
  return &f;
}

}  // namespace

SPECULA_PLUGIN("gemma4", "model,converter", "0.1.0",
               "Gemma 4 text models from GGUF, Hugging Face safetensors and MLX; converts HF/MLX to GGUF",
               factories)

// Plugin entry: the gemma4-assistant drafter loader.
#include "assistant.hpp"
#include "converter.hpp"
#include "specula/plugin.hpp"

namespace {

namespace ga = specula::gemma4_assistant;

class AssistantLoader final : public specula::DrafterLoader {
 public:
  std::string architecture() const override { return "gemma4-assistant"; }
  bool accepts(const specula::ModelFile& file) const override { return ga::is_assistant(file); }
  void check(const specula::ModelFile& file, const specula::ComputeBackend&, const specula::ModelInfo& target,
             const nlohmann::json& options) const override {
    ga::check(file, target, options);
  }
  std::shared_ptr<specula::Drafter> load(std::shared_ptr<const specula::ModelFile> file,
                                         std::shared_ptr<specula::ComputeBackend> backend,
                                         const specula::ModelInfo& target, const nlohmann::json& options,
                                         const specula::ModelParts& parts) const override {
    return ga::load_drafter(std::move(file), std::move(backend), target, options, parts);
  }
};

std::unique_ptr<specula::DrafterLoader> make_loader(const nlohmann::json& options) {
  ga::parse_options(options);  // a typo in the pipeline fails here, so `specula validate` reports it
  return std::make_unique<AssistantLoader>();
}

const specula::PluginFactories* factories() {
  static const specula::PluginFactories f{.drafter = &make_loader,
                                          .converter = [] { return ga::make_converter(); },
                                          .drafter_options = &ga::option_schema()};
  return &f;
}

}  // namespace

SPECULA_PLUGIN("gemma4-assistant", "drafter,converter", "0.1.0",
               "Gemma 4 assistant MTP drafter (GGUF upstream/fork layouts, Hugging Face safetensors); converts HF to "
               "GGUF", factories)

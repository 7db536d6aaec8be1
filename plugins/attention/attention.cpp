// Plugin "attention", kind attention: the SDK's standard attention (Op::Attention, specula/attention.hpp),
// which models use when the pipeline names no other. As a plugin, a pipeline can name it
// (target.attention: attention), and it is the shape of an attention plugin.
#include "specula/attention.hpp"
#include "specula/plugin.hpp"

namespace {

class Standard final : public specula::Attention {
 public:
  std::string name() const override { return "attention"; }
  specula::Value build(specula::Graph& g, const specula::AttentionCall& call) const override {
    return attention_->build(g, call);
  }

 private:
  std::shared_ptr<const specula::Attention> attention_ = specula::standard_attention();
};

const specula::PluginFactories* factories() {
  static const specula::PluginFactories f = [] {
    specula::PluginFactories x;
    x.attention = [](const nlohmann::json&) -> std::unique_ptr<specula::Attention> { return std::make_unique<Standard>(); };
    static const specula::OptionSchema none;
    x.attention_options = &none;
    return x;
  }();
  return &f;
}

}  // namespace

SPECULA_PLUGIN("attention", "attention", "1.0.0", "standard attention (causal, sliding window, over a foreign cache)",
               factories)

// Test plugin "test-half-head", kind lm_head: a third head, plugged in by the pipeline (target.lm_head,
// drafter.lm_head). It is the standard dense head with every logit halved, so its effect is exact and
// known, and it refuses centroid-masked weights.
#include "specula/lm_head.hpp"
#include "specula/plugin.hpp"

namespace {

class HalfHead final : public specula::LmHead {
 public:
  std::string name() const override { return "test-half-head"; }
  std::string refuses(const specula::LmHeadWeights& w) const override {
    return w.centroid() ? "test-half-head computes dense heads only" : standard_->refuses(w);
  }
  specula::LmHeadOutput build(specula::Graph& g, specula::Value rows, const specula::LmHeadWeights& w) const override {
    specula::LmHeadOutput out = standard_->build(g, rows, w);
    out.logits = g.scale(out.logits, 0.5f);
    return out;
  }

 private:
  std::shared_ptr<const specula::LmHead> standard_ = specula::standard_lm_head();
};

const specula::PluginFactories* factories() {
  static const specula::PluginFactories f = [] {
    specula::PluginFactories x;
    x.lm_head = [](const nlohmann::json&) -> std::unique_ptr<specula::LmHead> { return std::make_unique<HalfHead>(); };
    return x;
  }();
  return &f;
}

}  // namespace

SPECULA_PLUGIN("test-half-head", "lm_head", "1.0.0", "test LM head: the dense head, halved", factories)

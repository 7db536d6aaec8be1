// Plugin "lm-head", kind lm_head: the SDK's standard heads (specula::standard_lm_head(): dense with the
// final softcap, and the centroid-masked head), which models use when the pipeline names no head. As a
// plugin, a pipeline can name it (target.lm_head: lm-head), and it is the shape of a head plugin.
#include "specula/lm_head.hpp"
#include "specula/plugin.hpp"

namespace {

// The factory hands out an owning pointer; the standard head is stateless, so a wrapper forwards to it.
class Standard final : public specula::LmHead {
 public:
  std::string name() const override { return "lm-head"; }
  std::string refuses(const specula::LmHeadWeights& w) const override { return head_->refuses(w); }
  specula::LmHeadOutput build(specula::Graph& g, specula::Value rows, const specula::LmHeadWeights& w) const override {
    return head_->build(g, rows, w);
  }

 private:
  std::shared_ptr<const specula::LmHead> head_ = specula::standard_lm_head();
};

std::unique_ptr<specula::LmHead> make_head(const nlohmann::json&) { return std::make_unique<Standard>(); }

const specula::PluginFactories* factories() {
  static const specula::PluginFactories f = [] {
    specula::PluginFactories x;
    x.lm_head = &make_head;
    static const specula::OptionSchema none;
    x.lm_head_options = &none;
    return x;
  }();
  return &f;
}

}  // namespace

SPECULA_PLUGIN("lm-head", "lm_head", "1.0.0", "dense LM head (final softcap) and the centroid-masked head", factories)

// Test plugin "test-row-split-attention", kind attention: a third attention, plugged in by the pipeline
// (target.attention, drafter.attention). It computes the standard attention for the first and the second
// half of the query rows separately and joins them: the same values by another graph, so a model using
// it must give the standard logits.
#include "specula/attention.hpp"
#include "specula/plugin.hpp"

namespace {

using specula::Value;

class RowSplit final : public specula::Attention {
 public:
  std::string name() const override { return "test-row-split-attention"; }
  Value build(specula::Graph& g, const specula::AttentionCall& c) const override {
    const specula::Shape q = g.shape(c.q);
    const int64_t n = q[0], row = q[1] * q[2], out = q[1] * g.shape(c.v)[2], half = n / 2;
    if (n < 2) return standard_->build(g, c);
    auto part = [&](int64_t begin, int64_t len) {
      specula::AttentionCall p = c;
      p.q = g.reshape(g.slice(g.reshape(c.q, {1, n * row}), begin * row, len * row), {len, q[1], q[2]});
      p.query_positions = g.slice(c.query_positions, begin, len);
      return g.reshape(standard_->build(g, p), {1, len * out});
    };
    return g.reshape(g.concat(part(0, half), part(half, n - half)), {n, out});
  }

 private:
  std::shared_ptr<const specula::Attention> standard_ = specula::standard_attention();
};

const specula::PluginFactories* factories() {
  static const specula::PluginFactories f = [] {
    specula::PluginFactories x;
    x.attention = [](const nlohmann::json&) -> std::unique_ptr<specula::Attention> { return std::make_unique<RowSplit>(); };
    return x;
  }();
  return &f;
}

}  // namespace

SPECULA_PLUGIN("test-row-split-attention", "attention", "1.0.0", "test attention: the standard one by halves of the rows",
               factories)

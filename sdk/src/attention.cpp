#include "specula/attention.hpp"

namespace specula {
namespace {

class StandardAttention final : public Attention {
 public:
  std::string name() const override { return "attention"; }
  Value build(Graph& g, const AttentionCall& c) const override {
    return g.attention(c.q, c.k, c.v, c.key_positions, c.query_positions, c.scale, c.window, c.causal,
                       c.slots_in_use);
  }
};

}  // namespace

std::shared_ptr<const Attention> standard_attention() {
  static const auto attention = std::make_shared<const StandardAttention>();
  return attention;
}

}  // namespace specula

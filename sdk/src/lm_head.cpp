#include "specula/lm_head.hpp"

#include <fmt/format.h>

#include "specula/error.hpp"

namespace specula {
namespace {

// dense:    logits = table · row, then c · tanh(logits / c) when the model has a final softcap c.
// centroid: the top_clusters best clusters by centroids · row; the logits of their tokens only
//           (gemma4-assistant-spec §2.5: rows of the cluster-ordered table, gathered by cluster).
class StandardHead final : public LmHead {
 public:
  std::string name() const override { return "lm-head"; }

  std::string refuses(const LmHeadWeights& w) const override {
    if (!w.table) return "it has no head table";
    if (!w.centroid()) return w.table->shape().size() == 2 ? "" : "the head table is not a matrix [vocab, hidden]";
    const Shape& c = w.centroids->shape();
    if (c.size() != 2 || w.table->shape().size() != 2 || w.table->shape()[0] != c[0])
      return fmt::format("centroids {} and table {} are not [clusters, hidden] and [clusters, tokens per cluster x hidden]",
                         shape_str(c), shape_str(w.table->shape()));
    if (w.top_clusters < 1 || w.top_clusters > c[0])
      return fmt::format("it keeps {} clusters of {}", w.top_clusters, c[0]);
    if (w.softcap != 0.0f) return "a softcap on candidate logits is not defined";
    return "";
  }

  LmHeadOutput build(Graph& g, Value rows, const LmHeadWeights& w) const override {
    if (!w.centroid()) {
      Value logits = g.matmul(g.constant(w.table), rows);
      return {w.softcap > 0.0f ? g.softcap(logits, w.softcap) : logits, {}};
    }
    const Shape& in = g.shape(rows);
    if (in.size() != 2 || in[0] != 1)
      fail("lm-head: the centroid head scores one row at a time (a draft step), not {}", shape_str(in));
    const int64_t H = in[1], K = w.top_clusters, C = w.table->shape()[0], S = w.table->shape()[1] / H;
    Value clusters = g.top_k(g.matmul(g.constant(w.centroids), rows), K);  // [1, K]
    // Each cluster's S rows as one expert of a [C, S, H] table: the selected ones are multiplied where
    // they lie (no copy of K * S rows decoded to F32), with the dense head's arithmetic.
    Value experts = g.reshape(g.constant(w.table), {C, S, H});
    Value logits = g.matmul_id(experts, g.reshape(rows, {1, 1, H}), clusters);  // [1, K, S]
    return {g.reshape(logits, {1, K * S}), clusters};                            // [1, K * S]
  }
};

}  // namespace

std::shared_ptr<const LmHead> standard_lm_head() {
  static const auto head = std::make_shared<const StandardHead>();
  return head;
}

std::shared_ptr<const LmHead> choose_lm_head(std::shared_ptr<const LmHead> chosen, const LmHeadWeights& weights,
                                             const std::string& who) {
  if (!chosen) chosen = standard_lm_head();
  const std::string why = chosen->refuses(weights);
  if (!why.empty())
    fail("{}: the LM head '{}' cannot serve this model's {} head: {}", who, chosen->name(),
         weights.centroid() ? "centroid-masked" : "dense", why);
  return chosen;
}

}  // namespace specula

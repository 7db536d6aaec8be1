// The LM head as a plugin kind ("lm_head"): the final-normed hidden rows to logits. A model keeps its
// head weights and hands them, with the rows, to the LmHead it was loaded with (ModelParts), which
// appends the head to the model's graph. The standard head (standard_lm_head(), also plugin "lm-head")
// is the dense head (the tied embedding or an output matrix, optional final softcap) and the
// centroid-masked head of the gemma4-assistant drafter; models use it when the pipeline names no other
// (target.lm_head / drafter.lm_head). docs/plugin-authoring.md, "An LM head".
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "specula/compute.hpp"

namespace specula {

// What a model has for its head. Dense: `table` [V, H]. Centroid-masked (the gemma4-assistant head,
// gemma4-assistant-spec §2.5): `centroids` [C, H] score the clusters, the `top_clusters` best are kept,
// and `table` holds the vocabulary in cluster order, one [S * H] row per cluster (S = V / C).
struct LmHeadWeights {
  BackendTensorPtr table;
  float softcap = 0.0f;          // final logit softcap c: c * tanh(z / c); 0 = none
  BackendTensorPtr centroids;    // set: a centroid-masked head
  int64_t top_clusters = 0;      // centroid: clusters kept per row
  bool centroid() const { return static_cast<bool>(centroids); }
};

// What the head appended. Dense: logits [T, V]. Centroid: the logits of the kept clusters' tokens
// [T, top_clusters * S] in cluster order, and `clusters` (I32 [T, top_clusters]) the kept clusters, from
// which the model maps a candidate index back to a vocabulary id.
struct LmHeadOutput {
  Value logits;
  Value clusters;
};

class LmHead {
 public:
  virtual ~LmHead() = default;
  virtual std::string name() const = 0;
  // Why this head cannot serve `weights` ("" = it can). Models ask when they load, so that a pipeline
  // pairing a model with a head that does not fit it fails there, naming both.
  virtual std::string refuses(const LmHeadWeights& weights) const = 0;
  // Appends the head over `rows` ([T, H], final-normed) to `g`.
  virtual LmHeadOutput build(Graph& g, Value rows, const LmHeadWeights& weights) const = 0;
};

// Dense and centroid-masked, as specified above; stateless, shared.
std::shared_ptr<const LmHead> standard_lm_head();

// `chosen` (the pipeline's head; null: the standard one), checked against `weights`: throws naming `who`
// (e.g. "gemma4") and the head when it refuses them.
std::shared_ptr<const LmHead> choose_lm_head(std::shared_ptr<const LmHead> chosen, const LmHeadWeights& weights,
                                             const std::string& who);

}  // namespace specula

// BatchedModel: what every target model built on KvCache and BatchGraph shares, so that a model plugin
// writes only its architecture (build_forward). It provides the contexts (a KvCache each, and the
// TargetView drafters read), the graphs by batch shape, prompts split into steps, Model::forward_batch,
// and speculative rounds on the backend (ModelContext::prepare_round, Model::verify): a batch of
// sequences' rounds verified and decided in one graph, greedy and sampled alike.
// docs/plugin-authoring.md, "A model".
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "specula/compute.hpp"
#include "specula/kv_cache.hpp"
#include "specula/model.hpp"

namespace specula {

class BatchedModel : public Model, public std::enable_shared_from_this<BatchedModel> {
 public:
  ~BatchedModel() override;
  std::vector<std::vector<float>> forward_batch(std::span<const BatchEntry> batch) override;
  // Every round in one graph: one forward over each round's [tokens, drafts], then each verdict.
  std::vector<RoundVerdict> verify(std::span<const RoundEntry> rounds) override;

  // One sequence's share of a graph run: at most one step of tokens appended to its cache, logits for
  // the last n_logits of them.
  struct Part {
    KvCache* cache = nullptr;
    std::span<const int32_t> tokens;
    int64_t n_logits = 0;
  };

 protected:
  // `name` prefixes errors ("gemma4"). The model's constructor then calls set_cache().
  BatchedModel(std::string name, std::shared_ptr<ComputeBackend> backend);
  // The KV cache every context gets, and the width of the logits build_forward returns.
  void set_cache(KvCacheSpec spec, int64_t vocab);
  // What BatchGraph::attention computes with (ModelParts::attention; null: standard_attention()).
  void set_attention(std::shared_ptr<const Attention> attention);
  const Attention& attention() const { return *attention_; }
  // A context of `capacity` tokens (new_context, after the model's own checks).
  std::unique_ptr<ModelContext> make_context(int64_t capacity);

  // The architecture: the forward pass of every row of `batch` from the token ids `ids` (I32 [rows]).
  // It attends through batch.attention, hands the final-normed hidden rows to batch.keep_hidden (what
  // MTP drafters read) and returns the logits of batch.last_rows(hidden, n_logits) ([sum n_logits,
  // vocab]), or an empty Value when no logits are wanted.
  virtual Value build_forward(BatchGraph& batch, Value ids, std::span<const int64_t> n_logits) const = 0;
  // The cache layer a drafter reads for an attention type ("full", "sliding"); throws for others.
  virtual size_t target_cache_layer(const std::string& attention_type) const = 0;
  virtual TokenEmbedding target_embedding() const = 0;

  ComputeBackend& backend() const { return *backend_; }
  const KvCacheSpec& cache_spec() const { return spec_; }

 private:
  class Context;
  struct Built;
  friend class Context;

  std::vector<float> forward(KvCache& cache, std::span<const int32_t> tokens, int64_t n_logits) const;
  // One sequence's round as verify() runs it: its cache, host ids, drafts and rule, the buffers its drafts
  // are in.
  struct Round {
    KvCache* cache = nullptr;
    std::span<const int32_t> tokens;
    int64_t drafts = 0;
    RoundRule rule;
    RoundBuffers buffers;
  };
  // The graph of a set of rounds that each fit one step: one forward over every round's [tokens, drafts],
  // then each round's verdict (Built::verdict, all of them in one I32 vector), or none with Built::why.
  Built& round_graph(std::span<const Round> rounds) const;
  // Round i's verdict from its logit rows p ([k + 1, vocab]), its drafts (I32 [k]) and uniforms u.
  Value round_verdict(Built& b, size_t i, const Round& r, Value p, Value drafts, Value u) const;
  std::vector<RoundVerdict> run_rounds(std::span<const Round> rounds) const;
  void check_tokens(const KvCache& cache, std::span<const int32_t> tokens, int64_t n_logits) const;
  void check_room(const KvCache& cache, int64_t n) const;  // n more tokens fit the context
  // The graph cached under `key`, made by `build` (which fills its graph and ids, then compiled) the first time.
  using GraphKey = std::pair<std::vector<int64_t>, std::string>;
  Built& cached_graph(GraphKey key, const std::function<void(Built&)>& build) const;
  Built& graph_for(std::span<const Part> parts) const;  // the forward graph of a batch shape
  void execute(Built& b, std::span<const Part> parts) const;
  std::vector<float> run(std::span<const Part> parts) const;  // their logits, in order
  void forget(uint64_t cache_id) const;  // drops the graphs of a cache that goes away

  std::string name_;
  std::shared_ptr<ComputeBackend> backend_;
  KvCacheSpec spec_;
  int64_t vocab_ = 0;
  std::shared_ptr<const Attention> attention_ = standard_attention();
  // Graphs by batch shape (cache id, tokens, logits or drafts of each part) and what ends them ("round:"
  // and each round's rule).
  mutable std::mutex graphs_mu_;
  mutable std::map<GraphKey, std::unique_ptr<Built>> graphs_;
};

}  // namespace specula

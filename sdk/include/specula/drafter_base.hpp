// DrafterBase: what every drafter that reads its target (an MTP head, an EAGLE-style layer) needs
// around its own step graph, as BatchedModel is for targets. A drafter derives from it and writes two
// things: check_target (do the target's tensors fit) and build_step (one draft step's graph, from the
// token it embeds to its head's logits). DrafterBase does the rest:
//   - binding: reads the target's KV caches, last hidden state and token embedding through TargetView,
//     checks them once per set of tensors (one per context) and rebuilds the graphs when they change;
//   - graph caching: one compiled graph per kind of step (the first step of a round reads the target's
//     hidden state, later ones the drafter's own state; host or backend drafts; greedy or a sampler);
//   - the K-step loop: on the backend (DraftRequest::buffers: step k writes its draft into row k, step
//     k + 1 embeds it from there, nothing is read back; sampled steps draw with the request's sampler
//     and write their vocabulary-wide logits for the verification) or on the host (each draft read back,
//     optionally its logits, and `pick` choosing what the next step embeds);
//   - candidate heads: a head that scores a subset of the vocabulary (a centroid head) returns the
//     subset's vocabulary ids with its logits; drafts, host logits and device logits are mapped back
//     to vocabulary ids here, once.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "specula/compute.hpp"
#include "specula/model.hpp"

namespace specula {

// The target tensors a step graph reads, bound once per set of target tensors.
struct DraftTarget {
  std::map<std::string, KvView> kv;  // by attention type, those DrafterBase::Setup::attention_types names
  BackendTensorPtr hidden;           // F32 [hidden]: the target's final-normed last hidden state
  TokenEmbedding embed;              // the target's token embedding table and its scale
  const KvView& cache(const std::string& attention_type) const { return kv.at(attention_type); }
};

// The inputs of one step's graph; DrafterBase fills them before each run.
struct DraftStepInputs {
  Value token;         // I32 [1]: the token this step embeds (the round's last accepted token, then a draft)
  Value position;      // I32 [1]: the query position (the target's position - Setup::query_offset)
  Value slots_in_use;  // I32 [1]: the target cache's slots in use (its position)
  Value row0;          // I32 [1] holding 0: a row index for write_rows into the drafter's own state
  bool first = false;  // the round's first step (reads the target's hidden state), else a later one
};

// What a step's head computed: `logits` [1, N]; `ids` (I32 [N]) the vocabulary id of each logit when
// the head scores a subset of the vocabulary (a centroid head), else Value{} (N is the vocabulary).
struct DraftHead {
  Value logits;
  Value ids;
};

class DrafterBase : public Drafter {
  struct Step;  // one compiled step graph with its inputs and outputs

 public:
  ~DrafterBase() override;
  // Drafts request.n tokens (see DraftRequest): on the backend when the request gives buffers and the
  // backend can keep them, else on the host.
  std::vector<DraftStep> draft(const TargetView& target, const DraftRequest& request) final;

 protected:
  struct Setup {
    std::string name;                          // for messages: "gemma4-assistant (path/to/file.gguf)"
    int64_t vocab = 0;                         // the head's vocabulary
    int query_offset = 0;                      // query position = target position - query_offset (>= 0)
    std::vector<std::string> attention_types;  // the target KV caches the steps read ("sliding", "full")
  };
  DrafterBase(std::shared_ptr<ComputeBackend> backend, Setup setup);

  // Throws (naming what and why) when the bound target's tensors do not fit this drafter. Called once
  // per set of target tensors, before any graph reads them.
  virtual void check_target(const DraftTarget& target) const = 0;
  // One draft step: embeds `in.token`, reads `target`, updates the drafter's own state, returns the head.
  virtual DraftHead build_step(Graph& graph, const DraftTarget& target, const DraftStepInputs& in) const = 0;

  // One host step after its graph ran.
  class HostStep {
   public:
    int32_t token() const { return token_; }  // the greedy draft, a vocabulary id
    std::vector<int32_t> ids() const;         // the head's candidate ids; empty when it scores the vocabulary
    std::vector<float> logits() const;        // the head's logits: [vocab], or one per candidate id
    std::vector<float> vocab_logits() const;  // over the vocabulary (candidates scattered: scatter_logits)

   private:
    friend class DrafterBase;
    const DrafterBase* base_ = nullptr;
    const Step* step_ = nullptr;
    int32_t token_ = -1;
  };
  // Runs `n` steps on the host from `last`; after step k, `next(k, step)` returns the token step k + 1
  // embeds (step.token() for the drafter's own choice).
  void run_steps(const TargetView& target, int32_t last, int n,
                 const std::function<int32_t(int, const HostStep&)>& next);

  ComputeBackend& backend() const { return *backend_; }
  const Setup& setup() const { return setup_; }

 private:
  struct Kind {
    bool first = false;
    const BackendTensor* drafts = nullptr;  // step k writes its draft into row k here (backend drafts)
    const BackendTensor* logits = nullptr;  // sampled on the backend: row k gets the step's logits
    std::string sampler;                    // sampled on the backend: Sampler::device_key
    auto operator<=>(const Kind&) const = default;
  };
  void bind(const TargetView& target);
  Step& step(const Kind& kind, const DraftRequest* request);
  std::unique_ptr<Step> build(const Kind& kind, const DraftRequest* request) const;
  bool draft_on_backend(const DraftRequest& request);
  RunInputs inputs(const Step& s) const;
  void check_token(int32_t token) const;

  // A set of target tensors (one context's) with the step graphs that read them. Several are kept, so
  // that sequences batched together do not rebuild their graphs every round; the graphs hold the
  // tensors, so a key's addresses cannot be reused while it is kept. `refs`: the references to the
  // target's hidden state this entry holds (its DraftTarget, its graphs and plans): when that is all
  // there are, the context is gone and the entry is dropped, freeing its caches.
  struct Bound {
    DraftTarget target;
    std::map<Kind, std::unique_ptr<Step>> steps;
    uint64_t used = 0;
    long refs = 1;
  };
  static constexpr size_t kBoundTargets = 8;  // contexts kept; the least recently used goes first

  std::shared_ptr<ComputeBackend> backend_;
  Setup setup_;
  std::map<std::vector<const void*>, Bound> bound_;
  Bound* current_ = nullptr;           // the target of this call
  uint64_t uses_ = 0;
  int32_t position_ = 0, in_use_ = 0;  // this round's step inputs
  BackendTensorPtr zeros_;  // F32 [vocab]: a candidate head's logits are spread over it for the verification
};

// A candidate head's logits over the whole vocabulary, as Hugging Face's masked head fills them: every
// id not among `ids` gets min(logits) - 1, the candidates their logits.
std::vector<float> scatter_logits(int64_t vocab, std::span<const int32_t> ids, std::span<const float> logits);

}  // namespace specula

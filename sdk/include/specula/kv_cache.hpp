// The KV cache of a sequence and the batched forward pass over several sequences: what a model plugin
// uses instead of keeping cache tensors, ring slots, positions and rollback itself. A model describes
// the layers that store keys and values (KvCacheSpec); each sequence gets a KvCache; one forward pass
// appends tokens to one or more sequences at once (BatchGraph), reading every weight once for all rows.
// docs/architecture.md, "Sequences and the KV cache".
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "specula/attention.hpp"
#include "specula/compute.hpp"

namespace specula {

// One attention type's KV cache as the drafter sees it: the cache tensors, plus the absolute token
// position held by each cache slot (-1 for an empty slot). K is [S, Hkv, D], V is [S, Hkv, Dv].
struct KvView {
  BackendTensorPtr k;
  BackendTensorPtr v;
  BackendTensorPtr positions;   // I32 [S]
  int64_t window = 0;           // sliding window of the producing layer, 0 for full attention
};

// A layer that stores keys and values (layers that attend over another layer's cache have none).
struct KvLayerSpec {
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // K and V rows are [kv_heads, head_dim]
  int64_t window = 0;    // sliding window, 0 = full attention
  std::string name;      // its tensors are <name>.k, .v and .pos; empty: <KvCacheSpec::name>.<index>
};

struct KvCacheSpec {
  std::string name = "cache";        // tensor name prefix ("gemma4.cache")
  DType type = DType::F32;           // K/V storage: F32, F16 or BF16
  std::vector<KvLayerSpec> layers;   // by cache index (the model maps its layers to these)
  // The most tokens one forward pass appends to a sequence. A sliding layer keeps window - 1 + step
  // slots (a ring) so the keys a step needs are never overwritten by the step itself; this is also
  // the deepest rollback such a cache allows.
  int64_t step_tokens = 256;
  // > 0: keep the final hidden rows ([hidden_size]) of the last step, so that the hidden state of the
  // last position is there after a rollback too (what MTP drafters read, TargetView::last_hidden).
  int64_t hidden_size = 0;

  // Bytes of the persistent tensors of one sequence of `capacity` tokens (in double: a hostile size
  // must not wrap around), for checks before allocating.
  double bytes(int64_t capacity) const;
};

// One sequence's cache: K, V and slot positions per cache layer, the sequence's position, and the
// hidden rows of its last step. Slot s of a full layer holds position s; a sliding layer whose window
// is shorter than the capacity is a ring (slot = position % slots).
class KvCache {
 public:
  KvCache(ComputeBackend& backend, KvCacheSpec spec, int64_t capacity);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  struct Layer {
    BackendTensorPtr k, v, pos;  // [slots, kv_heads, head_dim] x 2, I32 [slots]
    int64_t slots = 0;
    bool ring = false;
    int64_t window = 0;
  };

  const KvCacheSpec& spec() const { return spec_; }
  uint64_t id() const { return id_; }  // unique per cache in the process (graph caches key on it)
  int64_t capacity() const { return capacity_; }
  int64_t position() const { return position_; }
  const Layer& layer(size_t i) const { return layers_.at(i); }
  KvView view(size_t layer) const;

  // The deepest truncate() allowed from the current position: a ring has overwritten keys older than
  // its window, so only a rollback within one step leaves every key the next token needs in place.
  int64_t max_rollback() const;
  // Forgets every position >= pos (speculative rollback): 0 <= pos <= position(), and position() - pos
  // <= max_rollback(). The hidden state of position pos - 1 becomes last_hidden() when the last step
  // computed it. One graph run on the backend: the host reads nothing back.
  void truncate(int64_t pos);
  // Prefix sharing: this cache takes `from`'s first n positions (a copy: the layout is contiguous per
  // sequence). Both caches must have the same spec and capacity; from.position() - n <= from.max_rollback().
  void copy_prefix(const KvCache& from, int64_t n);

  BackendTensorPtr last_hidden() const { return last_hidden_; }  // F32 [hidden_size], or null

  // For BatchGraph: the slot of `pos` in a layer, and the bookkeeping after a step ran.
  int32_t slot(const Layer& layer, int64_t pos) const;
  void appended(int64_t n);
  const BackendTensorPtr& step_hidden() const { return step_hidden_; }  // F32 [step_tokens, hidden_size]

 private:
  ComputeBackend& backend_;
  KvCacheSpec spec_;
  uint64_t id_;
  int64_t capacity_;
  int64_t position_ = 0;
  std::vector<Layer> layers_;
  BackendTensorPtr last_hidden_, step_hidden_;
  struct Rollback;  // truncate()'s graph for one depth, with or without the hidden row
  std::map<std::pair<int64_t, bool>, std::unique_ptr<Rollback>> rollbacks_;
  Rollback& rollback(int64_t depth, bool hidden);
  int64_t step_start_ = 0, step_len_ = 0;  // positions the rows of step_hidden_ hold
};

// A forward pass that appends tokens to several sequences at once. Every per-token value of the model
// ([T, ...]) has the entries' rows in order: rows [offset(e), offset(e) + tokens(e)) belong to entry e.
// Matrix products run once over all rows (each weight is read once for the whole batch); attention and
// cache writes run per entry over that entry's own cache. The graph is built once for a batch shape
// (which caches, how many tokens each) and run again for every step of that shape.
class BatchGraph {
 public:
  struct Entry {
    KvCache* cache = nullptr;
    int64_t tokens = 0;
  };
  // Adds the Inputs positions [T] and the slots of each distinct layer geometry to `g`. `attention`
  // computes each entry's attention (null: standard_attention()).
  BatchGraph(Graph& g, std::vector<Entry> entries, std::shared_ptr<const Attention> attention = nullptr);

  Graph& graph() const { return g_; }
  int64_t rows() const { return rows_; }
  size_t entries() const { return entries_.size(); }
  int64_t offset(size_t e) const { return offsets_[e]; }
  int64_t tokens(size_t e) const { return entries_[e].tokens; }
  Value positions() const { return pos_; }  // I32 [T]: each row's absolute position in its sequence

  // Rows [begin, begin + n) of x [T, ...].
  Value rows(Value x, int64_t begin, int64_t n) const;
  // The last n(e) rows of every entry, stacked: [sum n(e), ...] (the rows logits are wanted for).
  Value last_rows(Value x, std::span<const int64_t> n) const;

  // Causal attention of q [T, Hq, D] over cache layer `layer` of every entry after writing this step's
  // k [T, Hkv, D] and v [T, Hkv, Dv] into it (at each row's slot); with k and v unset, over what an
  // earlier call wrote to that layer in this graph (a layer sharing another's cache). The layer's
  // window applies; the batch's Attention computes it. -> [T, Hq * Dv].
  Value attention(size_t layer, Value q, Value k, Value v, float scale);

  // Stores the final hidden rows h [T, hidden_size] of every entry in its cache (KvCacheSpec::hidden_size).
  void keep_hidden(Value h);

  // Before each run: the values of this graph's inputs for the caches' current positions. After the run:
  // advance every cache by its tokens.
  void set_inputs(RunInputs& in);
  void appended();

 private:
  struct Written {
    Value k, v, pos;
  };
  Value slots_for(size_t layer);

  Graph& g_;
  std::vector<Entry> entries_;
  std::shared_ptr<const Attention> attention_;
  std::vector<int64_t> offsets_;
  int64_t rows_ = 0;
  Value pos_;
  struct SlotInput {  // the slot each row writes to in layers of one window
    int64_t window = 0;
    size_t layer = 0;   // a layer of that window
    bool ring = false;  // false: slot = position, the value is positions()
    Value value;
    std::vector<int32_t> data;
  };
  std::vector<SlotInput> slot_inputs_;
  std::vector<std::vector<Written>> written_;          // [entry][layer]
  std::vector<Value> hidden_ids_;                      // per entry: iota rows for keep_hidden
  // Per entry, made by the first attention() call: its cache's slots in use after this step, I32 [1]
  // (position + tokens; a layer's slots fill from 0, so later ones are empty: Op::Attention's src5).
  std::vector<Value> in_use_;
  std::vector<int32_t> in_use_data_;
  // Host buffers of the inputs, filled by set_inputs (RunInputs points into them).
  std::vector<int32_t> pos_data_;
  std::vector<std::vector<int32_t>> hidden_id_data_;
};

}  // namespace specula

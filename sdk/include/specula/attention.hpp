// Attention as a plugin kind ("attention"): one sequence's queries over a KV cache, appended to the
// model's graph. Models call it for every attention layer (BatchGraph::attention for a target's own
// cache, directly for a drafter reading its target's), so a plugin can supply another implementation
// (a fused or paged kernel, a long-context scheme) without forking a model. The cache layout it reads is
// KvCache's (specula/kv_cache.hpp): K/V rows in slots, with the absolute position each slot holds, a
// ring for sliding-window layers. standard_attention() (also plugin "attention") is Op::Attention.
// A pipeline names another with target.attention / drafter.attention (docs/plugin-authoring.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "specula/compute.hpp"

namespace specula {

struct AttentionCall {
  Value q;                // [n, Hq, D]: the queries of one sequence's rows
  Value k, v;             // [S, Hkv, D], [S, Hkv, Dv]: the cache after this step's writes
  Value key_positions;    // I32 [S]: the position each slot holds, -1 = empty; slots in any order
  Value query_positions;  // I32 [n]
  float scale = 1.0f;
  int64_t window = 0;     // sliding window; 0 = none
  bool causal = true;     // false: bidirectional over what the cache holds (a drafter over its target's)
  Value slots_in_use;     // optional I32 [1]: slots >= it are empty (Op::Attention's src5)
};

class Attention {
 public:
  virtual ~Attention() = default;
  virtual std::string name() const = 0;
  // Appends the attention of `call` to `g` -> [n, Hq * Dv], as Op::Attention defines it (compute.hpp):
  // query t sees slot s iff it holds a position kp >= 0, kp <= qp when causal, within the window.
  virtual Value build(Graph& g, const AttentionCall& call) const = 0;
};

// Op::Attention itself; stateless, shared.
std::shared_ptr<const Attention> standard_attention();

}  // namespace specula

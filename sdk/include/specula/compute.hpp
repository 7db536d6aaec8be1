// ComputeBackend: where tensors live and how a graph of ops runs. Model plugins never touch device
// memory: they upload weights once, allocate persistent tensors (KV cache) once, and describe every
// forward pass as a Graph that the backend runs as a whole (CPU: fused and threaded; Vulkan: one
// submission).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "specula/dtype.hpp"
#include "specula/model_file.hpp"

namespace specula {

class OpProfile;  // specula/op_profile.hpp

using Shape = std::vector<int64_t>;  // outermost first; the last axis is contiguous

// Storage owned by a backend: a weight, a KV cache, any persistent tensor. Graphs refer to it.
class BackendTensor {
 public:
  virtual ~BackendTensor() = default;
  virtual DType type() const = 0;
  virtual const Shape& shape() const = 0;
  virtual const std::string& name() const = 0;
};
using BackendTensorPtr = std::shared_ptr<BackendTensor>;

// Operand and result types: "float" operands may be stored as F32, F16, BF16 or any quantized type
// (the backend converts); results are F32 unless stated. Every op's operands are src[0..4] in the
// order listed.
enum class Op : uint32_t {
  Input,       // host data set before each run (token ids, positions); any plain dtype
  Constant,    // a BackendTensor (weight, cache)
  GetRows,     // src0 table [R, C] (any dtype), src1 ids I32 [...] -> F32 [..., C]; ids must be in [0, R).
               // An I32 table (a constant or a computed value) gives its I32 rows: ids of ids, e.g. a
               // drafter's vocab id from a candidate index, without the host
  MatMul,      // src0 weight [O, I] (any dtype), src1 x F32 [..., I] -> F32 [..., O]   (x @ W^T)
  MatMulId,    // src0 experts [E, O, I], src1 x [N, K, I] or [N, 1, I], src2 ids I32 [N, K] -> [N, K, O]
               // row (n, k) = x[n, k or 0] @ experts[ids[n, k]]^T
  Add,         // a + b -> shape of a. b is right-aligned against a (numpy broadcasting restricted to b):
               // each axis of b equals a's or is 1, so b [C], [1], [N, K, 1] against a [N, K, C] all work
  Mul,         // a * b, same broadcast
  Scale,       // a * f[0]
  RmsNorm,     // x * (mean(x^2) + f[0])^-0.5 over the last axis; src1 optional weight [C] (multiplied as
               // is, no 1 + w)
  GeluTanh,    // 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))
  Softcap,     // f[0] * tanh(x / f[0])
  Rope,        // src0 x [T, H, D], src1 positions I32 [T]; NeoX halves: pair k is (x[k], x[k + D/2]).
               // Pairs k < i[0] rotate by angle pos * f[2] * f[0]^(-2k / f[1]); the others pass through.
               // (f[0] = theta, f[1] = exponent divisor, f[2] = frequency scale = 1 / rope "factor")
  Attention,   // src0 q [T, Hq, D], src1 K [S, Hkv, D], src2 V [S, Hkv, Dv], src3 key positions I32 [S]
               // (-1 = empty slot), src4 query positions I32 [T]; f[0] = scale; i[0] = sliding window
               // (0 = none), i[1] = 1 for causal, 0 for bidirectional; -> F32 [T, Hq * Dv].
               // Query t sees slot s iff kp = key_pos[s] >= 0, and kp <= qp when causal, and
               // |qp - kp| < window when windowed (causal: 0 <= qp - kp < window). Query head j reads
               // KV head j / (Hq / Hkv). Scores and softmax in F32; a query that sees no slot gives 0.
               // K and V are F32, F16 or BF16 (a cache); slots may be in any order (a ring buffer).
               // Optional src5 I32 [1] = n, the slots in use: the caller promises that slots >= n are
               // empty (a cache fills slots from 0), so a backend reads only min(n, S) slots and a
               // decode step costs the live context, not the allocated one.
  Softmax,     // over the last axis
  TopK,        // i[0] = k over the last axis -> I32 [..., k] indices, highest first (ties: lower index)
  Argmax,      // over the last axis -> I32 [..., 1] (ties: lower index)
  Reshape,     // same data, new shape (also in i[]; product must match); keeps the dtype
  Slice,       // along the last axis: i[0] = start, i[1] = length (F32 or I32)
  Concat,      // along the last axis (both F32 or both I32)
  WriteRows,   // copy src1 rows [N, ...] into rows of persistent src0 [R, ...] at row indices src2 I32 [N],
               // converting to src0's dtype (F32, F16, BF16; I32 rows into I32); -> src0 (use this
               // value, not the Constant, to read the tensor after the write). Ids must be in [0, R).
  Copy,        // convert src0 to dtype of the node: F32, F16 or BF16 (e.g. F32 -> F16 for a cache)
  // Ops of the device sampler (docs/sampling.md); all F32 in, plain loops out.
  Div,         // a / b (IEEE division, not a * (1 / b)), same broadcast as Add
  Clamp,       // x < f[0] ? f[0] : (x > f[1] ? f[1] : x); f[0] <= f[1]. f[0] == f[1] fills with f[0]
  Scatter,     // src0 a F32 [N], src1 ids I32 [M], src2 values F32 [M] -> F32 [N]: a copy of a with
               // out[ids[m]] = values[m]. Ids must be in [0, N); repeated ids must carry equal values
               // (which one lands is otherwise unspecified).
  TopPDraw,    // src0 logits F32 [K] highest first, src1 uniform F32 [1], src2 ids I32 [K]; f[0] =
               // temperature (> 0), f[1] = top_p in (0, 1], f[2] = min_p in [0, 1], f[3] = 1.0f / temperature
               // (set by Graph::top_p_draw) -> I32 [1] = ids[pick]. The pick is specula::top_p_set /
               // top_p_pick (sampling_rule.hpp): float32 weights rule_exp(x_k f[3] - x_0 f[3]), min-p and
               // top-p prefixes and the inverse-CDF draw with sums left to right, using only correctly
               // rounded +, -, * (no fused multiply-add, no division, no library exp). Every backend
               // computes it bit for bit as the host sampler does (plugins/sampler_standard).
  AcceptDrafts,  // a sampled speculative round decided on the backend (docs/sampling.md): src0 target logits
               // F32 [n + 1, V] (rows of [last, d_1..d_n]), src1 their TopK I32 [n + 1, K], src2 the drafter's
               // logits F32 [n, V], src3 their TopK I32 [n, Kq], src4 drafts I32 [n], src5 uniforms F32
               // [2n + 1] (acceptance and residual of each draft, then the bonus); f[] as TopPDraw's, for
               // both distributions -> I32 [n + 2] = [a, t_0 .. t_a, -1 ...]: a drafts accepted, and the
               // a + 1 tokens the round emits (those drafts, then the replacement, or the bonus when a = n).
               // A row's distribution is top_p_set over its TopK prefix; a token is kept by a row iff it
               // ranks (by logit, then lower id) at or before the row's last kept candidate, and weighs
               // rule_exp(x_t f[3] - x_0 f[3]) there. Drafts are decided in order by
               // specula::speculative_verdict (sampling_rule.hpp) up to the first rejection; the bonus is
               // top_p_pick of row n. Bit for bit the host engine's rule (core/speculative.hpp).
};

// "MatMul", "RmsNorm", ... for errors and profiles.
std::string_view op_name(Op op);
// "[2, 64, 256]", for errors.
std::string shape_str(const Shape& s);

// A node of a Graph. Parameters are small and fixed-size so a graph is plain data a backend can cache.
struct Node {
  Op op = Op::Input;
  DType type = DType::F32;
  Shape shape;
  std::array<int32_t, 6> src{-1, -1, -1, -1, -1, -1};  // indices of earlier nodes, -1 = unused
  std::array<int64_t, 8> i{};
  std::array<float, 4> f{};
  BackendTensorPtr tensor;  // Constant and WriteRows destination
  std::string name;         // for errors and profiles
};

// A value in a Graph under construction.
struct Value {
  int32_t id = -1;
  explicit operator bool() const { return id >= 0; }
};

// A forward pass recorded as data. Builders check shapes as they go and throw specula::Error naming
// the op, node and shapes on a mismatch, so a wrong model fails while the graph is built.
class Graph {
 public:
  Value input(DType type, Shape shape, std::string name);
  Value constant(const BackendTensorPtr& t);
  Value get_rows(Value table, Value ids);
  Value matmul(Value weight, Value x);
  Value matmul_id(Value experts, Value x, Value ids);
  Value add(Value a, Value b);
  Value mul(Value a, Value b);
  Value scale(Value a, float s);
  Value rms_norm(Value x, Value weight, float eps);  // weight may be Value{} (none)
  Value gelu_tanh(Value x);
  Value softcap(Value x, float cap);
  Value rope(Value x, Value positions, int64_t rotated_pairs, float theta, float exponent_divisor,
             float freq_scale = 1.0f);
  Value attention(Value q, Value k, Value v, Value key_pos, Value query_pos, float scale,
                  int64_t window, bool causal, Value slots_in_use = {});
  Value softmax(Value x);
  Value top_k(Value x, int64_t k);
  Value argmax(Value x);
  Value reshape(Value x, Shape shape);
  Value slice(Value x, int64_t start, int64_t length);
  Value concat(Value a, Value b);
  Value write_rows(const BackendTensorPtr& dst, Value rows, Value row_ids);
  Value copy(Value x, DType type);
  Value div(Value a, Value b);
  Value clamp(Value x, float lo, float hi);
  Value scatter(Value a, Value ids, Value values);
  Value top_p_draw(Value logits, Value uniform, Value ids, float temperature, float top_p, float min_p = 0.0f);
  Value accept_drafts(Value target_logits, Value target_top, Value draft_logits, Value draft_top, Value drafts,
                      Value uniforms, float temperature, float top_p, float min_p = 0.0f);

  // Gives a node a name for errors and profiles ("blk.3.attn_q"); returns v.
  Value named(Value v, std::string name);

  // Marks a value whose data the caller reads after the run.
  void mark_output(Value v);

  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(Value v) const;
  const std::vector<int32_t>& outputs() const { return outputs_; }
  const Shape& shape(Value v) const { return node(v).shape; }

 private:
  Value push(Node n);
  std::vector<Node> nodes_;
  std::vector<int32_t> outputs_;
  std::unordered_map<const BackendTensor*, int32_t> constants_;  // one Constant node per tensor
};

// Answer of a capability query: whether an op is supported on a dtype, and if not, why.
struct Support {
  bool ok = true;
  std::string reason;  // empty when ok
  static Support yes() { return {}; }
  static Support no(std::string why) { return {false, std::move(why)}; }
};

struct DeviceInfo {
  std::string name;        // "CPU (oneDNN 2.6, AVX2)", "NVIDIA H200 (Vulkan 1.3)"
  uint64_t memory_bytes = 0;
  bool unified_memory = true;
};

// A host vector's bytes, as RunInputs and ComputeBackend::write take them.
template <typename T>
std::span<const std::byte> bytes_of(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// Data for one run: the values of the graph's Input nodes.
struct RunInputs {
  std::vector<std::pair<Value, std::span<const std::byte>>> inputs;
};

// A graph prepared by one backend (ComputeBackend::compile): run it any number of times and read its
// outputs after each run. Each compiled graph keeps its own outputs, so graphs of several contexts, the
// drafter's and the sampler's run in any order with nothing shared between them but the persistent
// tensors they name. The graph and the backend must outlive it, and the graph must not change.
class CompiledGraph {
 public:
  virtual ~CompiledGraph() = default;
  // Runs the whole graph; on return its outputs are readable.
  virtual void run(const RunInputs& inputs) = 0;
  // Copies an output of the last run (a value given to Graph::mark_output) to host memory as F32/I32.
  virtual void read(Value output, std::span<std::byte> dst) const = 0;
};

// Plugin kind "backend".
class ComputeBackend {
 public:
  virtual ~ComputeBackend() = default;
  virtual std::string name() const = 0;
  virtual DeviceInfo device() const = 0;

  // Whether `op` can run with its weight/input operand stored as `type`, and if not, why.
  virtual Support supports(Op op, DType type) const = 0;

  // A weight from a checkpoint: mapped (CPU) or uploaded (GPU) once.
  virtual BackendTensorPtr load_weight(const TensorInfo& info) = 0;
  // A zero-initialised persistent tensor (KV cache, state).
  virtual BackendTensorPtr allocate(const std::string& name, DType type, const Shape& shape) = 0;

  // Prepares a finished graph to run (plans its buffers, kernels, command buffers).
  virtual std::unique_ptr<CompiledGraph> compile(const Graph& graph) = 0;
  // Copies a persistent tensor to host memory as F32/I32, or host data into it.
  virtual void read(const BackendTensor& tensor, std::span<std::byte> dst) = 0;
  virtual void write(BackendTensor& tensor, std::span<const std::byte> src) = 0;

  // What option `profile` has recorded so far (specula/op_profile.hpp), or null: the option is off or the
  // backend keeps no profile.
  virtual const OpProfile* profile() const { return nullptr; }
};

}  // namespace specula

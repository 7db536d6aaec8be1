// Lowering: each op of a graph to dispatches of the shaders, with their bindings and push constants, and
// the plan's arena of intermediates. VulkanBackend::build runs a Lowering over the nodes in order, then
// makes the plan's buffers and records it (vk_record.cpp).
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>

#include "specula/log.hpp"
#include "shaders/push_constants.h"
#include "vk_backend_impl.hpp"

namespace specula::vulkan::detail {

// A MatMul of at least kTiledMinRows activation rows runs matmul_coopmat.comp where the device has
// cooperative matrices (tiles of 64 rows by 64 columns), else matmul_tiled.comp, kTileRows rows a
// workgroup (its TN): prefill. Fewer rows run matvec.comp, a team of 32 threads per weight row, which
// gives a row the same bits whatever the row count (a verification scores as a decode step); MatMulId
// runs matmul.comp.
constexpr int64_t kTiledMinRows = 32, kTileRows = 32;
// TopK / Argmax of up to kTopKRounds run topk.comp (a pass over the row per pick); more run
// topk_select.comp (about seven passes and a sort of the k picked, whatever k is).
constexpr int64_t kTopKRounds = 4;
// Attention over more than kAttentionChunk slots with fewer than kAttentionWorkgroups queries x heads
// splits its slots into chunks of at least kAttentionChunk, up to kAttentionWorkgroups workgroups (at
// most kMaxChunks chunks a query and head in attention_combine.comp). Up to kAttentionRowQueries queries
// (decode, a verification) the chunks are those of one query, so that a verification scores each of its
// queries with the very sums a decode step would.
constexpr int64_t kAttentionChunk = 64, kAttentionWorkgroups = 512, kAttentionRowQueries = 16;

// llvmpipe (lavapipe, a CPU implementation of Vulkan) ends a shader invocation's loops after 65535
// iterations in all and carries on with wrong values. Where one invocation of a dispatch could loop
// more than kLoopBudget (`iterations`, an upper estimate; the budget leaves a margin), such a device
// refuses the graph with what to change instead. GPUs have no such limit.
constexpr int64_t kLoopBudget = 60000;
void check_cpu_device_loops(const Device& dev, const Node& n, int64_t iterations, const std::string& what,
                            const std::string& instead) {
  if (dev.props.deviceType != VK_PHYSICAL_DEVICE_TYPE_CPU || iterations <= kLoopBudget) return;
  fail("Vulkan backend: {} '{}' {} on '{}', a CPU implementation of Vulkan that stops a shader's loops "
       "after 65535 iterations (this one would need about {}); {}, or run on the CPU backend (backend: "
       "{{plugin: cpu}}), which is also much faster on this machine",
       op_name(n.op), n.name, what, dev.props.deviceName, iterations, instead);
}

namespace {

// copy.comp's operations (PC_COPY_OP).
enum CopyOp : uint32_t { kCopySlice = 0, kCopyConcat = 1, kCopyConvert = 2, kCopyWriteRows = 3, kCopyScatter = 4, kCopyGather = 5 };

// elementwise.comp's operations (PC_EW_OP).
uint32_t elementwise_op(Op op) {
  switch (op) {
    case Op::Add: return 0;
    case Op::Mul: return 1;
    case Op::Scale: return 2;
    case Op::GeluTanh: return 3;
    case Op::Softcap: return 4;
    case Op::Div: return 5;
    default: return 6;  // Clamp
  }
}

// Threads per weight row of matmul.comp: enough for the row's chunks of 32 values, at most 64.
uint32_t threads_per_row(int64_t cols) {
  const int64_t chunks = (cols + 31) / 32;
  uint32_t tpr = 1;
  while (tpr < 64 && tpr < chunks) tpr *= 2;
  return tpr;
}

// The rotated pairs of a Rope node (its frequency table's length).
int64_t rope_pairs(const Node& n) { return std::min<int64_t>(n.i[0], n.shape[2] / 2); }

// Liveness through reshapes, as the CPU backend: a Reshape shares the storage of its operand's root,
// and a root's range is released after its last reader. Inputs and outputs live to the end.
struct Liveness {
  std::vector<int32_t> root, last_use;

  explicit Liveness(const Graph& g) : root(g.nodes().size()), last_use(g.nodes().size()) {
    const auto& nodes = g.nodes();
    const int32_t count = static_cast<int32_t>(nodes.size());
    for (int32_t i = 0; i < count; ++i) {
      const Node& n = nodes[static_cast<size_t>(i)];
      root[static_cast<size_t>(i)] = n.op == Op::Reshape ? root[static_cast<size_t>(n.src[0])] : i;
      last_use[static_cast<size_t>(i)] = i;
      for (int32_t s : n.src)
        if (s >= 0) last_use[static_cast<size_t>(root[static_cast<size_t>(s)])] = i;
    }
    for (int32_t o : g.outputs()) last_use[static_cast<size_t>(root[static_cast<size_t>(o)])] = count;
    for (int32_t i = 0; i < count; ++i)
      if (nodes[static_cast<size_t>(i)].op == Op::Input) last_use[static_cast<size_t>(i)] = count;
  }
  // The root of `v` when node `i` is its root's last reader.
  std::optional<int32_t> done_after(int32_t v, int32_t i) const {
    const int32_t r = root[static_cast<size_t>(v)];
    if (last_use[static_cast<size_t>(r)] != i) return std::nullopt;
    return r;
  }
};

// Rows [first, end) of a weight bound as one window.
using Window = std::pair<int64_t, int64_t>;

// The lowering of one graph into a plan: the arena (inputs and rope tables first, then each node's
// result, released after its last reader), and each node's dispatches, one function per op family.
class Lowering {
 public:
  Lowering(const VulkanBackend& backend, const Device& dev, const Graph& g, Plan& p)
      : backend_(backend), dev_(dev), nodes_(g.nodes()), p_(p),
        align_(std::max<VkDeviceSize>(dev.props.limits.minStorageBufferOffsetAlignment, 16)),
        max_range_(dev.max_binding), arena_(align_), live_(g), rope_off_(g.nodes().size(), 0) {
    p_.loc.assign(nodes_.size(), Loc{});
    p_.id_bound.assign(nodes_.size(), 0);
    place_inputs();
    place_rope_tables();
  }

  // Node i's dispatches, then the ranges it was the last to read released.
  void lower(int32_t i) {
    const Node& n = node(i);
    temps_.clear();
    switch (n.op) {
      case Op::Input: break;  // placed up front
      case Op::Constant: p_.loc[static_cast<size_t>(i)] = whole(vk_tensor(*n.tensor)); break;
      case Op::Reshape: p_.loc[static_cast<size_t>(i)] = operand(n, 0); break;
      case Op::GetRows: get_rows(i, n); break;
      case Op::MatMul: matmul(i, n); break;
      case Op::MatMulId: matmul_id(i, n); break;
      case Op::Add: case Op::Mul: case Op::Div: broadcast(i, n); break;
      case Op::Scale: case Op::GeluTanh: case Op::Softcap: case Op::Clamp: unary(i, n); break;
      case Op::RmsNorm: case Op::Softmax: rows(i, n); break;
      case Op::Rope: rope(i, n); break;
      case Op::Attention: attention(i, n); break;
      case Op::TopK: case Op::Argmax: top_k(i, n); break;
      case Op::Slice: slice(i, n); break;
      case Op::Concat: concat(i, n); break;
      case Op::Copy: convert(i, n); break;
      case Op::Scatter: scatter(i, n); break;
      case Op::WriteRows: write_rows(i, n); break;
      case Op::TopPDraw: top_p_draw(i, n); break;
      case Op::AcceptDrafts: accept_drafts(i, n); break;
      default:
        fail("Vulkan backend: node '{}' is {}, which the Vulkan backend does not implement", n.name, op_name(n.op));
    }
    release(i, n);
  }

  VkDeviceSize arena_bytes() const { return arena_.size(); }
  VkDeviceSize staging_bytes() const { return staging_; }

 private:
  // ---- The arena before the first node: inputs and constant tables, never released.

  // Inputs first: the run copies them in before the first dispatch.
  void place_inputs() {
    for (int32_t i = 0; i < static_cast<int32_t>(nodes_.size()); ++i) {
      const Node& n = node(i);
      if (n.op != Op::Input) continue;
      const size_t es = plain_size(n.type);
      if (es == 0) fail("Vulkan backend: input '{}' is {}; inputs hold plain values", n.name, dtype_name(n.type));
      const VkDeviceSize bytes = static_cast<VkDeviceSize>(elements(n.shape)) * es;
      const VkDeviceSize off = arena_.alloc(bytes);
      p_.loc[static_cast<size_t>(i)] = {nullptr, off, (bytes + 3) / 4 * 4};
      p_.inputs.push_back({i, staging_, off, bytes});
      staging_ += (bytes + 15) / 16 * 16;
    }
  }

  // Rope frequency tables, exactly as the CPU backend computes them (F32 pow on the host): one arena
  // range allocated before any intermediate, copied in with the inputs.
  void place_rope_tables() {
    for (int32_t i = 0; i < static_cast<int32_t>(nodes_.size()); ++i) {
      const Node& n = node(i);
      if (n.op != Op::Rope) continue;
      const int64_t pairs = rope_pairs(n);
      std::vector<float> inv(static_cast<size_t>(std::max<int64_t>(pairs, 1)));
      for (int64_t k = 0; k < pairs; ++k)
        inv[static_cast<size_t>(k)] = (1.0f / std::pow(n.f[0], static_cast<float>(2 * k) / n.f[1])) * n.f[2];
      rope_off_[static_cast<size_t>(i)] = p_.consts.size();
      p_.consts.resize(p_.consts.size() + (inv.size() * 4 + 255) / 256 * 256);
      std::memcpy(p_.consts.data() + rope_off_[static_cast<size_t>(i)], inv.data(), inv.size() * 4);
    }
    if (p_.consts.empty()) return;
    p_.consts_arena = arena_.alloc(p_.consts.size());
    p_.consts_staging = staging_;
    staging_ += p_.consts.size();
  }

  // ---- Shared helpers: values, the arena, dispatches.

  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  const Node& src(const Node& n, int k) const { return node(n.src[static_cast<size_t>(k)]); }
  Loc loc(int32_t id) const { return p_.loc[static_cast<size_t>(id)]; }
  Loc operand(const Node& n, int k) const { return loc(n.src[static_cast<size_t>(k)]); }
  static Loc whole(VkTensor& t) { return {&t, 0, t.buf->size}; }

  // Node i's result: a new arena range.
  Loc result(int32_t i, const Node& n) {
    const VkDeviceSize bytes = value_bytes(n.type, n.shape);
    return p_.loc[static_cast<size_t>(i)] = {nullptr, arena_.alloc(bytes), bytes};
  }
  // A range for this node only (an operand's conversion, partial results), released after it.
  Loc scratch(VkDeviceSize bytes) {
    const VkDeviceSize off = arena_.alloc(bytes);
    temps_.emplace_back(off, bytes);
    return {nullptr, off, bytes};
  }
  // The node's scratch ranges, and the ranges it was the last to read (its own when nothing reads it).
  void release(int32_t i, const Node& n) {
    for (auto [off, size] : temps_) arena_.release(off, size);
    auto release_root = [&](int32_t v) {
      const auto r = live_.done_after(v, i);
      if (!r) return;
      const Loc& l = p_.loc[static_cast<size_t>(*r)];
      if (!l.tensor && l.size > 0) arena_.release(l.off, l.size);
    };
    for (int32_t s : n.src)
      if (s >= 0) release_root(s);
    release_root(i);
  }

  void emit(const Dispatch& d) {
    if (d.groups > 0) p_.dispatches.push_back(d);
  }
  static Dispatch dispatch(int32_t i, std::string shader) {
    Dispatch d;
    d.node = i;
    d.shader = std::move(shader);
    return d;
  }
  // copy.comp writing `words` 32-bit words (Scatter: values).
  static Dispatch copy_dispatch(int32_t i, CopyOp op, uint64_t words) {
    Dispatch d = dispatch(i, "copy");
    d.pc[PC_COPY_OP] = op;
    d.pc[PC_COPY_WORDS] = u32(static_cast<int64_t>(words));
    d.groups = (words + 255) / 256;
    return d;
  }
  // get_rows.comp: `rows` rows of the R x C table of `type` at binding 0, as F32.
  static Dispatch get_rows_dispatch(int32_t i, DType type, int64_t R, int64_t C, int64_t rows) {
    Dispatch d = dispatch(i, "get_rows");
    d.pc[PC_GR_TYPE] = static_cast<uint32_t>(type);
    d.pc[PC_GR_R] = u32(R);
    d.pc[PC_GR_C] = u32(C);
    d.pc[PC_GR_ROWS] = u32(rows);
    d.pc[PC_GR_NODE] = u32(i);
    d.groups = (static_cast<uint64_t>(rows) * static_cast<uint64_t>((C + 31) / 32) + 63) / 64;
    return d;
  }
  // elementwise.comp over node n's values, with operand 0 (as F32) at binding 0.
  Dispatch elementwise_dispatch(int32_t i, const Node& n) {
    Dispatch d = dispatch(i, "elementwise");
    d.bind[0] = as_f32(i, n, 0);
    d.pc[PC_EW_OP] = elementwise_op(n.op);
    d.pc[PC_EW_COUNT] = u32(elements(n.shape));
    d.groups = (static_cast<uint64_t>(elements(n.shape)) + 255) / 256;
    return d;
  }

  // Operand k of node n as F32: the value itself, or its conversion from a stored F16/BF16/quantized
  // value into a scratch range (a get_rows dispatch of identity ids before node n's own).
  Loc as_f32(int32_t i, const Node& n, int k, bool allow_i32 = false) {
    const int32_t s = n.src[static_cast<size_t>(k)];
    const Node& sn = node(s);
    if (sn.type == DType::F32 || (allow_i32 && sn.type == DType::I32)) return loc(s);
    const Support ok = backend_.supports(n.op, sn.type);
    if (!ok.ok || !decodable(sn.type))
      fail("Vulkan backend: {} '{}': operand '{}' is {}, which the Vulkan backend cannot read here: {}", op_name(n.op),
           n.name, sn.name, dtype_name(sn.type),
           !ok.ok ? ok.reason
           : sn.type == DType::MLX_AFFINE
               ? "MLX affine weights are decoded only as the weight (first operand) of MatMul, MatMulId and GetRows"
               : "not a decodable type");
    const int64_t cols = sn.shape.back(), rows = elements(sn.shape) / cols;
    Dispatch d = get_rows_dispatch(i, sn.type, rows, cols, rows);
    d.pc[PC_GR_IDENTITY] = 1;
    d.bind[0] = loc(s);
    d.bind[5] = scratch(static_cast<VkDeviceSize>(rows * cols) * 4);
    emit(d);
    return d.bind[5];
  }

  // ---- Weights: the table of GetRows, MatMul and MatMulId, bound in windows where it is too large.

  void need_weight(const Node& n, int k) const {
    const Node& w = src(n, k);
    const Support ok = backend_.supports(n.op, w.type);
    if (!ok.ok) fail("Vulkan backend: {} '{}': weight '{}' is {}: {}", op_name(n.op), n.name, w.name, dtype_name(w.type), ok.reason);
  }
  // An MLX weight's tensor (its codes, scales and biases are bound as three sections, windowed alike).
  static const VkTensor& mlx_tensor(const Loc& w, const Node& wn, int64_t cols) {
    if (!w.tensor || w.tensor->type() != DType::MLX_AFFINE || w.tensor->shape().back() != cols)
      fail("Vulkan backend: MLX weight '{}' {} must be used as loaded, with rows of its {} values", wn.name,
           shape_str(wn.shape), w.tensor ? w.tensor->shape().back() : cols);
    return *w.tensor;
  }
  // Row windows [first, end) of a weight that fit maxStorageBufferRange at an aligned offset (one
  // window when it fits whole); `unit` rows move together (an expert's O rows).
  std::vector<Window> windows(const Loc& w, const Node& wn, int64_t rows, int64_t cols, int64_t unit) const {
    std::vector<Window> out;
    const DType type = wn.type;
    const VkTensor* mlx = type == DType::MLX_AFFINE ? &mlx_tensor(w, wn, cols) : nullptr;
    // MLX: the codes are the largest section; scale windows start at the same rows.
    if ((mlx ? mlx->section_bytes[0] : w.size) <= max_range_) return {{0, rows}};
    const uint64_t rb = (mlx ? mlx->code_row : *dtype_row_bytes(type, static_cast<uint64_t>(cols))) *
                        static_cast<uint64_t>(unit);
    const uint64_t sb = mlx ? mlx->scale_row * static_cast<uint64_t>(unit) : 0;
    uint64_t step = std::max<uint64_t>(1, (max_range_ - 4) / rb);
    while (step > 1 && ((step * rb) % align_ != 0 || (step * sb) % align_ != 0)) --step;
    if ((step * rb) % align_ != 0 || (step * sb) % align_ != 0 || step * rb > max_range_)
      fail("Vulkan backend: weight '{}': rows of {} bytes cannot be bound in windows of at most {} bytes", wn.name, rb,
           max_range_);
    const int64_t units = rows / unit;
    for (int64_t u = 0; u < units; u += static_cast<int64_t>(step))
      out.emplace_back(u * unit, std::min<int64_t>(units, u + static_cast<int64_t>(step)) * unit);
    return out;
  }
  Loc window_loc(const Loc& w, DType type, int64_t cols, Window win) const {
    if (w.size <= max_range_) return w;
    const uint64_t rb = *dtype_row_bytes(type, static_cast<uint64_t>(cols));
    Loc l = w;
    l.off = w.off + static_cast<VkDeviceSize>(win.first) * rb;
    l.size = std::min<VkDeviceSize>((static_cast<VkDeviceSize>(win.second - win.first) * rb + 3) / 4 * 4, w.size - (l.off - w.off));
    return l;
  }
  // Binds window `win` of weight `wn` (at `w`) for get_rows / matmul: at binding 0; for MLX, the codes
  // there, the scales and biases at bindings 3 and 4 and the parameters in pc[24..26] (common.glsl).
  void bind_weight(Dispatch& d, const Loc& w, const Node& wn, int64_t cols, Window win) const {
    if (wn.type != DType::MLX_AFFINE) {
      d.bind[0] = window_loc(w, wn.type, cols, win);
      return;
    }
    const VkTensor& t = mlx_tensor(w, wn, cols);
    const VkDeviceSize first = static_cast<VkDeviceSize>(win.first), count = static_cast<VkDeviceSize>(win.second - win.first);
    auto section = [&](int k, VkDeviceSize start, uint64_t row) {
      const VkDeviceSize off = first * row;
      return Loc{w.tensor, start + off, std::min<VkDeviceSize>((count * row + 3) / 4 * 4, t.section_bytes[k] - off)};
    };
    d.bind[0] = section(0, 0, t.code_row);
    d.bind[3] = section(1, t.scales_off, t.scale_row);
    d.bind[4] = section(2, t.biases_off, t.scale_row);
    d.pc[PC_MLX_BITS] = t.mlx.bits;
    d.pc[PC_MLX_GROUP] = t.mlx.group_size;
    d.pc[PC_MLX_SCALE_TYPE] = static_cast<uint32_t>(t.mlx.scale_type);
  }

  // ---- The op families.

  // GetRows: rows of a weight table by id, one dispatch per window of the table.
  void get_rows(int32_t i, const Node& n) {
    const Node& t = src(n, 0);
    if (t.type == DType::I32) return gather(i, n);
    need_weight(n, 0);
    const int64_t R = t.shape[0], C = t.shape[1];
    Dispatch d = get_rows_dispatch(i, t.type, R, C, elements(src(n, 1).shape));
    d.bind[1] = operand(n, 1);
    d.bind[5] = result(i, n);
    p_.id_bound[static_cast<size_t>(i)] = R;
    const Loc table = operand(n, 0);
    for (Window win : windows(table, t, R, C, 1)) {
      d.pc[PC_GR_FIRST] = u32(win.first);
      d.pc[PC_GR_END] = u32(win.second);
      bind_weight(d, table, t, C, win);
      emit(d);
    }
  }
  // GetRows of ids from ids: a gather of 32-bit words, from any value.
  void gather(int32_t i, const Node& n) {
    const Node& t = src(n, 0);
    const int64_t R = t.shape[0], C = t.shape[1];
    Dispatch d = copy_dispatch(i, kCopyGather, static_cast<uint64_t>(elements(n.shape)));
    d.bind[0] = as_f32(i, n, 0, true);
    d.bind[1] = operand(n, 1);
    d.bind[5] = result(i, n);
    d.pc[PC_COPY_COLS] = u32(C);
    d.pc[PC_COPY_ARG] = u32(R);
    d.pc[PC_COPY_NODE] = u32(i);
    p_.id_bound[static_cast<size_t>(i)] = R;
    emit(d);
  }

  // MatMul: y = x W^T, one dispatch per window of W's output rows; the shader by the activation rows N
  // (kTiledMinRows).
  void matmul(int32_t i, const Node& n) {
    need_weight(n, 0);
    const Node& w = src(n, 0);
    const int64_t O = w.shape[0], I = w.shape[1], N = elements(src(n, 1).shape) / I;
    const bool tiled = N >= kTiledMinRows, coopmat = tiled && dev_.coopmat;
    const char* shader = coopmat ? (dev_.coopmat_n == 8 ? "matmul_coopmat_n8" : "matmul_coopmat")
                         : tiled ? "matmul_tiled"
                         : dev_.subgroup_shuffle && dev_.subgroup_size >= 32 ? "matvec_subgroup"
                                                                             : "matvec";
    Dispatch d = dispatch(i, shader);
    d.bind[1] = as_f32(i, n, 1);
    d.bind[5] = result(i, n);
    d.pc[PC_MM_TYPE] = static_cast<uint32_t>(w.type);
    d.pc[PC_MM_O] = u32(O);
    d.pc[PC_MM_I] = u32(I);
    d.pc[PC_MM_N] = u32(N);
    d.pc[PC_MM_MODE] = 0;
    d.pc[PC_MM_NODE] = u32(i);
    d.pc[PC_MM_TPR] = threads_per_row(I);
    const Loc wl = operand(n, 0);
    for (Window win : windows(wl, w, O, I, 1)) {
      const uint64_t cols = static_cast<uint64_t>(win.second - win.first);
      d.pc[PC_MM_WIN_FIRST] = u32(win.first);
      d.pc[PC_MM_WIN_COUNT] = u32(win.second - win.first);
      bind_weight(d, wl, w, I, win);
      d.groups = coopmat ? (cols + 63) / 64 * static_cast<uint64_t>((N + 63) / 64)
                 : tiled ? (cols + 63) / 64 * static_cast<uint64_t>((N + kTileRows - 1) / kTileRows)
                         : (cols + 3) / 4 * static_cast<uint64_t>((N + 7) / 8);
      emit(d);
    }
  }
  // MatMulId: each token's K experts' products (matmul.comp), one dispatch per window of whole experts.
  void matmul_id(int32_t i, const Node& n) {
    need_weight(n, 0);
    const Node& w = src(n, 0);
    const int64_t E = w.shape[0], O = w.shape[1], I = w.shape[2], N = n.shape[0], K = n.shape[1];
    Dispatch d = dispatch(i, dev_.subgroup_shuffle ? "matmul_subgroup" : "matmul");
    d.bind[1] = as_f32(i, n, 1);
    d.bind[5] = result(i, n);
    d.bind[2] = operand(n, 2);
    const uint32_t tpr = threads_per_row(I);
    const uint64_t rows_per_group = 64 / tpr;
    d.pc[PC_MM_TYPE] = static_cast<uint32_t>(w.type);
    d.pc[PC_MM_O] = u32(O);
    d.pc[PC_MM_I] = u32(I);
    d.pc[PC_MM_N] = u32(N * K);
    d.pc[PC_MM_MODE] = 1;
    d.pc[PC_MM_K] = u32(K);
    d.pc[PC_MM_X_SHARED] = src(n, 1).shape[1] == 1 && K != 1 ? 1u : 0u;
    d.pc[PC_MM_E] = u32(E);
    d.pc[PC_MM_NODE] = u32(i);
    d.pc[PC_MM_TPR] = tpr;
    d.groups = (static_cast<uint64_t>(O) + rows_per_group - 1) / rows_per_group * static_cast<uint64_t>((N * K + 7) / 8);
    const Loc wl = operand(n, 0);
    for (Window win : windows(wl, w, E * O, I, O)) {
      d.pc[PC_MM_WIN_FIRST] = u32(win.first / O);
      d.pc[PC_MM_WIN_COUNT] = u32(win.second / O);
      bind_weight(d, wl, w, I, win);
      emit(d);
    }
    p_.id_bound[static_cast<size_t>(i)] = E;
  }

  // Add, Mul, Div: a op b, b broadcast over a's shape (up to 6 axes).
  void broadcast(int32_t i, const Node& n) {
    Dispatch d = elementwise_dispatch(i, n);
    d.bind[1] = as_f32(i, n, 1);
    const Shape& as = n.shape;
    const Shape& bs = src(n, 1).shape;
    if (as.size() > 6) fail("Vulkan backend: {} '{}': rank {} is above the 6 axes the shader handles", op_name(n.op), n.name, as.size());
    std::array<int64_t, 6> adim{1, 1, 1, 1, 1, 1}, bdim{1, 1, 1, 1, 1, 1}, bstride{};
    for (size_t k = 0; k < as.size(); ++k) adim[6 - as.size() + k] = as[k];
    for (size_t k = 0; k < bs.size(); ++k) bdim[6 - bs.size() + k] = bs[k];
    int64_t stride = 1;
    for (int k = 5; k >= 0; --k) {
      bstride[static_cast<size_t>(k)] = bdim[static_cast<size_t>(k)] == 1 ? 0 : stride;
      stride *= bdim[static_cast<size_t>(k)];
    }
    for (int k = 0; k < 6; ++k) {
      d.pc[static_cast<size_t>(PC_EW_A_DIMS + k)] = u32(adim[static_cast<size_t>(k)]);
      d.pc[static_cast<size_t>(PC_EW_B_STRIDES + k)] = u32(bstride[static_cast<size_t>(k)]);
    }
    d.bind[5] = result(i, n);
    emit(d);
  }
  // Scale, GeluTanh, Softcap, Clamp: one value at a time, with up to two float parameters.
  void unary(int32_t i, const Node& n) {
    Dispatch d = elementwise_dispatch(i, n);
    d.pc[PC_EW_F0] = fbits(n.f[0]);
    d.pc[PC_EW_F1] = fbits(n.f[1]);
    d.bind[5] = result(i, n);
    emit(d);
  }

  // RmsNorm (with or without a weight) and Softmax: a workgroup per row (rows.comp).
  void rows(int32_t i, const Node& n) {
    Dispatch d = dispatch(i, "rows");
    d.bind[0] = as_f32(i, n, 0);
    const bool has_w = n.op == Op::RmsNorm && n.src[1] >= 0;
    if (has_w) d.bind[1] = as_f32(i, n, 1);
    const int64_t C = n.shape.back();
    d.pc[PC_ROWS_OP] = n.op == Op::RmsNorm ? 0u : 1u;
    d.pc[PC_ROWS_COLS] = u32(C);
    d.pc[PC_ROWS_EPS] = fbits(n.f[0]);
    d.pc[PC_ROWS_HAS_WEIGHT] = has_w ? 1u : 0u;
    d.bind[5] = result(i, n);
    d.groups = static_cast<uint64_t>(elements(n.shape) / C);
    emit(d);
  }

  // Rope: x [T, H, D] rotated by positions, with the node's frequency table (place_rope_tables).
  void rope(int32_t i, const Node& n) {
    Dispatch d = dispatch(i, "rope");
    d.bind[0] = as_f32(i, n, 0);
    d.bind[1] = operand(n, 1);
    const int64_t T = n.shape[0], H = n.shape[1], D = n.shape[2], pairs = rope_pairs(n);
    d.bind[2] = {nullptr, p_.consts_arena + rope_off_[static_cast<size_t>(i)],
                 static_cast<VkDeviceSize>(std::max<int64_t>(pairs, 1)) * 4};
    d.pc[PC_ROPE_T] = u32(T);
    d.pc[PC_ROPE_H] = u32(H);
    d.pc[PC_ROPE_D] = u32(D);
    d.pc[PC_ROPE_PAIRS] = u32(pairs);
    d.bind[5] = result(i, n);
    d.groups = (static_cast<uint64_t>(T * H * (D / 2)) + 63) / 64;
    emit(d);
  }

  // Few queries x heads over many slots (decode): the slots split into chunks, one workgroup each,
  // so a GPU has kAttentionWorkgroups to run instead of Hq; attention_combine.comp merges them.
  // {chunks per (query, head), slots per chunk}: {1, 0} when the slots are not split.
  static std::pair<int64_t, int64_t> attention_chunks(int64_t T, int64_t Hq, int64_t S) {
    const int64_t rows = T <= kAttentionRowQueries ? Hq : T * Hq;
    const int64_t chunks = S > kAttentionChunk ? std::clamp<int64_t>(kAttentionWorkgroups / std::max<int64_t>(rows, 1), 1,
                                                                     (S + kAttentionChunk - 1) / kAttentionChunk)
                                               : 1;
    return {chunks, chunks > 1 ? ((S + chunks - 1) / chunks + 63) / 64 * 64 : 0};
  }
  void check_attention_loops(const Node& n, int64_t T, int64_t S, int64_t D, int64_t Dv, int64_t chunks,
                             int64_t chunk) const {
    // attention.comp's loops per tile of 64 slots: the dots (eight groups, 64 values a step), the
    // partials' sums, the output update, the reductions; attention_combine.comp's per chunk.
    const int64_t per_tile = 8 * ((D + 63) / 64 + 4 + D % 2 * D / 8) + 8 + (Dv + 7) / 8 + 2 * ((Dv + 63) / 64) + 40;
    const int64_t slots = chunks > 1 ? chunk : S;
    check_cpu_device_loops(dev_, n, std::max((slots + 63) / 64 * per_tile, chunks * (3 + (Dv + 63) / 64)),
                           fmt::format("over {} cache slots (head dims {} / {}) for {} queries", S, D, Dv, T),
                           fmt::format("use a context of at most {} tokens here, or shorter prompt chunks",
                                       kLoopBudget / per_tile * 64));
  }

  // Attention: q [T, Hq, D] over the K/V cache's S slots; decode's few queries split the slots into
  // chunks whose partial results attention_combine.comp merges.
  void attention(int32_t i, const Node& n) {
    const Node& q = src(n, 0);
    const Node& k = src(n, 1);
    const Node& v = src(n, 2);
    for (const Node* kv : {&k, &v})
      if (!plain_float(kv->type))
        fail("Vulkan backend: Attention '{}': '{}' is {}; {}", n.name, kv->name, dtype_name(kv->type),
             backend_.supports(Op::Attention, kv->type).reason);
    const int64_t T = q.shape[0], Hq = q.shape[1], S = k.shape[0], D = q.shape[2], Dv = v.shape[2];
    const auto [chunks, chunk] = attention_chunks(T, Hq, S);
    check_attention_loops(n, T, S, D, Dv, chunks, chunk);
    Dispatch d = dispatch(i, "attention");
    d.bind[0] = as_f32(i, n, 0);
    d.bind[1] = operand(n, 1);
    d.bind[2] = operand(n, 2);
    d.bind[3] = operand(n, 3);
    d.bind[4] = operand(n, 4);
    const bool in_use = n.src[5] >= 0;  // slots in use: the shader reads only those
    if (in_use) d.bind[6] = operand(n, 5);
    d.bind[5] = result(i, n);
    d.pc[PC_ATT_T] = u32(T);
    d.pc[PC_ATT_HQ] = u32(Hq);
    d.pc[PC_ATT_D] = u32(D);
    d.pc[PC_ATT_S] = u32(S);
    d.pc[PC_ATT_HKV] = u32(k.shape[1]);
    d.pc[PC_ATT_DV] = u32(Dv);
    d.pc[PC_ATT_SCALE] = fbits(n.f[0]);
    d.pc[PC_ATT_WINDOW] = u32(n.i[0]);
    d.pc[PC_ATT_CAUSAL] = n.i[1] != 0 ? 1u : 0u;
    d.pc[PC_ATT_K_TYPE] = static_cast<uint32_t>(k.type);
    d.pc[PC_ATT_V_TYPE] = static_cast<uint32_t>(v.type);
    d.pc[PC_ATT_IN_USE] = in_use ? 1u : 0u;
    if (Dv > 1024 || D > 1024)
      fail("Vulkan backend: Attention '{}': head dims {} / {}: the shader takes at most 1024", n.name, D, Dv);
    d.groups = static_cast<uint64_t>(T * Hq);
    if (chunks == 1) return emit(d);
    // The partials into a scratch range, then the combine into the result.
    d.bind[5] = scratch(static_cast<VkDeviceSize>(T * Hq * chunks * (Dv + 2)) * 4);
    d.pc[PC_ATT_CHUNK] = u32(chunk);
    d.pc[PC_ATT_CHUNKS] = u32(chunks);
    d.groups = static_cast<uint64_t>(T * Hq * chunks);
    emit(d);
    Dispatch merge = dispatch(i, "attention_combine");
    merge.bind[0] = d.bind[5];
    merge.bind[5] = loc(i);
    merge.pc[PC_ATT_DV] = u32(Dv);
    merge.pc[PC_ATT_CHUNKS] = u32(chunks);
    merge.groups = static_cast<uint64_t>(T * Hq);
    emit(merge);
  }

  // ---- Sampling: TopK / Argmax, TopPDraw, AcceptDrafts.

  void top_k(int32_t i, const Node& n) {
    const int64_t C = src(n, 0).shape.back(), K = n.op == Op::TopK ? n.i[0] : 1;
    // A few rounds over the row for argmax and a small k; a radix select and a sort beyond.
    Dispatch d = dispatch(i, K <= kTopKRounds ? "topk" : "topk_select");
    {
      int64_t P = 1, steps = 0;
      while (P < K) P <<= 1, steps += 1;
      const int64_t loops = K <= kTopKRounds ? K * ((C + 63) / 64 + 6)
                                             : 6 * ((C + 255) / 256) + 1100 + steps * (steps + 1) / 2 * (P / 2048 + 1);
      check_cpu_device_loops(dev_, n, loops, fmt::format("of {} over {} values", K, C),
                             "pick fewer (top_k) or sample on the host (sampler.device: off)");
    }
    d.bind[0] = as_f32(i, n, 0);
    d.pc[PC_TOPK_COLS] = u32(C);
    d.pc[PC_TOPK_K] = u32(K);
    d.bind[5] = result(i, n);
    d.groups = static_cast<uint64_t>(elements(n.shape) / K);
    emit(d);
  }

  void top_p_draw(int32_t i, const Node& n) {
    const int64_t K = src(n, 0).shape[0];
    Dispatch d = dispatch(i, "top_p_draw");
    d.bind[0] = as_f32(i, n, 0);
    d.bind[1] = as_f32(i, n, 1);
    d.bind[2] = operand(n, 2);
    d.bind[5] = result(i, n);
    // top_p_draw.comp walks the candidates up to five times, one thread, left to right.
    check_cpu_device_loops(dev_, n, 5 * K, fmt::format("over {} candidates", K),
                           fmt::format("set top_k to at most {} or sample on the host (sampler.device: off)",
                                       kLoopBudget / 5));
    d.pc[PC_DRAW_K] = u32(K);
    d.pc[PC_DRAW_TOP_P] = fbits(n.f[1]);
    d.pc[PC_DRAW_MIN_P] = fbits(n.f[2]);
    d.pc[PC_DRAW_INV_T] = fbits(n.f[3]);
    d.groups = 1;
    emit(d);
  }

  void accept_drafts(int32_t i, const Node& n) {
    const int64_t N = src(n, 4).shape[0], V = src(n, 0).shape[1];
    const int64_t K = src(n, 1).shape[1], Kq = src(n, 3).shape[1];
    Dispatch d = dispatch(i, "accept_drafts");
    d.bind[0] = as_f32(i, n, 0);
    d.bind[1] = operand(n, 1);
    d.bind[2] = as_f32(i, n, 2);
    d.bind[3] = operand(n, 3);
    d.bind[4] = operand(n, 4);
    d.bind[6] = as_f32(i, n, 5);  // operand 5 (binding 7)
    d.bind[5] = result(i, n);
    d.pc[PC_AD_N] = u32(N);
    d.pc[PC_AD_V] = u32(V);
    d.pc[PC_AD_K] = u32(K);
    d.pc[PC_AD_KQ] = u32(Kq);
    d.pc[PC_AD_TOP_P] = fbits(n.f[1]);
    d.pc[PC_AD_MIN_P] = fbits(n.f[2]);
    d.pc[PC_AD_INV_T] = fbits(n.f[3]);
    d.pc[PC_AD_NODE] = u32(i);
    p_.id_bound[static_cast<size_t>(i)] = V;
    {
      // accept_drafts.comp, one thread, all in main's loop nest: each row's top_p_set walks its TopK
      // `passes` times (min-p, top-p's sum and its prefix, the mass), for the N + 1 target rows and N
      // drafter rows at most; then the residual's sum and draw (2 K) or the bonus draw (K); plus the
      // output fill, the draft check and the row loop itself (3 N + 3).
      const int64_t passes = 1 + (n.f[2] > 0.0f ? 1 : 0) + (n.f[1] < 1.0f ? 2 : 0);
      const int64_t loops = passes * ((N + 1) * K + N * Kq) + 2 * K + 3 * N + 3;
      const int64_t top_k = std::max<int64_t>(1, (kLoopBudget - 3 * N - 3) / (passes * (2 * N + 1) + 2));
      check_cpu_device_loops(dev_, n, loops,
                             fmt::format("of {} drafts over top {} (target) and {} (drafter) candidates", N, K, Kq),
                             fmt::format("set top_k to at most {} for {} drafts, draft fewer tokens, or sample on "
                                         "the host (sampler.device: off)", top_k, N));
    }
    d.groups = 1;
    emit(d);
  }

  // ---- Copies: Slice, Concat, Copy (a conversion), Scatter, WriteRows.

  void slice(int32_t i, const Node& n) {
    Dispatch d = copy_dispatch(i, kCopySlice, static_cast<uint64_t>(elements(n.shape)));
    d.bind[0] = as_f32(i, n, 0, true);
    d.pc[PC_COPY_COLS] = u32(src(n, 0).shape.back());
    d.pc[PC_COPY_ARG] = u32(n.i[0]);
    d.pc[PC_COPY_OUT_COLS] = u32(n.i[1]);
    d.bind[5] = result(i, n);
    emit(d);
  }

  void concat(int32_t i, const Node& n) {
    Dispatch d = copy_dispatch(i, kCopyConcat, static_cast<uint64_t>(elements(n.shape)));
    d.bind[0] = as_f32(i, n, 0, true);
    d.bind[1] = as_f32(i, n, 1, true);
    d.pc[PC_COPY_COLS] = u32(src(n, 0).shape.back());
    d.pc[PC_COPY_ARG] = u32(src(n, 1).shape.back());
    d.bind[5] = result(i, n);
    emit(d);
  }

  // Copy: F32 to F32, F16 or BF16 (two values a word).
  void convert(int32_t i, const Node& n) {
    if (!plain_float(n.type))
      fail("Vulkan backend: Copy '{}' to {}: {}", n.name, dtype_name(n.type), backend_.supports(Op::Copy, n.type).reason);
    const int64_t cnt = elements(n.shape);
    const uint64_t words = n.type == DType::F32 ? static_cast<uint64_t>(cnt) : static_cast<uint64_t>(cnt + 1) / 2;
    Dispatch d = copy_dispatch(i, kCopyConvert, words);
    d.bind[0] = as_f32(i, n, 0);
    d.pc[PC_COPY_TYPE] = static_cast<uint32_t>(n.type);
    d.pc[PC_COPY_NODE] = u32(i);
    d.pc[PC_COPY_COUNT] = u32(cnt);
    d.bind[5] = result(i, n);
    emit(d);
  }

  // Scatter: a copy of a, then the scattered values (the barrier between them comes from the overlap).
  void scatter(int32_t i, const Node& n) {
    const int64_t N = n.shape[0], M = src(n, 1).shape[0];
    Dispatch all = copy_dispatch(i, kCopySlice, static_cast<uint64_t>(N));  // a Slice of all of a
    all.bind[0] = as_f32(i, n, 0);
    all.bind[5] = result(i, n);
    all.pc[PC_COPY_COLS] = u32(N);
    all.pc[PC_COPY_OUT_COLS] = u32(N);
    emit(all);
    Dispatch d = copy_dispatch(i, kCopyScatter, static_cast<uint64_t>(M));
    d.bind[1] = operand(n, 1);
    d.bind[2] = as_f32(i, n, 2);
    d.bind[5] = loc(i);
    d.pc[PC_COPY_ARG] = u32(N);
    d.pc[PC_COPY_NODE] = u32(i);
    p_.id_bound[static_cast<size_t>(i)] = N;
    emit(d);
  }

  // WriteRows: rows into a persistent tensor (a KV cache), which becomes the node's value.
  void write_rows(int32_t i, const Node& n) {
    VkTensor& t = vk_tensor(*n.tensor);
    if (t.weight)
      fail("Vulkan backend: WriteRows '{}': '{}' is a read-only weight; write into a tensor from allocate()", n.name, t.name());
    const Support ok = backend_.supports(Op::WriteRows, t.type());
    if (!ok.ok) fail("Vulkan backend: WriteRows '{}' into '{}': {}", n.name, t.name(), ok.reason);
    const int64_t R = t.shape()[0], C = elements(t.shape()) / R, N = src(n, 2).shape[0];
    const bool wide = t.type() == DType::F32 || t.type() == DType::I32;
    if (!wide && C % 2 != 0)
      fail("Vulkan backend: WriteRows '{}': rows of {} {} values are not whole 32-bit words (odd row length)", n.name,
           C, dtype_name(t.type()));
    Dispatch d = copy_dispatch(i, kCopyWriteRows, static_cast<uint64_t>(N) * static_cast<uint64_t>(wide ? C : C / 2));
    d.bind[0] = as_f32(i, n, 1, t.type() == DType::I32);
    d.bind[2] = operand(n, 2);
    d.bind[5] = p_.loc[static_cast<size_t>(i)] = whole(t);
    d.pc[PC_COPY_COLS] = u32(C);
    d.pc[PC_COPY_ARG] = u32(R);
    d.pc[PC_COPY_TYPE] = static_cast<uint32_t>(t.type());
    d.pc[PC_COPY_N] = u32(N);
    d.pc[PC_COPY_NODE] = u32(i);
    p_.id_bound[static_cast<size_t>(i)] = R;
    emit(d);
  }

  const VulkanBackend& backend_;
  const Device& dev_;
  const std::vector<Node>& nodes_;
  Plan& p_;
  const VkDeviceSize align_, max_range_;
  Arena arena_;
  Liveness live_;
  VkDeviceSize staging_ = 0;                              // the inputs' and constants' staging bytes
  std::vector<VkDeviceSize> rope_off_;                    // per Rope node: its table in p_.consts
  std::vector<std::pair<VkDeviceSize, VkDeviceSize>> temps_;  // the current node's scratch ranges
};

// The outputs' offsets in the readback buffer, and its size.
VkDeviceSize place_readback(Plan& p, const Graph& g) {
  VkDeviceSize bytes = 0;
  for (int32_t o : g.outputs()) {
    // A persistent tensor (a cache after WriteRows) is read from its buffer when asked: copying it out
    // every run would cost its whole size (a KV cache: the allocated context) per step.
    if (p.readback_off.count(o) || p.loc[static_cast<size_t>(o)].tensor) continue;
    p.readback_off[o] = bytes;
    const Node& n = g.nodes()[static_cast<size_t>(o)];
    bytes += (value_bytes(n.type, n.shape) + 15) / 16 * 16;
  }
  return bytes;
}

void check_binding_limits(const Plan& p, const std::vector<Node>& nodes, VkDeviceSize max_range) {
  for (const Dispatch& d : p.dispatches)
    for (const Loc& l : d.bind)
      if (l.valid() && l.size > max_range)
        fail("Vulkan backend: {} '{}' binds {} bytes{}, above the binding limit of {} bytes (maxStorageBufferRange)",
             op_name(nodes[static_cast<size_t>(d.node)].op), nodes[static_cast<size_t>(d.node)].name, l.size,
             l.tensor ? " of '" + l.tensor->name() + "'" : std::string(), max_range);
}

}  // namespace

std::unique_ptr<Plan> VulkanBackend::build(const Graph& g) {
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  p.dev = dev_;
  Lowering lowering(*this, *dev_, g, p);
  for (int32_t i = 0; i < static_cast<int32_t>(g.nodes().size()); ++i) lowering.lower(i);

  const VkDeviceSize readback_size = place_readback(p, g);
  p.arena = dev_->buffer(std::max<VkDeviceSize>(lowering.arena_bytes(), 16), false, "graph intermediates", dev_);
  p.staging = dev_->buffer(std::max<VkDeviceSize>(lowering.staging_bytes(), 16), true, "graph inputs", dev_);
  p.readback = dev_->buffer(std::max<VkDeviceSize>(readback_size, 16), true, "graph outputs", dev_);
  p.err = dev_->buffer(16, true, "error record", dev_);
  if (!p.consts.empty()) std::memcpy(static_cast<std::byte*>(p.staging->map) + p.consts_staging, p.consts.data(), p.consts.size());
  check_binding_limits(p, g.nodes(), dev_->max_binding);
  record(p, g.nodes());
  return plan;
}

}  // namespace specula::vulkan::detail

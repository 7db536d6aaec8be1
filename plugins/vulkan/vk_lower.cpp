// Lowering: each op of a graph to dispatches of the shaders, with their bindings and push constants, and
// the plan's arena of intermediates.
#include <bit>
#include <cmath>
#include <cstring>

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
       "{{plugin: onednn}}), which is also much faster on this machine",
       op_name(n.op), n.name, what, dev.props.deviceName, iterations, instead);
}

std::unique_ptr<Plan> VulkanBackend::build(const Graph& g) {
  const auto& nodes = g.nodes();
  const int32_t count = static_cast<int32_t>(nodes.size());
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  p.dev = dev_;
  p.loc.assign(nodes.size(), Loc{});
  p.id_bound.assign(nodes.size(), 0);
  const VkDeviceSize align = std::max<VkDeviceSize>(dev_->props.limits.minStorageBufferOffsetAlignment, 16);
  Arena arena(align);

  // Liveness through reshapes, as the CPU backend: a range is released after its last reader.
  std::vector<int32_t> root(nodes.size()), last_use(nodes.size());
  for (int32_t i = 0; i < count; ++i) {
    const Node& n = nodes[static_cast<size_t>(i)];
    root[static_cast<size_t>(i)] = n.op == Op::Reshape ? root[static_cast<size_t>(n.src[0])] : i;
    last_use[static_cast<size_t>(i)] = i;
    for (int32_t s : n.src)
      if (s >= 0) last_use[static_cast<size_t>(root[static_cast<size_t>(s)])] = i;
  }
  for (int32_t o : g.outputs()) last_use[static_cast<size_t>(root[static_cast<size_t>(o)])] = count;

  // Inputs first and never released: the run copies them in before the first dispatch.
  VkDeviceSize staging_size = 0;
  for (int32_t i = 0; i < count; ++i) {
    const Node& n = nodes[static_cast<size_t>(i)];
    if (n.op != Op::Input) continue;
    const size_t es = plain_size(n.type);
    if (es == 0) fail("Vulkan backend: input '{}' is {}; inputs hold plain values", n.name, dtype_name(n.type));
    const VkDeviceSize bytes = static_cast<VkDeviceSize>(elements(n.shape)) * es;
    const VkDeviceSize off = arena.alloc(bytes);
    p.loc[static_cast<size_t>(i)] = {nullptr, off, (bytes + 3) / 4 * 4};
    p.inputs.push_back({i, staging_size, off, bytes});
    staging_size += (bytes + 15) / 16 * 16;
    last_use[static_cast<size_t>(i)] = count;
  }

  // Rope frequency tables, exactly as the CPU backend computes them (F32 pow on the host): one arena
  // range allocated before any intermediate, copied in with the inputs.
  std::vector<VkDeviceSize> rope_off(nodes.size(), 0);
  for (int32_t i = 0; i < count; ++i) {
    const Node& n = nodes[static_cast<size_t>(i)];
    if (n.op != Op::Rope) continue;
    const int64_t pairs = std::min<int64_t>(n.i[0], n.shape[2] / 2);
    std::vector<float> inv(static_cast<size_t>(std::max<int64_t>(pairs, 1)));
    for (int64_t k = 0; k < pairs; ++k)
      inv[static_cast<size_t>(k)] = (1.0f / std::pow(n.f[0], static_cast<float>(2 * k) / n.f[1])) * n.f[2];
    rope_off[static_cast<size_t>(i)] = p.consts.size();
    p.consts.resize(p.consts.size() + (inv.size() * 4 + 255) / 256 * 256);
    std::memcpy(p.consts.data() + rope_off[static_cast<size_t>(i)], inv.data(), inv.size() * 4);
  }
  if (!p.consts.empty()) {
    p.consts_arena = arena.alloc(p.consts.size());
    p.consts_staging = staging_size;
    staging_size += p.consts.size();
  }

  auto src_node = [&](const Node& n, int k) -> const Node& { return nodes[static_cast<size_t>(n.src[static_cast<size_t>(k)])]; };
  auto loc_of = [&](int32_t id) { return p.loc[static_cast<size_t>(id)]; };
  auto release_if_done = [&](int32_t v, int32_t i) {
    const int32_t r = root[static_cast<size_t>(v)];
    Loc& l = p.loc[static_cast<size_t>(r)];
    if (last_use[static_cast<size_t>(r)] == i && !l.tensor && l.size > 0) arena.release(l.off, l.size);
  };
  std::vector<std::pair<VkDeviceSize, VkDeviceSize>> temps;  // conversions of this node's operands

  // Operand k of node n as F32 (decoding a stored F16/BF16/quantized value first when needed).
  auto as_f32 = [&](const Node& n, int32_t i, int k, bool allow_i32) -> Loc {
    const int32_t s = n.src[static_cast<size_t>(k)];
    const Node& sn = nodes[static_cast<size_t>(s)];
    if (sn.type == DType::F32 || (allow_i32 && sn.type == DType::I32)) return loc_of(s);
    const Support ok = supports(n.op, sn.type);
    if (!ok.ok || !decodable(sn.type))
      fail("Vulkan backend: {} '{}': operand '{}' is {}, which the Vulkan backend cannot read here: {}", op_name(n.op),
           n.name, sn.name, dtype_name(sn.type),
           !ok.ok ? ok.reason
           : sn.type == DType::MLX_AFFINE
               ? "MLX affine weights are decoded only as the weight (first operand) of MatMul, MatMulId and GetRows"
               : "not a decodable type");
    const int64_t cols = sn.shape.back(), rows = elements(sn.shape) / cols;
    const VkDeviceSize bytes = static_cast<VkDeviceSize>(rows * cols) * 4;
    const VkDeviceSize off = arena.alloc(bytes);
    temps.emplace_back(off, bytes);
    Dispatch d;
    d.shader = "get_rows";
    d.node = i;
    d.bind[0] = loc_of(s);
    d.bind[5] = {nullptr, off, bytes};
    d.pc[PC_GR_TYPE] = static_cast<uint32_t>(sn.type);
    d.pc[PC_GR_R] = u32(rows);
    d.pc[PC_GR_C] = u32(cols);
    d.pc[PC_GR_ROWS] = u32(rows);
    d.pc[PC_GR_IDENTITY] = 1;
    d.pc[PC_GR_NODE] = u32(i);
    d.groups = (static_cast<uint64_t>(rows) * static_cast<uint64_t>((cols + 31) / 32) + 63) / 64;
    p.dispatches.push_back(d);
    return d.bind[5];
  };
  // Row windows [first, end) of a weight that fit maxStorageBufferRange at an aligned offset (one
  // window when it fits whole); `unit` rows move together (an expert's O rows).
  const VkDeviceSize max_range = dev_->max_binding;
  // An MLX weight's tensor (its codes, scales and biases are bound as three sections, windowed alike).
  auto mlx_tensor = [&](const Loc& w, const Node& wn, int64_t cols) -> const VkTensor& {
    if (!w.tensor || w.tensor->type() != DType::MLX_AFFINE || w.tensor->shape().back() != cols)
      fail("Vulkan backend: MLX weight '{}' {} must be used as loaded, with rows of its {} values", wn.name,
           shape_str(wn.shape), w.tensor ? w.tensor->shape().back() : cols);
    return *w.tensor;
  };
  auto windows = [&](const Loc& w, const Node& wn, int64_t rows, int64_t cols, int64_t unit) {
    std::vector<std::pair<int64_t, int64_t>> out;
    const DType type = wn.type;
    const VkTensor* mlx = type == DType::MLX_AFFINE ? &mlx_tensor(w, wn, cols) : nullptr;
    // MLX: the codes are the largest section; scale windows start at the same rows.
    if ((mlx ? mlx->section_bytes[0] : w.size) <= max_range) return std::vector<std::pair<int64_t, int64_t>>{{0, rows}};
    const uint64_t rb = (mlx ? mlx->code_row : *dtype_row_bytes(type, static_cast<uint64_t>(cols))) *
                        static_cast<uint64_t>(unit);
    const uint64_t sb = mlx ? mlx->scale_row * static_cast<uint64_t>(unit) : 0;
    uint64_t step = std::max<uint64_t>(1, (max_range - 4) / rb);
    while (step > 1 && ((step * rb) % align != 0 || (step * sb) % align != 0)) --step;
    if ((step * rb) % align != 0 || (step * sb) % align != 0 || step * rb > max_range)
      fail("Vulkan backend: weight '{}': rows of {} bytes cannot be bound in windows of at most {} bytes", wn.name, rb,
           max_range);
    const int64_t units = rows / unit;
    for (int64_t u = 0; u < units; u += static_cast<int64_t>(step))
      out.emplace_back(u * unit, std::min<int64_t>(units, u + static_cast<int64_t>(step)) * unit);
    return out;
  };
  auto window_loc = [&](const Loc& w, DType type, int64_t cols, std::pair<int64_t, int64_t> win) {
    if (w.size <= max_range) return w;
    const uint64_t rb = *dtype_row_bytes(type, static_cast<uint64_t>(cols));
    Loc l = w;
    l.off = w.off + static_cast<VkDeviceSize>(win.first) * rb;
    l.size = std::min<VkDeviceSize>((static_cast<VkDeviceSize>(win.second - win.first) * rb + 3) / 4 * 4, w.size - (l.off - w.off));
    return l;
  };
  // Binds window `win` of weight `wn` (at `w`) for get_rows / matmul: at binding 0; for MLX, the codes
  // there, the scales and biases at bindings 3 and 4 and the parameters in pc[24..26] (common.glsl).
  // After d.pc is set.
  auto bind_weight = [&](Dispatch& d, const Loc& w, const Node& wn, int64_t cols, std::pair<int64_t, int64_t> win) {
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
  };
  auto need_weight = [&](const Node& n, int k) {
    const Node& w = src_node(n, k);
    const Support ok = supports(n.op, w.type);
    if (!ok.ok) fail("Vulkan backend: {} '{}': weight '{}' is {}: {}", op_name(n.op), n.name, w.name, dtype_name(w.type), ok.reason);
  };

  for (int32_t i = 0; i < count; ++i) {
    const Node& n = nodes[static_cast<size_t>(i)];
    Loc& out = p.loc[static_cast<size_t>(i)];
    temps.clear();
    auto result = [&](VkDeviceSize extra = 0) {
      const VkDeviceSize bytes = value_bytes(n.type, n.shape);
      out = {nullptr, arena.alloc(bytes + extra), bytes + extra};
      return out;
    };
    Dispatch d;
    d.node = i;
    switch (n.op) {
      case Op::Input:
        break;
      case Op::Constant: {
        VkTensor& t = vk_tensor(*n.tensor);
        out = {&t, 0, t.buf->size};
        break;
      }
      case Op::Reshape:
        out = loc_of(n.src[0]);
        break;
      case Op::GetRows: {
        const Node& t = src_node(n, 0);
        if (t.type == DType::I32) {  // ids of ids: a gather of 32-bit words, from any value
          const int64_t R = t.shape[0], C = t.shape[1];
          const uint64_t words = static_cast<uint64_t>(elements(n.shape));
          d.shader = "copy";
          d.bind[0] = as_f32(n, i, 0, true);
          d.bind[1] = loc_of(n.src[1]);
          d.bind[5] = result();
          d.pc = {};
          d.pc[PC_COPY_OP] = 5;
          d.pc[PC_COPY_WORDS] = u32(static_cast<int64_t>(words));
          d.pc[PC_COPY_COLS] = u32(C);
          d.pc[PC_COPY_ARG] = u32(R);
          d.pc[PC_COPY_NODE] = u32(i);
          d.groups = (words + 255) / 256;
          p.id_bound[static_cast<size_t>(i)] = R;
          break;
        }
        need_weight(n, 0);
        const int64_t R = t.shape[0], C = t.shape[1], rows = elements(src_node(n, 1).shape);
        d.shader = "get_rows";
        d.bind[1] = loc_of(n.src[1]);
        d.bind[5] = result();
        d.groups = (static_cast<uint64_t>(rows) * static_cast<uint64_t>((C + 31) / 32) + 63) / 64;
        p.id_bound[static_cast<size_t>(i)] = R;
        const Loc table = loc_of(n.src[0]);
        for (auto win : windows(table, t, R, C, 1)) {
          d.pc = {};
          d.pc[PC_GR_TYPE] = static_cast<uint32_t>(t.type);
          d.pc[PC_GR_R] = u32(R);
          d.pc[PC_GR_C] = u32(C);
          d.pc[PC_GR_ROWS] = u32(rows);
          d.pc[PC_GR_NODE] = u32(i);
          d.pc[PC_GR_FIRST] = u32(win.first);
          d.pc[PC_GR_END] = u32(win.second);
          bind_weight(d, table, t, C, win);
          p.dispatches.push_back(d);
        }
        d.shader.clear();
        break;
      }
      case Op::MatMul:
      case Op::MatMulId: {
        need_weight(n, 0);
        const Node& w = src_node(n, 0);
        d.shader = dev_->subgroup_shuffle ? "matmul_subgroup" : "matmul";
        d.bind[1] = as_f32(n, i, 1, false);
        d.bind[5] = result();
        const Loc wl = loc_of(n.src[0]);
        const int64_t chunks = (w.shape.back() + 31) / 32;
        uint32_t tpr = 1;  // threads per weight row
        while (tpr < 64 && tpr < chunks) tpr *= 2;
        const uint64_t rpw = 64 / tpr;
        if (n.op == Op::MatMul) {
          const int64_t O = w.shape[0], I = w.shape[1], N = elements(src_node(n, 1).shape) / I;
          const bool tiled = N >= kTiledMinRows, coopmat = tiled && dev_->coopmat;
          if (tiled) d.shader = coopmat ? (dev_->coopmat_n == 8 ? "matmul_coopmat_n8" : "matmul_coopmat") : "matmul_tiled";
          else d.shader = dev_->subgroup_shuffle && dev_->subgroup_size >= 32 ? "matvec_subgroup" : "matvec";
          for (auto win : windows(wl, w, O, I, 1)) {
            d.pc = {};
            d.pc[PC_MM_TYPE] = static_cast<uint32_t>(w.type);
            d.pc[PC_MM_O] = u32(O);
            d.pc[PC_MM_I] = u32(I);
            d.pc[PC_MM_N] = u32(N);
            d.pc[PC_MM_MODE] = 0;
            d.pc[PC_MM_NODE] = u32(i);
            d.pc[PC_MM_WIN_FIRST] = u32(win.first);
            d.pc[PC_MM_WIN_COUNT] = u32(win.second - win.first);
            d.pc[PC_MM_TPR] = tpr;
            bind_weight(d, wl, w, I, win);
            const uint64_t cols = static_cast<uint64_t>(win.second - win.first);
            d.groups = coopmat ? (cols + 63) / 64 * static_cast<uint64_t>((N + 63) / 64)
                       : tiled ? (cols + 63) / 64 * static_cast<uint64_t>((N + kTileRows - 1) / kTileRows)
                               : (cols + 3) / 4 * static_cast<uint64_t>((N + 7) / 8);
            p.dispatches.push_back(d);
          }
        } else {
          const int64_t E = w.shape[0], O = w.shape[1], I = w.shape[2], N = n.shape[0], K = n.shape[1];
          d.bind[2] = loc_of(n.src[2]);
          const bool shared = src_node(n, 1).shape[1] == 1 && K != 1;
          for (auto win : windows(wl, w, E * O, I, O)) {
            d.pc = {};
            d.pc[PC_MM_TYPE] = static_cast<uint32_t>(w.type);
            d.pc[PC_MM_O] = u32(O);
            d.pc[PC_MM_I] = u32(I);
            d.pc[PC_MM_N] = u32(N * K);
            d.pc[PC_MM_MODE] = 1;
            d.pc[PC_MM_K] = u32(K);
            d.pc[PC_MM_X_SHARED] = shared ? 1u : 0u;
            d.pc[PC_MM_E] = u32(E);
            d.pc[PC_MM_NODE] = u32(i);
            d.pc[PC_MM_WIN_FIRST] = u32(win.first / O);
            d.pc[PC_MM_WIN_COUNT] = u32(win.second / O);
            d.pc[PC_MM_TPR] = tpr;
            bind_weight(d, wl, w, I, win);
            d.groups = (static_cast<uint64_t>(O) + rpw - 1) / rpw * static_cast<uint64_t>((N * K + 7) / 8);
            p.dispatches.push_back(d);
          }
          p.id_bound[static_cast<size_t>(i)] = E;
        }
        d.shader.clear();
        break;
      }
      case Op::Add:
      case Op::Mul:
      case Op::Div:
      case Op::Scale:
      case Op::GeluTanh:
      case Op::Softcap:
      case Op::Clamp: {
        d.shader = "elementwise";
        d.bind[0] = as_f32(n, i, 0, false);
        d.pc[PC_EW_COUNT] = u32(elements(n.shape));
        if (n.op == Op::Add || n.op == Op::Mul || n.op == Op::Div) {
          d.bind[1] = as_f32(n, i, 1, false);
          const Shape& as = n.shape;
          const Shape& bs = src_node(n, 1).shape;
          if (as.size() > 6) fail("Vulkan backend: {} '{}': rank {} is above the 6 axes the shader handles", op_name(n.op), n.name, as.size());
          std::array<int64_t, 6> adim{1, 1, 1, 1, 1, 1}, bdim{1, 1, 1, 1, 1, 1}, bstride{};
          for (size_t k = 0; k < as.size(); ++k) adim[6 - as.size() + k] = as[k];
          for (size_t k = 0; k < bs.size(); ++k) bdim[6 - bs.size() + k] = bs[k];
          int64_t stride = 1;
          for (int k = 5; k >= 0; --k) {
            bstride[static_cast<size_t>(k)] = bdim[static_cast<size_t>(k)] == 1 ? 0 : stride;
            stride *= bdim[static_cast<size_t>(k)];
          }
          d.pc[PC_EW_OP] = n.op == Op::Add ? 0 : n.op == Op::Mul ? 1 : 5;
          for (int k = 0; k < 6; ++k) {
            d.pc[static_cast<size_t>(PC_EW_A_DIMS + k)] = u32(adim[static_cast<size_t>(k)]);
            d.pc[static_cast<size_t>(PC_EW_B_STRIDES + k)] = u32(bstride[static_cast<size_t>(k)]);
          }
        } else {
          d.pc[PC_EW_OP] = n.op == Op::Scale ? 2 : n.op == Op::GeluTanh ? 3 : n.op == Op::Softcap ? 4 : 6;
          d.pc[PC_EW_F0] = fbits(n.f[0]);
          d.pc[PC_EW_F1] = fbits(n.f[1]);
        }
        d.bind[5] = result();
        d.groups = (static_cast<uint64_t>(elements(n.shape)) + 255) / 256;
        break;
      }
      case Op::RmsNorm:
      case Op::Softmax: {
        d.shader = "rows";
        d.bind[0] = as_f32(n, i, 0, false);
        const bool has_w = n.op == Op::RmsNorm && n.src[1] >= 0;
        if (has_w) d.bind[1] = as_f32(n, i, 1, false);
        const int64_t C = n.shape.back();
        d.pc[PC_ROWS_OP] = n.op == Op::RmsNorm ? 0u : 1u;
        d.pc[PC_ROWS_COLS] = u32(C);
        d.pc[PC_ROWS_EPS] = fbits(n.f[0]);
        d.pc[PC_ROWS_HAS_WEIGHT] = has_w ? 1u : 0u;
        d.bind[5] = result();
        d.groups = static_cast<uint64_t>(elements(n.shape) / C);
        break;
      }
      case Op::Rope: {
        d.shader = "rope";
        d.bind[0] = as_f32(n, i, 0, false);
        d.bind[1] = loc_of(n.src[1]);
        const int64_t T = n.shape[0], H = n.shape[1], D = n.shape[2], pairs = std::min<int64_t>(n.i[0], D / 2);
        d.bind[2] = {nullptr, p.consts_arena + rope_off[static_cast<size_t>(i)],
                     static_cast<VkDeviceSize>(std::max<int64_t>(pairs, 1)) * 4};
        d.pc[PC_ROPE_T] = u32(T);
        d.pc[PC_ROPE_H] = u32(H);
        d.pc[PC_ROPE_D] = u32(D);
        d.pc[PC_ROPE_PAIRS] = u32(pairs);
        d.bind[5] = result();
        d.groups = (static_cast<uint64_t>(T * H * (D / 2)) + 63) / 64;
        break;
      }
      case Op::Attention: {
        const Node& q = src_node(n, 0);
        const Node& k = src_node(n, 1);
        const Node& v = src_node(n, 2);
        for (const Node* kv : {&k, &v})
          if (!plain_float(kv->type))
            fail("Vulkan backend: Attention '{}': '{}' is {}; {}", n.name, kv->name, dtype_name(kv->type),
                 supports(Op::Attention, kv->type).reason);
        const int64_t T = q.shape[0], Hq = q.shape[1], S = k.shape[0], D = q.shape[2], Dv = v.shape[2];
        // Few queries x heads over many slots (decode): the slots split into chunks, one workgroup each,
        // so a GPU has kAttentionWorkgroups to run instead of Hq; attention_combine.comp merges them.
        const int64_t rows = T <= kAttentionRowQueries ? Hq : T * Hq;
        const int64_t chunks = S > kAttentionChunk ? std::clamp<int64_t>(kAttentionWorkgroups / std::max<int64_t>(rows, 1), 1,
                                                                         (S + kAttentionChunk - 1) / kAttentionChunk)
                                                   : 1;
        const int64_t chunk = chunks > 1 ? ((S + chunks - 1) / chunks + 63) / 64 * 64 : 0;
        {
          // attention.comp's loops per tile of 64 slots: the dots (eight groups, 64 values a step), the
          // partials' sums, the output update, the reductions; attention_combine.comp's per chunk.
          const int64_t per_tile = 8 * ((D + 63) / 64 + 4 + D % 2 * D / 8) + 8 + (Dv + 7) / 8 + 2 * ((Dv + 63) / 64) + 40;
          const int64_t slots = chunks > 1 ? chunk : S;
          check_cpu_device_loops(*dev_, n, std::max((slots + 63) / 64 * per_tile, chunks * (3 + (Dv + 63) / 64)),
                                 fmt::format("over {} cache slots (head dims {} / {}) for {} queries", S, D, Dv, T),
                                 fmt::format("use a context of at most {} tokens here, or shorter prompt chunks",
                                             kLoopBudget / per_tile * 64));
        }
        d.shader = "attention";
        d.bind[0] = as_f32(n, i, 0, false);
        d.bind[1] = loc_of(n.src[1]);
        d.bind[2] = loc_of(n.src[2]);
        d.bind[3] = loc_of(n.src[3]);
        d.bind[4] = loc_of(n.src[4]);
        const bool in_use = n.src[5] >= 0;  // slots in use: the shader reads only those
        if (in_use) d.bind[6] = loc_of(n.src[5]);
        d.bind[5] = result();
        d.pc[PC_ATT_T] = u32(T);
        d.pc[PC_ATT_HQ] = u32(Hq);
        d.pc[PC_ATT_D] = u32(q.shape[2]);
        d.pc[PC_ATT_S] = u32(S);
        d.pc[PC_ATT_HKV] = u32(k.shape[1]);
        d.pc[PC_ATT_DV] = u32(v.shape[2]);
        d.pc[PC_ATT_SCALE] = fbits(n.f[0]);
        d.pc[PC_ATT_WINDOW] = u32(n.i[0]);
        d.pc[PC_ATT_CAUSAL] = n.i[1] != 0 ? 1u : 0u;
        d.pc[PC_ATT_K_TYPE] = static_cast<uint32_t>(k.type);
        d.pc[PC_ATT_V_TYPE] = static_cast<uint32_t>(v.type);
        d.pc[PC_ATT_IN_USE] = in_use ? 1u : 0u;
        if (Dv > 1024 || D > 1024)
          fail("Vulkan backend: Attention '{}': head dims {} / {}: the shader takes at most 1024", n.name, D, Dv);
        d.groups = static_cast<uint64_t>(T * Hq);
        if (chunks > 1) {
          // The partials into a scratch range, then the combine into the result.
          const VkDeviceSize bytes = static_cast<VkDeviceSize>(T * Hq * chunks * (Dv + 2)) * 4;
          const VkDeviceSize off = arena.alloc(bytes);
          temps.emplace_back(off, bytes);
          d.bind[5] = {nullptr, off, bytes};
          d.pc[PC_ATT_CHUNK] = u32(chunk);
          d.pc[PC_ATT_CHUNKS] = u32(chunks);
          d.groups = static_cast<uint64_t>(T * Hq * chunks);
          p.dispatches.push_back(d);
          Dispatch merge;
          merge.node = i;
          merge.shader = "attention_combine";
          merge.bind[0] = {nullptr, off, bytes};
          merge.bind[5] = out;
          merge.pc[PC_ATT_DV] = u32(Dv);
          merge.pc[PC_ATT_CHUNKS] = u32(chunks);
          merge.groups = static_cast<uint64_t>(T * Hq);
          d = merge;
        }
        break;
      }
      case Op::TopK:
      case Op::Argmax: {
        const int64_t C = src_node(n, 0).shape.back(), K = n.op == Op::TopK ? n.i[0] : 1;
        // A few rounds over the row for argmax and a small k; a radix select and a sort beyond.
        d.shader = K <= kTopKRounds ? "topk" : "topk_select";
        {
          int64_t P = 1, steps = 0;
          while (P < K) P <<= 1, steps += 1;
          const int64_t loops = K <= kTopKRounds ? K * ((C + 63) / 64 + 6)
                                                 : 6 * ((C + 255) / 256) + 1100 + steps * (steps + 1) / 2 * (P / 2048 + 1);
          check_cpu_device_loops(*dev_, n, loops, fmt::format("of {} over {} values", K, C),
                                 "pick fewer (top_k) or sample on the host (sampler.device: off)");
        }
        d.bind[0] = as_f32(n, i, 0, false);
        d.pc[PC_TOPK_COLS] = u32(C);
        d.pc[PC_TOPK_K] = u32(K);
        d.bind[5] = result();
        d.groups = static_cast<uint64_t>(elements(n.shape) / K);
        break;
      }
      case Op::Slice:
      case Op::Concat: {
        d.shader = "copy";
        d.bind[0] = as_f32(n, i, 0, true);
        const uint64_t words = static_cast<uint64_t>(elements(n.shape));
        if (n.op == Op::Slice) {
          d.pc[PC_COPY_OP] = 0;
          d.pc[PC_COPY_WORDS] = u32(static_cast<int64_t>(words));
          d.pc[PC_COPY_COLS] = u32(src_node(n, 0).shape.back());
          d.pc[PC_COPY_ARG] = u32(n.i[0]);
          d.pc[PC_COPY_OUT_COLS] = u32(n.i[1]);
        } else {
          d.bind[1] = as_f32(n, i, 1, true);
          d.pc[PC_COPY_OP] = 1;
          d.pc[PC_COPY_WORDS] = u32(static_cast<int64_t>(words));
          d.pc[PC_COPY_COLS] = u32(src_node(n, 0).shape.back());
          d.pc[PC_COPY_ARG] = u32(src_node(n, 1).shape.back());
        }
        d.bind[5] = result();
        d.groups = (words + 255) / 256;
        break;
      }
      case Op::TopPDraw: {
        d.shader = "top_p_draw";
        d.bind[0] = as_f32(n, i, 0, false);
        d.bind[1] = as_f32(n, i, 1, false);
        d.bind[2] = loc_of(n.src[2]);
        d.bind[5] = result();
        d.pc[PC_DRAW_K] = u32(src_node(n, 0).shape[0]);
        // top_p_draw.comp walks the candidates up to five times, one thread, left to right.
        check_cpu_device_loops(*dev_, n, 5 * src_node(n, 0).shape[0],
                               fmt::format("over {} candidates", src_node(n, 0).shape[0]),
                               fmt::format("set top_k to at most {} or sample on the host (sampler.device: off)",
                                           kLoopBudget / 5));
        d.pc[PC_DRAW_TOP_P] = fbits(n.f[1]);
        d.pc[PC_DRAW_MIN_P] = fbits(n.f[2]);
        d.pc[PC_DRAW_INV_T] = fbits(n.f[3]);
        d.groups = 1;
        break;
      }
      case Op::AcceptDrafts: {
        const int64_t N = src_node(n, 4).shape[0], V = src_node(n, 0).shape[1];
        const int64_t K = src_node(n, 1).shape[1], Kq = src_node(n, 3).shape[1];
        d.shader = "accept_drafts";
        d.bind[0] = as_f32(n, i, 0, false);
        d.bind[1] = loc_of(n.src[1]);
        d.bind[2] = as_f32(n, i, 2, false);
        d.bind[3] = loc_of(n.src[3]);
        d.bind[4] = loc_of(n.src[4]);
        d.bind[6] = as_f32(n, i, 5, false);  // operand 5 (binding 7)
        d.bind[5] = result();
        d.pc[PC_AD_N] = u32(N);
        d.pc[PC_AD_V] = u32(V);
        d.pc[PC_AD_K] = u32(K);
        d.pc[PC_AD_KQ] = u32(Kq);
        d.pc[PC_AD_TOP_P] = fbits(n.f[1]);
        d.pc[PC_AD_MIN_P] = fbits(n.f[2]);
        d.pc[PC_AD_INV_T] = fbits(n.f[3]);
        d.pc[PC_AD_NODE] = u32(i);
        p.id_bound[static_cast<size_t>(i)] = V;
        {
          // accept_drafts.comp, one thread, all in main's loop nest: each row's top_p_set walks its TopK
          // `passes` times (min-p, top-p's sum and its prefix, the mass), for the N + 1 target rows and N
          // drafter rows at most; then the residual's sum and draw (2 K) or the bonus draw (K); plus the
          // output fill, the draft check and the row loop itself (3 N + 3).
          const int64_t passes = 1 + (n.f[2] > 0.0f ? 1 : 0) + (n.f[1] < 1.0f ? 2 : 0);
          const int64_t loops = passes * ((N + 1) * K + N * Kq) + 2 * K + 3 * N + 3;
          const int64_t top_k = std::max<int64_t>(1, (kLoopBudget - 3 * N - 3) / (passes * (2 * N + 1) + 2));
          check_cpu_device_loops(*dev_, n, loops,
                                 fmt::format("of {} drafts over top {} (target) and {} (drafter) candidates", N, K, Kq),
                                 fmt::format("set top_k to at most {} for {} drafts, draft fewer tokens, or sample on "
                                             "the host (sampler.device: off)", top_k, N));
        }
        d.groups = 1;
        break;
      }
      case Op::Scatter: {
        // A copy of a, then the scattered values (the barrier between them comes from the overlap).
        const int64_t N = n.shape[0], M = src_node(n, 1).shape[0];
        Dispatch c;
        c.shader = "copy";
        c.node = i;
        c.bind[0] = as_f32(n, i, 0, false);
        c.bind[5] = result();
        c.pc[PC_COPY_OP] = 0;  // a Slice of all of a
        c.pc[PC_COPY_WORDS] = u32(N);
        c.pc[PC_COPY_COLS] = u32(N);
        c.pc[PC_COPY_OUT_COLS] = u32(N);
        c.groups = (static_cast<uint64_t>(N) + 255) / 256;
        p.dispatches.push_back(c);
        d.shader = "copy";
        d.bind[1] = loc_of(n.src[1]);
        d.bind[2] = as_f32(n, i, 2, false);
        d.bind[5] = out;
        d.pc[PC_COPY_OP] = 4;
        d.pc[PC_COPY_WORDS] = u32(M);
        d.pc[PC_COPY_ARG] = u32(N);
        d.pc[PC_COPY_NODE] = u32(i);
        d.groups = (static_cast<uint64_t>(M) + 255) / 256;
        p.id_bound[static_cast<size_t>(i)] = N;
        break;
      }
      case Op::Copy: {
        if (!plain_float(n.type))
          fail("Vulkan backend: Copy '{}' to {}: {}", n.name, dtype_name(n.type), supports(Op::Copy, n.type).reason);
        d.shader = "copy";
        d.bind[0] = as_f32(n, i, 0, false);
        const int64_t cnt = elements(n.shape);
        const uint64_t words = n.type == DType::F32 ? static_cast<uint64_t>(cnt) : static_cast<uint64_t>(cnt + 1) / 2;
        d.pc[PC_COPY_OP] = 2;
        d.pc[PC_COPY_WORDS] = u32(static_cast<int64_t>(words));
        d.pc[PC_COPY_TYPE] = static_cast<uint32_t>(n.type);
        d.pc[PC_COPY_NODE] = u32(i);
        d.pc[PC_COPY_COUNT] = u32(cnt);
        d.bind[5] = result();
        d.groups = (words + 255) / 256;
        break;
      }
      case Op::WriteRows: {
        VkTensor& t = vk_tensor(*n.tensor);
        if (t.weight)
          fail("Vulkan backend: WriteRows '{}': '{}' is a read-only weight; write into a tensor from allocate()", n.name, t.name());
        const Support ok = supports(Op::WriteRows, t.type());
        if (!ok.ok) fail("Vulkan backend: WriteRows '{}' into '{}': {}", n.name, t.name(), ok.reason);
        const int64_t R = t.shape()[0], C = elements(t.shape()) / R, N = src_node(n, 2).shape[0];
        const bool wide = t.type() == DType::F32 || t.type() == DType::I32;
        if (!wide && C % 2 != 0)
          fail("Vulkan backend: WriteRows '{}': rows of {} {} values are not whole 32-bit words (odd row length)", n.name,
               C, dtype_name(t.type()));
        d.shader = "copy";
        d.bind[0] = as_f32(n, i, 1, t.type() == DType::I32);
        d.bind[2] = loc_of(n.src[2]);
        out = {&t, 0, t.buf->size};
        d.bind[5] = out;
        const uint64_t words = static_cast<uint64_t>(N) * static_cast<uint64_t>(wide ? C : C / 2);
        d.pc[PC_COPY_OP] = 3;
        d.pc[PC_COPY_WORDS] = u32(static_cast<int64_t>(words));
        d.pc[PC_COPY_COLS] = u32(C);
        d.pc[PC_COPY_ARG] = u32(R);
        d.pc[PC_COPY_TYPE] = static_cast<uint32_t>(t.type());
        d.pc[PC_COPY_N] = u32(N);
        d.pc[PC_COPY_NODE] = u32(i);
        d.groups = (words + 255) / 256;
        p.id_bound[static_cast<size_t>(i)] = R;
        break;
      }
      default:
        fail("Vulkan backend: node '{}' is {}, which the Vulkan backend does not implement", n.name, op_name(n.op));
    }
    if (!d.shader.empty() && d.groups > 0) p.dispatches.push_back(d);
    for (auto [off, size] : temps) arena.release(off, size);
    for (int32_t s : n.src)
      if (s >= 0) release_if_done(s, i);
    release_if_done(i, i);
  }

  VkDeviceSize readback_size = 0;
  for (int32_t o : g.outputs()) {
    // A persistent tensor (a cache after WriteRows) is read from its buffer when asked: copying it out
    // every run would cost its whole size (a KV cache: the allocated context) per step.
    if (p.readback_off.count(o) || p.loc[static_cast<size_t>(o)].tensor) continue;
    p.readback_off[o] = readback_size;
    readback_size += (value_bytes(nodes[static_cast<size_t>(o)].type, nodes[static_cast<size_t>(o)].shape) + 15) / 16 * 16;
  }
  p.arena = dev_->buffer(std::max<VkDeviceSize>(arena.size(), 16), false, "graph intermediates", dev_);
  p.staging = dev_->buffer(std::max<VkDeviceSize>(staging_size, 16), true, "graph inputs", dev_);
  p.readback = dev_->buffer(std::max<VkDeviceSize>(readback_size, 16), true, "graph outputs", dev_);
  p.err = dev_->buffer(16, true, "error record", dev_);
  if (!p.consts.empty()) std::memcpy(static_cast<std::byte*>(p.staging->map) + p.consts_staging, p.consts.data(), p.consts.size());
  for (const Dispatch& d : p.dispatches)
    for (const Loc& l : d.bind)
      if (l.valid() && l.size > max_range)
        fail("Vulkan backend: {} '{}' binds {} bytes{}, above the binding limit of {} bytes (maxStorageBufferRange)",
             op_name(nodes[static_cast<size_t>(d.node)].op), nodes[static_cast<size_t>(d.node)].name, l.size,
             l.tensor ? " of '" + l.tensor->name() + "'" : std::string(), max_range);
  record(p, nodes);
  return plan;
}

}  // namespace specula::vulkan::detail

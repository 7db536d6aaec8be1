// Recording a plan's command buffer once, and running it: inputs in, one submit, outputs read back.
#include <cstring>

#include "vk_backend_impl.hpp"

namespace specula::vulkan::detail {

namespace {

// One descriptor set per dispatch (at least one), from a new p.pool: bindings 0-5 and 7 the dispatch's
// operands and result (`dummy` where it binds nothing), 6 the error record.
std::vector<VkDescriptorSet> write_descriptor_sets(VkDevice d, Plan& p, VkDescriptorSetLayout layout, const Buffer& dummy) {
  const uint32_t sets = static_cast<uint32_t>(std::max<size_t>(p.dispatches.size(), 1));
  VkDescriptorPoolSize ps{VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, sets * 8};
  VkDescriptorPoolCreateInfo pi{VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
  pi.maxSets = sets;
  pi.poolSizeCount = 1;
  pi.pPoolSizes = &ps;
  check(vkCreateDescriptorPool(d, &pi, nullptr, &p.pool), "vkCreateDescriptorPool");
  std::vector<VkDescriptorSetLayout> layouts(sets, layout);
  std::vector<VkDescriptorSet> ds(sets);
  VkDescriptorSetAllocateInfo ai{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
  ai.descriptorPool = p.pool;
  ai.descriptorSetCount = sets;
  ai.pSetLayouts = layouts.data();
  check(vkAllocateDescriptorSets(d, &ai, ds.data()), "vkAllocateDescriptorSets");

  auto info = [&](const Loc& l) -> VkDescriptorBufferInfo {
    if (l.tensor) return {l.tensor->buf->buf, l.off, l.size};
    if (l.size > 0) return {p.arena->buf, l.off, l.size};
    return {dummy.buf, 0, VK_WHOLE_SIZE};
  };
  for (size_t k = 0; k < p.dispatches.size(); ++k) {
    std::array<VkDescriptorBufferInfo, 8> bi;
    for (size_t b = 0; b < 6; ++b) bi[b] = info(p.dispatches[k].bind[b]);
    bi[6] = {p.err->buf, 0, VK_WHOLE_SIZE};
    bi[7] = info(p.dispatches[k].bind[6]);
    VkWriteDescriptorSet w{VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    w.dstSet = ds[k];
    w.descriptorCount = 8;
    w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    w.pBufferInfo = bi.data();
    vkUpdateDescriptorSets(d, 1, &w, 0, nullptr);
  }
  return ds;
}

// A range of a plan's buffers (the arena or a persistent tensor's).
struct Range {
  VkBuffer b;
  VkDeviceSize off, size;
};
Range range_of(const Plan& p, const Loc& l) {
  if (l.tensor) return {l.tensor->buf->buf, l.off, l.size};
  return {p.arena->buf, l.off, l.size};
}

// A barrier only where a dispatch touches a range written since the last one, or writes a range read
// since then (arena ranges are reused).
class Hazards {
 public:
  // Whether dispatch `dp` needs a barrier before it (the ranges tracked start again after one); then
  // its ranges are tracked.
  bool barrier_before(const Plan& p, const Dispatch& dp) {
    bool need = false;
    const Range w = range_of(p, dp.bind[5]);
    for (size_t b : {0, 1, 2, 3, 4, 6})
      if (dp.bind[b].valid() && overlaps(written_, range_of(p, dp.bind[b]))) need = true;
    if (overlaps(written_, w) || overlaps(read_, w)) need = true;
    if (need) {
      written_.clear();
      read_.clear();
    }
    for (size_t b : {0, 1, 2, 3, 4, 6})
      if (dp.bind[b].valid()) read_.push_back(range_of(p, dp.bind[b]));
    written_.push_back(w);
    return need;
  }

 private:
  static bool overlaps(const std::vector<Range>& v, const Range& r) {
    for (const Range& x : v)
      if (x.b == r.b && x.off < r.off + r.size && r.off < x.off + x.size) return true;
    return false;
  }
  std::vector<Range> written_, read_;
};

// The inputs and the constant tables, from staging into the arena.
void record_input_copies(VkCommandBuffer cb, const Plan& p) {
  std::vector<VkBufferCopy> copies;
  for (const auto& in : p.inputs)
    if (in.bytes > 0) copies.push_back({in.staging_off, in.arena_off, in.bytes});
  if (!p.consts.empty()) copies.push_back({p.consts_staging, p.consts_arena, p.consts.size()});
  if (!copies.empty()) vkCmdCopyBuffer(cb, p.staging->buf, p.arena->buf, static_cast<uint32_t>(copies.size()), copies.data());
}

// The outputs, into the readback buffer.
void record_readback(VkCommandBuffer cb, const Plan& p, const std::vector<Node>& graph_nodes) {
  for (const auto& [node, off] : p.readback_off) {
    const Loc& l = p.loc[static_cast<size_t>(node)];
    const Node& n = graph_nodes[static_cast<size_t>(node)];
    if (!l.valid()) continue;
    const Range r = range_of(p, l);
    VkBufferCopy c{r.off, off, std::min<VkDeviceSize>(value_bytes(n.type, n.shape), r.size)};
    vkCmdCopyBuffer(cb, r.b, p.readback->buf, 1, &c);
  }
}

}  // namespace

void VulkanBackend::record(Plan& p, const std::vector<Node>& graph_nodes) {
  VkDevice d = dev_->dev;
  const std::vector<VkDescriptorSet> ds = write_descriptor_sets(d, p, set_layout_, *dummy_);
  VkCommandBufferAllocateInfo ci{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
  ci.commandPool = dev_->cmd_pool;
  ci.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
  ci.commandBufferCount = 1;
  check(vkAllocateCommandBuffers(d, &ci, &p.cmd), "vkAllocateCommandBuffers");
  VkCommandBuffer cb = p.cmd;
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  vkBeginCommandBuffer(cb, &bi);
  const uint32_t stamps = static_cast<uint32_t>(p.dispatches.size()) + 1;
  if (profile_) {
    VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO};
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = stamps;
    check(vkCreateQueryPool(d, &qi, nullptr, &p.timestamps), "vkCreateQueryPool");
    vkCmdResetQueryPool(cb, p.timestamps, 0, stamps);
  }
  // Earlier submissions (weight uploads, writes, previous runs) complete before anything here.
  full_barrier(cb, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_HOST_WRITE_BIT,
               VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
               VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_HOST_BIT,
               VK_PIPELINE_STAGE_TRANSFER_BIT);
  vkCmdFillBuffer(cb, p.err->buf, 0, VK_WHOLE_SIZE, 0);
  record_input_copies(cb, p);
  full_barrier(cb, VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT,
               VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT,
               VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);

  Hazards hazards;
  VkPipeline bound = VK_NULL_HANDLE;
  if (p.timestamps) vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, p.timestamps, 0);
  for (size_t k = 0; k < p.dispatches.size(); ++k) {
    const Dispatch& dp = p.dispatches[k];
    if (hazards.barrier_before(p, dp))
      full_barrier(cb, VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_SHADER_READ_BIT,
                   VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                   VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT);
    VkPipeline pl = pipeline(dp.shader);
    if (pl != bound) vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl);
    bound = pl;
    vkCmdBindDescriptorSets(cb, VK_PIPELINE_BIND_POINT_COMPUTE, playout_, 0, 1, &ds[k], 0, nullptr);
    vkCmdPushConstants(cb, playout_, VK_SHADER_STAGE_COMPUTE_BIT, 0, 128, dp.pc.data());
    const auto [x, y] = grid(dp.groups);
    vkCmdDispatch(cb, x, y, 1);
    if (p.timestamps) vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, p.timestamps, static_cast<uint32_t>(k) + 1);
  }
  full_barrier(cb, VK_ACCESS_SHADER_WRITE_BIT, VK_ACCESS_TRANSFER_READ_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
               VK_PIPELINE_STAGE_TRANSFER_BIT);
  record_readback(cb, p, graph_nodes);
  full_barrier(cb, VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT, VK_ACCESS_HOST_READ_BIT,
               VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_PIPELINE_STAGE_HOST_BIT);
  check(vkEndCommandBuffer(cb), "vkEndCommandBuffer");
}

void VkCompiled::run(const RunInputs& inputs) { backend_.run(*this, inputs); }
void VkCompiled::read(Value output, std::span<std::byte> dst) const { backend_.read(*this, output, dst); }

void VulkanBackend::run(VkCompiled& c, const RunInputs& inputs) {
  const Graph& graph = c.graph_;
  const auto& nodes = graph.nodes();
  if (nodes.size() != c.nodes_)
    fail("Vulkan backend: a graph of {} nodes was compiled, it has {} now; compile it again after changing it",
         c.nodes_, nodes.size());
  c.ran_ = false;
  // Inputs: each Input node given exactly once, with the right size (checked before any device work).
  std::vector<const std::span<const std::byte>*> given(nodes.size(), nullptr);
  for (const auto& in : inputs.inputs) {
    const Node& n = graph.node(in.first);
    if (n.op != Op::Input) fail("Vulkan backend: run: node '{}' is a {}, not an Input", n.name, op_name(n.op));
    const size_t want = static_cast<size_t>(elements(n.shape)) * plain_size(n.type);
    if (in.second.size() != want)
      fail("Vulkan backend: input '{}' {} {} needs {} bytes but was given {}", n.name, dtype_name(n.type),
           shape_str(n.shape), want, in.second.size());
    if (given[static_cast<size_t>(in.first.id)]) fail("Vulkan backend: input '{}' was given twice", n.name);
    given[static_cast<size_t>(in.first.id)] = &in.second;
  }
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i].op == Op::Input && !given[i])
      fail("Vulkan backend: input '{}' {} {} was not given to run()", nodes[i].name, dtype_name(nodes[i].type),
           shape_str(nodes[i].shape));

  Plan& p = *c.plan_;
  for (const auto& in : p.inputs)
    if (in.bytes > 0) std::memcpy(static_cast<std::byte*>(p.staging->map) + in.staging_off, given[static_cast<size_t>(in.node)]->data(), in.bytes);
  dev_->submit_wait(p.cmd);
  const auto* err = static_cast<const uint32_t*>(p.err->map);
  if (err[0] != 0) {
    const Node& n = nodes[std::min<size_t>(err[1], nodes.size() - 1)];
    fail("Vulkan backend: {} '{}': id {} at index {} is outside [0, {})", op_name(n.op), n.name,
         static_cast<int32_t>(err[2]), err[3], p.id_bound[std::min<size_t>(err[1], nodes.size() - 1)]);
  }
  if (profile_) record_profile(p, graph);
  c.ran_ = true;
}

void VulkanBackend::record_profile(const Plan& p, const Graph& graph) {
  const size_t n = p.dispatches.size();
  std::vector<uint64_t> t(n + 1);
  check(vkGetQueryPoolResults(dev_->dev, p.timestamps, 0, static_cast<uint32_t>(n + 1), t.size() * 8, t.data(), 8,
                              VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT),
        "vkGetQueryPoolResults");
  const double tick = 1e-9 * static_cast<double>(dev_->props.limits.timestampPeriod);
  std::vector<double> seconds(graph.nodes().size(), 0.0);
  std::vector<bool> ran(graph.nodes().size(), false);
  for (size_t k = 0; k < n; ++k) {
    const auto node = static_cast<size_t>(p.dispatches[k].node);
    seconds[node] += tick * static_cast<double>(t[k + 1] - t[k]);
    ran[node] = true;
  }
  profile_->begin_run(graph);
  for (size_t i = 0; i < seconds.size(); ++i) {
    if (!ran[i]) continue;
    const Node& nd = graph.nodes()[i];
    // Weight bytes read: the whole matrix, or the gathered rows of a table (as the CPU backend counts).
    const bool weighted = (nd.op == Op::MatMul || nd.op == Op::MatMulId || nd.op == Op::GetRows) &&
                          graph.nodes()[static_cast<size_t>(nd.src[0])].op == Op::Constant;
    const VkTensor* w = weighted ? &vk_tensor(*graph.nodes()[static_cast<size_t>(nd.src[0])].tensor) : nullptr;
    size_t bytes = w ? static_cast<size_t>(w->bytes) : 0;
    if (w && nd.op == Op::GetRows)
      bytes = bytes / static_cast<size_t>(w->shape()[0]) *
              static_cast<size_t>(elements(graph.nodes()[static_cast<size_t>(nd.src[1])].shape));
    profile_->record(graph, static_cast<int32_t>(i), seconds[i], w ? w->name() : std::string(), bytes);
  }
}

void VulkanBackend::read(const VkCompiled& c, Value output, std::span<std::byte> dst) {
  const Plan& p = *c.plan_;
  const Node& n = c.graph_.node(output);
  if (!c.ran_) fail("Vulkan backend: read: '{}' before the graph has run", n.name);
  const int64_t count = elements(n.shape);
  const size_t want = static_cast<size_t>(count) * 4;
  if (dst.size() != want)
    fail("Vulkan backend: read: '{}' {} {} needs {} bytes ({} as {}) but the destination has {}", n.name,
         dtype_name(n.type), shape_str(n.shape), want, count, n.type == DType::I32 ? "I32" : "F32", dst.size());
  const Loc& l = p.loc[static_cast<size_t>(output.id)];
  const std::byte* src = nullptr;
  std::vector<std::byte> host;
  auto ro = p.readback_off.find(output.id);
  if (ro != p.readback_off.end()) {
    src = static_cast<const std::byte*>(p.readback->map) + ro->second;
  } else if (l.tensor) {
    read(*l.tensor, dst);  // a persistent tensor: its current contents
    return;
  } else if (n.op == Op::Input) {
    for (const auto& in : p.inputs)
      if (in.node == output.id) src = static_cast<const std::byte*>(p.staging->map) + in.staging_off;
  }
  if (!src) fail("Vulkan backend: read: '{}' was not marked as an output of the graph (Graph::mark_output)", n.name);
  if (n.type == DType::F32 || n.type == DType::I32 || n.type == DType::U32) {
    std::memcpy(dst.data(), src, want);
    return;
  }
  if (!can_dequantize(n.type))
    fail("Vulkan backend: read: '{}' is {}, which cannot be read as F32", n.name, dtype_name(n.type));
  const int64_t cols = n.shape.back(), rows = count / cols;
  const uint64_t rb = *dtype_row_bytes(n.type, static_cast<uint64_t>(cols));
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(n.type, src + static_cast<size_t>(r) * rb, reinterpret_cast<float*>(dst.data()) + r * cols, cols);
}

}  // namespace specula::vulkan::detail

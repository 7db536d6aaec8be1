#include "specula/op_profile.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <regex>
#include <vector>

namespace specula {

namespace {
// "blk.12.ffn_up.weight" -> 12 (and "blk.*.ffn_up.weight"), the same for safetensors names
// ("model.language_model.layers.12.mlp.up_proj.weight" -> "model.language_model.layers.*.mlp.up_proj.weight");
// -1 when the name has no layer.
int layer_of(const std::string& name, std::string* folded) {
  static const std::regex layer(R"(^(blk|.*\blayers)\.(\d+)\.)");
  std::smatch m;
  if (!std::regex_search(name, m, layer)) {
    if (folded) *folded = name;
    return -1;
  }
  if (folded) *folded = m[1].str() + ".*." + m.suffix().str();
  return std::stoi(m[2].str());
}
}  // namespace

void OpProfile::begin_run(const Graph& g) {
  int64_t rows = 0;  // of the first matrix product: 1 for a decode step
  for (const Node& n : g.nodes())
    if (n.op == Op::MatMul) {
      const Node& w = g.nodes()[static_cast<size_t>(n.src[0])];
      const Shape& x = g.nodes()[static_cast<size_t>(n.src[1])].shape;
      int64_t count = 1;
      for (int64_t d : x) count *= d;
      rows = count / w.shape[1];
      break;
    }
  Kind& kind = kinds_[{rows, static_cast<int64_t>(g.nodes().size())}];
  current_ = kind.first.runs == 0 ? &kind.first : &kind.rest;
  ++current_->runs;
  layer_ = -1;
  run_experts_.clear();
}

void OpProfile::record(const Graph& g, int32_t id, double seconds, const std::string& weight, size_t weight_bytes,
                       std::span<const int32_t> experts) {
  const Node& n = g.nodes()[static_cast<size_t>(id)];
  if (n.op == Op::Input || n.op == Op::Constant || n.op == Op::Reshape) return;
  Table& t = *current_;
  // A node belongs to the layer of its weight (none for token_embd and the like) or of its name, else
  // to that of the last node before it.
  std::string folded;
  int l;
  if (!weight.empty()) {
    l = layer_of(weight, &folded);
  } else {
    l = layer_of(n.name, nullptr);
    if (l < 0) l = layer_;
  }
  layer_ = l;
  auto add = [&](Entry& e) {
    e.calls += 1;
    e.seconds += seconds;
    e.bytes += static_cast<double>(weight_bytes);
  };
  add(t.ops[std::string(op_name(n.op))]);
  if (!weight.empty()) add(t.weights[folded]);
  add(t.layers[layer_]);
  // Experts: MatMulIds of a layer's weights (a table outside the layers, a one-hot gather or a centroid
  // head's clusters, is not a mixture of experts).
  if (n.op == Op::MatMulId && !weight.empty() && l >= 0) {
    t.moe_layers.insert(layer_);
    t.expert_bytes += static_cast<double>(weight_bytes);
    std::vector<bool>& seen = run_experts_[layer_];
    for (int32_t e : experts) {
      if (e < 0) continue;
      if (static_cast<size_t>(e) >= seen.size()) seen.resize(static_cast<size_t>(e) + 1);
      if (!seen[static_cast<size_t>(e)]) {
        seen[static_cast<size_t>(e)] = true;
        t.experts += 1;
      }
    }
  }
}

double OpProfile::Table::seconds() const {
  double total = 0;
  for (const auto& [name, e] : ops) total += e.seconds;
  return total;
}

std::vector<OpProfile::ExpertReads> OpProfile::expert_reads() const {
  std::vector<ExpertReads> out;
  for (const auto& [key, kind] : kinds_) {
    const Table& t = kind.reported();
    if (t.moe_layers.empty()) continue;
    ExpertReads r;
    r.rows = key.first;
    r.nodes = key.second;
    r.runs = t.runs;
    r.moe_layers = static_cast<int64_t>(t.moe_layers.size());
    r.experts_per_run = t.experts / static_cast<double>(t.runs);
    r.bytes_per_run = t.expert_bytes / static_cast<double>(t.runs);
    out.push_back(r);
  }
  return out;
}

std::string OpProfile::report() const {
  std::string out;
  for (const auto& [key, kind] : kinds_) {
    const Table& t = kind.reported();  // a named reference: clang 14 cannot capture a structured binding
    const auto [rows, nodes] = key;
    const double total = t.seconds();
    const std::string runs =
        kind.rest.runs > 0
            ? fmt::format("{} run{} after the first, {:.3f} ms per run; the first, left out: {:.3f} ms", t.runs,
                          t.runs == 1 ? "" : "s", 1e3 * total / static_cast<double>(t.runs), 1e3 * kind.first.seconds())
            : fmt::format("1 run, {:.3f} ms: its first, one-time costs included", 1e3 * total);
    out += fmt::format("profile: graphs of {} nodes with {} activation row{} ({})\n", nodes, rows, rows == 1 ? "" : "s", runs);
    auto table = [&](const char* title, std::vector<std::pair<std::string, Entry>> rowsv, size_t limit) {
      std::sort(rowsv.begin(), rowsv.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
      out += fmt::format("  {:<28}{:>10}{:>12}{:>8}{:>10}\n", title, "calls/run", "ms/run", "%", "GB/s");
      for (size_t i = 0; i < rowsv.size() && i < limit; ++i) {
        const Entry& e = rowsv[i].second;
        out += fmt::format("  {:<28}{:>10.0f}{:>12.3f}{:>8.1f}{:>10}\n", rowsv[i].first,
                           static_cast<double>(e.calls) / static_cast<double>(t.runs), 1e3 * e.seconds / static_cast<double>(t.runs),
                           100.0 * e.seconds / total, e.bytes > 0 ? fmt::format("{:.1f}", e.bytes / e.seconds / 1e9) : "");
      }
    };
    table("op", {t.ops.begin(), t.ops.end()}, 64);
    table("weight", {t.weights.begin(), t.weights.end()}, 12);
    std::vector<std::pair<std::string, Entry>> layers;
    for (const auto& [l, e] : t.layers) layers.emplace_back(l < 0 ? "outside layers" : fmt::format("layer {}", l), e);
    table("layer (slowest)", layers, 8);
    if (!t.moe_layers.empty())
      out += fmt::format("  experts: {:.1f} read per run (the distinct experts of each of {} MoE layers, summed), "
                         "{:.2f} MB of expert weights\n",
                         t.experts / static_cast<double>(t.runs), t.moe_layers.size(),
                         t.expert_bytes / static_cast<double>(t.runs) / 1e6);
  }
  return out;
}

}  // namespace specula

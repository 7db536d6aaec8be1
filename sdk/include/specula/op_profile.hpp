// Per-op timing of a compute backend (option `profile: true`, `specula bench --profile`; the CPU backend
// times each node on the host, the Vulkan backend with GPU timestamps): time and weight bytes per op kind, per weight (layer index folded: blk.*.ffn_up.weight) and per layer, one table per
// graph kind: the activation rows of its matrix products (1 = a decode step, N = a prompt chunk) and its
// node count, which tells a target's step from a drafter's at the same row count. A kind's first run is
// kept apart: it pays one-time costs (packing the weights at their first product, the first touch of new
// buffers: a verification's 9 rows of 262144 logits fault in 9 MB), which averaged in made an op look
// several times dearer than it is over a few runs. The tables average the runs after it, when there are.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "specula/compute.hpp"

namespace specula {

class OpProfile {
 public:
  // Called before a graph's nodes are recorded: its first MatMul's activation rows and its node count
  // name the table they go to.
  void begin_run(const Graph& g);
  // experts: for a MatMulId, the distinct experts the node read (weight_bytes: their bytes). Each layer's
  // distinct experts are counted once per run however many MatMulIds read them (gate_up and down); only
  // MatMulIds of a layer's weight (blk.N.*) count.
  void record(const Graph& g, int32_t id, double seconds, const std::string& weight, size_t weight_bytes,
              std::span<const int32_t> experts = {});
  std::string report() const;

  // Mixture-of-experts reads of one graph kind (a table with MatMulId nodes), per run: the sum over its
  // MoE layers of the distinct experts selected, and the bytes of expert weights its MatMulIds read.
  struct ExpertReads {
    int64_t rows = 0, nodes = 0, runs = 0;
    int64_t moe_layers = 0;
    double experts_per_run = 0, bytes_per_run = 0;
  };
  std::vector<ExpertReads> expert_reads() const;

 private:
  struct Entry {
    int64_t calls = 0;
    double seconds = 0;
    double bytes = 0;
  };
  struct Table {
    int64_t runs = 0;
    std::map<std::string, Entry> ops, weights;
    std::map<int, Entry> layers;
    double experts = 0, expert_bytes = 0;  // over all runs
    std::set<int> moe_layers;
    double seconds() const;
  };
  struct Kind {
    Table first, rest;  // its first run; the runs after it
    const Table& reported() const { return rest.runs > 0 ? rest : first; }
  };
  std::map<std::pair<int64_t, int64_t>, Kind> kinds_;  // by (rows, nodes)
  Table* current_ = nullptr;
  int layer_ = -1;
  std::map<int, std::vector<bool>> run_experts_;  // by layer: the experts this run has read so far
};

}  // namespace specula

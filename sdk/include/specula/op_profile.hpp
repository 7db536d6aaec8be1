// Per-op timing of a compute backend (option `profile: true`, `specula bench --profile`; the CPU backend
// times each node on the host, the Vulkan backend with GPU timestamps): time and weight bytes per op kind, per weight (layer index folded: blk.*.ffn_up.weight) and per layer, one table per
// graph kind: the activation rows of its matrix products (1 = a decode step, N = a prompt chunk) and its
// node count, which tells a target's step from a drafter's at the same row count.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "specula/compute.hpp"

namespace specula {

class OpProfile {
 public:
  // Called before a graph's nodes are recorded: its first MatMul's activation rows and its node count
  // name the table they go to.
  void begin_run(const Graph& g);
  void record(const Graph& g, int32_t id, double seconds, const std::string& weight, size_t weight_bytes);
  std::string report() const;

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
  };
  std::map<std::pair<int64_t, int64_t>, Table> tables_;  // by (rows, nodes)
  Table* current_ = nullptr;
  int layer_ = -1;
};

}  // namespace specula

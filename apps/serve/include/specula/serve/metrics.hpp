// The server's Prometheus metrics (GET /metrics, docs/serving.md lists every name). Names follow vLLM's
// (vllm:num_requests_waiting -> specula:num_requests_waiting, ...) so that tools written for it, the
// Gateway API Inference Extension's endpoint picker among them, read Specula with a name mapping only.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "specula/core/generator.hpp"

namespace specula::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Prometheus text: NAME_bucket{LABELS,le=...}, NAME_sum{LABELS}, NAME_count{LABELS}.
  void render(std::string& out, const std::string& name, const std::string& labels) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> buckets_;  // per bound, not cumulative
  double sum_ = 0;
  uint64_t count_ = 0;
};

// What the scheduler reports at scrape time.
struct Gauges {
  int64_t waiting = 0;
  int64_t running = 0;
  double kv_cache_usage = 0;      // tokens running requests hold / the slots' total capacity
  double prefix_cache_usage = 0;  // tokens idle slots keep for prefix reuse (reclaimable) / the same
  int64_t slots = 0;
  int64_t connections = 0;        // open HTTP connections, idle ones included
};

class Metrics {
 public:
  Metrics();
  void prompt_tokens(int64_t n, int64_t cached);
  void queued(double seconds);  // from arrival to a slot
  void generation_token(double seconds_since_previous, bool first, double seconds_since_arrival);
  // A request that ended: finish reason "stop", "length", "abort" or "error"; its statistics.
  void finished(const std::string& reason, const core::GenerationStats* stats, double e2e_seconds);
  void rejected(const std::string& why);  // "queue_full", "shutting_down"
  void response(int status);              // every HTTP answer, by status code
  // Every sample carries model_name="MODEL", as vLLM's do.
  std::string render(const Gauges& g, const std::string& model) const;

 private:
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, generation_tokens_ = 0;
  std::map<std::string, int64_t> finished_, rejected_;
  std::map<int, int64_t> responses_;
  Histogram ttft_, itl_, e2e_, queue_;
  int64_t spec_drafts_ = 0, spec_draft_tokens_ = 0, spec_accepted_ = 0;
  std::vector<int64_t> spec_accepted_by_position_;
};

}  // namespace specula::serve

#include "specula/serve/metrics.hpp"

#include <initializer_list>
#include <map>

#include <fmt/format.h>

namespace specula::serve {

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), buckets_(bounds_.size(), 0) {}

void Histogram::observe(double v) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (v <= bounds_[i]) {
      ++buckets_[i];
      break;
    }
  }
  sum_ += v;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += buckets_[i];
    out += fmt::format("{}_bucket{{{},le=\"{}\"}} {}\n", name, labels, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{{},le=\"+Inf\"}} {}\n{}_sum{{{}}} {}\n{}_count{{{}}} {}\n", name, labels, count_, name,
                     labels, sum_, name, labels, count_);
}

namespace {
// vLLM's buckets for the same histograms.
std::vector<double> ttft_bounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> itl_bounds() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0};
}
std::vector<double> e2e_bounds() { return {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0}; }

void header(std::string& out, const char* name, const char* type, const char* help) {
  out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// A Prometheus label value: backslash, double quote and newline escaped.
std::string label_value(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

// A metric of one sample.
template <typename T>
void single(std::string& out, const std::string& labels, const char* name, const char* type, const char* help, T value) {
  header(out, name, type, help);
  out += fmt::format("{}{{{}}} {}\n", name, labels, value);
}

// A counter with one sample per value of `label`, every value in `values` shown (0 when not counted yet).
void by_label(std::string& out, const std::string& labels, const char* name, const char* help, const char* label,
              std::initializer_list<const char*> values, const std::map<std::string, int64_t>& counts) {
  header(out, name, "counter", help);
  for (const char* v : values) {
    auto it = counts.find(v);
    out += fmt::format("{}{{{},{}=\"{}\"}} {}\n", name, labels, label, v, it == counts.end() ? 0 : it->second);
  }
}
}  // namespace

Metrics::Metrics() : ttft_(ttft_bounds()), itl_(itl_bounds()), e2e_(e2e_bounds()), queue_(e2e_bounds()) {}

void Metrics::queued(double seconds) {
  std::lock_guard lock(mu_);
  queue_.observe(seconds);
}

void Metrics::response(int status) {
  std::lock_guard lock(mu_);
  ++responses_[status];
}

void Metrics::prompt_tokens(int64_t n, int64_t cached) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += n;
  cached_tokens_ += cached;
}

void Metrics::generation_token(double since_previous, bool first, double since_arrival) {
  std::lock_guard lock(mu_);
  ++generation_tokens_;
  if (first) ttft_.observe(since_arrival);
  else itl_.observe(since_previous);
}

void Metrics::finished(const std::string& reason, const core::GenerationStats* stats, double e2e_seconds) {
  std::lock_guard lock(mu_);
  ++finished_[reason];
  e2e_.observe(e2e_seconds);
  if (!stats) return;
  spec_drafts_ += stats->speculative_steps;
  spec_draft_tokens_ += stats->drafted_tokens;
  spec_accepted_ += stats->accepted_tokens;
  if (spec_accepted_by_position_.size() < stats->accepted_by_position.size())
    spec_accepted_by_position_.resize(stats->accepted_by_position.size());
  for (size_t i = 0; i < stats->accepted_by_position.size(); ++i)
    spec_accepted_by_position_[i] += stats->accepted_by_position[i];
}

void Metrics::rejected(const std::string& why) {
  std::lock_guard lock(mu_);
  ++rejected_[why];
}

std::string Metrics::render(const Gauges& g, const std::string& model) const {
  std::lock_guard lock(mu_);
  const std::string l = fmt::format("model_name=\"{}\"", label_value(model));
  std::string out;
  single(out, l, "specula:num_requests_waiting", "gauge", "Requests queued, not yet in a slot.", g.waiting);
  single(out, l, "specula:num_requests_running", "gauge", "Requests generating in a slot.", g.running);
  single(out, l, "specula:kv_cache_usage_perc", "gauge",
         "KV-cache usage, 0..1: tokens the running requests hold over the slots' capacity (kept prefixes not counted).",
         g.kv_cache_usage);
  single(out, l, "specula:prefix_cache_usage_perc", "gauge",
         "Prefixes idle slots keep for reuse, 0..1 of the slots' capacity; reclaimed by any new request.",
         g.prefix_cache_usage);
  single(out, l, "specula:num_slots", "gauge", "Sequences generated at once (--parallel).", g.slots);
  single(out, l, "specula:http_connections", "gauge", "Open HTTP connections, idle ones included (--max-connections).",
         g.connections);
  single(out, l, "specula:prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", prompt_tokens_);
  single(out, l, "specula:prompt_tokens_cached_total", "counter", "Prompt tokens reused from a slot's context (prefix reuse).",
         cached_tokens_);
  single(out, l, "specula:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the slots' kept prefixes.",
         prompt_tokens_);
  single(out, l, "specula:prefix_cache_hits_total", "counter", "Prompt tokens found in a slot's kept prefix.", cached_tokens_);
  single(out, l, "specula:generation_tokens_total", "counter", "Generated tokens.", generation_tokens_);
  by_label(out, l, "specula:request_success_total", "Requests that ended, by finish reason (stop, length, abort, error).",
           "finished_reason", {"stop", "length", "abort", "error"}, finished_);
  by_label(out, l, "specula:request_rejected_total", "Requests refused before queueing (queue_full: 429, shutting_down: 503).",
           "reason", {"queue_full", "shutting_down"}, rejected_);
  header(out, "specula:http_responses_total", "counter", "HTTP answers by status code.");
  for (const auto& [status, n] : responses_) out += fmt::format("specula:http_responses_total{{{},code=\"{}\"}} {}\n", l, status, n);
  header(out, "specula:time_to_first_token_seconds", "histogram", "From arrival to the first generated token.");
  ttft_.render(out, "specula:time_to_first_token_seconds", l);
  header(out, "specula:inter_token_latency_seconds", "histogram", "Between consecutive generated tokens of a request.");
  itl_.render(out, "specula:inter_token_latency_seconds", l);
  header(out, "specula:e2e_request_latency_seconds", "histogram", "From arrival to the end of a request.");
  e2e_.render(out, "specula:e2e_request_latency_seconds", l);
  header(out, "specula:request_queue_time_seconds", "histogram", "From arrival to a slot (the body read, queued).");
  queue_.render(out, "specula:request_queue_time_seconds", l);
  single(out, l, "specula:spec_decode_num_drafts_total", "counter", "Speculative rounds (drafts verified).", spec_drafts_);
  single(out, l, "specula:spec_decode_num_draft_tokens_total", "counter", "Tokens proposed by the drafter.", spec_draft_tokens_);
  single(out, l, "specula:spec_decode_num_accepted_tokens_total", "counter", "Drafted tokens the target accepted.",
         spec_accepted_);
  header(out, "specula:spec_decode_num_accepted_tokens_per_pos_total", "counter",
         "Rounds whose draft at this position (0 = first) was accepted.");
  for (size_t i = 0; i < spec_accepted_by_position_.size(); ++i)
    out += fmt::format("specula:spec_decode_num_accepted_tokens_per_pos_total{{{},position=\"{}\"}} {}\n", l, i,
                       spec_accepted_by_position_[i]);
  return out;
}

}  // namespace specula::serve

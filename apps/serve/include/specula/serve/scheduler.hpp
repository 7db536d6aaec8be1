// The server's scheduler: a bounded queue of requests and N slots (--parallel), each an api::Session
// with a context of its own. One thread runs the loop: between steps it admits waiting requests into
// free slots (the slot whose context holds the longest prefix of the prompt first), then advances every
// running request by one step (step_running), in rotation. docs/serving.md, "Scheduling".
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "specula/api.hpp"
#include "specula/serve/metrics.hpp"

namespace specula::serve {

using Clock = std::chrono::steady_clock;

// One request's life: filled by the HTTP thread, run by the scheduler thread, its output read back by
// the HTTP thread (streamed or at the end). Everything below `mu` is guarded by it.
struct Job {
  std::vector<int32_t> prompt;
  api::SamplingConfig sampling;
  Clock::time_point arrival = Clock::now();
  std::atomic<bool> cancel{false};  // the client went away, or shutdown: stop after the current step

  std::mutex mu;
  std::condition_variable cv;
  std::string text, reasoning;      // produced, not yet taken by the HTTP thread
  bool done = false;
  std::optional<api::Result> result;
  std::string error;                // set when the request failed in the scheduler
  std::string finish_reason;        // stop, length, abort, error

  struct Output {
    std::string text, reasoning;
    bool done = false;
  };
  // Waits up to `timeout` for output; takes what was produced.
  Output take(std::chrono::milliseconds timeout);
  void wait_done(std::chrono::milliseconds timeout);  // bounded wait for `done`
};

struct SchedulerOptions {
  int parallel = 1;       // slots
  int queue_limit = 64;   // waiting requests at most (a full queue answers 429)
};

class Scheduler {
 public:
  Scheduler(std::shared_ptr<api::Model> model, SchedulerOptions options, Metrics& metrics);
  ~Scheduler();  // cancels what runs and joins the thread

  enum class Admission { Queued, QueueFull, ShuttingDown };
  Admission submit(std::shared_ptr<Job> job);
  // Refuses new requests, lets queued and running ones finish for up to `timeout`, then cancels the rest
  // and waits (bounded) for them to end.
  void drain(std::chrono::milliseconds timeout);
  bool draining() const { return draining_; }
  Gauges gauges() const;

 private:
  struct Slot {
    std::unique_ptr<api::Session> session;
    std::shared_ptr<Job> job;  // null when free
    bool first = true;         // no token yet
    Clock::time_point last_token;
  };
  void loop();
  void admit();          // waiting requests into free slots
  void step_running();   // one step of every running request
  // `cached`: the prompt tokens the slot's context already holds (what admit() chose it for).
  void start(Slot& slot, std::shared_ptr<Job> job, size_t cached);
  void complete(Slot& slot, std::optional<api::Result> result, const std::string& error);
  void update_usage();  // kv_cache_usage_perc from the slots' contexts

  std::shared_ptr<api::Model> model_;
  SchedulerOptions options_;
  Metrics& metrics_;
  std::vector<Slot> slots_;            // touched by the scheduler thread only
  mutable std::mutex mu_;              // guards waiting_, stop_, and the gauges below
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  std::atomic<bool> cancel_all_{false};  // drain() past its timeout
  int64_t running_ = 0, held_tokens_ = 0, capacity_tokens_ = 0;
  std::thread thread_;
};

}  // namespace specula::serve

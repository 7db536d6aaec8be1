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
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "specula/api.hpp"
#include "specula/serve/metrics.hpp"

namespace specula::serve {

using Clock = std::chrono::steady_clock;

// One request's life: filled by the HTTP side, run by the scheduler thread, its output read back by the
// HTTP side as it comes (streamed) or at the end. Everything below `mu` is guarded by it.
struct Job {
  std::vector<int32_t> prompt;
  api::SamplingConfig sampling;
  Clock::time_point arrival = Clock::now();
  std::atomic<bool> cancel{false};  // the client went away: stop after the current step
  // Called by the scheduler thread after new output and at the end; must not block. Set before submit.
  std::function<void()> on_update;

  std::mutex mu;
  std::string text, reasoning;      // produced, not yet taken
  std::vector<api::ToolCall> tool_calls;  // parsed, not yet taken
  std::vector<core::TokenLogprob> logprobs;  // with sampling.logprobs: the tokens' since the last take
  bool done = false;
  bool update_pending = false;      // on_update was called and take() has not run since
  std::optional<api::Result> result;  // absent when the request failed
  std::string error;                // why it ended early: a failure, or shutdown
  std::string finish_reason;        // stop, length, abort, error

  struct Output {
    std::string text, reasoning;
    std::vector<api::ToolCall> tool_calls;
    bool done = false;
    std::vector<core::TokenLogprob> logprobs;
  };
  Output take();  // what was produced since the last take
  void notify();  // on_update, unless one is still pending
};

struct SchedulerOptions {
  int parallel = 1;       // slots
  int queue_limit = 64;   // requests waiting for a slot at most, those being prepared included
};

class Scheduler : public std::enable_shared_from_this<Scheduler> {
 public:
  Scheduler(std::shared_ptr<api::Model> model, SchedulerOptions options, Metrics& metrics);
  ~Scheduler();  // cancels what runs and joins the thread

  // A place among the --parallel + --queue-limit requests the server takes at once, held from a request's
  // arrival (while its body is read into a prompt) until it is submitted: requests being prepared count
  // against the limit as the queued ones do, so that no burst gets past it.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&&) noexcept = default;
    Ticket& operator=(Ticket&& o) noexcept;
    ~Ticket();
    explicit operator bool() const { return owner_ != nullptr; }

   private:
    friend class Scheduler;
    explicit Ticket(std::shared_ptr<Scheduler> owner) : owner_(std::move(owner)) {}
    std::shared_ptr<Scheduler> owner_;  // (a moved-from shared_ptr is empty)
  };
  // An empty ticket when the server holds its limit already (or is shutting down). The scheduler must be
  // owned by a shared_ptr.
  Ticket reserve();
  bool full() const;  // reserve() would fail now

  enum class Admission { Queued, ShuttingDown };
  Admission submit(std::shared_ptr<Job> job, Ticket ticket);
  // Refuses new requests, lets queued and running ones finish for up to `timeout`, then cancels the rest
  // (they end as "abort") and waits (bounded) for them to end.
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
  void update_usage();  // the KV gauges from the slots' contexts
  bool full_locked() const;

  std::shared_ptr<api::Model> model_;
  SchedulerOptions options_;
  Metrics& metrics_;
  std::vector<Slot> slots_;            // touched by the scheduler thread only
  mutable std::mutex mu_;              // guards waiting_, stop_, reserved_, and the gauges below
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> waiting_;
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  std::atomic<bool> cancel_all_{false};  // drain() past its timeout
  int64_t reserved_ = 0;                 // tickets out
  int64_t running_ = 0, running_tokens_ = 0, kept_tokens_ = 0, capacity_tokens_ = 0;
  std::thread thread_;
};

}  // namespace specula::serve

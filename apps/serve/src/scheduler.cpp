#include "specula/serve/scheduler.hpp"

#include "specula/error.hpp"
#include "specula/log.hpp"

namespace specula::serve {

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string finish_reason(core::StopReason r) {
  switch (r) {
    case core::StopReason::EndToken:
    case core::StopReason::StopString: return "stop";
    case core::StopReason::MaxTokens:
    case core::StopReason::ContextFull: return "length";
    case core::StopReason::Interrupted: return "abort";
  }
  return "stop";
}
}  // namespace

Job::Output Job::take(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu);
  cv.wait_for(lock, timeout, [&] { return done || !text.empty() || !reasoning.empty(); });
  Output o{std::move(text), std::move(reasoning), done};
  text.clear();
  reasoning.clear();
  return o;
}

void Job::wait_done(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu);
  cv.wait_for(lock, timeout, [&] { return done; });
}

Scheduler::Scheduler(std::shared_ptr<api::Model> model, SchedulerOptions options, Metrics& metrics)
    : model_(std::move(model)), options_(options), metrics_(metrics) {
  if (options_.parallel < 1) fail("--parallel must be at least 1, got {}", options_.parallel);
  if (options_.queue_limit < 0) fail("the queue limit must not be negative, got {}", options_.queue_limit);
  for (int i = 0; i < options_.parallel; ++i) {
    Slot s;
    s.session = model_->new_session();
    capacity_tokens_ += s.session->capacity();
    slots_.push_back(std::move(s));
  }
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Scheduler::Admission Scheduler::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lock(mu_);
    if (draining_ || stop_) return Admission::ShuttingDown;
    // Full when every slot is busy and the queue holds its limit.
    if (static_cast<int>(waiting_.size()) >= options_.queue_limit + (options_.parallel - running_)) return Admission::QueueFull;
    waiting_.push_back(std::move(job));
  }
  cv_.notify_all();
  return Admission::Queued;
}

Gauges Scheduler::gauges() const {
  std::lock_guard lock(mu_);
  Gauges g;
  g.waiting = static_cast<int64_t>(waiting_.size());
  g.running = running_;
  g.kv_cache_usage = capacity_tokens_ ? double(held_tokens_) / double(capacity_tokens_) : 0.0;
  g.slots = static_cast<int64_t>(slots_.size());
  return g;
}

void Scheduler::drain(std::chrono::milliseconds timeout) {
  draining_ = true;
  const auto deadline = Clock::now() + timeout;
  auto idle = [&] {
    std::lock_guard lock(mu_);
    return waiting_.empty() && running_ == 0;
  };
  while (!idle() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (idle()) return;
  log_warn("shutdown: cancelling the requests still queued or running after {} ms", timeout.count());
  cancel_all_ = true;  // the scheduler thread cancels them between steps
  cv_.notify_all();
  const auto hard = Clock::now() + std::chrono::seconds(10);
  while (!idle() && Clock::now() < hard) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

void Scheduler::loop() {
  while (true) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !waiting_.empty() || running_ > 0; });
      if (stop_) break;
    }
    admit();
    step_running();
  }
  // Stopping: end what still runs so that every waiting HTTP thread gets an answer.
  for (auto& s : slots_) {
    if (!s.job) continue;
    s.session->cancel();
    try {
      complete(s, s.session->end(), {});
    } catch (const std::exception& e) {
      complete(s, std::nullopt, e.what());
    }
  }
  std::deque<std::shared_ptr<Job>> left;
  {
    std::lock_guard lock(mu_);
    left.swap(waiting_);
  }
  for (auto& j : left) {
    std::lock_guard lock(j->mu);
    j->error = "the server is shutting down";
    j->finish_reason = "abort";
    j->done = true;
    j->cv.notify_all();
  }
}

void Scheduler::admit() {
  while (true) {
    std::shared_ptr<Job> job;
    Slot* best = nullptr;
    size_t best_common = 0;
    {
      std::lock_guard lock(mu_);
      if (waiting_.empty()) return;
      job = waiting_.front();
      // The free slot whose context already holds the longest prefix of this prompt (prefix reuse).
      for (auto& s : slots_) {
        if (s.job) continue;
        const size_t common = s.session->reusable_prefix(job->prompt);
        if (!best || common > best_common) {
          best = &s;
          best_common = common;
        }
      }
      if (!best) return;
      waiting_.pop_front();
      ++running_;
    }
    if (job->cancel || cancel_all_) {  // gone while waiting
      best->job = job;
      complete(*best, std::nullopt, {});
      continue;
    }
    start(*best, std::move(job), best_common);
  }
}

void Scheduler::start(Slot& slot, std::shared_ptr<Job> job, size_t cached) {
  slot.job = job;
  slot.first = true;
  Job* j = job.get();
  try {
    slot.session->begin(job->prompt, job->sampling, [this, &slot, j](const api::Chunk& c) {
      if (c.token >= 0) {
        const auto now = Clock::now();
        metrics_.generation_token(seconds(now - slot.last_token), slot.first, seconds(now - j->arrival));
        slot.first = false;
        slot.last_token = now;
      }
      if (c.text.empty() && c.reasoning.empty()) return;
      {
        std::lock_guard lock(j->mu);
        j->text += c.text;
        j->reasoning += c.reasoning;
      }
      j->cv.notify_all();
    });
    metrics_.prompt_tokens(static_cast<int64_t>(job->prompt.size()), static_cast<int64_t>(cached));
  } catch (const std::exception& e) {
    complete(slot, std::nullopt, e.what());
    return;
  }
  if (slot.session->finished()) complete(slot, slot.session->end(), {});
}

// Advances every running request by one step (one token, or one speculative round with a drafter):
// one target forward for all of them (Session::step_all), each sampling, accepting and rolling back on
// its own. Admission, completion and cancellation happen between these steps.
void Scheduler::step_running() {
  std::vector<Slot*> running;
  std::vector<api::Session*> sessions;
  for (auto& slot : slots_) {
    if (!slot.job) continue;
    if (slot.job->cancel || cancel_all_) slot.session->cancel();
    running.push_back(&slot);
    sessions.push_back(slot.session.get());
  }
  if (!running.empty()) {
    try {
      api::Session::step_all(sessions);
      for (Slot* slot : running)
        if (slot->session->finished()) complete(*slot, slot->session->end(), {});
    } catch (const std::exception& e) {
      log_warn("requests failed while generating: {}", e.what());
      for (Slot* slot : running)
        if (slot->job) complete(*slot, std::nullopt, e.what());
    }
  }
  update_usage();
}

void Scheduler::update_usage() {
  int64_t held = 0;
  for (const auto& s : slots_) held += s.session->position();
  std::lock_guard lock(mu_);
  held_tokens_ = held;
}

void Scheduler::complete(Slot& slot, std::optional<api::Result> result, const std::string& error) {
  std::shared_ptr<Job> job = std::move(slot.job);  // leaves the slot free
  if (slot.session->active()) {  // cancelled before its first step, or failed: end it quietly
    try {
      slot.session->cancel();
      slot.session->end();
    } catch (const std::exception&) {
      slot.session->reset();
    }
  }
  const std::string reason = !error.empty() ? "error" : result ? finish_reason(result->stop_reason) : "abort";
  metrics_.finished(reason, result ? &result->stats : nullptr, seconds(Clock::now() - job->arrival));
  {
    std::lock_guard lock(mu_);
    --running_;
  }
  update_usage();
  {
    std::lock_guard lock(job->mu);
    job->result = std::move(result);
    job->error = error;
    job->finish_reason = reason;
    job->done = true;
  }
  job->cv.notify_all();
}

}  // namespace specula::serve

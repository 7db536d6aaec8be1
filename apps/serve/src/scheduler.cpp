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

Job::Output Job::take() {
  std::lock_guard lock(mu);
  update_pending = false;
  Output o{std::move(text), std::move(reasoning), std::move(tool_calls), done, std::move(logprobs)};
  logprobs.clear();
  text.clear();
  reasoning.clear();
  tool_calls.clear();
  return o;
}

void Job::notify() {
  {
    std::lock_guard lock(mu);
    if (update_pending) return;  // the reader has not taken the last update yet: it will see this one too
    update_pending = true;
  }
  if (on_update) on_update();
}

Scheduler::Ticket& Scheduler::Ticket::operator=(Ticket&& o) noexcept {
  if (this != &o) {
    Ticket dropped(std::move(*this));
    owner_ = std::move(o.owner_);
  }
  return *this;
}

Scheduler::Ticket::~Ticket() {
  if (!owner_) return;
  std::lock_guard lock(owner_->mu_);
  --owner_->reserved_;
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

bool Scheduler::full_locked() const {
  return reserved_ + static_cast<int64_t>(waiting_.size()) + running_ >= options_.parallel + options_.queue_limit;
}

bool Scheduler::full() const {
  std::lock_guard lock(mu_);
  return full_locked();
}

Scheduler::Ticket Scheduler::reserve() {
  std::lock_guard lock(mu_);
  if (draining_ || stop_ || full_locked()) return {};
  ++reserved_;
  return Ticket(shared_from_this());
}

Scheduler::Admission Scheduler::submit(std::shared_ptr<Job> job, Ticket ticket) {
  if (!ticket) fail("Scheduler::submit without a ticket; reserve() one first");
  {
    std::lock_guard lock(mu_);
    if (draining_ || stop_) return Admission::ShuttingDown;  // the ticket is given back
    ticket.owner_.reset();  // its place passes to the queued job
    --reserved_;
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
  g.kv_cache_usage = capacity_tokens_ ? double(running_tokens_) / double(capacity_tokens_) : 0.0;
  g.prefix_cache_usage = capacity_tokens_ ? double(kept_tokens_) / double(capacity_tokens_) : 0.0;
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
    {
      std::lock_guard lock(j->mu);
      j->error = "the server shut down before the request started";
      j->finish_reason = "abort";
      j->done = true;
    }
    j->notify();
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
  metrics_.queued(seconds(Clock::now() - job->arrival));
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
      if (c.text.empty() && c.reasoning.empty() && c.tool_calls.empty() && !c.logprob) return;
      {
        std::lock_guard lock(j->mu);
        if (c.logprob) j->logprobs.push_back(*c.logprob);
        j->text += c.text;
        j->reasoning += c.reasoning;
        j->tool_calls.insert(j->tool_calls.end(), c.tool_calls.begin(), c.tool_calls.end());
      }
      j->notify();
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
  // What running requests hold is in use; what idle slots keep for prefix reuse is reclaimable (a new
  // request truncates it), so it is reported apart: a kept prefix must not make an idle server look full.
  int64_t running = 0, kept = 0;
  for (const auto& s : slots_) (s.job ? running : kept) += s.session->position();
  std::lock_guard lock(mu_);
  running_tokens_ = running;
  kept_tokens_ = kept;
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
  // Nothing forces the host path silently (penalties, logit_bias, logprobs): the log says why.
  if (result && result->stats.host_sampled_tokens > 0 && !result->stats.host_sampling_reason.empty())
    log_info("request sampled {} of {} tokens on the host{}: {}", result->stats.host_sampled_tokens,
             result->tokens.size(), result->stats.drafted_tokens > 0 ? " (drafting stayed on)" : "",
             result->stats.host_sampling_reason);
  {
    std::lock_guard lock(mu_);
    --running_;
  }
  update_usage();
  {
    std::lock_guard lock(job->mu);
    job->result = std::move(result);
    job->error = error;
    if (reason == "abort" && !job->cancel)
      job->error = cancel_all_ ? "the server shut down before the answer was complete" : "the request was cancelled";
    job->finish_reason = reason;
    job->done = true;
  }
  job->notify();
}

}  // namespace specula::serve

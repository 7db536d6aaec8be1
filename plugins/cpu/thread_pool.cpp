#include "thread_pool.hpp"

#include <chrono>
#include <exception>
#include <utility>

#include <immintrin.h>

namespace specula::cpu {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (workers_.empty()) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  state_.store(kOpen, std::memory_order_release);
  // Sequentially consistent with the sleeper count: a worker counts itself before it checks the
  // generation under the mutex, so either it sees this job or we see it and wake it.
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst) > 0) {
    { std::lock_guard<std::mutex> lock(mutex_); }  // a worker between its check and its wait holds the mutex
    wake_.notify_all();
  }
  // An exception in the caller's share must not leave workers running a dangling job.
  std::exception_ptr error;
  try {
    fn(0, size());
  } catch (...) {
    error = std::current_exception();
  }
  // Close the job: a worker that has not joined by now (descheduled, or still waking) skips it, as the
  // caller has claimed what it would have done; the ones inside finish their chunks.
  state_.fetch_and(~kOpen, std::memory_order_acq_rel);
  while (state_.load(std::memory_order_acquire) != 0) _mm_pause();
  if (!error) {
    std::lock_guard<std::mutex> lock(mutex_);
    error = std::exchange(worker_error_, nullptr);
  }
  if (error) std::rethrow_exception(error);
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin a little (about 100 us) for the next job, then sleep.
    auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
    int polls = 0;
    while (generation_.load(std::memory_order_acquire) == seen && !stop_.load()) {
      _mm_pause();
      if (++polls % 256 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(mutex_);
        sleeping_.fetch_add(1, std::memory_order_seq_cst);
        wake_.wait(lock, [&] { return generation_.load() != seen || stop_.load(); });
        sleeping_.fetch_sub(1, std::memory_order_seq_cst);
      }
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    // Join the job if it is still open. Once inside, the caller waits for us, so job_ and the generation
    // stay those of the job joined (possibly a newer one than `seen`).
    int64_t s = state_.load(std::memory_order_acquire);
    while ((s & kOpen) && !state_.compare_exchange_weak(s, s + kJoined, std::memory_order_acq_rel)) {
    }
    if (!(s & kOpen)) continue;
    seen = generation_.load(std::memory_order_acquire);
    try {
      (*job_)(index, size());
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!worker_error_) worker_error_ = std::current_exception();  // rethrown by run()
    }
    state_.fetch_sub(kJoined, std::memory_order_acq_rel);
  }
}

}  // namespace specula::cpu

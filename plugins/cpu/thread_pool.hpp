// A small fork-join pool for the CPU backend. Graph ops are short (a decode step runs hundreds of them
// in milliseconds), so idle workers spin briefly before sleeping: waking a sleeping thread costs tens of
// microseconds, which would dominate small ops.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specula::cpu {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(thread_index, thread_count) on the caller (thread 0) and on each worker that joins before
  // the caller's own call returns, then waits for those; an exception thrown on any thread is rethrown
  // here. A worker that is not running (the cores are shared with other processes) is not waited for, so
  // fn must leave no work to a particular thread: parallel_for's threads claim chunks from a shared counter.
  void run(const std::function<void(int, int)>& fn);

  // Splits [0, n) into contiguous chunks at least `grain` long (up to 8 per thread) and calls fn(begin,
  // end) for each. Threads claim chunks in order as they come free, so one that starts late (a worker
  // waking up) or runs slower does less, instead of the others waiting for it.
  template <typename F>
  void parallel_for(int64_t n, int64_t grain, F&& fn) {
    if (n <= 0) return;
    const int64_t max_chunks = grain > 0 ? (n + grain - 1) / grain : n;
    const int threads = static_cast<int>(std::min<int64_t>(size(), max_chunks));
    if (threads <= 1) {
      fn(int64_t{0}, n);
      return;
    }
    // Few chunks (a small op) come in a multiple of the thread count, so that two threads running alike
    // finish together: 3 chunks on 2 threads would leave one thread a third of the work after the other.
    const int64_t chunks = max_chunks >= int64_t{8} * threads ? int64_t{8} * threads : max_chunks / threads * threads;
    std::atomic<int64_t> next{0};
    run([&](int t, int) {
      if (t >= threads) return;
      for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
           c = next.fetch_add(1, std::memory_order_relaxed)) {
        const int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
        if (begin < end) fn(begin, end);
      }
    });
  }

 private:
  void worker(int index);

  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  // Bit 0: the current job is open to workers; the bits above count the workers inside it.
  std::atomic<int64_t> state_{0};
  static constexpr int64_t kOpen = 1, kJoined = 2;
  std::atomic<bool> stop_{false};
  std::atomic<int> sleeping_{0};  // workers waiting on wake_: run() takes the mutex only when there are some
  std::mutex mutex_;
  std::condition_variable wake_;
  std::exception_ptr worker_error_;  // first exception thrown on a worker during run()
};

}  // namespace specula::cpu

// Memory read bandwidth, the decode roofline's denominator: threads sum a buffer well above the last-level
// cache (default 2 GiB) with AVX2 loads; prints the best of --runs in GB/s, over three ways of reading:
// plain loads, and loads with software prefetches into L1 2 KB ahead or into L2 8 KB ahead. On a 2-core
// Xeon VM (2026-12-06) plain loads read 16.6-22.2 GB/s and the L2 prefetches 24.2-28.8: the roofline is
// what the machine can be made to give, so the best of the three counts.
//   bench_bandwidth [--threads N] [--mib M] [--runs R]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency())), runs = 3;
  size_t mib = 2048;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string k = argv[a];
    if (k == "--threads") threads = std::max(1, std::atoi(argv[a + 1]));
    else if (k == "--mib") mib = static_cast<size_t>(std::max(64, std::atoi(argv[a + 1])));
    else if (k == "--runs") runs = std::max(1, std::atoi(argv[a + 1]));
    else {
      std::fprintf(stderr, "bench_bandwidth: unknown option %s (expected --threads, --mib, --runs)\n", k.c_str());
      return 2;
    }
  }
  const size_t bytes = mib << 20, share = bytes / static_cast<size_t>(threads) / 64 * 64;
  auto* p = static_cast<char*>(std::aligned_alloc(64, bytes));
  if (!p) {
    std::fprintf(stderr, "bench_bandwidth: cannot allocate %zu MiB\n", mib);
    return 1;
  }
  std::memset(p, 1, bytes);
  std::vector<long long> sink(static_cast<size_t>(threads));
  double best = 0;
  for (int r = 0; r < 3 * runs; ++r) {
    const int way = r % 3;  // 0: plain loads; 1: prefetch into L1, 2 KB ahead; 2: into L2, 8 KB ahead
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const char* q = p + static_cast<size_t>(t) * share;
        __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
        for (size_t i = 0; i < share; i += 64) {
          if (way == 1) _mm_prefetch(q + i + 2048, _MM_HINT_T0);
          if (way == 2) _mm_prefetch(q + i + 8192, _MM_HINT_T1);
          a = _mm256_add_epi64(a, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + i)));
          b = _mm256_add_epi64(b, _mm256_load_si256(reinterpret_cast<const __m256i*>(q + i + 32)));
        }
        a = _mm256_add_epi64(a, b);
        sink[static_cast<size_t>(t)] = _mm256_extract_epi64(a, 0);
      });
    for (auto& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(share) * threads / s / 1e9);
  }
  std::printf("%.2f\n", best);
  std::free(p);
  return sink[0] == 42 ? 3 : 0;  // keeps the sums alive
}

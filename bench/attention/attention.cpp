// The CPU backend's attention kernel alone: T query rows against S cache slots of one layer (default: an
// E2B global layer, 8 query heads on 1 KV head of 512 values), causal, the rows the last positions. Prints
// the best and the median ms a call over --seconds of calls, per row count and thread count.
//   bench_attention [--rows 1,5,9] [--slots 2048] [--dim 512] [--heads 8] [--kv-heads 1] [--window 0]
//                   [--cache F32|F16|BF16] [--threads 1,2] [--seconds 1]
// E2B's sliding layers: --slots 512 --dim 256. SPECULA_CPU_ISA=avx2 measures the AVX2 set.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels.hpp"
#include "specula/dtype.hpp"
#include "specula/error.hpp"
#include "specula/quant.hpp"
#include "thread_pool.hpp"

using namespace specula;

namespace {
std::vector<int64_t> numbers(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoll(item));
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> rows{1, 5, 9}, threads{1, 2};
  int64_t S = 2048, D = 512, Hq = 8, Hkv = 1, window = 0;
  std::string cache = "F32";
  double seconds = 1.0;
  for (int a = 1; a + 1 < argc; a += 2) {
    const std::string k = argv[a], v = argv[a + 1];
    if (k == "--rows") rows = numbers(v);
    else if (k == "--slots") S = std::stoll(v);
    else if (k == "--dim") D = std::stoll(v);
    else if (k == "--heads") Hq = std::stoll(v);
    else if (k == "--kv-heads") Hkv = std::stoll(v);
    else if (k == "--window") window = std::stoll(v);
    else if (k == "--cache") cache = v;
    else if (k == "--threads") threads = numbers(v);
    else if (k == "--seconds") seconds = std::stod(v);
    else { std::fprintf(stderr, "unknown option %s (see the comment atop bench/attention/attention.cpp)\n", k.c_str()); return 2; }
  }
  try {
    const DType type = cache == "F16" ? DType::F16 : cache == "BF16" ? DType::BF16 : DType::F32;
    if (type == DType::F32 && cache != "F32") throw Error("--cache " + cache + ": expected F32, F16 or BF16");
    if (S < 1 || D < 1 || Hkv < 1 || Hq % Hkv != 0) throw Error("--slots, --dim >= 1 and --heads a multiple of --kv-heads");
    const int64_t T = *std::max_element(rows.begin(), rows.end());
    if (T > S) throw Error("more rows than --slots");
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto floats = [&](int64_t n) {
      std::vector<float> v(static_cast<size_t>(n));
      for (float& x : v) x = u(gen);
      return v;
    };
    const std::vector<float> q = floats(T * Hq * D);
    auto encode = [&](const std::vector<float>& x) {  // the cache as the backend stores it
      std::vector<std::byte> out(*dtype_row_bytes(type, x.size()));
      quantize_row(type, x.data(), out.data(), static_cast<int64_t>(x.size()));
      return out;
    };
    const std::vector<std::byte> k = encode(floats(S * Hkv * D)), v = encode(floats(S * Hkv * D));
    std::vector<int32_t> key_pos(static_cast<size_t>(S));
    for (int64_t s = 0; s < S; ++s) key_pos[static_cast<size_t>(s)] = static_cast<int32_t>(s);
    std::vector<float> out(static_cast<size_t>(T * Hq * D));
    const cpu::KernelSet& kernels = cpu::select_kernels("");
    std::printf("attention, %s kernels: %lld slots, %lld heads on %lld KV heads of %lld, %s cache, window %lld\n",
                kernels.name, static_cast<long long>(S), static_cast<long long>(Hq), static_cast<long long>(Hkv),
                static_cast<long long>(D), cache.c_str(), static_cast<long long>(window));
    for (int64_t nt : threads) {
      cpu::ThreadPool pool(static_cast<int>(nt));
      for (int64_t n : rows) {
        std::vector<int32_t> query_pos(static_cast<size_t>(n));
        for (int64_t t = 0; t < n; ++t) query_pos[static_cast<size_t>(t)] = static_cast<int32_t>(S - n + t);
        cpu::AttentionArgs a{};
        a.q = q.data();
        a.k = k.data();
        a.v = v.data();
        a.k_type = a.v_type = type;
        a.key_pos = key_pos.data();
        a.query_pos = query_pos.data();
        a.T = n;
        a.S = S;
        a.Hq = Hq;
        a.Hkv = Hkv;
        a.D = a.Dv = D;
        a.scale = 1.0f / 16;
        a.window = window;
        a.causal = true;
        std::vector<double> ms;
        const auto start = std::chrono::steady_clock::now();
        while (ms.size() < 5 || std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
          const auto t0 = std::chrono::steady_clock::now();
          cpu::attention(pool, kernels, a, out.data());
          ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(ms.begin(), ms.end());
        std::printf("  %lld rows, %lld threads: best %.3f ms, median %.3f ms (%zu calls)\n", static_cast<long long>(n),
                    static_cast<long long>(nt), ms.front(), ms[ms.size() / 2], ms.size());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention: %s\n", e.what());
    return 1;
  }
}

// Weight-streaming throughput of the CPU backend's matrix products: for each weight type, an [O, I]
// matrix (default 10240 x 2560, a Gemma 4 E4B FFN projection) times N activation rows, timed through
// the real ComputeBackend::run path. Reports the best and the median ms per product over --seconds of runs,
// GB/s of weight bytes read and GFLOP/s (at the best), and the process's CPU time per run.
//   bench_matvec [--rows O] [--cols I] [--n N[,N...]] [--threads T[,T...]] [--types Q4_K,Q8_0,...] [--cached 1]
//                [--pack 0] (Q8_0 / Q4_0 rows as the file holds them, not the backend's packed panels)
// --cached 1 keeps one copy of the weight, which stays in the caches if it fits: the kernel's compute
// cost without the memory stream (a small model's matrices live in L2/L3).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_backend.hpp"
#include "specula/error.hpp"
#include "specula/quant.hpp"

using namespace specula;

namespace {
double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  int64_t O = 10240, I = 2560;
  std::vector<std::string> types{"Q4_K", "Q6_K", "Q8_0", "Q4_0", "BF16", "F16", "F32"};
  std::vector<int> threads{1, 2}, ns{1};
  double seconds = 1.0;
  bool cached = false, pack = true;
  for (int a = 1; a + 1 < argc; a += 2) {
    std::string k = argv[a], v = argv[a + 1];
    if (k == "--rows") O = std::stoll(v);
    else if (k == "--cols") I = std::stoll(v);
    else if (k == "--types") types = split(v);
    else if (k == "--threads") { threads.clear(); for (auto& t : split(v)) threads.push_back(std::stoi(t)); }
    else if (k == "--n") { ns.clear(); for (auto& t : split(v)) ns.push_back(std::stoi(t)); }
    else if (k == "--seconds") seconds = std::stod(v);
    else if (k == "--cached") cached = v == "1";
    else if (k == "--pack") pack = v != "0";
    else { std::fprintf(stderr, "unknown option %s\n", k.c_str()); return 2; }
  }
  try {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(O * I));
    for (auto& v : w) v = dist(rng);
    std::printf("%-6s %8s %3s %4s %10s %8s %8s %9s %10s %9s\n", "type", "shape", "N", "thr", "best ms", "med ms",
                "GB/s", "GFLOP/s", "cpu ms", "GB/s/cpu");
    for (const auto& tn : types) {
      // MLX4 / MLX8: MLX affine, groups of 64, bf16 scales and biases (mlx-community's usual layout).
      const bool mlx = tn == "MLX4" || tn == "MLX8";
      const MlxRowParams mp{tn == "MLX8" ? 8u : 4u, 64, DType::BF16};
      auto type = mlx ? std::optional<DType>(DType::MLX_AFFINE) : dtype_from_name(tn);
      if (!type) fail("unknown type {}", tn);
      const size_t rb = mlx ? static_cast<size_t>(I) * mp.bits / 8 : *dtype_row_bytes(*type, static_cast<uint64_t>(I));
      const size_t sb = static_cast<size_t>(I / 64) * 2;
      std::vector<std::byte> packed(rb * static_cast<size_t>(O)), scales(mlx ? sb * O : 0), biases(scales.size());
      for (int64_t o = 0; o < O; ++o) {
        if (mlx)
          mlx_quantize_row(mp, w.data() + o * I, I, packed.data() + o * rb, scales.data() + o * sb, biases.data() + o * sb);
        else
          quantize_row(*type, w.data() + o * I, packed.data() + o * rb, I);
      }
      QuantParams qp;
      if (mlx) qp = {mp.bits, mp.group_size, mp.scale_type, scales, biases};
      for (int t : threads) {
        auto backend = cpu::make_cpu_backend({{"threads", t}, {"pack_weights", pack}});
        // Enough copies of the weight to overflow the last-level cache, so that the numbers measure
        // streaming from memory as a model's decode step does.
        const size_t copies = cached ? 1 : std::max<size_t>(1, (size_t{512} << 20) / packed.size());
        std::vector<std::vector<std::byte>> held(copies, packed);
        std::vector<BackendTensorPtr> wts;
        for (auto& h : held) wts.push_back(backend->load_weight({"w", *type, {O, I}, std::span<const std::byte>(h), qp}));
        for (int n : ns) {
          std::vector<float> x(static_cast<size_t>(n * I));
          for (auto& v : x) v = dist(rng);
          std::vector<Graph> graphs(copies);
          std::vector<RunInputs> ins;
          std::vector<std::unique_ptr<CompiledGraph>> plans;
          for (size_t c = 0; c < copies; ++c) {
            Value xv = graphs[c].input(DType::F32, {n, I}, "x");
            graphs[c].mark_output(graphs[c].matmul(graphs[c].constant(wts[c]), xv));
            ins.push_back({{{xv, std::as_bytes(std::span<const float>(x))}}});
            plans.push_back(backend->compile(graphs[c]));
          }
          // Warm-up: every copy once, so that packing the weights (their first product) is not timed.
          for (size_t c = 0; c < copies; ++c) plans[c]->run(ins[c]);
          size_t next = 0;
          // The fastest of many runs (on a shared machine the mean mostly measures other processes), and the
          // median, which a model's sequence of products pays more nearly.
          const auto t0 = std::chrono::steady_clock::now();
          const double cpu0 = cpu_seconds();
          int runs = 0;
          double elapsed = 0, best = 1e30;
          std::vector<double> times;
          do {
            const auto t1 = std::chrono::steady_clock::now();
            plans[next]->run(ins[next]);
            next = (next + 1) % copies;
            const auto t2 = std::chrono::steady_clock::now();
            times.push_back(std::chrono::duration<double>(t2 - t1).count());
            best = std::min(best, times.back());
            elapsed = std::chrono::duration<double>(t2 - t0).count();
            ++runs;
          } while (elapsed < seconds);
          const double ms = best * 1e3;
          std::nth_element(times.begin(), times.begin() + static_cast<ptrdiff_t>(times.size() / 2), times.end());
          const double median_ms = times[times.size() / 2] * 1e3;
          // CPU time of the whole process per run: with one thread, the time the product would take on
          // an idle core (the machine this runs on is often shared); with more, the sum over threads.
          const double cpu_ms = (cpu_seconds() - cpu0) / runs * 1e3;
          std::printf("%-6s %4ldx%-4ld %3d %4d %10.3f %8.3f %8.2f %9.2f %10.3f %9.2f\n", tn.c_str(), static_cast<long>(O),
                      static_cast<long>(I), n, t, ms, median_ms, packed.size() / (ms * 1e-3) / 1e9,
                      2.0 * O * I * n / (ms * 1e-3) / 1e9, cpu_ms, packed.size() / (cpu_ms * 1e-3) / 1e9);
          std::fflush(stdout);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_matvec: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Helpers for backend tests: random data, weights held by the test (zero-copy into the backend), and a
// one-call "build, run, read" for a graph.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "cpu_backend.hpp"
#include "specula/compute.hpp"
#ifdef SPECULA_TEST_VULKAN
#include "vk_backend.hpp"
#endif
#include "specula/model_file.hpp"
#include "specula/quant.hpp"

namespace specula::test {

using specula::bytes_of;

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Bytes of F32 values stored as `type` (F32, F16 or BF16).
inline std::vector<std::byte> encode(const std::vector<float>& v, DType type) {
  std::vector<std::byte> out(v.size() * (type == DType::F32 ? 4 : 2));
  for (size_t i = 0; i < v.size(); ++i) {
    if (type == DType::F32) {
      std::memcpy(out.data() + 4 * i, &v[i], 4);
    } else {
      uint16_t h = type == DType::F16 ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// Random values exactly representable in `type`, so that storing them loses nothing and a reference
// can use them as they are: multiples of 2^-10 in [-1, 1] for F16, 8-bit mantissas for BF16.
inline std::vector<float> exact_floats(size_t n, uint32_t seed, DType type) {
  std::vector<float> v = random_floats(n, seed);
  for (auto& x : v) {
    if (type == DType::F16) {
      x = std::round(x * 1024.0f) / 1024.0f;
    } else if (type == DType::BF16) {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      u &= 0xffff0000u;
      std::memcpy(&x, &u, 4);
    }
  }
  return v;
}

// The backend the op suites run on: the CPU backend, or the one SPECULA_TEST_BACKEND names. tests/backend
// registers the conformance suites a second time with SPECULA_TEST_BACKEND=vulkan (prefix "vulkan:"), so
// every backend is held to the same independent references (docs/backends.md, "Conformance").
inline std::string backend_under_test() {
  const char* e = std::getenv("SPECULA_TEST_BACKEND");
  return e && *e ? e : "cpu";
}
inline bool on_vulkan() { return backend_under_test() == "vulkan"; }

inline std::unique_ptr<ComputeBackend> make_test_backend(int threads) {
  const std::string name = backend_under_test();
  if (name == "cpu") return cpu::make_cpu_backend({{"threads", threads}});
#ifdef SPECULA_TEST_VULKAN
  // The fp32 matrix paths, held to these suites' tolerances; tests/vulkan checks the cooperative-matrix
  // (fp16) path against its own bound where the device has one.
  if (name == "vulkan") return vulkan::make_vulkan_backend({{"cooperative_matrix", false}});
#endif
  throw std::runtime_error("SPECULA_TEST_BACKEND=" + name + ": this test binary runs cpu or vulkan");
}

// Skips every test of a run on a backend this machine cannot make (no Vulkan device).
class BackendAvailable final : public ::testing::Environment {
 public:
  void SetUp() override {
    try {
      make_test_backend(1);
    } catch (const std::exception& e) {
      GTEST_SKIP() << "backend '" << backend_under_test() << "' is not available here: " << e.what();
    }
  }
};
inline ::testing::Environment* const kBackendAvailable = ::testing::AddGlobalTestEnvironment(new BackendAvailable);

// A backend plus the storage of the weights the test hands it (TensorInfo data must outlive them).
struct Fixture {
  std::unique_ptr<ComputeBackend> backend;
  std::vector<std::shared_ptr<std::vector<std::byte>>> storage;
  std::unique_ptr<CompiledGraph> plan;  // of the last run()

  explicit Fixture(int threads = 2) : backend(make_test_backend(threads)) {}

  BackendTensorPtr weight(const std::string& name, DType type, Shape shape, std::vector<std::byte> data) {
    auto held = std::make_shared<std::vector<std::byte>>(std::move(data));
    storage.push_back(held);
    TensorInfo info;
    info.name = name;
    info.type = type;
    info.shape = std::move(shape);
    info.data = std::span<const std::byte>(held->data(), held->size());
    return backend->load_weight(info);
  }
  BackendTensorPtr weight(const std::string& name, DType type, Shape shape, const std::vector<float>& values) {
    return weight(name, type, std::move(shape), encode(values, type));
  }

  // Compiles and runs `g`; read_f32 / read_i32 read that run's outputs.
  void run(const Graph& g, const RunInputs& inputs) {
    plan = backend->compile(g);
    plan->run(inputs);
  }
  std::vector<float> read_f32(const Graph& g, Value v) {
    int64_t n = 1;
    for (int64_t d : g.shape(v)) n *= d;
    std::vector<float> out(static_cast<size_t>(n));
    plan->read(v, std::as_writable_bytes(std::span<float>(out)));
    return out;
  }
  std::vector<int32_t> read_i32(const Graph& g, Value v) {
    int64_t n = 1;
    for (int64_t d : g.shape(v)) n *= d;
    std::vector<int32_t> out(static_cast<size_t>(n));
    plan->read(v, std::as_writable_bytes(std::span<int32_t>(out)));
    return out;
  }
};

// |got - want| <= abs_tol + rel_tol * |want| element-wise, reporting the first failure.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, double abs_tol,
                         double rel_tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = abs_tol + rel_tol * std::abs(want[i]);
    if (!(std::abs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i]
                    << " (tolerance " << tol << ")";
      return;
    }
  }
}

}  // namespace specula::test

// A ComputeBackend that forwards to another and counts what crosses between the host and the backend
// outside graph inputs: tensor reads, graph output reads and tensor writes. Tests of "no host round
// trips" (rollback, a speculative round kept on the backend) assert on these counts. Ops in `lacking` are
// reported unsupported, for tests of what the engine does without them. finish_reading_once() steps a
// generation through such a backend.
#pragma once

#include <memory>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "specula/core/generator.hpp"

#include "specula/compute.hpp"

namespace specula_test {

class CountingBackend final : public specula::ComputeBackend {
 public:
  explicit CountingBackend(std::shared_ptr<specula::ComputeBackend> inner) : inner_(std::move(inner)) {}
  int reads = 0, writes = 0;
  std::set<specula::Op> lacking;

  std::string name() const override { return inner_->name(); }
  specula::DeviceInfo device() const override { return inner_->device(); }
  specula::Support supports(specula::Op op, specula::DType type) const override {
    if (lacking.count(op)) return specula::Support::no("left out by the test");
    return inner_->supports(op, type);
  }
  specula::BackendTensorPtr load_weight(const specula::TensorInfo& info) override { return inner_->load_weight(info); }
  specula::BackendTensorPtr allocate(const std::string& name, specula::DType type, const specula::Shape& shape) override {
    return inner_->allocate(name, type, shape);
  }
  std::unique_ptr<specula::CompiledGraph> compile(const specula::Graph& graph) override {
    struct Counted final : specula::CompiledGraph {
      std::unique_ptr<specula::CompiledGraph> plan;
      int* reads = nullptr;
      void run(const specula::RunInputs& in) override { plan->run(in); }
      void read(specula::Value v, std::span<std::byte> dst) const override {
        ++*reads;
        plan->read(v, dst);
      }
    };
    auto c = std::make_unique<Counted>();
    c->plan = inner_->compile(graph);
    c->reads = &reads;
    return c;
  }
  void read(const specula::BackendTensor& t, std::span<std::byte> dst) override {
    ++reads;
    inner_->read(t, dst);
  }
  void write(specula::BackendTensor& t, std::span<const std::byte> src) override {
    ++writes;
    inner_->write(t, src);
  }

 private:
  std::shared_ptr<specula::ComputeBackend> inner_;
};

// Runs `gen` to its end one step at a time, expecting each step (plain or a speculative round kept on the
// backend) to read from `counting` at most once and write nothing; `what` labels failures.
inline specula::core::GenerationResult finish_reading_once(specula::core::Generation& gen, CountingBackend& counting,
                                                           const std::string& what = {}) {
  for (int step = 0; !gen.finished(); ++step) {
    counting.reads = counting.writes = 0;
    gen.step();
    EXPECT_LE(counting.reads, 1) << what << ", step " << step;
    EXPECT_EQ(counting.writes, 0) << what << ", step " << step;
  }
  return gen.finish();
}

}  // namespace specula_test

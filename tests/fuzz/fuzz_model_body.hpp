// What one fuzz input exercises for model loading: a GGUF file (any metadata values, shapes, counts)
// opened in memory and loaded by the gemma4 target or the gemma4-assistant drafter on a backend that
// computes nothing but checks every call, up to building (and "running") the first graph. The backend
// states a small memory size and traps when asked for more: a model must refuse an allocation that
// hostile metadata drives (a KV cache for 4e9 tokens) with an error naming the key, before asking.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "assistant.hpp"  // plugins/gemma4_assistant
#include "fuzz_support.hpp"
#include "model.hpp"      // plugins/gemma4
#include "specula/compute.hpp"
#include "specula/dtype.hpp"
#include "specula/error.hpp"

namespace specula::fuzz {

class FuzzTensor final : public BackendTensor {
 public:
  FuzzTensor(DType type, Shape shape, std::string name) : type_(type), shape_(std::move(shape)), name_(std::move(name)) {}
  DType type() const override { return type_; }
  const Shape& shape() const override { return shape_; }
  const std::string& name() const override { return name_; }
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape_) n *= d;
    return n;
  }

 private:
  DType type_;
  Shape shape_;
  std::string name_;
};

class FuzzBackend final : public ComputeBackend {
 public:
  static constexpr uint64_t kMemory = uint64_t{64} << 20;  // what the "device" has

  std::string name() const override { return "fuzz"; }
  DeviceInfo device() const override { return {"fuzz device", kMemory, true}; }
  Support supports(Op, DType) const override { return Support::yes(); }

  BackendTensorPtr load_weight(const TensorInfo& info) override {
    // Touch the first and last byte: a span outside the file shows under ASan.
    if (!info.data.empty()) checksum_ += static_cast<uint8_t>(info.data.front()) + static_cast<uint8_t>(info.data.back());
    return std::make_shared<FuzzTensor>(info.type, info.shape, info.name);
  }
  BackendTensorPtr allocate(const std::string& name, DType type, const Shape& shape) override {
    const DTypeTraits* t = dtype_traits(type);
    if (!t || t->quantized || shape.empty()) __builtin_trap();
    uint64_t bytes = t->block_bytes;
    for (int64_t d : shape) {
      if (d <= 0 || __builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes)) __builtin_trap();
    }
    // A model checks what it allocates against device().memory_bytes before asking (a context its caches,
    // the drafter's target its table); together they may pass it a little, never by far.
    if (bytes > kMemory) __builtin_trap();
    allocated_ += bytes;
    if (allocated_ > 2 * kMemory) __builtin_trap();
    return std::make_shared<FuzzTensor>(type, shape, name);
  }
  // Runs check their inputs and compute nothing; outputs read as zeros.
  class Plan final : public CompiledGraph {
   public:
    explicit Plan(const Graph& graph) : graph_(graph) {}
    void run(const RunInputs& inputs) override {
      for (const auto& [v, bytes] : inputs.inputs) {
        const Node& n = graph_.node(v);
        if (n.op != Op::Input || bytes.size() != node_bytes(n)) __builtin_trap();
      }
    }
    void read(Value output, std::span<std::byte> dst) const override {
      const Node& n = graph_.node(output);
      if (dst.size() != elements(n.shape) * 4) __builtin_trap();  // read as F32 / I32
      std::memset(dst.data(), 0, dst.size());
    }

   private:
    const Graph& graph_;
  };
  std::unique_ptr<CompiledGraph> compile(const Graph& graph) override { return std::make_unique<Plan>(graph); }
  void read(const BackendTensor& tensor, std::span<std::byte> dst) override {
    if (dst.size() != elements(tensor.shape()) * 4) __builtin_trap();
    std::memset(dst.data(), 0, dst.size());
  }
  void write(BackendTensor& tensor, std::span<const std::byte> src) override {
    const DTypeTraits* t = dtype_traits(tensor.type());
    if (!t || src.size() != elements(tensor.shape()) * t->block_bytes) __builtin_trap();
  }

 private:
  static uint64_t elements(const Shape& s) {
    uint64_t n = 1;
    for (int64_t d : s) n *= static_cast<uint64_t>(d);
    return n;
  }
  static uint64_t node_bytes(const Node& n) { return elements(n.shape) * dtype_traits(n.type)->block_bytes; }

  uint64_t allocated_ = 0;
  uint64_t checksum_ = 0;
};

// A target for the drafter to read, shaped as its configuration asks: small caches of each attention
// type, the last hidden state and an embedding table of the backbone's width.
class FuzzTarget final : public TargetView {
 public:
  FuzzTarget(ComputeBackend& be, const gemma4_assistant::Config& c) {
    for (const auto& l : c.layers) {
      KvView& kv = l.full ? full_ : sliding_;
      kv.k = be.allocate("k", DType::F32, {8, 1, l.head_dim});
      kv.v = be.allocate("v", DType::F32, {8, 1, l.head_dim});
      kv.positions = be.allocate("pos", DType::I32, {8});
      kv.window = l.full ? 0 : c.window;
    }
    hidden_ = be.allocate("hidden", DType::F32, {c.backbone});
    embed_ = be.allocate("embed", DType::F32, {c.vocab, c.backbone});
  }
  KvView kv(const std::string& type) const override {
    const KvView& kv = type == "full" ? full_ : sliding_;
    if (!kv.k) fail("fuzz target: no {} attention layer", type);
    return kv;
  }
  BackendTensorPtr last_hidden() const override { return hidden_; }
  int64_t position() const override { return 5; }
  TokenEmbedding token_embedding() const override { return {embed_, 1.0f}; }

 private:
  KvView full_, sliding_;
  BackendTensorPtr hidden_, embed_;
};

inline bool model_one(const uint8_t* data, size_t size) {
  quiet_logs();
  try {
    auto file = std::make_shared<const GgufBytesFile>(data, size);
    auto backend = std::make_shared<FuzzBackend>();
    if (gemma4_assistant::is_assistant(*file)) {
      gemma4_assistant::check(*file, ModelInfo{}, nlohmann::json::object());
      auto drafter = gemma4_assistant::load_drafter(file, backend, ModelInfo{}, nlohmann::json::object());
      const gemma4_assistant::Config& c = drafter->config();
      // The target's embedding table is [vocab, backbone]: refuse what the device could not hold, as a
      // real target would have.
      if (static_cast<double>(c.vocab) * static_cast<double>(c.backbone) * 4 > FuzzBackend::kMemory / 2) return true;
      FuzzTarget target(*backend, c);
      DraftRequest request;
      request.last_token = 0;
      request.n = 2;
      drafter->draft(target, request);
    } else {
      gemma4::check(*file, *backend, nlohmann::json::object());
      auto model = gemma4::load_model(file, backend, nlohmann::json::object());
      auto ctx = model->new_context({});
      const int32_t token = 0;
      ctx->forward(std::span(&token, 1), 1);
      ctx->truncate(0);
    }
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace specula::fuzz

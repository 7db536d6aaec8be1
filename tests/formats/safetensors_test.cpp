// Safetensors / MLX reader and writer: both writer styles, sharded directories, configs, MLX affine
// folding and the quantization-resolution precedence.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "common/plugins.hpp"
#include "safetensors_io.hpp"  // plugins/safetensors (specula_safetensors_io)
#include "specula/error.hpp"
#include "specula/quant.hpp"

namespace fs = std::filesystem;
using namespace specula;
using nlohmann::json;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::path(SPECULA_BINARY_DIR) / "test-tmp" / "formats-st" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

template <typename T>
std::vector<std::byte> raw(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

std::vector<float> normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

void write_json(const fs::path& p, const json& j) { std::ofstream(p) << j.dump(2); }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, RustStylePaddedHeaderRoundTrip) {
  safetensors::Writer w(safetensors::Writer::Style::Rust);
  w.set_metadata("format", "pt");
  const std::vector<uint16_t> bf{0x3F80, 0x4000, 0xC040, 0x0000, 0x3F00, 0x3E80};
  const std::vector<int64_t> i64{-1, 5, 1ll << 40};
  const std::vector<uint8_t> u8{1, 2, 3};
  const std::vector<float> f32{1.5f};
  w.add_tensor("b.weight", DType::BF16, {2, 3}, raw(bf));
  w.add_tensor("a.order", DType::I64, {3}, raw(i64));
  w.add_tensor("c.mask", DType::U8, {3}, raw(u8));
  w.add_tensor("scalar", DType::F32, {}, raw(f32));
  w.add_tensor("empty", DType::F32, {0, 4}, {});
  const auto bytes = w.serialize();
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);  // Rust pads the header to 8 with spaces
  safetensors::File f = safetensors::parse(bytes, "mem.safetensors");
  EXPECT_EQ(f.metadata["format"], "pt");
  ASSERT_EQ(f.tensors.size(), 5u);
  // Rust order: larger dtypes first, then by name; offsets follow that order.
  std::map<std::string, const TensorInfo*> by;
  for (const auto& t : f.tensors) by[t.name] = &t;
  EXPECT_LT(by["a.order"]->data.data(), by["scalar"]->data.data());
  EXPECT_LT(by["scalar"]->data.data(), by["b.weight"]->data.data());
  EXPECT_LT(by["b.weight"]->data.data(), by["c.mask"]->data.data());
  EXPECT_EQ(by["b.weight"]->type, DType::BF16);
  EXPECT_EQ(by["b.weight"]->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(by["scalar"]->shape.size(), 0u);
  EXPECT_EQ(by["scalar"]->elements(), 1);
  EXPECT_EQ(by["empty"]->elements(), 0);
  std::vector<float> y(6);
  dequantize_tensor(*by["b.weight"], y.data());
  EXPECT_EQ(y, (std::vector<float>{1.0f, 2.0f, -3.0f, 0.0f, 0.5f, 0.25f}));
  int64_t third;
  std::memcpy(&third, by["a.order"]->data.data() + 16, 8);
  EXPECT_EQ(third, 1ll << 40);
}

TEST(Safetensors, MlxStyleUnpaddedHeaderRoundTrip) {
  safetensors::Writer w(safetensors::Writer::Style::Mlx);
  w.set_metadata("format", "mlx");
  const std::vector<int32_t> order{3, 1, 2};
  const std::vector<uint16_t> h{0x3C00, 0xC000};
  w.add_tensor("z", DType::I32, {3}, raw(order));
  w.add_tensor("a", DType::F16, {2}, raw(h));
  const auto bytes = w.serialize();
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_NE(static_cast<char>(bytes[8 + n - 1]), ' ');  // no padding
  safetensors::File f = safetensors::parse(bytes, "mem.safetensors");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].name, "a");  // alphabetical, data in the same order
  EXPECT_EQ(f.tensors[0].data.data(), reinterpret_cast<const std::byte*>(bytes.data()) + 8 + n);
  std::vector<float> y(2);
  dequantize_tensor(f.tensors[0], y.data());
  EXPECT_EQ(y, (std::vector<float>{1.0f, -2.0f}));
}

TEST(Safetensors, ShardedDirectoryWithConfigs) {
  const fs::path dir = temp_dir("sharded");
  safetensors::Writer s1, s2;
  const auto a = normal(8, 1), b = normal(4, 2);
  s1.add_tensor("model.language_model.a", DType::F32, {2, 4}, raw(a));
  s2.add_tensor("model.language_model.b", DType::F32, {4}, raw(b));
  s1.write(dir / "model-00001-of-00002.safetensors");
  s2.write(dir / "model-00002-of-00002.safetensors");
  safetensors::write_index(dir, {{"model-00001-of-00002.safetensors", &s1}, {"model-00002-of-00002.safetensors", &s2}});
  write_json(dir / "config.json", {{"model_type", "gemma4"}, {"vocab_size", 7}, {"text_config", {{"hidden_size", 4}, {"vocab_size", 9}}}});
  write_json(dir / "generation_config.json", {{"eos_token_id", {1, 106, 50}}, {"top_k", 64}});
  std::ofstream(dir / "tokenizer.json") << "{}";
  auto mf = safetensors::open(dir);
  EXPECT_EQ(mf->format(), "safetensors");
  ASSERT_EQ(mf->tensors().size(), 2u);
  const TensorInfo* tb = mf->find("model.language_model.b");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(std::memcmp(tb->data.data(), b.data(), 16), 0);
  const json& md = mf->metadata();
  EXPECT_EQ(md["generation_config"]["top_k"], 64);
  EXPECT_EQ(md["tokenizer_json_path"], (dir / "tokenizer.json").string());
  // text_config first, root as fallback.
  EXPECT_EQ(*safetensors::text_config_value(md["config"], "vocab_size"), 9);
  EXPECT_EQ(*safetensors::text_config_value(md["config"], "hidden_size"), 4);
  EXPECT_EQ(*safetensors::text_config_value(md["config"], "model_type"), "gemma4");
  EXPECT_EQ(safetensors::text_config_value(md["config"], "absent"), nullptr);

  // Opening one shard file alone reads just that file.
  auto one = safetensors::open(dir / "model-00002-of-00002.safetensors");
  EXPECT_EQ(one->tensors().size(), 1u);

  fs::remove(dir / "model-00002-of-00002.safetensors");
  const std::string err = error_of([&] { safetensors::open(dir); });
  EXPECT_NE(err.find("model.safetensors.index.json"), std::string::npos) << err;
  EXPECT_NE(err.find("model-00002-of-00002.safetensors"), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;
}

TEST(Safetensors, DirectoryWithoutIndexReadsEveryModelFile) {
  const fs::path dir = temp_dir("noindex");
  safetensors::Writer s1, s2;
  const std::vector<float> a{1, 2}, b{3};
  s1.add_tensor("a", DType::F32, {2}, raw(a));
  s2.add_tensor("b", DType::F32, {1}, raw(b));
  s1.write(dir / "model-00001-of-00002.safetensors");
  s2.write(dir / "model-00002-of-00002.safetensors");
  auto mf = safetensors::open(dir);
  EXPECT_EQ(mf->tensors().size(), 2u);
  EXPECT_NE(mf->find("b"), nullptr);
  s2 = safetensors::Writer();
  s2.add_tensor("a", DType::F32, {2}, raw(a));
  s2.write(dir / "model-00002-of-00002.safetensors");
  const std::string err = error_of([&] { safetensors::open(dir); });
  EXPECT_NE(err.find("'a' also appears"), std::string::npos) << err;
}

TEST(Safetensors, QuantizationPrecedence) {
  using safetensors::resolve_quantization;
  // Nothing stated: INT4 / 64.
  auto q = resolve_quantization(json::object(), "m");
  EXPECT_EQ(q.bits, 4u);
  EXPECT_EQ(q.group_size, 64u);
  // Flat fields win over the nested object.
  json c = {{"quantization_bits", 8}, {"quantization_group_size", 32}, {"quantization", {{"bits", 4}, {"group_size", 64}}}};
  q = resolve_quantization(c, "m");
  EXPECT_EQ(q.bits, 8u);
  EXPECT_EQ(q.group_size, 32u);
  // Flat fields in text_config still win over a nested object in the root.
  c = {{"quantization", {{"bits", 4}, {"group_size", 64}}}, {"text_config", {{"quantization_bits", 6}}}};
  q = resolve_quantization(c, "m");
  EXPECT_EQ(q.bits, 6u);
  EXPECT_EQ(q.group_size, 64u);
  // Nested object, root before text_config.
  c = {{"quantization", {{"bits", 3}, {"group_size", 128}}}, {"text_config", {{"quantization", {{"bits", 5}}}}}};
  q = resolve_quantization(c, "m");
  EXPECT_EQ(q.bits, 3u);
  EXPECT_EQ(q.group_size, 128u);
  c = {{"text_config", {{"quantization", {{"bits", 5}, {"group_size", 32}}}}}};
  q = resolve_quantization(c, "m");
  EXPECT_EQ(q.bits, 5u);
  // quantization_config is read when "quantization" is absent.
  c = {{"quantization_config", {{"bits", 2}, {"group_size", 32}}}};
  EXPECT_EQ(resolve_quantization(c, "m").bits, 2u);
  // The int8 label names no group size.
  c = {{"quantization", "int8"}};
  q = resolve_quantization(c, "m");
  EXPECT_EQ(q.bits, 8u);
  EXPECT_EQ(q.group_size, 0u);
  // Per-module override beats everything for its module only; its missing fields come from the object.
  c = {{"quantization_bits", 4}, {"quantization", {{"bits", 4}, {"group_size", 64}, {"l.router.proj", {{"bits", 8}}}}}};
  q = resolve_quantization(c, "l.router.proj");
  EXPECT_EQ(q.bits, 8u);
  EXPECT_EQ(q.group_size, 64u);
  EXPECT_NE(q.source.find("l.router.proj"), std::string::npos);
  EXPECT_EQ(resolve_quantization(c, "l.other").bits, 4u);
  // Overrides in text_config apply too.
  c = {{"text_config", {{"quantization", {{"bits", 4}, {"x", {{"bits", 6}, {"group_size", 32}}}}}}}};
  EXPECT_EQ(resolve_quantization(c, "x").bits, 6u);
  EXPECT_EQ(resolve_quantization(c, "x").group_size, 32u);
}

TEST(Safetensors, MlxQuantizedCheckpoint) {
  const fs::path dir = temp_dir("mlx");
  const int64_t rows = 8, k = 256;
  const auto w4 = normal(rows * k, 10), w8 = normal(rows * k, 11), w3 = normal(2 * rows * k, 12);
  const std::vector<uint16_t> norm(k, 0x3F80);
  safetensors::Writer w(safetensors::Writer::Style::Mlx);
  w.set_metadata("format", "mlx");
  w.add_mlx_quantized("language_model.model.layers.0.mlp.down_proj", {rows, k}, w4.data(), 4, 64);
  w.add_mlx_quantized("language_model.model.layers.0.router.proj", {rows, k}, w8.data(), 8, 64);
  w.add_mlx_quantized("language_model.model.layers.0.experts.switch_glu.up_proj", {2, rows, k}, w3.data(), 3, 32,
                      DType::F16);
  w.add_tensor("language_model.model.norm.weight", DType::BF16, {k}, raw(norm));
  w.write(dir / "model.safetensors");
  json q = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"},
            {"language_model.model.layers.0.router.proj", {{"group_size", 64}, {"bits", 8}}},
            {"language_model.model.layers.0.experts.switch_glu.up_proj", {{"group_size", 32}, {"bits", 3}}}};
  write_json(dir / "config.json", {{"model_type", "gemma4"}, {"quantization", q}, {"quantization_config", q}});
  auto mf = safetensors::open(dir);
  EXPECT_EQ(mf->format(), "mlx");
  ASSERT_EQ(mf->tensors().size(), 4u);  // scales/biases folded into their weights
  EXPECT_EQ(mf->find("language_model.model.layers.0.mlp.down_proj.scales"), nullptr);
  struct Case {
    const char* name;
    const std::vector<float>* ref;
    uint32_t bits, gs;
    std::vector<int64_t> shape;
  };
  for (const Case& c : {Case{"language_model.model.layers.0.mlp.down_proj.weight", &w4, 4, 64, {rows, k}},
                        Case{"language_model.model.layers.0.router.proj.weight", &w8, 8, 64, {rows, k}},
                        Case{"language_model.model.layers.0.experts.switch_glu.up_proj.weight", &w3, 3, 32, {2, rows, k}}}) {
    const TensorInfo* t = mf->find(c.name);
    ASSERT_NE(t, nullptr) << c.name;
    EXPECT_EQ(t->type, DType::MLX_AFFINE);
    EXPECT_EQ(t->shape, c.shape);
    EXPECT_EQ(t->quant.bits, c.bits);
    EXPECT_EQ(t->quant.group_size, c.gs);
    std::vector<float> y(c.ref->size());
    dequantize_tensor(*t, y.data());
    double err = 0, ref = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      err += (y[i] - (*c.ref)[i]) * double(y[i] - (*c.ref)[i]);
      ref += (*c.ref)[i] * double((*c.ref)[i]);
    }
    // Relative RMS bound of a b-bit uniform quantizer over each group's range (with slack).
    EXPECT_LT(std::sqrt(err / ref), 4.0 / ((1 << c.bits) - 1)) << c.name;
    // Row 5 alone equals the same row of the whole tensor.
    std::vector<float> row(k);
    dequantize_rows(*t, 5, 6, row.data());
    EXPECT_EQ(std::memcmp(row.data(), y.data() + 5 * k, k * 4), 0);
  }

  // A config that claims 4 bits for the 8-bit router is refused, naming the module and the source.
  json bad = q;
  bad.erase("language_model.model.layers.0.router.proj");
  write_json(dir / "config.json", {{"quantization", bad}});
  const std::string err = error_of([&] { safetensors::open(dir); });
  EXPECT_NE(err.find("language_model.model.layers.0.router.proj"), std::string::npos) << err;
  EXPECT_NE(err.find("bits=4"), std::string::npos) << err;
  EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;

  // The int8 label names no group size: it follows from the shapes (an 8-bit gs-64 module here).
  const fs::path dir8 = temp_dir("mlx-int8");
  safetensors::Writer w8only(safetensors::Writer::Style::Mlx);
  w8only.add_mlx_quantized("router", {rows, k}, w8.data(), 8, 64);
  w8only.write(dir8 / "model.safetensors");
  write_json(dir8 / "config.json", {{"text_config", {{"quantization", "int8"}}}});
  auto m8 = safetensors::open(dir8);
  ASSERT_NE(m8->find("router.weight"), nullptr);
  EXPECT_EQ(m8->find("router.weight")->quant.bits, 8u);
  EXPECT_EQ(m8->find("router.weight")->quant.group_size, 64u);
}

// Through the host: the safetensors plugin opens the checkpoint, has no typed GGUF keys and does not write.
TEST(SafetensorsFormat, ThroughTheHostHasNoGgufMetadataAndDoesNotWrite) {
  const fs::path dir = temp_dir("host");
  safetensors::Writer w;
  const auto a = normal(8, 3);
  w.add_tensor("model.a", DType::F32, {2, 4}, raw(a));
  w.write(dir / "model.safetensors");
  write_json(dir / "config.json", {{"model_type", "gemma4"}});
  auto& host = specula_test::host();
  const auto file = host.open_model(dir);
  EXPECT_EQ(file->format(), "safetensors");
  EXPECT_EQ(file->architecture(), "gemma4");
  EXPECT_EQ(file->gguf_metadata(), nullptr);
  const auto format = host.make_format("safetensors");
  EXPECT_FALSE(format->can_write());
  const std::string err = error_of([&] { format->write(dir / "out.gguf", {}, {}); });
  EXPECT_NE(err.find("cannot write"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(dir / "out.gguf"));
}

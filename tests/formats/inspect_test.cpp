// `specula inspect` through the real CLI and plugin host, on the real Gemma 4 vocab GGUF and on
// safetensors / MLX checkpoints written by the SDK writer.
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "safetensors_io.hpp"  // plugins/safetensors (specula_safetensors_io)

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Result {
  int status;
  std::string out;
};

Result run(const std::string& args) {
  const std::string cmd = std::string("SPECULA_PLUGIN_PATH= '") + SPECULA_CLI + "' inspect " + args + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p.get())) > 0) out.append(buf.data(), n);
  const int status = pclose(p.release());
  return {WEXITSTATUS(status), out};
}

}  // namespace

TEST(Inspect, RealGemma4VocabGguf) {
  const std::string vocab = std::string(SPECULA_SHARED_DIR) + "/gemma4-vocab/ggml-vocab-gemma-4.gguf";
  const Result r = run("'" + vocab + "' --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["format"], "gguf");
  EXPECT_EQ(j["metadata"]["general.architecture"], "gemma4");
  // The 262144-entry token list is summarised: its first 8 tokens, the cut noted in a separate field,
  // so arrays keep one element type (numbers stay numbers).
  const json& tokens = j["metadata"]["tokenizer.ggml.tokens"];
  ASSERT_EQ(tokens.size(), 8u);
  EXPECT_EQ(tokens[2], "<bos>");
  EXPECT_EQ(j["metadata_summarised"]["tokenizer.ggml.tokens"], json::parse(R"({"shown": 8, "length": 262144})"));
  for (const auto& t : j["metadata"]["tokenizer.ggml.token_type"]) EXPECT_TRUE(t.is_number_integer()) << t;
  EXPECT_EQ(j["metadata"]["tokenizer.ggml.token_type"].size(), 8u);
  EXPECT_EQ(j["totals"]["tensors"], 0);

  const Result text = run("'" + vocab + "'");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("format: gguf"), std::string::npos);
  EXPECT_NE(text.out.find("tokenizer.ggml.merges"), std::string::npos);
  EXPECT_NE(text.out.find("totals: 0 tensors"), std::string::npos);
}

TEST(Inspect, MlxDirectoryTableAndTotals) {
  const fs::path dir = fs::path(SPECULA_BINARY_DIR) / "test-tmp" / "formats-inspect" / "mlx";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<float> w(4 * 128);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (auto& v : w) v = nd(rng);
  specula::safetensors::Writer wr(specula::safetensors::Writer::Style::Mlx);
  wr.add_mlx_quantized("model.layers.0.mlp.up_proj", {4, 128}, w.data(), 4, 64);
  std::vector<uint16_t> norm(128, 0x3F80);
  wr.add_tensor("model.norm.weight", specula::DType::BF16, {128},
                {reinterpret_cast<const std::byte*>(norm.data()), 256});
  wr.write(dir / "model.safetensors");
  std::ofstream(dir / "config.json") << R"({"model_type": "gemma4_text", "quantization": {"bits": 4, "group_size": 64}})";
  const Result r = run("'" + dir.string() + "' --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["format"], "mlx");
  EXPECT_EQ(j["metadata"]["config"]["model_type"], "gemma4_text");
  ASSERT_EQ(j["tensors"].size(), 2u);
  json up;
  for (const auto& t : j["tensors"])
    if (t["name"] == "model.layers.0.mlp.up_proj.weight") up = t;
  EXPECT_EQ(up["type"], "MLX_AFFINE");
  EXPECT_EQ(up["shape"], json({4, 128}));
  EXPECT_EQ(up["quant"]["bits"], 4);
  // 4x128 4-bit codes (256 B) + 4x2 BF16 scales and biases (16 B each).
  EXPECT_EQ(up["bytes"], 256 + 16 + 16);
  EXPECT_EQ(j["totals"]["bytes"], 256 + 32 + 256);
  EXPECT_EQ(j["totals"]["elements"], 4 * 128 + 128);

  const Result text = run("'" + dir.string() + "'");
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("MLX4b/g64/BF16"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("[4, 128]"), std::string::npos) << text.out;
}

TEST(Inspect, BadFileGivesAClearError) {
  const fs::path p = fs::path(SPECULA_BINARY_DIR) / "test-tmp" / "formats-inspect" / "broken.gguf";
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << "GGUF\x03\0\0\0garbage";
  const Result r = run("'" + p.string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("broken.gguf"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("truncated"), std::string::npos) << r.out;
  const Result missing = run("/nonexistent/model.gguf");
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.out.find("/nonexistent/model.gguf"), std::string::npos) << missing.out;
}

// A file or directory no format plugin opens: the error gives each format plugin's own reason.
TEST(Inspect, NoFormatPluginOpensItEachSaysWhy) {
  const fs::path dir = fs::temp_directory_path() / ("specula-inspect-" + std::to_string(::getpid()));
  fs::create_directories(dir / "empty");
  std::ofstream(dir / "bad.gguf") << "GGUXxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";
  Result r = run("'" + (dir / "bad.gguf").string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("no format plugin can open " + (dir / "bad.gguf").string() + " (gguf: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("not a GGUF file: magic is \"GGUX\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("; safetensors: "), std::string::npos) << r.out;
  r = run("'" + (dir / "empty").string() + "'");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.out.find("no .safetensors files in this directory"), std::string::npos) << r.out;
  fs::remove_all(dir);
}

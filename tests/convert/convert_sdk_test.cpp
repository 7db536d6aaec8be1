// The SDK side of conversion on small synthetic inputs: write_converted through the host's GGUF writer
// (row mapping, concatenation, truncation, transforms, llama.cpp's per-tensor type rules) and add_hf_tokenizer (llama.cpp's
// LlamaHfVocab + SpecialVocab rules on a hand-written tokenizer.json).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/plugins.hpp"
#include "foundation/test_util.hpp"
#include "specula/convert.hpp"
#include "specula/error.hpp"
#include "specula/quant.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using specula::DType;

// A ModelFile of in-memory metadata only (the tokenizer helper reads files named by it).
class MetaFile final : public specula::ModelFile {
 public:
  MetaFile(fs::path path, json md) : path_(std::move(path)), md_(std::move(md)) {}
  std::string format() const override { return "safetensors"; }
  fs::path path() const override { return path_; }
  const json& metadata() const override { return md_; }
  const std::vector<specula::TensorInfo>& tensors() const override { return none_; }
  const specula::TensorInfo* find(const std::string&) const override { return nullptr; }

 private:
  fs::path path_;
  json md_;
  std::vector<specula::TensorInfo> none_;
};

specula::TensorInfo f32_tensor(const std::string& name, std::vector<int64_t> shape, std::vector<float>& store) {
  specula::TensorInfo t;
  t.name = name;
  t.type = DType::F32;
  t.shape = std::move(shape);
  t.data = std::as_bytes(std::span<const float>(store));
  return t;
}

std::vector<float> read_f32(const specula::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.elements()));
  specula::dequantize_tensor(t, v.data());
  return v;
}

TEST(ConvertSdk, RowsComeFromSourcesConcatenatedTruncatedAndTransformed) {
  test::TempDir tmp;
  // gate [2 experts, 2 rows, 32] and up [2, 1, 32]: fused along axis 1 -> [2, 3, 32], expert-major.
  std::vector<float> g(2 * 2 * 32), u(2 * 1 * 32), e(5 * 48);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i);
  for (size_t i = 0; i < u.size(); ++i) u[i] = 1000.0f + static_cast<float>(i);
  for (size_t i = 0; i < e.size(); ++i) e[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  const auto gt = f32_tensor("gate", {2, 2, 32}, g), ut = f32_tensor("up", {2, 1, 32}, u), et = f32_tensor("embd", {5, 48}, e);

  std::vector<specula::ConvertTensor> plan(4);
  plan[0].name = "gen";
  plan[0].shape = {4};
  plan[0].keep_f32 = true;
  plan[0].transform = [](int64_t, std::span<float> v) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 2.0f;
  };
  plan[1].name = "fused.weight";
  plan[1].shape = {2, 3, 32};
  plan[1].sources = {&gt, &ut};
  plan[1].concat_axis = 1;
  plan[2].name = "embd.weight";
  plan[2].shape = {3, 48};  // the first 3 of 5 rows; 48 is not whole Q8_0 blocks -> F16
  plan[2].sources = {&et};
  plan[3].name = "scaled.weight";
  plan[3].shape = {2, 2, 32};
  plan[3].sources = {&gt};
  plan[3].keep_f32 = true;
  plan[3].transform = [](int64_t row, std::span<float> v) {
    for (float& x : v) x = x * 0.0f + static_cast<float>(row);  // row index, to check the row numbering
  };

  specula::gguf::Metadata md;
  md.set_string("general.architecture", "test");
  specula::write_converted(*specula_test::host().make_writer("gguf"), md, plan, DType::Q8_0, tmp / "out.gguf");
  ASSERT_FALSE(fs::exists(tmp / "out.gguf.part"));
  const auto file = specula_test::host().open_model(tmp / "out.gguf");
  const std::vector<specula::TensorInfo>& tensors = file->tensors();
  ASSERT_EQ(tensors.size(), 4u);
  EXPECT_EQ(file->metadata().at("general.architecture"), "test");

  EXPECT_EQ(tensors[0].type, DType::F32);
  EXPECT_EQ(read_f32(tensors[0]), (std::vector<float>{0, 2, 4, 6}));

  EXPECT_EQ(tensors[1].type, DType::Q8_0);
  EXPECT_EQ(tensors[1].shape, (std::vector<int64_t>{2, 3, 32}));
  // Expected: expert 0 = gate rows 0,1 then up row 0; expert 1 = gate rows 2,3 then up row 1, each Q8_0.
  std::vector<float> want;
  for (int ex = 0; ex < 2; ++ex) {
    want.insert(want.end(), g.begin() + ex * 64, g.begin() + ex * 64 + 64);
    want.insert(want.end(), u.begin() + ex * 32, u.begin() + ex * 32 + 32);
  }
  std::vector<std::byte> q(tensors[1].data.size());
  for (int r = 0; r < 6; ++r) specula::quantize_row(DType::Q8_0, want.data() + r * 32, q.data() + r * 34, 32);
  EXPECT_EQ(std::memcmp(q.data(), tensors[1].data.data(), q.size()), 0);

  EXPECT_EQ(tensors[2].type, DType::F16);
  EXPECT_EQ(tensors[2].shape, (std::vector<int64_t>{3, 48}));
  EXPECT_EQ(read_f32(tensors[2]), std::vector<float>(e.begin(), e.begin() + 3 * 48));  // exact in F16

  const auto rows = read_f32(tensors[3]);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(rows[static_cast<size_t>(r) * 32], static_cast<float>(r));
}

TEST(ConvertSdk, PlanErrorsNameTheTensorAndWriteNothing) {
  test::TempDir tmp;
  std::vector<float> a(2 * 32);
  const auto at = f32_tensor("src", {2, 32}, a);
  std::vector<specula::ConvertTensor> plan(1);
  plan[0].name = "too_many_rows.weight";
  plan[0].shape = {3, 32};
  plan[0].sources = {&at};
  try {
    specula::write_converted(*specula_test::host().make_writer("gguf"), {}, plan, DType::F16, tmp / "out.gguf");
    FAIL() << "expected an error";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find("too_many_rows.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 32]"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(tmp / "out.gguf"));
  EXPECT_FALSE(fs::exists(tmp / "out.gguf.part"));
  EXPECT_FALSE(specula::convert_outtype("q4_k"));
  EXPECT_EQ(specula::llama_file_type(DType::BF16), 32u);
}

TEST(ConvertSdk, LlamaCppKeepsTheseF32) {
  EXPECT_TRUE(specula::llama_keeps_f32("blk.0.attn_q.weight", 1));             // 1-D
  EXPECT_TRUE(specula::llama_keeps_f32("blk.0.attn_q_norm.weight", 2));        // a norm
  EXPECT_TRUE(specula::llama_keeps_f32("blk.0.ffn_gate_inp.scale", 2));        // not .weight
  EXPECT_TRUE(specula::llama_keeps_f32("blk.3.ffn_gate_inp.weight", 2));       // the router
  EXPECT_FALSE(specula::llama_keeps_f32("per_layer_model_proj.weight", 2));    // quantized by the converter
  EXPECT_FALSE(specula::llama_keeps_f32("blk.0.ffn_gate_up_exps.weight", 3));
}

// A tokenizer.json exercising llama.cpp's rules: string and pair merges (a space inside a pair part
// becomes U+0120), an added token past the vocabulary, special tokens from added_tokens and from
// tokenizer_config.json, ids from config.json when tokenizer_config.json names none, the post-processor's
// BOS, and a chat template from chat_template.jinja.
TEST(ConvertSdk, TokenizerKeysFollowLlamaCpp) {
  test::TempDir tmp;
  const json vocab = {{"<pad>", 0}, {"<eos>", 1}, {"<bos>", 2}, {"<0x41>", 3}, {"a", 4}, {"b", 5}, {"ab", 6},
                      {"<|turn>", 7}, {"<|x|>", 8}};
  const json tj = {
      {"added_tokens", json::array({{{"id", 0}, {"content", "<pad>"}, {"special", true}},
                                    {{"id", 1}, {"content", "<eos>"}, {"special", true}},
                                    {{"id", 2}, {"content", "<bos>"}, {"special", false}},
                                    {{"id", 9}, {"content", "<extra>"}, {"special", false}}})},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<bos>"}}}}, {{"Sequence", {{"id", "A"}}}}})}}},
      {"model", {{"type", "BPE"}, {"byte_fallback", true}, {"vocab", vocab},
                 {"merges", json::array({"a b", json::array({"a b", "b"})})}}}};
  test::write_file(tmp / "tokenizer.json", tj.dump());
  test::write_file(tmp / "chat_template.jinja", "{{ bos_token }}");
  const json md = {{"tokenizer_json_path", (tmp / "tokenizer.json").string()},
                   {"tokenizer_config", {{"bos_token", "<bos>"}, {"eos_token", {{"content", "<eos>"}}},
                                         {"add_eos_token", false}, {"sot_token", "<|turn>"}}},
                   {"config", {{"text_config", {{"pad_token_id", 0}, {"mask_token_id", 8}}}}}};
  const MetaFile file(tmp.path(), md);
  specula::gguf::Metadata w;
  EXPECT_EQ(specula::add_hf_tokenizer(file, w, "gemma4", {"<|x|>"}), 10);
  std::vector<std::string> keys;
  for (const auto& [k, t] : w.keys()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.scores",
                                            "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
                                            "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                                            "tokenizer.ggml.padding_token_id", "tokenizer.ggml.mask_token_id",
                                            "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token",
                                            "tokenizer.chat_template"}));
  EXPECT_EQ(w.type("tokenizer.ggml.token_type")->elem, specula::gguf::ValueType::INT32);
  EXPECT_EQ(w.type("tokenizer.ggml.bos_token_id")->type, specula::gguf::ValueType::UINT32);
  const json& m = w.values();
  EXPECT_EQ(m["tokenizer.ggml.tokens"].back(), "<extra>");
  // <pad> <eos>: special added; <bos>: named by tokenizer_config; <0x41>: byte; <|turn>: named (sot_token);
  // <|x|>: user-defined by the caller; <extra>: a non-special added token past the vocabulary.
  EXPECT_EQ(m["tokenizer.ggml.token_type"], json::parse("[3, 3, 3, 6, 1, 1, 1, 3, 4, 4]"));
  EXPECT_EQ(m["tokenizer.ggml.scores"][4], -1000.0);
  EXPECT_EQ(m["tokenizer.ggml.merges"], json::parse("[\"a b\", \"a\u0120b b\"]"));
  EXPECT_EQ(m["tokenizer.ggml.bos_token_id"], 2);
  EXPECT_EQ(m["tokenizer.ggml.eos_token_id"], 1);
  EXPECT_EQ(m["tokenizer.ggml.padding_token_id"], 0);
  EXPECT_EQ(m["tokenizer.ggml.mask_token_id"], 8);
  EXPECT_EQ(m["tokenizer.ggml.add_bos_token"], true);
  EXPECT_EQ(m["tokenizer.ggml.add_eos_token"], false);
  EXPECT_EQ(m["tokenizer.chat_template"], "{{ bos_token }}");
}

TEST(ConvertSdk, TokenizerErrorsNameTheFile) {
  test::TempDir tmp;
  test::write_file(tmp / "tokenizer.json", R"({"model": {"type": "Unigram", "vocab": []}})");
  const MetaFile file(tmp.path(), {{"tokenizer_json_path", (tmp / "tokenizer.json").string()}});
  specula::gguf::Metadata w;
  try {
    specula::add_hf_tokenizer(file, w, "gemma4", {});
    FAIL() << "expected an error";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.json: model is not a BPE with byte_fallback"), std::string::npos)
        << e.what();
  }
  const MetaFile none(tmp.path(), json::object());
  EXPECT_THROW(specula::add_hf_tokenizer(none, w, "gemma4", {}), specula::Error);
}

}  // namespace

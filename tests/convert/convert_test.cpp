// `specula convert` (issue 10): Hugging Face / MLX checkpoints written by the Python fixture tools become
// GGUF files that (a) equal, key by key and tensor by tensor, the GGUF the fixture writer makes for the
// same weights in llama.cpp's layout (its tokenizer keys are a real llama.cpp conversion of the Gemma 4
// tokenizer, turned back into tokenizer.json for the HF fixtures), (b) give Specula the same logits and
// drafts as the checkpoint they came from, and (c) bad input fails naming what is wrong, leaving no file.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "assistant.hpp"
#include "common/plugins.hpp"
#include "common/sanitizers.hpp"
#include "foundation/test_util.hpp"
#include "gguf_io.hpp"  // plugins/gguf (specula_gguf_io)
#include "safetensors_io.hpp"  // plugins/safetensors (specula_safetensors_io)
#include "specula/mapped_file.hpp"
#include "specula/quant.hpp"

namespace {

namespace fs = std::filesystem;
namespace ga = specula::gemma4_assistant;
using json = nlohmann::json;
using specula_test::backend;
using specula_test::host;

const std::string kVocab = std::string(SPECULA_SHARED_DIR) + "/gemma4-vocab/ggml-vocab-gemma-4.gguf";

// The fixtures of one target variant (and, for e2b, its drafter), generated on first use. A directory of
// their own: the stamp of tools/gemma4_fixture.py covers the format list, which differs from tests/gemma4's.
fs::path fixture(const std::string& variant) {
  static std::mutex mu;
  static std::set<std::string> done;
  const fs::path dir = fs::path(SPECULA_FIXTURE_DIR) / "convert-fixtures" / variant;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.count(variant)) {
    const std::string py = std::string(SPECULA_PYTHON) + " " + SPECULA_SOURCE_DIR + "/tools/";
    std::string cmd = py + "gemma4_fixture.py --variant " + variant + " --out " + dir.string() + " --vocab " + kVocab +
                      " --formats f32,q8_0,hf-tok,mlx4-tok,mlx4-ref" + (variant == "e2b" ? ",hf-sharded" : "");
    if (variant == "e2b")
      cmd += " && " + py + "gemma4_assistant_fixture.py --out " + dir.string() + " --vocab " + kVocab +
             " --formats gguf-f32,gguf-seed,hf-tok";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("fixture generation failed: " + cmd);
    done.insert(variant);
  }
  return dir;
}

// Runs `specula convert SRC --out OUT ARGS`; returns the CLI's exit status and output.
test::CommandResult convert(const fs::path& src, const fs::path& out, const std::string& args) {
  return test::run_command(test::cli() + " convert " + test::quote(src.string()) + " --out " +
                           test::quote(out.string()) + " " + args);
}

// A converted file in this test's own temp dir (tests run as separate processes in parallel).
fs::path converted(const test::TempDir& tmp, const fs::path& src, const std::string& name, const std::string& args) {
  const fs::path out = tmp / name;
  const auto r = convert(src, out, args);
  if (r.status != 0) throw std::runtime_error("convert failed: " + r.output);
  return out;
}

struct Gguf {
  std::shared_ptr<const specula::MappedFile> map;
  specula::gguf::File file;
  const specula::TensorInfo* find(const std::string& n) const {
    for (const auto& t : file.tensors)
      if (t.name == n) return &t;
    return nullptr;
  }
};

Gguf read(const fs::path& p) {
  Gguf g;
  g.map = specula::MappedFile::open(p);
  g.file = specula::gguf::parse(g.map->bytes(), p.string());
  return g;
}

std::vector<std::string> names(const Gguf& g) {
  std::vector<std::string> out;
  for (const auto& t : g.file.tensors) out.push_back(t.name);
  return out;
}

// Every difference between two GGUF files: key order and types, key values, then per tensor (matched by
// name) type, shape and bytes. Tensors in `skip` are left to the caller.
std::vector<std::string> differences(const Gguf& a, const Gguf& b, const std::set<std::string>& skip = {}) {
  std::vector<std::string> d;
  auto key_list = [](const Gguf& g) {
    std::vector<std::string> k;
    for (const auto& [name, type] : g.file.keys)
      k.push_back(fmt::format("{}:{}:{}", name, specula::gguf::value_type_name(type.type),
                              type.type == specula::gguf::ValueType::ARRAY ? specula::gguf::value_type_name(type.elem)
                                                                           : ""));
    return k;
  };
  if (key_list(a) != key_list(b))
    d.push_back(fmt::format("keys (name:type) differ:\n  {}\n  {}", json(key_list(a)).dump(), json(key_list(b)).dump()));
  for (const auto& [key, v] : a.file.metadata.items())
    if (b.file.metadata.contains(key) && b.file.metadata[key] != v) d.push_back("value of key " + key + " differs");
  std::set<std::string> in_b;
  for (const auto& t : b.file.tensors) in_b.insert(t.name);
  for (const auto& t : a.file.tensors) {
    if (skip.count(t.name)) continue;
    const specula::TensorInfo* u = b.find(t.name);
    if (!u) {
      d.push_back("tensor only in the first file: " + t.name);
      continue;
    }
    in_b.erase(t.name);
    if (t.type != u->type || t.shape != u->shape)
      d.push_back(fmt::format("tensor {}: {} {} vs {} {}", t.name, specula::dtype_name(t.type), json(t.shape).dump(),
                              specula::dtype_name(u->type), json(u->shape).dump()));
    else if (t.data.size() != u->data.size() || std::memcmp(t.data.data(), u->data.data(), t.data.size()) != 0)
      d.push_back("tensor bytes differ: " + t.name);
  }
  for (const auto& n : in_b)
    if (!skip.count(n)) d.push_back("tensor only in the second file: " + n);
  return d;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x + "\n";
  return s;
}

// ------------------------------------------------------------------------- the llama.cpp layout

TEST(Convert, TargetF32EqualsTheFixtureWritersGguf) {
  const fs::path dir = fixture("e2b");
  test::TempDir tmp;
  const Gguf got = read(converted(tmp, dir / "hf-tok", "e2b-f32.gguf", "--outtype f32 --name specula-fixture-e2b"));
  const Gguf want = read(dir / "model-f32.gguf");
  EXPECT_EQ(joined(differences(got, want)), "");
  // llama.cpp's order: the generated rope_freqs, then the checkpoint's tensors in its (name) order.
  const auto n = names(got);
  ASSERT_GE(n.size(), 6u);
  EXPECT_EQ(std::vector<std::string>(n.begin(), n.begin() + 6),
            (std::vector<std::string>{"rope_freqs.weight", "token_embd.weight", "per_layer_token_embd.weight",
                                      "blk.0.attn_norm.weight", "blk.0.layer_output_scale.weight",
                                      "blk.0.ffn_down.weight"}));
  EXPECT_EQ(n.back(), "per_layer_proj_norm.weight");
  EXPECT_EQ(got.file.metadata["tokenizer.ggml.tokens"].size(), 262144u);
}

TEST(Convert, TargetQ8_0EqualsTheFixtureWritersGgufButQuantizesThePerLayerProjection) {
  SKIP_UNDER_SANITIZERS();  // the converter runs under them in TargetF32, Sharded, Moe, Mlx and BadInput
  const fs::path dir = fixture("e2b");
  test::TempDir tmp;
  const Gguf got = read(converted(tmp, dir / "hf-tok", "e2b-q8.gguf", "--outtype q8_0 --name specula-fixture-e2b"));
  const Gguf want = read(dir / "model-q8_0.gguf");
  EXPECT_EQ(joined(differences(got, want, {"per_layer_model_proj.weight"})), "");
  EXPECT_EQ(got.file.metadata["general.file_type"], 7);
  // llama.cpp's converter quantizes per_layer_model_proj like any matrix (only llama-quantize keeps it);
  // the fixture writer stores it F32. The converted bytes are the Q8_0 of exactly those values.
  const auto* q = got.find("per_layer_model_proj.weight");
  const auto* f = want.find("per_layer_model_proj.weight");
  ASSERT_TRUE(q && f);
  ASSERT_EQ(q->type, specula::DType::Q8_0);
  ASSERT_EQ(f->type, specula::DType::F32);
  std::vector<std::byte> expect(q->data.size());
  const int64_t cols = f->shape.back(), rows = f->elements() / cols;
  const uint64_t qrow = *specula::dtype_row_bytes(specula::DType::Q8_0, static_cast<uint64_t>(cols));
  for (int64_t r = 0; r < rows; ++r)
    specula::quantize_row(specula::DType::Q8_0, reinterpret_cast<const float*>(f->data.data()) + r * cols,
                          expect.data() + r * qrow, cols);
  EXPECT_EQ(std::memcmp(expect.data(), q->data.data(), expect.size()), 0);
  // Rows of 16 (per_layer_input width) are not whole Q8_0 blocks: F16 there, as llama.cpp falls back.
  EXPECT_EQ(got.find("blk.0.proj.weight")->type, specula::DType::F16);
}

TEST(Convert, ShardedCheckpointGivesTheSameFile) {
  const fs::path dir = fixture("e2b");
  test::TempDir tmp;
  // No --outtype: auto, the checkpoint's BF16, as llama.cpp's default.
  const Gguf one = read(converted(tmp, dir / "hf-tok", "one.gguf", ""));
  const Gguf two = read(converted(tmp, dir / "hf-sharded", "two.gguf", ""));
  EXPECT_EQ(joined(differences(one, two, {})), "value of key general.name differs\n");  // the directory's name
  EXPECT_EQ(one.file.metadata["general.name"], "hf-tok");
  EXPECT_EQ(two.file.metadata["general.file_type"], 32);
  EXPECT_EQ(two.find("token_embd.weight")->type, specula::DType::BF16);
}

TEST(Convert, MoeTargetEqualsTheFixtureWritersGguf) {
  const fs::path dir = fixture("26b");
  test::TempDir tmp;
  const Gguf got = read(converted(tmp, dir / "hf-tok", "26b.gguf", "--outtype f32 --name specula-fixture-26b"));
  EXPECT_EQ(joined(differences(got, read(dir / "model-f32.gguf"))), "");
  EXPECT_TRUE(got.find("blk.0.ffn_gate_up_exps.weight"));
  EXPECT_EQ(got.file.metadata["gemma4.attention.head_count_kv"].size(), 6u);  // per layer (global KV heads)
}

// MLX 4-bit: each converted tensor equals the fixture writer's own dequantization of the MLX file
// (mlx4-ref-f32.gguf, numpy), bit for bit; the split experts come out fused as from a HF file.
void expect_mlx_matches_reference(const std::string& variant) {
  const fs::path dir = fixture(variant);
  test::TempDir tmp;
  const Gguf got =
      read(converted(tmp, dir / "mlx4-tok", "mlx.gguf", "--outtype f32 --name specula-fixture-" + variant));
  const Gguf want = read(dir / "mlx4-ref-f32.gguf");
  // mlx-vlm drops the K/V of KV-shared layers; the reference keeps the original ones.
  std::set<std::string> dropped;
  for (const auto& t : want.file.tensors)
    if (!got.find(t.name)) dropped.insert(t.name);
  const int64_t layers = want.file.metadata["gemma4.block_count"], shared = want.file.metadata["gemma4.attention.shared_kv_layers"];
  std::set<std::string> expected_dropped;
  for (int64_t l = layers - shared; l < layers && shared > 0; ++l)
    for (const char* s : {"attn_k.weight", "attn_v.weight", "attn_k_norm.weight"})
      expected_dropped.insert(fmt::format("blk.{}.{}", l, s));
  EXPECT_EQ(json(dropped).dump(), json(expected_dropped).dump());
  EXPECT_EQ(joined(differences(got, want, dropped)), "");
}

TEST(Convert, MlxDequantizesExactly) { expect_mlx_matches_reference("e2b"); }
TEST(Convert, MlxMoeDequantizesExactlyAndFusesExperts) {
  SKIP_UNDER_SANITIZERS();  // MLX decoding and expert fusing run under them in MlxDequantizesExactly and Moe
  expect_mlx_matches_reference("26b");
}

TEST(Convert, AssistantBothSchemasEqualTheFixtureWritersGguf) {
  SKIP_UNDER_SANITIZERS();  // the converter runs under them in TargetF32, Sharded, Moe, Mlx and BadInput
  const fs::path dir = fixture("e2b");
  test::TempDir tmp;
  const std::string name = " --outtype f32 --name specula-fixture-assistant-e2b-small";
  const Gguf seed = read(converted(tmp, dir / "assistant-hf-tok", "seed.gguf", "--schema seed" + name));
  const Gguf upstream = read(converted(tmp, dir / "assistant-hf-tok", "up.gguf", "--schema upstream" + name));
  EXPECT_EQ(joined(differences(seed, read(dir / "assistant-seed-f32.gguf"))), "");
  EXPECT_EQ(joined(differences(upstream, read(dir / "assistant-f32.gguf"))), "");
  EXPECT_EQ(seed.find("assist_token_ordering.weight")->type, specula::DType::F32);
  EXPECT_FALSE(upstream.find("assist_embed_centroids.weight"));
  // The default is the seed's schema; Q8_0 keeps the centroids F32.
  const Gguf q8 = read(converted(tmp, dir / "assistant-hf-tok", "q8.gguf", "--outtype q8_0"));
  EXPECT_EQ(q8.find("assist_embed_centroids.weight")->type, specula::DType::F32);
  EXPECT_EQ(q8.find("assist_pre_proj.weight")->type, specula::DType::Q8_0);
}

// The 26B-A4B and 31B assistants' full-attention layer reads the target's global KV heads: head_count_kv
// then goes per layer, as llama.cpp's converter writes it (llama.cpp sizes its views of the target's cache
// by it and aborts on a scalar). The drafter's layers are Q-only, so the config alone changes.
TEST(Convert, AssistantWithGlobalKvHeadsWritesThemPerLayer) {
  SKIP_UNDER_SANITIZERS();
  const fs::path dir = fixture("e2b");
  test::TempDir tmp;
  const fs::path src = tmp / "assistant-global-kv";
  fs::copy(dir / "assistant-hf-tok", src, fs::copy_options::recursive);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(src / "config.json"));
  cfg["text_config"]["num_key_value_heads"] = 2;
  cfg["text_config"]["num_global_key_value_heads"] = 1;
  std::ofstream(src / "config.json") << cfg.dump();
  for (const std::string schema : {"seed", "upstream"}) {
    const Gguf g = read(converted(tmp, src, schema + ".gguf", "--outtype f32 --schema " + schema));
    EXPECT_EQ(g.file.metadata.at("gemma4-assistant.attention.head_count_kv"), nlohmann::json::array({2, 2, 2, 1}))
        << schema;
  }
  // Without it, one scalar as before.
  const Gguf plain = read(converted(tmp, dir / "assistant-hf-tok", "plain.gguf", "--outtype f32"));
  EXPECT_TRUE(plain.file.metadata.at("gemma4-assistant.attention.head_count_kv").is_number());
}

// ------------------------------------------------------------------ HF -> GGUF -> Specula = HF -> Specula

std::vector<float> logits(const fs::path& model, const std::vector<int32_t>& tokens) {
  // The same embedding scale for both (by default HF rounds sqrt(hidden) to bf16, GGUF does not).
  auto m = specula_test::load(model, {{"embedding_scale", "exact"}});
  auto ctx = m->new_context({64});
  return ctx->forward(tokens, static_cast<int64_t>(tokens.size()));
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

TEST(Convert, TargetLogitsEqualTheCheckpoints) {
  SKIP_UNDER_SANITIZERS();  // the converter runs under them in TargetF32, Sharded, Moe, Mlx and BadInput
  const fs::path dir = fixture("e2b");
  test::TempDir tmp;
  const fs::path f32 = converted(tmp, dir / "hf-tok", "f32.gguf", "--outtype f32");
  const fs::path q8 = converted(tmp, dir / "hf-tok", "q8.gguf", "--outtype q8_0");
  const std::vector<std::vector<int32_t>> prompts = {
      {2, 9259, 1902}, {2, 105, 2364, 107, 26352, 4109, 236888, 106, 107}, {2, 672, 563, 236743, 478, 397, 404, 391}};
  for (const auto& p : prompts) {
    const auto hf = logits(dir / "hf-tok", p), a = logits(f32, p), b = logits(q8, p);
    // The F32 file holds exactly the BF16 checkpoint's numbers (tested above) and the CPU backend
    // computes both in F32: bit-equal logits.
    EXPECT_EQ(max_abs_diff(hf, a), 0.0) << "f32, prompt of " << p.size();
    // Q8_0 rounds each weight to 8 bits per 32-value block. Bound: 2% of the logit range (measured 1.2%;
    // the fixture writer's own Q8_0 file of these weights is off by as much, 1.3%), and not lossless.
    const double range = *std::max_element(hf.begin(), hf.end()) - *std::min_element(hf.begin(), hf.end());
    EXPECT_LT(max_abs_diff(hf, b), 0.02 * range) << "q8_0, prompt of " << p.size();
    EXPECT_GT(max_abs_diff(hf, b), 0.0) << "q8_0 should not be lossless";
  }
}

TEST(Convert, DrafterDraftsTheSameFromBothSchemas) {
  SKIP_UNDER_SANITIZERS();  // the converter runs under them in TargetF32, Sharded, Moe, Mlx and BadInput
  const fs::path dir = fixture("e2b");
  test::TempDir tmp;
  const fs::path seed = converted(tmp, dir / "assistant-hf-tok", "seed.gguf", "--outtype f32 --schema seed");
  const fs::path up = converted(tmp, dir / "assistant-hf-tok", "up.gguf", "--outtype f32 --schema upstream");
  auto file = host().open_model(dir / "model-f32.gguf");
  auto target = host().find_model_loader(*file)->load(file, backend(), json::object());
  auto ctx = target->new_context({64});
  const std::vector<int32_t> prompt = {2, 105, 2364, 107, 9259, 1902, 106, 107, 105, 4368, 107};
  const auto lg = ctx->forward(prompt, 1);
  const int32_t x = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
  auto trace = [&](const fs::path& p, const std::string& head) {
    auto d = ga::load_drafter(host().open_model(p), backend(), target->info(), {{"head", head}});
    return d->trace(ctx->view(), x, 6);
  };
  auto same = [](const std::vector<ga::StepTrace>& a, const std::vector<ga::StepTrace>& b, double tol,
                 const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_EQ(a[k].token, b[k].token) << what << " step " << k;
      EXPECT_EQ(a[k].ids, b[k].ids) << what << " step " << k;
      double m = 0;
      for (size_t i = 0; i < a[k].h_next.size(); ++i) m = std::max(m, std::fabs(double(a[k].h_next[i]) - b[k].h_next[i]));
      EXPECT_LE(m, tol) << what << " step " << k << ": h_next differs by " << m;
    }
  };
  const auto hf_dense = trace(dir / "assistant-hf-tok", "dense");
  // Both GGUF schemas hold the same F32 numbers: identical drafts, bit for bit.
  same(trace(seed, "dense"), trace(up, "dense"), 0.0, "seed vs upstream");
  // Against the BF16 checkpoint only the kernels differ.
  same(trace(seed, "dense"), hf_dense, 1e-4, "seed vs HF");
  same(trace(seed, "centroid"), trace(dir / "assistant-hf-tok", "centroid"), 1e-4, "centroid head, seed vs HF");
}

// ------------------------------------------------------------------------------------- bad input

// A run that must fail: exit status 1, a message with every `needles`, and no output file or .part left.
void expect_failure(const fs::path& src, const fs::path& out, const std::string& args,
                    const std::vector<std::string>& needles) {
  const auto r = convert(src, out, args);
  EXPECT_EQ(r.status, 1) << r.output;
  for (const auto& n : needles) EXPECT_NE(r.output.find(n), std::string::npos) << "missing '" << n << "' in: " << r.output;
  EXPECT_FALSE(fs::exists(out)) << out;
  EXPECT_FALSE(fs::exists(out.string() + ".part")) << out;
}

// `dir` with the checkpoint of `src` but tensors changed by `edit` (name, shape -> keep?, new shape).
void write_edited(const fs::path& src, const fs::path& dir,
                  const std::function<bool(const std::string&, std::vector<int64_t>&)>& keep) {
  fs::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    if (fs::exists(src / f)) fs::create_symlink(src / f, dir / f);
  const auto file = specula::safetensors::open(src);
  specula::safetensors::Writer w;
  for (const auto& t : file->tensors()) {
    std::vector<int64_t> shape = t.shape;
    if (keep(t.name, shape)) w.add_tensor(t.name, t.type, shape, t.data);
  }
  w.write(dir / "model.safetensors");
}

TEST(Convert, BadInputIsNamedAndLeavesNoFile) {
  const fs::path dir = fixture("e2b");
  test::TempDir tmp;
  const fs::path out = tmp / "out.gguf";

  expect_failure(dir / "hf-tok", out, "--outtype q4_k", {"--outtype 'q4_k' is not one of f32, f16, bf16, q8_0, auto"});
  expect_failure(dir / "hf-tok", tmp / "no-such-dir" / "x.gguf", "", {"output directory", "no-such-dir", "does not exist"});
  expect_failure(dir / "hf-tok", out, "--schema upstream", {"--schema 'upstream' is not a layout of the gemma4 converter"});
  expect_failure(dir / "assistant-hf-tok", out, "--schema fork", {"--schema 'fork'", "expected seed, upstream"});

  const fs::path no_config = tmp / "no-config";
  fs::create_directories(no_config);
  fs::create_symlink(dir / "hf-tok" / "model.safetensors", no_config / "model.safetensors");
  expect_failure(no_config, out, "", {"no-config has no config.json"});

  const fs::path llama = tmp / "llama";
  fs::create_directories(llama);
  fs::create_symlink(dir / "hf-tok" / "model.safetensors", llama / "model.safetensors");
  test::write_file(llama / "config.json", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})");
  expect_failure(llama, out, "",
                 {"no converter plugin accepts", "architectures [\"LlamaForCausalLM\"], model_type 'llama'",
                  "gemma4 (gemma4)", "gemma4-assistant (gemma4-assistant)"});

  const std::string gone = "model.language_model.layers.1.mlp.up_proj.weight";
  write_edited(dir / "hf-tok", tmp / "missing", [&](const std::string& n, std::vector<int64_t>&) { return n != gone; });
  expect_failure(tmp / "missing", out, "", {"tensor '" + gone + "' is missing", "[64, 64]"});

  const std::string bent = "model.language_model.layers.0.self_attn.q_norm.weight";
  write_edited(dir / "hf-tok", tmp / "misshaped", [&](const std::string& n, std::vector<int64_t>& s) {
    if (n == bent) s = {s[0] / 2, 2};
    return true;
  });
  expect_failure(tmp / "misshaped", out, "", {"tensor '" + bent + "' has shape [16, 2]", "needs [32]"});

  const std::string pre = "pre_projection.weight";
  write_edited(dir / "assistant-hf-tok", tmp / "bad-drafter", [&](const std::string& n, std::vector<int64_t>& s) {
    if (n == pre) s = {s[1], s[0]};
    return true;
  });
  expect_failure(tmp / "bad-drafter", out, "", {"tensor 'pre_projection.weight' has shape [128, 32]", "needs [32, 128]"});

  const fs::path no_tok = tmp / "no-tokenizer";
  fs::create_directories(no_tok);
  for (const char* f : {"config.json", "model.safetensors"}) fs::create_symlink(dir / "hf-tok" / f, no_tok / f);
  expect_failure(no_tok, out, "", {"tokenizer.json is missing"});

  expect_failure(dir / "model-f32.gguf", out, "", {"is already GGUF"});
}

}  // namespace

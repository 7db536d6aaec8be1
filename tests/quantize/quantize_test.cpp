// `specula quantize` against llama.cpp's llama-quantize. The goldens (golden/) hold what llama.cpp wrote
// for the same inputs (tools/llama-ref/quantize_goldens.py; CI has no llama.cpp):
//  - quant-f16.json: tools/gemma4_fixture.py's "quant" fixture (F16) quantized to every file type: tensor
//    order and types, sha256 of the file, of its header and of each tensor's data, llama.cpp's RMS error;
//  - 26b-f32-types.json (MoE, 8 experts) and e2b-real-types.json (real E2B shapes): tensor tables and the
//    type llama.cpp gave each tensor.
// Q8_0 and Q4_0 must be byte-identical files. Specula's K and IQ4 block encoders are its own searches
// (sdk/src/quant_blocks.cpp), so for those tensors the data may differ; their RMS error against the
// input must stay within kErrorRatio of llama.cpp's.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>

#include <nlohmann/json.hpp>

#include "common/plugins.hpp"
#include "common/sha256.hpp"
#include "gguf_io.hpp"         // plugins/gguf (specula_gguf_io): reads outputs, writes inputs
#include "safetensors_io.hpp"  // plugins/safetensors (specula_safetensors_io)
#include "specula/quantize.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/mapped_file.hpp"
#include "specula/quant.hpp"

namespace {

namespace fs = std::filesystem;
namespace core = specula::core;
using json = nlohmann::json;
using specula::DType;

// Specula's K/IQ4 tensors may have at most this times llama.cpp's relative RMS error (measured worst:
// 1.10 for Q4_K/Q5_K/Q6_K, 1.06 for IQ4_NL/IQ4_XS).
constexpr double kErrorRatio = 1.15;

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  return json::parse(in);
}

fs::path golden(const std::string& name) { return fs::path(SPECULA_SOURCE_DIR) / "tests/quantize/golden" / name; }

// This process's outputs (ctest runs the tests of this file in parallel processes), removed at exit.
fs::path work_dir() {
  struct Dir {
    fs::path path = fs::path(SPECULA_BINARY_DIR) / "quantize-tests" / std::to_string(getpid());
    Dir() { fs::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

// The "quant" fixture (generated once, cached in the build dir); format "f16" or "q8_0".
fs::path fixture(const std::string& format) {
  static std::once_flag once;
  const fs::path dir = fs::path(SPECULA_FIXTURE_DIR) / "quantize-fixtures" / "quant";
  std::call_once(once, [&] {
    const std::string cmd = std::string(SPECULA_PYTHON) + " " + SPECULA_SOURCE_DIR +
                            "/tools/gemma4_fixture.py --variant quant --formats f16,q8_0 --out " + dir.string() +
                            " --vocab " + SPECULA_SHARED_DIR + "/gemma4-vocab/ggml-vocab-gemma-4.gguf";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("fixture generation failed: " + cmd);
  });
  return dir / ("model-" + format + ".gguf");
}

const core::QuantFileType& file_type(const std::string& name) {
  const auto* t = core::find_quant_file_type(name);
  if (!t) throw std::runtime_error("no file type " + name);
  return *t;
}

// The fixture quantized by Specula, once per process and type.
fs::path quantized(const std::string& type, unsigned threads = 2, const std::string& format = "f16") {
  static std::mutex mu;
  static std::map<std::string, fs::path> done;
  std::lock_guard<std::mutex> lock(mu);
  const std::string key = format + "-" + type + "-t" + std::to_string(threads);
  auto& out = done[key];
  if (out.empty()) {
    const fs::path path = work_dir() / ("specula-" + key + ".gguf");
    core::QuantizeOptions o;
    o.type = &file_type(type);
    o.threads = threads;
    core::quantize_gguf(specula_test::host(), fixture(format), path, o);
    out = path;
  }
  return out;
}

struct Opened {
  std::shared_ptr<const specula::MappedFile> map;
  specula::gguf::File file;
  const specula::TensorInfo& tensor(const std::string& name) const {
    for (const auto& t : file.tensors)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
};

Opened open(const fs::path& p) {
  Opened o{specula::MappedFile::open(p), {}};
  o.file = specula::gguf::parse(o.map->bytes(), p.string());
  return o;
}

std::vector<float> to_f32(const specula::TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.elements()));
  specula::dequantize_tensor(t, v.data());
  return v;
}

double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  double e = 0, r = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    e += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    r += double(want[i]) * want[i];
  }
  return std::sqrt(e / r);
}

std::string sha256_file(const fs::path& p) { return specula_test::sha256_hex(specula::MappedFile::open(p)->bytes()); }

bool exact_encoder(const std::string& type) {
  return type != "Q4_K" && type != "Q5_K" && type != "Q6_K" && type != "IQ4_NL" && type != "IQ4_XS";
}

// ---------------------------------------------------------------------------------------- file types

TEST(QuantFileTypes, LlamaCppNamesAliasesAndNumbers) {
  EXPECT_EQ(file_type("q4_k_m").ftype, 15u);
  EXPECT_EQ(file_type("Q4_K").ftype, 15u);  // llama.cpp's alias
  EXPECT_EQ(file_type("Q4_K").base, DType::Q4_K);
  EXPECT_EQ(file_type("q5_k").ftype, 17u);
  EXPECT_EQ(file_type("iq4_xs").base, DType::IQ4_XS);
  EXPECT_EQ(file_type("bf16").ftype, 32u);
  EXPECT_EQ(file_type("15").name, "Q4_K_M");
  EXPECT_EQ(file_type("7").name, "Q8_0");
  EXPECT_EQ(file_type("0").name, "F32");
  for (const char* bad : {"Q3_K_M", "Q2_K", "IQ2_XS", "", "15x", "-1", "Q4_K_L"})
    EXPECT_EQ(core::find_quant_file_type(bad), nullptr) << bad;
  // Every type Specula can quantize is the base of some file type.
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                  DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS}) {
    bool found = false;
    for (const auto& f : core::quant_file_types()) found = found || f.base == t;
    EXPECT_TRUE(found) << specula::dtype_name(t);
  }
}

// ---------------------------------------------------------------------------- llama.cpp's type rules

// Compares plan_quantization's order and types with each file type of a types golden.
void expect_llama_types(const json& metadata, const std::vector<specula::TensorInfo>& tensors, const std::string& type,
                        const std::vector<std::string>& want_names, const std::vector<std::string>& want_types) {
  const auto plan = core::plan_quantization(metadata, tensors, file_type(type), false, "golden");
  ASSERT_EQ(plan.size(), want_names.size()) << type;
  size_t mismatches = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    EXPECT_EQ(plan[i].name, want_names[i]) << type << " position " << i;
    if (std::string(specula::dtype_name(plan[i].to)) != want_types[i]) {
      ++mismatches;
      ADD_FAILURE() << type << ": " << plan[i].name << " gets " << specula::dtype_name(plan[i].to)
                    << ", llama.cpp wrote " << want_types[i];
    }
  }
  EXPECT_EQ(mismatches, 0u) << type;
}

class TypesGolden : public ::testing::TestWithParam<std::string> {};

// Shape-only tensor tables (no data needed to plan): MoE with 8 experts, and the real E2B shapes.
TEST_P(TypesGolden, PlanEqualsLlamaCpp) {
  const json g = read_json(golden(GetParam()));
  std::vector<specula::TensorInfo> tensors;
  for (const auto& t : g["tensors"]) {
    specula::TensorInfo info;
    info.name = t[0].get<std::string>();
    info.type = *specula::dtype_from_name(t[1].get<std::string>());
    info.shape = t[2].get<std::vector<int64_t>>();
    tensors.push_back(info);
  }
  ASSERT_FALSE(g["ftypes"].empty());
  for (const auto& [type, want] : g["ftypes"].items()) {
    std::vector<std::string> names;
    for (const auto& i : want["order"]) names.push_back(tensors.at(i.get<size_t>()).name);
    expect_llama_types(g["metadata"], tensors, type, names, want["types"].get<std::vector<std::string>>());
    EXPECT_EQ(file_type(type).ftype, want["ftype"].get<uint32_t>()) << type;
  }
}

INSTANTIATE_TEST_SUITE_P(Files, TypesGolden, ::testing::Values("26b-f32-types.json", "e2b-real-types.json"),
                         [](const auto& info) { return info.param.substr(0, info.param.find('-')); });

class FixtureGolden : public ::testing::Test {
 protected:
  static const json& g() {
    static const json j = read_json(golden("quant-f16.json"));
    return j;
  }
};

TEST_F(FixtureGolden, InputIsTheOneLlamaCppQuantized) {
  ASSERT_EQ(sha256_file(fixture("f16")), g()["input_sha256"].get<std::string>())
      << "tools/gemma4_fixture.py --variant quant changed: regenerate the goldens with "
         "tools/llama-ref/quantize_goldens.py";
}

// Every file type's plan of the fixture, before quantizing anything.
TEST_F(FixtureGolden, PlanEqualsLlamaCppForEveryFileType) {
  const Opened in = open(fixture("f16"));
  const auto names = g()["tensors"].get<std::vector<std::string>>();
  for (const auto& [type, want] : g()["ftypes"].items())
    expect_llama_types(in.file.metadata, in.file.tensors, type, names, want["types"].get<std::vector<std::string>>());
}

TEST_F(FixtureGolden, Q8_0AndQ4_0AreByteIdenticalToLlamaCpp) {
  for (const std::string type : {"Q8_0", "Q4_0"})
    EXPECT_EQ(sha256_file(quantized(type)), g()["ftypes"][type]["file_sha256"].get<std::string>()) << type;
}

class Mix : public FixtureGolden, public ::testing::WithParamInterface<std::string> {};

// The K / IQ4 mixes: the same header (metadata, order, types, offsets) as llama.cpp's file; each
// tensor's data identical, or for the types whose encoders differ, within kErrorRatio of llama.cpp's
// RMS error against the input.
TEST_P(Mix, HeaderEqualAndValuesWithinLlamaCppsError) {
  const std::string type = GetParam();
  const json& want = g()["ftypes"][type];
  const Opened in = open(fixture("f16")), out = open(quantized(type));
  EXPECT_EQ(specula_test::sha256_hex(out.map->bytes().first(out.file.data_offset)),
            want["header_sha256"].get<std::string>())
      << type << ": metadata or tensor infos differ from llama.cpp's";
  const auto names = g()["tensors"].get<std::vector<std::string>>();
  ASSERT_EQ(out.file.tensors.size(), names.size());
  size_t identical = 0, within = 0;
  double worst = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& t = out.file.tensors[i];
    ASSERT_EQ(t.name, names[i]);
    const std::string got_type(specula::dtype_name(t.type));
    ASSERT_EQ(got_type, want["types"][i].get<std::string>()) << t.name;
    if (specula_test::sha256_hex(t.data).substr(0, 16) == want["data_sha256"][i].get<std::string>()) {
      ++identical;
      continue;
    }
    EXPECT_FALSE(exact_encoder(got_type)) << type << ": " << t.name << " (" << got_type
                                          << ") differs from llama.cpp's bytes";
    const double theirs = want["rel_rms_error"][i].get<double>();
    const double ours = rel_rms(to_f32(t), to_f32(in.tensor(t.name)));
    worst = std::max(worst, ours / theirs);
    EXPECT_LE(ours, theirs * kErrorRatio) << type << ": " << t.name << " (" << got_type << ")";
    ++within;
  }
  std::printf("  %s: %zu tensors byte-identical to llama.cpp, %zu K/IQ4 tensors re-encoded (worst RMS error "
              "%.3fx llama.cpp's)\n",
              type.c_str(), identical, within, worst);
  EXPECT_GT(within, 0u) << type << ": the fixture should exercise the K/IQ4 encoders";
}

INSTANTIATE_TEST_SUITE_P(Llama, Mix, ::testing::Values("Q4_K_M", "Q4_K_S", "IQ4_XS"));

// ------------------------------------------------------------------------------ streaming, threads

std::vector<std::string> g_log;
void capture(specula::LogLevel, const char* message) { g_log.emplace_back(message); }

// An already quantized input is dequantized and quantized again (llama-quantize --allow-requantize),
// says so, and the result does not depend on the thread count.
TEST(Quantize, RequantizesQ8_0AndThreadCountDoesNotChangeBytes) {
  const fs::path in = fixture("q8_0");
  g_log.clear();
  specula::set_log_sink(capture);
  const fs::path one = quantized("Q4_0", 1, "q8_0");
  specula::set_log_sink(nullptr);
  bool said = false;
  for (const auto& m : g_log) said = said || m.find("requantizing") != std::string::npos;
  EXPECT_TRUE(said) << "no log line about requantizing";
  EXPECT_EQ(sha256_file(one), sha256_file(quantized("Q4_0", 3, "q8_0")));

  // A requantized tensor is Q4_0 of the dequantized Q8_0 rows.
  const Opened src = open(in), out = open(one);
  const auto& q8 = src.tensor("blk.0.ffn_gate.weight");
  const auto& q4 = out.tensor("blk.0.ffn_gate.weight");
  ASSERT_EQ(q8.type, DType::Q8_0);
  ASSERT_EQ(q4.type, DType::Q4_0);
  const std::vector<float> x = to_f32(q8);
  std::vector<std::byte> want(q4.data.size());
  const int64_t cols = q8.shape.back(), rows = q8.elements() / cols;
  const size_t row_bytes = want.size() / static_cast<size_t>(rows);
  for (int64_t r = 0; r < rows; ++r)
    specula::quantize_row(DType::Q4_0, x.data() + r * cols, want.data() + r * row_bytes, cols);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), q4.data.begin()));
}

// --------------------------------------------------------------------------------- runs in Specula

// The quantized files load in the gemma4 plugin and predict about as close to the F16 file as
// llama.cpp's own quantizations of it do. The tiny random-weight fixture is sensitive to weight noise,
// so the reference is measured, not assumed: the mean relative RMS difference of the logits from F16's
// when Specula runs llama.cpp's Q8_0 / Q4_K_M file of this fixture (measured once; Q8_0 is byte-identical).
TEST(Quantize, QuantizedFixtureRunsInSpecula) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < 24; ++i) tokens.push_back(static_cast<int32_t>((i * 7919 + 13) % 262144));
  auto logits = [&](const fs::path& p) {
    auto ctx = specula_test::load(p)->new_context({});
    return ctx->forward(tokens, static_cast<int64_t>(tokens.size()));
  };
  const std::vector<float> ref = logits(fixture("f16"));
  const size_t vocab = ref.size() / tokens.size();
  const std::vector<std::pair<std::string, double>> llama_cpps = {{"Q8_0", 0.0354}, {"Q4_K_M", 0.1784}};
  for (const auto& [type, theirs] : llama_cpps) {
    const std::vector<float> got = logits(quantized(type));
    ASSERT_EQ(got.size(), ref.size());
    size_t same_top = 0;
    double mean = 0;
    for (size_t p = 0; p < tokens.size(); ++p) {
      const std::vector<float> a(got.begin() + p * vocab, got.begin() + (p + 1) * vocab);
      const std::vector<float> b(ref.begin() + p * vocab, ref.begin() + (p + 1) * vocab);
      mean += rel_rms(a, b) / static_cast<double>(tokens.size());
      same_top += std::max_element(a.begin(), a.end()) - a.begin() == std::max_element(b.begin(), b.end()) - b.begin();
    }
    std::printf("  %s: logits vs F16 mean relative RMS %.4f (llama.cpp's file %.4f), same top token at %zu/%zu\n",
                type.c_str(), mean, theirs, same_top, tokens.size());
    EXPECT_LE(mean, theirs * kErrorRatio) << type;
    EXPECT_GE(same_top * 3, tokens.size() * 2) << type;
  }
}

// ------------------------------------------------------------------------------------- bad input

struct Result {
  int status = -1;
  std::string out;
};

Result cli(const std::string& args) {
  const std::string cmd = std::string("SPECULA_PLUGIN_PATH= '") + SPECULA_CLI + "' quantize " + args + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  Result r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p.get())) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p.release());
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

// A tiny GGUF: one F32 row table and one layer whose attn_q weight is `attn_q` (F32 unless given).
fs::path tiny_gguf(const std::string& name, float attn_q_value = 0.5f, DType attn_q_type = DType::F32) {
  specula::gguf::Writer w;
  w.set_string("general.architecture", "tiny");
  w.set_u32("tiny.block_count", 1);
  std::vector<float> table(8 * 64), norm(64, 1.0f);
  for (size_t i = 0; i < table.size(); ++i) table[i] = std::sin(0.1f * static_cast<float>(i));
  w.add_tensor("token_embd.weight", DType::F32, {8, 64}, std::as_bytes(std::span(table)));
  w.add_tensor("blk.0.attn_norm.weight", DType::F32, {64}, std::as_bytes(std::span(norm)));
  if (attn_q_type == DType::F32) {
    std::vector<float> attn(4 * 64, 0.25f);
    attn[3 * 64 + 17] = attn_q_value;
    w.add_tensor("blk.0.attn_q.weight", DType::F32, {4, 64}, std::as_bytes(std::span(attn)));
  } else {
    std::vector<int32_t> attn(4 * 64, 1);
    w.add_tensor("blk.0.attn_q.weight", attn_q_type, {4, 64}, std::as_bytes(std::span(attn)));
  }
  const fs::path p = work_dir() / name;
  w.write(p);
  return p;
}

void expect_nothing_written(const fs::path& out) {
  EXPECT_FALSE(fs::exists(out)) << out;
  EXPECT_FALSE(fs::exists(fs::path(out.string() + ".part"))) << out << ".part";
}

TEST(QuantizeCli, WritesAndSummarises) {
  const fs::path in = tiny_gguf("tiny.gguf"), out = work_dir() / "tiny-q8.gguf";
  fs::remove(out);
  const Result r = cli(q(in) + " " + q(out) + " q8_0 --threads 2");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("as Q8_0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("2 Q8_0"), std::string::npos) << r.out;  // the per-type counts
  const Opened o = open(out);
  EXPECT_EQ(o.tensor("blk.0.attn_q.weight").type, DType::Q8_0);
  EXPECT_EQ(o.tensor("blk.0.attn_norm.weight").type, DType::F32);
  EXPECT_EQ(o.file.metadata.at("general.file_type"), 7);
  EXPECT_EQ(o.file.metadata.at("general.quantization_version"), 2);
}

TEST(QuantizeCli, DryRunPrintsThePlanAndWritesNothing) {
  const fs::path in = tiny_gguf("tiny-plan.gguf");
  const Result r = cli(q(in) + " Q4_K_M --dry-run");
  ASSERT_EQ(r.status, 0) << r.out;
  // 64-wide rows: the tied embedding takes Q8_0, attn_q falls back from Q4_K to Q5_0, the norm stays.
  EXPECT_NE(r.out.find("token_embd.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("F32 -> Q8_0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("F32 -> Q5_0  (fallback: rows are not whole blocks)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("F32 -> F32"), std::string::npos) << r.out;
}

TEST(QuantizeCli, HelpListsTheFileTypes) {
  const Result r = cli("--help");
  EXPECT_EQ(r.status, 0);
  for (const auto& t : core::quant_file_types()) EXPECT_NE(r.out.find(std::string(t.name)), std::string::npos) << t.name;
}

TEST(QuantizeCli, BadInputFailsCleanly) {
  const fs::path in = tiny_gguf("tiny-bad.gguf"), out = work_dir() / "bad-out.gguf";
  const fs::path text = work_dir() / "not-gguf.txt";
  std::ofstream(text) << "hello, this is not a model\n";
  fs::remove(out);
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {q(in) + " " + q(out) + " Q3_K_M", "unknown TYPE 'Q3_K_M'; expected one of Q4_0, Q4_1"},
      {q(work_dir() / "missing.gguf") + " " + q(out) + " Q8_0", "missing.gguf: cannot open"},
      {q(text) + " " + q(out) + " Q8_0", "not a GGUF file"},
      {q(in) + " " + q(work_dir() / "no-such-dir" / "out.gguf") + " Q8_0", "directory"},
      {q(in) + " " + q(in) + " Q8_0", "would replace the input"},
      {q(in) + " " + q(out), "give IN.gguf OUT.gguf TYPE"},
  };
  for (const auto& c : cases) {
    const Result r = cli(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << "\n" << r.out;
    expect_nothing_written(out);
    expect_nothing_written(work_dir() / "no-such-dir" / "out.gguf");
  }
  EXPECT_TRUE(fs::exists(in));  // refusing to overwrite the input left it alone
}

// A checkpoint the gguf plugin does not read (a Hugging Face safetensors directory, opened by the
// safetensors plugin) is refused, naming its format and `specula convert`, and nothing is written.
TEST(QuantizeCli, RefusesCheckpointsOfOtherFormats) {
  const fs::path dir = work_dir() / "hf-checkpoint", out = work_dir() / "hf-q8.gguf";
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"model_type": "tiny", "architectures": ["TinyForCausalLM"]})";
  specula::safetensors::Writer w;
  std::vector<float> table(8 * 64, 0.5f);
  w.add_tensor("model.embed_tokens.weight", DType::F32, {8, 64}, std::as_bytes(std::span(table)));
  w.write(dir / "model.safetensors");
  fs::remove(out);
  for (const std::string& args : {q(dir) + " " + q(out) + " Q8_0", q(dir) + " Q8_0 --dry-run"}) {
    const Result r = cli(args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.out.find("hf-checkpoint: a safetensors checkpoint; quantize reads GGUF files only"), std::string::npos)
        << args << "\n" << r.out;
    EXPECT_NE(r.out.find("specula convert"), std::string::npos) << r.out;
    expect_nothing_written(out);
  }
  // The same through the API.
  try {
    core::open_quantize_input(specula_test::host(), dir);
    ADD_FAILURE() << "open_quantize_input accepted a safetensors checkpoint";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find("a safetensors checkpoint"), std::string::npos) << e.what();
  }
}

// Errors while writing (a tensor that cannot be converted, a NaN) name the file, tensor and types,
// and remove the partial output.
TEST(QuantizeCli, TensorErrorsNameTheTensorAndLeaveNoPartialFile) {
  const fs::path out = work_dir() / "bad-tensor.gguf";
  const fs::path nan = tiny_gguf("tiny-nan.gguf", std::nanf(""));
  Result r = cli(q(nan) + " " + q(out) + " Q4_0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("tiny-nan.gguf: tensor 'blk.0.attn_q.weight': row 3 holds nan at column 17; cannot convert "
                       "F32 to Q4_0"),
            std::string::npos)
      << r.out;
  expect_nothing_written(out);
  const fs::path ints = tiny_gguf("tiny-i32.gguf", 0, DType::I32);
  r = cli(q(ints) + " " + q(out) + " Q8_0");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("tensor 'blk.0.attn_q.weight': cannot convert I32 to Q8_0"), std::string::npos) << r.out;
  expect_nothing_written(out);
}

}  // namespace

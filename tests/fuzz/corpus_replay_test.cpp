// Replays the kept fuzz corpus and the crash regressions through the same code the fuzzers run, in every
// build (and so under ASan/UBSan with SPECULA_SANITIZE=ON).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz_bodies.hpp"

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<uint8_t> read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

const fs::path kRoot = fs::path(SPECULA_SOURCE_DIR) / "tests/fuzz";

}  // namespace

TEST(FuzzCorpus, GgufInputsParseOrFailCleanly) {
  const auto files = files_in(kRoot / "corpus/gguf");
  ASSERT_GE(files.size(), 5u) << "corpus missing";
  size_t accepted = 0;
  for (const auto& f : files) {
    const auto bytes = read(f);
    EXPECT_NO_THROW(accepted += specula::fuzz::gguf_one(bytes.data(), bytes.size())) << f;
  }
  // The seeds include valid files, so some inputs must parse.
  EXPECT_GT(accepted, 0u);
  std::printf("  %zu GGUF corpus inputs, %zu accepted\n", files.size(), accepted);
}

TEST(FuzzCorpus, SafetensorsInputsParseOrFailCleanly) {
  const auto files = files_in(kRoot / "corpus/safetensors");
  ASSERT_GE(files.size(), 5u) << "corpus missing";
  size_t accepted = 0;
  for (const auto& f : files) {
    const auto bytes = read(f);
    EXPECT_NO_THROW(accepted += specula::fuzz::safetensors_one(bytes.data(), bytes.size())) << f;
  }
  EXPECT_GT(accepted, 0u);
  std::printf("  %zu safetensors corpus inputs, %zu accepted\n", files.size(), accepted);
}

TEST(FuzzCorpus, CrashRegressions) {
  // regressions/<parser>-<name>: inputs that once crashed a fuzzer; each must now fail cleanly or parse.
  for (const auto& f : files_in(kRoot / "regressions")) {
    const auto bytes = read(f);
    const std::string name = f.filename().string();
    if (name.rfind("gguf", 0) == 0) EXPECT_NO_THROW(specula::fuzz::gguf_one(bytes.data(), bytes.size())) << f;
    if (name.rfind("safetensors", 0) == 0)
      EXPECT_NO_THROW(specula::fuzz::safetensors_one(bytes.data(), bytes.size())) << f;
  }
}

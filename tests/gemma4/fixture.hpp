// The Gemma 4 test fixtures (tools/gemma4_fixture.py, generated on first use and cached in the build
// dir), and the shared plugin host, CPU backend and loaded models (common/plugins.hpp).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "common/plugins.hpp"

namespace gemma4_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

// Formats each variant's fixture provides (kept small: the vocab is the real 262144 tokens).
inline const std::map<std::string, std::string> kFormats = {
    {"e2b", "f32,f16,q8_0,hf,mlx4"}, {"e4b", "f32,q8_0"}, {"31b", "f32,f16,hf"}, {"26b", "f32,q8_0,hf,mlx4"}};

// The fixture directory of a variant, generated on first use.
inline fs::path fixture(const std::string& variant) {
  static std::mutex mu;
  static std::set<std::string> done;
  const fs::path dir = fs::path(SPECULA_FIXTURE_DIR) / "gemma4-fixtures" / variant;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.count(variant)) {
    const std::string cmd = std::string(SPECULA_PYTHON) + " " + SPECULA_SOURCE_DIR + "/tools/gemma4_fixture.py --variant " +
                            variant + " --formats " + kFormats.at(variant) + " --out " + dir.string() +
                            " --vocab " + SPECULA_SHARED_DIR + "/gemma4-vocab/ggml-vocab-gemma-4.gguf";
    const int rc = std::system(cmd.c_str());
    if (rc != 0) throw std::runtime_error("fixture generation failed: " + cmd);
    done.insert(variant);
  }
  return dir;
}

using specula_test::backend;
using specula_test::host;
using specula_test::load;

}  // namespace gemma4_test

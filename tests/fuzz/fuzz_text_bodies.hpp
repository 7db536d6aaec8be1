// What one fuzz input exercises for the text inputs Specula reads: tokenizer.json + tokenizer_config.json
// (then encoding and decoding), config.json + generation_config.json of a Gemma 4 target or assistant
// over an MLX-quantized checkpoint (so the quantization rules run too), and the pipeline YAML with
// command-line overrides. Shared by the libFuzzer targets and the corpus replay gtest. Bad input must
// end in specula::Error; anything else (another exception, a crash, UB) is a bug, and a broken
// invariant traps.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "config.hpp"      // plugins/gemma4
#include "weights.hpp"     // plugins/gemma4
#include "assistant.hpp"   // plugins/gemma4_assistant
#include "fuzz_support.hpp"
#include "specula/core/pipeline.hpp"
#include "specula/error.hpp"
#include "specula/options.hpp"
#include "safetensors_io.hpp"  // plugins/safetensors (specula_safetensors_io)
#include "specula/tokenizer.hpp"

namespace specula::fuzz {

// ------------------------------------------------------------------------------------- tokenizer
inline void exercise_tokenizer(const Tokenizer& tok, std::string_view text) {
  const int64_t vocab = tok.vocab_size();
  for (bool special : {false, true}) {
    const std::vector<int32_t> ids = tok.encode(text, special, special);
    for (int32_t id : ids)
      if (id < 0 || id >= vocab) __builtin_trap();
    tok.decode(ids, true);
    tok.decode(ids, false);
  }
  // The text's bytes read as token ids, most of them outside the vocabulary: refused, never read.
  std::vector<int32_t> raw(text.size() / 4);
  if (!raw.empty()) std::memcpy(raw.data(), text.data(), raw.size() * 4);
  try {
    tok.decode(raw, false);
  } catch (const Error&) {
  }
  for (int32_t id = 0; id < std::min<int64_t>(vocab, 256); ++id) {
    tok.token_bytes(id);
    tok.is_special(id);
    if (!tok.token_id(tok.piece(id))) __builtin_trap();  // every entry is found again by its text
  }
}

// The tokenizer cut from the real Gemma 4 vocabulary that make_seeds.py writes (tests/fuzz/data), loaded
// once: inputs with an empty tokenizer.json encode their text with it, so the fuzzer spends its time
// (and the corpus its bytes) on the encoder rather than on copies of one vocabulary.
inline const Tokenizer& base_tokenizer() {
  static const std::shared_ptr<const Tokenizer> tok = [] {
    const std::filesystem::path json = std::filesystem::path(SPECULA_FUZZ_DIR) / "data/gemma4-cut-tokenizer.json";
    return make_tokenizer(MetadataFile("safetensors", json.parent_path(), {{"tokenizer_json_path", json.string()}}));
  }();
  return *tok;
}

// Input: tokenizer.json NUL tokenizer_config.json NUL text (an empty tokenizer.json: the base tokenizer);
// or a GGUF image (its tokenizer.ggml.* keys), whose chat template is the text.
inline bool tokenizer_one(const uint8_t* data, size_t size) {
  quiet_logs();
  if (size >= 4 && std::memcmp(data, "GGUF", 4) == 0) {
    try {
      const GgufBytesFile file(data, size);
      const auto& md = file.metadata();
      const auto tmpl = md.find("tokenizer.chat_template");
      exercise_tokenizer(*make_tokenizer(file), tmpl != md.end() && tmpl->is_string() ? tmpl->get<std::string>() : "");
      return true;
    } catch (const Error&) {
      return false;
    }
  }
  const auto parts = split_parts(data, size, 3);
  if (parts[0].empty()) {
    try {
      exercise_tokenizer(base_tokenizer(), parts[2]);
      return true;
    } catch (const Error&) {
      return false;
    }
  }
  const auto& dir = scratch_dir();
  write_file(dir / "tokenizer.json", parts[0]);
  nlohmann::json md = {{"tokenizer_json_path", (dir / "tokenizer.json").string()}};
  if (!parts[1].empty()) {
    // The checkpoint readers refuse a malformed tokenizer_config.json before the tokenizer sees it.
    nlohmann::json config = nlohmann::json::parse(parts[1], nullptr, false);
    if (config.is_discarded()) return false;
    md["tokenizer_config"] = std::move(config);
  }
  try {
    const MetadataFile file("safetensors", dir, std::move(md));
    exercise_tokenizer(*make_tokenizer(file), parts[2]);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// ---------------------------------------------------------------------------------------- config
// Two small checkpoints (written once per process) for the configs to describe: a plain one (BF16
// embedding [64, 64], F32 norm) and an MLX one, whose embedding is affine 4-bit / group 32 and one
// projection 8-bit / group 64 (as mlx-vlm mixes them). Each config.json decides how the MLX modules are
// folded (bits, group size, per-module overrides).
inline std::filesystem::path checkpoint(bool mlx) {
  const auto dir = scratch_dir() / (mlx ? "mlx" : "plain");
  if (std::filesystem::exists(dir / "model.safetensors")) return dir;
  std::filesystem::create_directories(dir);
  safetensors::Writer w(mlx ? safetensors::Writer::Style::Mlx : safetensors::Writer::Style::Rust);
  std::vector<float> values(64 * 64);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(static_cast<int>(i % 17) - 8) / 8.0f;
  if (mlx) {
    w.set_metadata("format", "mlx");
    w.add_mlx_quantized("model.embed_tokens", {64, 64}, values.data(), 4, 32);
    w.add_mlx_quantized("model.layers.0.self_attn.q_proj", {32, 64}, values.data(), 8, 64);
  } else {
    std::vector<uint16_t> bf16(values.size(), 0x3f80);
    w.add_tensor("model.embed_tokens.weight", DType::BF16, {64, 64}, std::as_bytes(std::span<const uint16_t>(bf16)));
  }
  const std::vector<float> ones(64, 1.0f);
  w.add_tensor("model.norm.weight", DType::F32, {64}, std::as_bytes(std::span<const float>(ones)));
  w.write(dir / "model.safetensors");
  return dir;
}

// Input: config.json NUL generation_config.json (each omitted when empty). A config that mentions
// quantization describes the MLX checkpoint, as real MLX exports do; any other the plain one.
inline bool config_one(const uint8_t* data, size_t size) {
  quiet_logs();
  const auto parts = split_parts(data, size, 2);
  const auto dir = checkpoint(parts[0].find("quantization") != std::string_view::npos);
  std::filesystem::remove(dir / "config.json");
  std::filesystem::remove(dir / "generation_config.json");
  if (!parts[0].empty()) write_file(dir / "config.json", parts[0]);
  if (!parts[1].empty()) write_file(dir / "generation_config.json", parts[1]);
  try {
    const std::unique_ptr<ModelFile> file = safetensors::open(dir);
    const nlohmann::json& config = file->metadata().value("config", nlohmann::json());
    for (const char* module : {"model.embed_tokens", "model.layers.0.self_attn.q_proj", "lm_head"})
      safetensors::resolve_quantization(config, module);
    if (gemma4_assistant::is_assistant(*file)) {
      gemma4_assistant::read_config(*file).to_json();
      return true;
    }
    const gemma4::Config c = gemma4::config_from_hf(*file);
    c.to_json();
    try {
      gemma4::check_weights(*file, c);  // the tensors against the config: a small checkpoint lacks most
    } catch (const Error&) {
    }
    return true;
  } catch (const Error&) {
    return false;
  }
}

// -------------------------------------------------------------------------------------- pipeline
// Input: pipeline YAML NUL overrides, one per line: `key=value` replaces a key, `key+=value` appends to
// a list (as --stop does). Plugin option sections are then checked against a schema with one option
// of each type, as the plugin host checks them.
inline std::vector<core::Override> parse_overrides(std::string_view text) {
  std::vector<core::Override> out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    const std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    core::Override o;
    o.append = line[eq - 1] == '+';
    o.key = std::string(line.substr(0, eq - (o.append ? 1 : 0)));
    o.value = std::string(line.substr(eq + 1));
    o.flag = "command line (--" + o.key + ")";
    out.push_back(std::move(o));
  }
  return out;
}

inline const OptionSchema& fuzz_schema() {
  static const OptionSchema schema = {
      {"threads", OptionType::Integer, "an integer", 0, 0, 1024, {}},
      {"scale", OptionType::Number, "a number", 1.0, 0.0, 10.0, {}},
      {"fast", OptionType::Bool, "a bool", false, std::nullopt, std::nullopt, {}},
      {"head", OptionType::String, "a choice", "auto", std::nullopt, std::nullopt, {"auto", "dense", "centroid"}},
      {"name", OptionType::String, "any string", "", std::nullopt, std::nullopt, {}},
      {"chunk", OptionType::IntegerOrString, "an integer or auto", "auto", 1, 4096, {"auto"}},
  };
  return schema;
}

inline bool pipeline_one(const uint8_t* data, size_t size) {
  static const bool env = [] {
    setenv("SPECULA_FUZZ_MODEL", "/models/m.gguf", 1);  // a set variable for ${...} to find
    unsetenv("SPECULA_FUZZ_UNSET");
    return true;
  }();
  (void)env;
  const auto parts = split_parts(data, size, 2);
  try {
    const core::Pipeline p = core::parse_pipeline(parts[0], "fuzz.yaml", "/fuzz", parse_overrides(parts[1]));
    check_options(fuzz_schema(), p.backend.options, "backend plugin 'fuzz'", p.backend.options_at);
    check_options(fuzz_schema(), p.target.options, "model plugin 'fuzz'", p.target.options_at);
    if (p.drafter) check_options(fuzz_schema(), p.drafter->options, "drafter plugin 'fuzz'", p.drafter->options_at);
    check_options(fuzz_schema(), p.sampler.options, "sampler plugin 'fuzz'", p.sampler.options_at);
    return true;
  } catch (const Error&) {
    return false;
  }
}

}  // namespace specula::fuzz

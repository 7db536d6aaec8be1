// Format plugin "gguf": GGUF v3 files (and split GGUF models) through the reader and writer of
// specula_gguf_io. It writes too: `specula convert` and `specula quantize` write their GGUF through it.
#include "gguf_io.hpp"
#include "specula/plugin.hpp"

namespace {

class GgufFormat final : public specula::ModelFormat {
 public:
  std::string name() const override { return "gguf"; }
  bool can_open(const std::filesystem::path& path) const override {
    return std::filesystem::is_regular_file(path) && specula::gguf::has_magic(path);
  }
  std::unique_ptr<specula::ModelFile> open(const std::filesystem::path& path) const override {
    return specula::gguf::open(path);
  }
  bool can_write() const override { return true; }
  void write(const std::filesystem::path& path, const specula::gguf::Metadata& metadata,
             const std::vector<specula::TensorSpec>& tensors) const override {
    specula::gguf::write(path, metadata, tensors);
  }
};

std::unique_ptr<specula::ModelFormat> make_format(const nlohmann::json&) { return std::make_unique<GgufFormat>(); }

const specula::PluginFactories* factories() {
  static const specula::PluginFactories f{.format = &make_format};
  return &f;
}

}  // namespace

SPECULA_PLUGIN("gguf", "format", "1.0.0", "GGUF v3 reader and writer (llama.cpp checkpoints, split files)", factories)

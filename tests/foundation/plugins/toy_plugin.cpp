// The "toy" test plugin: every plugin kind, backed by the fakes of toy.hpp, so that the CLI (run,
// validate) and the pipeline builder are tested end to end without a real model.
//
// A toy checkpoint is a JSON file ending in .toy:
//   {"architecture": "toy", "vocab": 64, "context_length": 128, "seed": 7, "end_tokens": [0],
//    "tensors": [{"name": "w", "type": "F32", "shape": [4, 4]}]}
// and a toy drafter {"architecture": "toy-drafter", "error_every": 3}.
#include <fstream>

#include "specula/plugin.hpp"
#include "toy.hpp"

namespace {

namespace fs = std::filesystem;

class ToyFile final : public specula::ModelFile {
 public:
  ToyFile(fs::path p, nlohmann::json meta) : path_(std::move(p)), meta_(std::move(meta)) {
    if (meta_.contains("tensors")) {
      for (const auto& t : meta_["tensors"]) {
        specula::TensorInfo info;
        info.name = t.at("name").get<std::string>();
        auto type = specula::dtype_from_name(t.at("type").get<std::string>());
        if (!type) specula::fail("{}: tensor '{}' has unknown type '{}'", path_.string(), info.name, t.at("type").dump());
        info.type = *type;
        info.shape = t.at("shape").get<std::vector<int64_t>>();
        tensors_.push_back(info);
      }
    }
  }
  std::string format() const override { return "toy"; }
  fs::path path() const override { return path_; }
  const nlohmann::json& metadata() const override { return meta_; }
  std::string architecture() const override {
    const auto it = meta_.find("architecture");
    return it != meta_.end() && it->is_string() ? it->get<std::string>() : std::string();
  }
  const std::vector<specula::TensorInfo>& tensors() const override { return tensors_; }
  const specula::TensorInfo* find(const std::string& name) const override {
    for (const auto& t : tensors_) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }

 private:
  fs::path path_;
  nlohmann::json meta_;
  std::vector<specula::TensorInfo> tensors_;
};

class ToyFormat final : public specula::ModelFormat {
 public:
  std::string name() const override { return "toy"; }
  bool can_open(const fs::path& p) const override { return p.extension() == ".toy"; }
  std::unique_ptr<specula::ModelFile> open(const fs::path& p) const override {
    std::ifstream in(p);
    if (!in) specula::fail("{}: cannot be read", p.string());
    nlohmann::json j;
    try {
      in >> j;
    } catch (const std::exception& e) {
      specula::fail("{}: not a toy checkpoint: {}", p.string(), e.what());
    }
    return std::make_unique<ToyFile>(p, j);
  }
};

toy::Config config_of(const specula::ModelFile& f) {
  const auto& m = f.metadata();
  toy::Config c;
  c.vocab = m.value("vocab", c.vocab);
  c.context_length = m.value("context_length", c.context_length);
  c.seed = m.value("seed", c.seed);
  c.sharpness = m.value("sharpness", c.sharpness);
  c.end_tokens = m.value("end_tokens", c.end_tokens);
  c.delay_ms = m.value("delay_ms", c.delay_ms);
  return c;
}

class ToyLoader final : public specula::ModelLoader {
 public:
  std::string architecture() const override { return "toy"; }
  bool accepts(const specula::ModelFile& f) const override { return f.metadata().value("architecture", "") == "toy"; }
  // What load() reports, from the file alone; "hidden" (default 1) is what a drafter pairs with.
  specula::ModelInfo check(const specula::ModelFile& f, const specula::ComputeBackend&,
                           const nlohmann::json&) const override {
    const toy::Config c = config_of(f);
    specula::ModelInfo info;
    info.architecture = "toy";
    info.vocab_size = c.vocab;
    info.hidden_size = f.metadata().value("hidden", 1);
    info.context_length = c.context_length;
    return info;
  }
  std::shared_ptr<specula::Model> load(std::shared_ptr<const specula::ModelFile> file,
                                       std::shared_ptr<specula::ComputeBackend>, const nlohmann::json& options,
                                       const specula::ModelParts&) const override {
    for (const auto& [key, value] : options.items()) specula::fail("toy model: unknown option '{}'", key);
    return std::make_shared<toy::Model>(config_of(*file));
  }
};

class ToyDrafterLoader final : public specula::DrafterLoader {
 public:
  std::string architecture() const override { return "toy-drafter"; }
  bool accepts(const specula::ModelFile& f) const override {
    return f.metadata().value("architecture", "") == "toy-drafter";
  }
  // A drafter file may state the target width it was made for ("backbone").
  void check(const specula::ModelFile& f, const specula::ComputeBackend&, const specula::ModelInfo& target,
             const nlohmann::json&) const override {
    const int64_t backbone = f.metadata().value("backbone", target.hidden_size);
    if (target.hidden_size > 0 && backbone != target.hidden_size)
      specula::fail("{}: the toy drafter's backbone is {} but the target's hidden size is {}", f.path().string(),
                    backbone, target.hidden_size);
  }
  std::shared_ptr<specula::Drafter> load(std::shared_ptr<const specula::ModelFile> file,
                                         std::shared_ptr<specula::ComputeBackend> backend, const specula::ModelInfo& target,
                                         const nlohmann::json& options, const specula::ModelParts&) const override {
    if (target.architecture != "toy") specula::fail("toy drafter needs a toy target, got '{}'", target.architecture);
    if (backend) check(*file, *backend, target, options);
    // The drafter must know the target's logit function; the toy target file sits next to it.
    toy::Config c;
    const auto& m = file->metadata();
    c.vocab = target.vocab_size;
    c.seed = m.value("target_seed", c.seed);
    c.sharpness = m.value("target_sharpness", c.sharpness);
    return std::make_shared<toy::Drafter>(c, m.value("error_every", 3));
  }
};

// Computes nothing; answers capability queries: F32 and F16 only.
class ToyBackend final : public specula::ComputeBackend {
 public:
  std::string name() const override { return "toy"; }
  specula::DeviceInfo device() const override { return {"toy device", 0, true}; }
  specula::Support supports(specula::Op, specula::DType type) const override {
    if (type == specula::DType::F32 || type == specula::DType::F16) return specula::Support::yes();
    return specula::Support::no(fmt::format("the toy backend has no kernels for {}", specula::dtype_name(type)));
  }
  specula::BackendTensorPtr load_weight(const specula::TensorInfo&) override { specula::fail("toy backend: no weights"); }
  specula::BackendTensorPtr allocate(const std::string&, specula::DType, const specula::Shape&) override {
    specula::fail("toy backend: no memory");
  }
  std::unique_ptr<specula::CompiledGraph> compile(const specula::Graph&) override {
    specula::fail("toy backend: cannot run graphs");
  }
  void read(const specula::BackendTensor&, std::span<std::byte>) override { specula::fail("toy backend"); }
  void write(specula::BackendTensor&, std::span<const std::byte>) override { specula::fail("toy backend"); }
};

const specula::PluginFactories* factories() {
  static specula::PluginFactories f = [] {
    specula::PluginFactories x;
    x.format = [](const nlohmann::json&) -> std::unique_ptr<specula::ModelFormat> { return std::make_unique<ToyFormat>(); };
    x.backend = [](const nlohmann::json&) -> std::unique_ptr<specula::ComputeBackend> { return std::make_unique<ToyBackend>(); };
    x.model = [](const nlohmann::json&) -> std::unique_ptr<specula::ModelLoader> { return std::make_unique<ToyLoader>(); };
    x.drafter = [](const nlohmann::json&) -> std::unique_ptr<specula::DrafterLoader> {
      return std::make_unique<ToyDrafterLoader>();
    };
    x.sampler = [](const specula::SamplingParams& p, const nlohmann::json&) -> std::unique_ptr<specula::Sampler> {
      return std::make_unique<toy::Sampler>(p);
    };
    // Schemas for the host's option checks; the drafter declares none (its options reach it unchecked).
    static const specula::OptionSchema backend = {
        {"threads", specula::OptionType::Integer, "ignored (the toy computes nothing)", 0, 0, 1024, {}},
        {"isa", specula::OptionType::String, "ignored", "auto", std::nullopt, std::nullopt, {"auto", "avx2", "avx512"}}};
    static const specula::OptionSchema none;
    x.backend_options = &backend;
    x.model_options = &none;
    x.sampler_options = &none;
    return x;
  }();
  return &f;
}

}  // namespace

SPECULA_PLUGIN("toy", "format,backend,model,drafter,sampler", "0.1.0", "fakes of every kind for the foundation tests",
               factories)

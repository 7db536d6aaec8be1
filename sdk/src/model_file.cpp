#include "specula/model_file.hpp"

#include "specula/error.hpp"

namespace specula {

int64_t TensorInfo::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ModelFile::architecture() const {
  const nlohmann::json& md = metadata();
  if (!md.is_object()) return {};
  auto text = [](const nlohmann::json& j, const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  if (format() == "gguf") return text(md, "general.architecture");
  const auto config = md.find("config");
  return config != md.end() && config->is_object() ? text(*config, "model_type") : std::string();
}

void ModelFormat::write(const std::filesystem::path& path, const gguf::Metadata&, const std::vector<TensorSpec>&) const {
  fail("{}: the {} format plugin cannot write files", path.string(), name());
}

}  // namespace specula

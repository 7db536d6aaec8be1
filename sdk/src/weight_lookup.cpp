#include "specula/weight_lookup.hpp"

#include "specula/error.hpp"

namespace specula {

WeightLookup::WeightLookup(const ModelFile& file, ComputeBackend* backend, Names names, std::string whose)
    : file_(file), backend_(backend), names_(std::move(names)), whose_(std::move(whose)) {}

const TensorInfo* WeightLookup::find(const std::string& gguf_name, std::string* shown) const {
  const std::vector<std::string> candidates = names_(gguf_name);
  for (const std::string& n : candidates) {
    if (const TensorInfo* t = file_.find(n)) {
      if (shown) *shown = n;
      return t;
    }
  }
  if (shown) *shown = candidates.empty() ? gguf_name : candidates.front();
  return nullptr;
}

const TensorInfo& WeightLookup::info(const std::string& gguf_name, const Shape& shape) const {
  const TensorInfo* t = find(gguf_name);
  if (!t) {
    const std::vector<std::string> n = names_(gguf_name);
    const std::string first = n.empty() ? gguf_name : n.front();
    // A GGUF file's older spelling is worth naming too (the drafter's two schemas).
    const std::string other = n.size() > 1 && file_.format() == "gguf" ? fmt::format(" (or '{}')", n[1]) : "";
    fail("{}: tensor '{}'{} is missing; the {}'s configuration needs it with shape {}", file_.path().string(), first,
         other, whose_, shape_str(shape));
  }
  if (t->shape != shape)
    fail("{}: tensor '{}' has shape {}, but the {}'s configuration needs {}", file_.path().string(), t->name,
         shape_str(t->shape), whose_, shape_str(shape));
  return *t;
}

BackendTensorPtr WeightLookup::need(const std::string& gguf_name, const Shape& shape) {
  const TensorInfo& t = info(gguf_name, shape);
  return backend_ ? backend_->load_weight(t) : nullptr;
}

BackendTensorPtr WeightLookup::optional(const std::string& gguf_name, const Shape& shape) {
  return find(gguf_name) ? need(gguf_name, shape) : nullptr;
}

}  // namespace specula

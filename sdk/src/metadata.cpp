#include "specula/metadata.hpp"

#include <cstring>

namespace specula {

using json = nlohmann::json;

GgufKeys::GgufKeys(const json& metadata, std::string file, std::string arch)
    : md_(metadata), file_(std::move(file)), arch_(std::move(arch)) {}

const json* GgufKeys::find(const std::string& key) const {
  auto it = md_.find(arch_ + "." + key);
  return it == md_.end() ? nullptr : &*it;
}

int64_t GgufKeys::integer(const json& v, const std::string& key) const {
  if (!v.is_number_integer() && !v.is_number_unsigned())
    fail("{}: metadata key '{}.{}' is {}, expected an integer", file_, arch_, key, json_text(v));
  return v.get<int64_t>();
}

int64_t GgufKeys::required_int(const std::string& key) const {
  const json* v = find(key);
  if (!v) fail("{}: metadata key '{}.{}' is missing; a {} GGUF must have it", file_, arch_, key, arch_);
  return integer(*v, key);
}

int64_t GgufKeys::optional_int(const std::string& key, int64_t fallback) const {
  const json* v = find(key);
  return v ? integer(*v, key) : fallback;
}

int64_t GgufKeys::required_int(const std::string& key, int64_t lo, int64_t hi) const {
  return require_range(required_int(key), lo, hi, fmt::format("metadata key '{}.{}'", arch_, key), file_);
}

int64_t GgufKeys::optional_int(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const {
  return require_range(optional_int(key, fallback), lo, hi, fmt::format("metadata key '{}.{}'", arch_, key), file_);
}

float GgufKeys::optional_float(const std::string& key, float fallback) const {
  const json* v = find(key);
  if (!v) return fallback;
  if (!v->is_number()) fail("{}: metadata key '{}.{}' is {}, expected a number", file_, arch_, key, json_text(*v));
  return v->get<float>();
}

bool GgufKeys::optional_bool(const std::string& key, bool fallback) const {
  const json* v = find(key);
  if (!v) return fallback;
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_number_integer() || v->is_number_unsigned()) return v->get<int64_t>() != 0;
  fail("{}: metadata key '{}.{}' is {}, expected a boolean", file_, arch_, key, json_text(*v));
}

std::vector<int64_t> GgufKeys::per_layer(const std::string& key, size_t layers, bool required,
                                         int64_t fallback) const {
  const json* v = find(key);
  if (!v) {
    if (required) fail("{}: metadata key '{}.{}' is missing", file_, arch_, key);
    return std::vector<int64_t>(layers, fallback);
  }
  if (!v->is_array()) return std::vector<int64_t>(layers, integer(*v, key));
  if (v->size() != layers)
    fail("{}: metadata key '{}.{}' has {} entries, expected one per layer ({})", file_, arch_, key, v->size(), layers);
  std::vector<int64_t> out;
  for (const json& e : *v) out.push_back(integer(e, key));
  return out;
}

int64_t rope_freqs_rotated_pairs(const ModelFile& file, int64_t dims, int64_t fallback, const std::string& where) {
  const TensorInfo* rf = file.find("rope_freqs.weight");
  if (!rf) return fallback;
  if (rf->type != DType::F32 || rf->elements() != dims / 2)
    fail("{}: tensor 'rope_freqs.weight' is {} with {} values; expected F32 with rope.dimension_count/2 = {}", where,
         dtype_name(rf->type), rf->elements(), dims / 2);
  int64_t rotated = 0;
  for (int64_t i = 0; i < dims / 2; ++i) {
    float f;
    std::memcpy(&f, rf->data.data() + 4 * i, 4);
    const bool rotate = f == 1.0f, frozen = f >= 1e20f;
    if (!(rotate || frozen) || (rotate && rotated != i))
      fail("{}: rope_freqs.weight[{}] = {}; only 1.0 for a leading block of pairs then >= 1e20 "
           "(proportional RoPE) is supported", where, i, f);
    if (rotate) ++rotated;
  }
  return rotated;
}

std::string json_text(const json& value, size_t max) {
  std::string s = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

int64_t require_range(int64_t value, int64_t lo, int64_t hi, const std::string& what, const std::string& where) {
  if (value < lo || value > hi)
    fail("{}: {} is {}, outside [{}, {}], the range models of this architecture use; the file is damaged or "
         "describes another model", where, what, value, lo, hi);
  return value;
}

int64_t require_positive(int64_t value, const std::string& what, const std::string& where) {
  if (value <= 0) fail("{}: {} is {}, expected a positive number", where, what, value);
  return value;
}

}  // namespace specula

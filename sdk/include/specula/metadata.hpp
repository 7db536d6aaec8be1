// Checked reads of model metadata for model plugins: GGUF keys under an architecture prefix
// ("gemma4.block_count") and fields of a JSON config object (config.json or its text_config). Every
// error names the file, the key, the value found and what was expected.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/error.hpp"
#include "specula/model_file.hpp"

namespace specula {

// Bounds for hyper-parameters read from model files. Real models stay far inside them (Gemma 4: 62
// layers, 32 heads, head dims 512, hidden 5376, 128 experts, a 262144-token vocabulary); a value outside
// is a damaged or hostile file, refused where it is read, before it sizes an allocation or overflows a
// product of shapes.
namespace limits {
inline constexpr int64_t kLayers = 1024;
inline constexpr int64_t kHeads = 1024;
inline constexpr int64_t kHeadDim = 16384;
inline constexpr int64_t kWidth = int64_t{1} << 20;  // hidden sizes, feed-forward widths
inline constexpr int64_t kExperts = 1024;
inline constexpr int64_t kTokens = 2147483647;       // vocabularies, contexts, windows: ids and positions are int32
}  // namespace limits

// A JSON value as an error message shows it: at most `max` characters, invalid UTF-8 (from a GGUF string,
// a YAML scalar) replaced rather than thrown about as nlohmann::json::dump() would.
std::string json_text(const nlohmann::json& value, size_t max = 80);

// `value` when lo <= value <= hi; otherwise an error "{where}: {what} is {value}, outside [lo, hi] ...".
int64_t require_range(int64_t value, int64_t lo, int64_t hi, const std::string& what, const std::string& where);

class GgufKeys {
 public:
  // `file` names the model in messages; `arch` is the key prefix (general.architecture).
  GgufKeys(const nlohmann::json& metadata, std::string file, std::string arch);

  const nlohmann::json* find(const std::string& key) const;  // "{arch}.{key}", or null
  int64_t integer(const nlohmann::json& value, const std::string& key) const;
  int64_t required_int(const std::string& key) const;
  int64_t optional_int(const std::string& key, int64_t fallback) const;
  // The same, checked to lie in [lo, hi] (require_range, naming the key).
  int64_t required_int(const std::string& key, int64_t lo, int64_t hi) const;
  int64_t optional_int(const std::string& key, int64_t fallback, int64_t lo, int64_t hi) const;
  float optional_float(const std::string& key, float fallback) const;
  bool optional_bool(const std::string& key, bool fallback) const;  // a bool, or an integer (0 = false)
  // A scalar for every layer, or an array with one entry per layer (llama.cpp's "key or array").
  std::vector<int64_t> per_layer(const std::string& key, size_t layers, bool required = true,
                                 int64_t fallback = 0) const;

  const std::string& file() const { return file_; }
  const std::string& arch() const { return arch_; }

 private:
  const nlohmann::json& md_;
  std::string file_;
  std::string arch_;
};

// The fields of one JSON object; `where` ("model/config.json") and `prefix` ("text_config.") name a
// field in messages.
class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string where, std::string prefix = "")
      : object_(object), where_(std::move(where)), prefix_(std::move(prefix)) {}

  // The field, or `fallback` when it is absent or null; a field of another type is an error, and so is a
  // float outside an integer field's range (nlohmann would convert it with a cast: undefined behaviour).
  template <typename T>
  T get(const char* key, T fallback) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return fallback;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      if (it->is_number_float()) {
        const double d = it->template get<double>();
        const double limit = std::ldexp(1.0, std::numeric_limits<T>::digits);  // 2^digits, exact in a double
        if (!(d >= (std::is_signed_v<T> ? -limit : 0.0) && d < limit))
          fail("{}: {}{} is {}, outside the range of an integer", where_, prefix_, key, json_text(*it));
      }
    }
    try {
      return it->template get<T>();
    } catch (const nlohmann::json::exception&) {
      fail("{}: {}{} is {}, which is not the expected type", where_, prefix_, key, json_text(*it));
    }
  }
  // An integer field (or `fallback`) checked to lie in [lo, hi] (require_range, naming the field).
  int64_t integer(const char* key, int64_t fallback, int64_t lo, int64_t hi) const {
    return require_range(get<int64_t>(key, fallback), lo, hi, prefix_ + key, where_);
  }
  const nlohmann::json& object() const { return object_; }

 private:
  const nlohmann::json& object_;
  std::string where_;
  std::string prefix_;
};

// Proportional RoPE as llama.cpp's converter encodes it in a GGUF: tensor rope_freqs.weight, F32
// [dims / 2], 1.0 for a leading block of rotated pairs and >= 1e20 (frozen) for the rest. Returns how many
// pairs rotate, `fallback` when the file has no such tensor; any other content is an error.
int64_t rope_freqs_rotated_pairs(const ModelFile& file, int64_t dims, int64_t fallback, const std::string& where);

// `value` when it is > 0; otherwise an error "{where}: {what} is {value}, expected a positive number".
int64_t require_positive(int64_t value, const std::string& what, const std::string& where);

}  // namespace specula

// GGUF metadata as data: the value types of GGUF's key/value records and an ordered, typed set of keys
// (gguf::Metadata). Model plugins read it from ModelFile::gguf_metadata(); converters fill one for
// ModelFormat::write. Nothing here reads or writes files: the GGUF reader and writer live in the `gguf`
// format plugin.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula::gguf {

enum class ValueType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};
std::string_view value_type_name(ValueType t);

// The declared type of one key: `elem` is meaningful only when `type` is ARRAY.
struct KeyType {
  ValueType type = ValueType::UINT8;
  ValueType elem = ValueType::UINT8;
};

// Whether a JSON value has the kind a GGUF scalar type needs and fits its range (no silent truncation).
bool json_fits(ValueType type, const nlohmann::json& value);

// GGUF keys in the order they are (to be) written, each with its declared type and its value (arrays as
// JSON arrays). values() is the {key: value} object ModelFile::metadata() shows for a GGUF file.
class Metadata {
 public:
  Metadata() = default;

  // Sets (or replaces, keeping its place) a key. `value` must fit `type`; for ARRAY pass a JSON array and
  // `elem`. Throws specula::Error naming the key otherwise.
  void set(const std::string& key, ValueType type, nlohmann::json value, ValueType elem = ValueType::UINT8);
  void set_string(const std::string& key, const std::string& v) { set(key, ValueType::STRING, v); }
  void set_u32(const std::string& key, uint32_t v) { set(key, ValueType::UINT32, v); }
  void set_i32(const std::string& key, int32_t v) { set(key, ValueType::INT32, v); }
  void set_f32(const std::string& key, float v) { set(key, ValueType::FLOAT32, v); }
  void set_bool(const std::string& key, bool v) { set(key, ValueType::BOOL, v); }
  void set_array(const std::string& key, ValueType elem, nlohmann::json values) {
    set(key, ValueType::ARRAY, std::move(values), elem);
  }
  // Removes a key (nothing when absent).
  void erase(const std::string& key);

  bool contains(const std::string& key) const { return values_.contains(key); }
  const nlohmann::json* find(const std::string& key) const;  // the value, or nullptr
  const KeyType* type(const std::string& key) const;         // the declared type, or nullptr
  size_t size() const { return keys_.size(); }
  bool empty() const { return keys_.empty(); }
  // Keys with their declared types, in order.
  const std::vector<std::pair<std::string, KeyType>>& keys() const { return keys_; }
  // {key: value}.
  const nlohmann::json& values() const { return values_; }

  // For readers: takes a parsed file's values and key order as they are (the reader has checked them).
  // `keys` and `values` must hold the same keys.
  static Metadata adopt(nlohmann::json values, std::vector<std::pair<std::string, KeyType>> keys);

 private:
  nlohmann::json values_ = nlohmann::json::object();
  std::vector<std::pair<std::string, KeyType>> keys_;
};

}  // namespace specula::gguf

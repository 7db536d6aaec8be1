// gguf::Metadata: typed GGUF keys in order, checked as they are set.
#include "specula/gguf_metadata.hpp"

#include <algorithm>

#include "specula/error.hpp"

namespace specula::gguf {

std::string_view value_type_name(ValueType t) {
  switch (t) {
    case ValueType::UINT8: return "UINT8";
    case ValueType::INT8: return "INT8";
    case ValueType::UINT16: return "UINT16";
    case ValueType::INT16: return "INT16";
    case ValueType::UINT32: return "UINT32";
    case ValueType::INT32: return "INT32";
    case ValueType::FLOAT32: return "FLOAT32";
    case ValueType::BOOL: return "BOOL";
    case ValueType::STRING: return "STRING";
    case ValueType::ARRAY: return "ARRAY";
    case ValueType::UINT64: return "UINT64";
    case ValueType::INT64: return "INT64";
    case ValueType::FLOAT64: return "FLOAT64";
  }
  return "unknown";
}

bool json_fits(ValueType t, const nlohmann::json& v) {
  switch (t) {
    case ValueType::STRING: return v.is_string();
    case ValueType::BOOL: return v.is_boolean();
    case ValueType::FLOAT32: case ValueType::FLOAT64: return v.is_number();
    case ValueType::ARRAY: return false;
    default: break;
  }
  if (!v.is_number_integer()) return false;
  // The value must be representable in the declared integer type (no silent truncation).
  auto in = [&](int64_t lo, uint64_t hi) {
    if (v.is_number_unsigned()) return v.get<uint64_t>() <= hi;
    const int64_t x = v.get<int64_t>();
    return x >= lo && (x < 0 || static_cast<uint64_t>(x) <= hi);
  };
  switch (t) {
    case ValueType::UINT8: return in(0, UINT8_MAX);
    case ValueType::INT8: return in(INT8_MIN, INT8_MAX);
    case ValueType::UINT16: return in(0, UINT16_MAX);
    case ValueType::INT16: return in(INT16_MIN, INT16_MAX);
    case ValueType::UINT32: return in(0, UINT32_MAX);
    case ValueType::INT32: return in(INT32_MIN, INT32_MAX);
    case ValueType::UINT64: return in(0, UINT64_MAX);
    case ValueType::INT64: return in(INT64_MIN, INT64_MAX);
    default: return false;
  }
}

void Metadata::set(const std::string& key, ValueType type, nlohmann::json value, ValueType elem) {
  if (key.empty()) fail("gguf metadata: empty key");
  if (type == ValueType::ARRAY) {
    if (!value.is_array()) fail("gguf metadata: key '{}': ARRAY needs a JSON array, got {}", key, value.type_name());
    for (const auto& v : value)
      if (!json_fits(elem, v))
        fail("gguf metadata: key '{}': array element {} does not fit {}", key, v.dump(), value_type_name(elem));
  } else if (!json_fits(type, value)) {
    fail("gguf metadata: key '{}': value {} does not fit {}", key, value.dump(), value_type_name(type));
  }
  const KeyType kt{type, type == ValueType::ARRAY ? elem : ValueType::UINT8};
  if (values_.contains(key)) {
    for (auto& k : keys_)
      if (k.first == key) k.second = kt;
  } else {
    keys_.emplace_back(key, kt);
  }
  values_[key] = std::move(value);
}

void Metadata::erase(const std::string& key) {
  if (!values_.erase(key)) return;
  keys_.erase(std::find_if(keys_.begin(), keys_.end(), [&](const auto& k) { return k.first == key; }));
}

const nlohmann::json* Metadata::find(const std::string& key) const {
  const auto it = values_.find(key);
  return it == values_.end() ? nullptr : &*it;
}

const KeyType* Metadata::type(const std::string& key) const {
  if (!values_.contains(key)) return nullptr;
  for (const auto& k : keys_)
    if (k.first == key) return &k.second;
  return nullptr;
}

Metadata Metadata::adopt(nlohmann::json values, std::vector<std::pair<std::string, KeyType>> keys) {
  if (!values.is_object() || values.size() != keys.size())
    fail("gguf metadata: {} values for {} keys", values.is_object() ? values.size() : 0, keys.size());
  Metadata m;
  m.values_ = std::move(values);
  m.keys_ = std::move(keys);
  return m;
}

}  // namespace specula::gguf

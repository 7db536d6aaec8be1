// What one fuzz input exercises for the response_format json_object recognizer (token_constraint.hpp):
// a text it calls a whole JSON object must parse as one with a strict parser (nlohmann::json), and each
// prefix of a text it takes must be taken too (the mask relies on it). Anything else (a crash, UB) is a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "specula/core/token_constraint.hpp"

namespace specula::fuzz {

inline bool json_object_one(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const JsonPrefix r = check_json_object_prefix(text);
  if (!r.valid) return false;
  if (size > 0 && !check_json_object_prefix(text.substr(0, size - 1)).valid) __builtin_trap();
  if (r.complete && !nlohmann::json::parse(text, nullptr, false).is_object()) __builtin_trap();
  return true;
}

}  // namespace specula::fuzz

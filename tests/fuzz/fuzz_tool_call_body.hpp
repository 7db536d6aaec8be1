// What one fuzz input exercises for Gemma 4's tool-call parser (specula/tool_calls.hpp): the text the
// model writes between <|tool_call> and <tool_call|>. Malformed text is refused (no call); a parsed call
// has a non-empty name and arguments that are a JSON object, which must survive a JSON round trip.
// Anything else (an exception, a crash, UB, deep recursion) is a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "specula/tool_calls.hpp"

namespace specula::fuzz {

inline bool tool_call_one(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto call = parse_gemma4_tool_call(text);
  if (!call) return false;
  if (call->name.empty()) __builtin_trap();
  const auto args = nlohmann::json::parse(call->arguments, nullptr, false);
  if (!args.is_object()) __builtin_trap();
  if (args.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) != call->arguments) __builtin_trap();
  return true;
}

}  // namespace specula::fuzz

// Gemma 4's tool-call syntax, as its chat templates write it and the -it models generate it:
//
//   <|tool_call>call:NAME{key:<|"|>text<|"|>,n:5,flag:true,obj:{k:[1,2]}}<tool_call|>
//
// Keys are bare (or wrapped in <|"|>), strings are wrapped in <|"|>, numbers, true/false, null (or
// Python's None), objects {..} and lists [..] nest (at most kMaxToolCallDepth deep); ASCII whitespace
// between the parts is allowed. A block that does not follow this syntax is malformed: parse returns
// nothing, and the chat formats hand such a block back as answer text, spelled as the model wrote it
// (docs/serving.md "Tool calls").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "specula/tokenizer.hpp"

namespace specula {

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text (OpenAI's function.arguments)
};

inline constexpr int kMaxToolCallDepth = 32;

// `body`: what stands between <|tool_call> and <tool_call|> ("call:NAME{...}").
std::optional<ToolCall> parse_gemma4_tool_call(std::string_view body);

// What a token adds to a tool-call body: special tokens (<|"|>) as their spelling, others as bytes.
std::string tool_call_text(const Tokenizer& tok, int32_t token);

// Follows generated tokens and collects the tool calls they complete (well-formed ones only: what the
// chat format's answer filter hides from the answer text).
class ToolCallExtractor {
 public:
  // Inactive (push returns nothing) when the vocabulary has no <|tool_call> / <tool_call|> tokens.
  explicit ToolCallExtractor(std::shared_ptr<const Tokenizer> tok);
  bool active() const { return open_ >= 0; }
  // The calls this token completed (zero or one).
  std::vector<ToolCall> push(int32_t token);
  bool inside() const { return inside_; }

 private:
  std::shared_ptr<const Tokenizer> tok_;
  int32_t open_ = -1, close_ = -1, channel_open_ = -1, channel_close_ = -1;
  bool inside_ = false, in_channel_ = false;
  std::string body_;
};

}  // namespace specula

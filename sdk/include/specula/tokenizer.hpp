// Tokenizer and chat format interfaces. The SentencePiece-style BPE tokenizer that Gemma uses is built
// from a checkpoint's metadata (GGUF tokenizer.ggml.* keys, or tokenizer.json) by make_tokenizer().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace specula {

class ModelFile;

// A byte range [begin, end) of a text.
struct TextRange {
  size_t begin = 0, end = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int64_t vocab_size() const = 0;
  // Text to ids. `parse_special`: text spelling a special/control token becomes that token;
  // otherwise it is tokenized as plain text. No BOS is added unless `add_bos`.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos = false,
                                      bool parse_special = false) const = 0;
  // A rendered chat prompt: special tokens parsed in the template's own text, but inside `literal`
  // (byte ranges of `text`, sorted and disjoint: the messages' contents) text that spells a special token
  // stays text, as encode(..., parse_special = false) has it. What a user writes never becomes a control
  // token; outside those ranges the ids equal encode(text, false, true).
  virtual std::vector<int32_t> encode_prompt(std::string_view text, std::span<const TextRange> literal) const = 0;
  // The bytes of one token (byte-fallback tokens give their raw byte; may be invalid UTF-8 alone).
  virtual std::string token_bytes(int32_t id) const = 0;
  virtual std::string piece(int32_t id) const = 0;   // the vocabulary entry as stored
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special = true) const = 0;
  virtual bool is_special(int32_t id) const = 0;      // control / user-defined special tokens
  virtual std::optional<int32_t> token_id(std::string_view piece) const = 0;
  virtual int32_t bos() const = 0;
  virtual int32_t eos() const = 0;
};

// Builds the tokenizer a checkpoint carries; throws specula::Error naming what is missing.
std::shared_ptr<const Tokenizer> make_tokenizer(const ModelFile& file);

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool"
  std::string content;
  // An assistant message's tool calls: a JSON array in OpenAI's form
  // ([{"id", "type": "function", "function": {"name", "arguments"}}]), "" for none.
  std::string tool_calls = {};
  // A tool message's answer to: the call's id, and the function's name when the client gives it.
  std::string tool_call_id = {};
  std::string name = {};
};

// A conversation rendered: the prompt text, and where in it the messages' contents went (what
// Tokenizer::encode_prompt keeps as text).
struct RenderedChat {
  std::string text;
  std::vector<TextRange> content;
};

// Renders a conversation in a model's chat format and filters what the model writes back.
class ChatFormat {
 public:
  virtual ~ChatFormat() = default;
  // The prompt text (with the BOS spelled as text) ending with the generation prompt, and the byte
  // ranges of the messages' contents in it.
  virtual RenderedChat render_chat(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                   bool enable_thinking) const = 0;
  // With tool declarations: `tools` a JSON array in OpenAI's form ([{"type": "function", "function":
  // {"name", "description", "parameters"}}]), "" for none. A format without tool support throws for
  // tools, tool messages or tool calls.
  virtual RenderedChat render_chat_tools(std::span<const ChatMessage> messages, std::string_view tools,
                                         bool add_generation_prompt, bool enable_thinking) const {
    if (!tools.empty()) throw std::runtime_error("this model's chat format does not support tools");
    for (const auto& m : messages)
      if (m.role == "tool" || !m.tool_calls.empty())
        throw std::runtime_error("this model's chat format does not support tool messages or tool calls");
    return render_chat(messages, add_generation_prompt, enable_thinking);
  }
  // The prompt text alone.
  std::string render(std::span<const ChatMessage> messages, bool add_generation_prompt, bool enable_thinking) const {
    return render_chat(messages, add_generation_prompt, enable_thinking).text;
  }
  // Streams the visible text of generated tokens: thought channel and special tokens removed,
  // bytes held back until they form valid UTF-8.
  class AnswerFilter {
   public:
    virtual ~AnswerFilter() = default;
    virtual std::string push(int32_t token) = 0;   // visible text completed by this token
    virtual std::string finish() = 0;              // whatever is left at the end
  };
  virtual std::unique_ptr<AnswerFilter> answer_filter(bool show_thoughts) const = 0;
  virtual std::vector<int32_t> stop_tokens() const = 0;
};

}  // namespace specula

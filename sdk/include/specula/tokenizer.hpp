// Tokenizer and chat format interfaces. The SentencePiece-style BPE tokenizer that Gemma uses is built
// from a checkpoint's metadata (GGUF tokenizer.ggml.* keys, or tokenizer.json) by make_tokenizer().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace specula {

class ModelFile;

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int64_t vocab_size() const = 0;
  // Text to ids. `parse_special`: text spelling a special/control token becomes that token;
  // otherwise it is tokenized as plain text. No BOS is added unless `add_bos`.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos = false,
                                      bool parse_special = false) const = 0;
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
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

// Renders a conversation in a model's chat format and filters what the model writes back.
class ChatFormat {
 public:
  virtual ~ChatFormat() = default;
  // The prompt text (with the BOS spelled as text) ending with the generation prompt.
  virtual std::string render(std::span<const ChatMessage> messages, bool add_generation_prompt,
                             bool enable_thinking) const = 0;
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

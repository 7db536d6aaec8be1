// Gemma 4's chat format: renders conversations as the -it chat templates do (without tools) and filters
// what the model writes back (thought channel and special tokens removed, UTF-8 completed).
//
//   <bos><|turn>system\n[<|think|>\n]{system}<turn|>\n<|turn>user\n{text}<turn|>\n<|turn>model\n
//
// The model constructs it from its tokenizer:
//   chat_ = std::make_shared<gemma4::Gemma4ChatFormat>(tokenizer_, gemma4::Gemma4ChatFormat::options_for(*file_));
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "specula/model_file.hpp"
#include "specula/tokenizer.hpp"

namespace specula::gemma4 {

class Gemma4ChatFormat final : public ChatFormat {
 public:
  struct Options {
    // The 12B/26B/31B templates close an empty thought block after the generation prompt when thinking
    // is off (`<|channel>thought\n<channel|>`); the E2B/E4B templates do not.
    bool empty_thought_when_not_thinking = true;
    // The current 31B template continues one model turn over consecutive assistant messages; the
    // "interleaved" one opens a new turn for each.
    bool merge_consecutive_assistant = true;
  };
  // Reads the checkpoint's own chat template (GGUF tokenizer.chat_template, or tokenizer_config's
  // chat_template) when there is one; defaults otherwise.
  static Options options_for(const ModelFile& file);
  static Options options_from_template(std::string_view jinja);

  // Throws specula::Error when the tokenizer lacks one of Gemma 4's turn or channel tokens.
  Gemma4ChatFormat(std::shared_ptr<const Tokenizer> tokenizer, Options options);
  explicit Gemma4ChatFormat(std::shared_ptr<const Tokenizer> tokenizer)
      : Gemma4ChatFormat(std::move(tokenizer), Options{}) {}

  RenderedChat render_chat(std::span<const ChatMessage> messages, bool add_generation_prompt,
                           bool enable_thinking) const override;
  // Tools, tool calls and tool messages as the current 31B template renders them (the interleaved
  // template's older tool layout is not reproduced; its tool-less conversations are).
  RenderedChat render_chat_tools(std::span<const ChatMessage> messages, std::string_view tools,
                                 bool add_generation_prompt, bool enable_thinking) const override;
  std::unique_ptr<AnswerFilter> answer_filter(bool show_thoughts) const override;
  std::vector<int32_t> stop_tokens() const override;

 private:
  std::shared_ptr<const Tokenizer> tok_;
  Options options_;
  int32_t channel_open_, channel_close_, turn_end_;
};

// Python's str.strip() (what the template's `| trim` does): Unicode whitespace at both ends.
std::string trim_like_python(std::string_view s);

}  // namespace specula::gemma4

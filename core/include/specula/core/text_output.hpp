// What a generation shows: accepted tokens turned into visible text (the chat format's answer filter, or
// the tokenizer's bytes), always valid UTF-8, cut before a stop string and holding back text that may
// begin one while streaming. One concern of the generation engine (generator.hpp), kept apart from the
// speculative round.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "specula/model.hpp"

namespace specula::core {

// Holds back the bytes of an incomplete UTF-8 sequence so streamed text is always valid UTF-8.
class Utf8Stream {
 public:
  std::string push(std::string_view bytes);  // the complete part of what has arrived so far
  std::string finish();                      // the rest (invalid bytes replaced by U+FFFD)
 private:
  std::string pending_;
};

class TextOutput {
 public:
  // The model's chat format (when it has one) filters the text; otherwise its tokenizer's bytes are shown
  // (special tokens hidden); a model with neither shows nothing.
  TextOutput(const Model& model, bool show_thoughts, std::vector<std::string> stop_strings);
  ~TextOutput();

  struct Piece {
    std::string text;       // visible text to hand out now (may be empty)
    bool stop = false;      // a stop string completed: `text` ends before it, and nothing follows
  };
  // The text `token` completes, less what may begin a stop string.
  Piece push(int32_t token);
  // Everything still held back (a filter's tail, an incomplete UTF-8 sequence, a possible stop string's
  // start); `any` is false when nothing was held.
  struct Rest : Piece {
    bool any = false;
  };
  Rest finish();

 private:
  Piece cut(std::string piece, bool last);
  std::unique_ptr<ChatFormat::AnswerFilter> filter_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  Utf8Stream utf8_;
  std::vector<std::string> stop_strings_;
  std::string held_;  // visible text not handed out yet because it may begin a stop string
};

}  // namespace specula::core

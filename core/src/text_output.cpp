#include "specula/core/text_output.hpp"

#include <algorithm>

namespace specula::core {

namespace {

// Length of the UTF-8 sequence a lead byte starts, 0 for a byte that cannot start one.
size_t utf8_length(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return c >= 0xC2 ? 2 : 0;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return c <= 0xF4 ? 4 : 0;
  return 0;
}

bool continuation(unsigned char c) { return (c & 0xC0) == 0x80; }

const std::string kReplacement = "\xEF\xBF\xBD";

}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    unsigned char c = static_cast<unsigned char>(pending_[i]);
    size_t len = utf8_length(c);
    if (len == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    if (i + len > pending_.size()) {
      // Incomplete: hold it back unless what has arrived is already invalid.
      bool ok = true;
      for (size_t k = i + 1; k < pending_.size(); ++k) ok = ok && continuation(static_cast<unsigned char>(pending_[k]));
      if (ok) break;
      out += kReplacement;
      ++i;
      continue;
    }
    bool ok = true;
    for (size_t k = 1; k < len; ++k) ok = ok && continuation(static_cast<unsigned char>(pending_[i + k]));
    if (!ok) {
      out += kReplacement;
      ++i;
      continue;
    }
    out.append(pending_, i, len);
    i += len;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::finish() {
  std::string out = pending_.empty() ? std::string() : kReplacement;
  pending_.clear();
  return out;
}

TextOutput::TextOutput(const Model& model, bool show_thoughts, std::vector<std::string> stop_strings)
    : tokenizer_(model.tokenizer()), stop_strings_(std::move(stop_strings)) {
  if (auto cf = model.chat_format()) filter_ = cf->answer_filter(show_thoughts);
}

TextOutput::~TextOutput() = default;

TextOutput::Piece TextOutput::push(int32_t token) {
  std::string piece;
  if (filter_) piece = filter_->push(token);
  else if (tokenizer_ && !tokenizer_->is_special(token)) piece = utf8_.push(tokenizer_->token_bytes(token));
  return cut(std::move(piece), false);
}

TextOutput::Rest TextOutput::finish() {
  std::string rest = filter_ ? filter_->finish() : utf8_.finish();
  Rest out;
  out.any = !rest.empty() || !held_.empty();
  if (out.any) static_cast<Piece&>(out) = cut(std::move(rest), true);
  return out;
}

// Appends `piece` to what is held and hands out all of it but a possible stop string's beginning (none
// when `last`: nothing follows); at a complete stop string, the text before it.
TextOutput::Piece TextOutput::cut(std::string piece, bool last) {
  held_ += piece;
  size_t at = std::string::npos;
  for (const auto& stop : stop_strings_)
    if (!stop.empty()) at = std::min(at, held_.find(stop));
  size_t keep = 0;
  if (at == std::string::npos && !last) {
    for (const auto& stop : stop_strings_) {
      if (stop.empty()) continue;
      for (size_t n = std::min(stop.size() - 1, held_.size()); n > keep; --n)
        if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) keep = n;
    }
  }
  Piece out{held_.substr(0, at != std::string::npos ? at : held_.size() - keep), at != std::string::npos};
  held_.erase(0, out.stop ? held_.size() : out.text.size());
  return out;
}

}  // namespace specula::core

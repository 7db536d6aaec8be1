// The syntax of hf:// model ids (specula/core/model_ref.hpp): what a pipeline checks while parsing.
#include "specula/core/model_ref.hpp"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>

#include "specula/error.hpp"

namespace specula::core::hub {

std::string ModelRef::str() const {
  std::string s = std::string(kScheme) + repo;
  if (explicit_revision) s += "@" + revision;
  if (!selector.empty()) s += ":" + selector;
  return s;
}

bool is_ref(std::string_view text) { return text.substr(0, kScheme.size()) == kScheme; }

ModelRef parse_ref(std::string_view text, bool scheme_optional) {
  const std::string shown(text);
  std::string_view rest = text;
  if (is_ref(rest)) rest.remove_prefix(kScheme.size());
  else if (!scheme_optional) fail("'{}' is not a model id: expected hf://OWNER/REPO[@REVISION][:FILE-or-QUANT]", shown);
  const auto bad = [&](const std::string& why) {
    fail("model id '{}': {} (expected hf://OWNER/REPO[@REVISION][:FILE-or-QUANT], e.g. "
         "hf://google/gemma-4-E2B-it or hf://ggml-org/gemma-4-E2B-it-GGUF:Q8_0)",
         shown, why);
  };
  ModelRef ref;
  const size_t end = rest.find_first_of("@:");
  ref.repo = std::string(rest.substr(0, end));
  if (end != std::string_view::npos) {
    std::string_view tail = rest.substr(end);
    if (tail[0] == '@') {
      const size_t colon = tail.find(':');
      ref.revision = std::string(tail.substr(1, colon == std::string_view::npos ? std::string_view::npos : colon - 1));
      ref.explicit_revision = true;
      if (ref.revision.empty()) bad("empty revision after '@'");
      if (ref.revision.find("..") != std::string::npos || ref.revision.front() == '/' || ref.revision.back() == '/')
        bad(fmt::format("'{}' is not a revision", ref.revision));
      tail = colon == std::string_view::npos ? std::string_view() : tail.substr(colon);
    }
    if (!tail.empty()) {
      ref.selector = std::string(tail.substr(1));
      if (ref.selector.empty()) bad("empty file or quantization after ':'");
      if (ref.selector.find("..") != std::string::npos || ref.selector.front() == '/')
        bad(fmt::format("'{}' is not a file of the repository", ref.selector));
    }
  }
  const size_t slash = ref.repo.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == ref.repo.size() || ref.repo.find('/', slash + 1) != std::string::npos)
    bad("the repository must be OWNER/REPO");
  for (const std::string& part : {ref.repo.substr(0, slash), ref.repo.substr(slash + 1)}) {
    const bool chars = std::all_of(part.begin(), part.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    });
    if (!chars || part.find("--") != std::string::npos || part.find("..") != std::string::npos || part.size() > 96 ||
        part.front() == '-' || part.front() == '.' || part.back() == '-' || part.back() == '.')
      bad(fmt::format("'{}' is not a valid owner or repository name (letters, digits, '-', '_', '.'; no '--' or '..')", part));
  }
  return ref;
}

}  // namespace specula::core::hub

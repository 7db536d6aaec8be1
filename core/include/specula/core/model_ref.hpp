// A model named by its Hugging Face id instead of a path, as a pipeline may name it:
//
//   hf://OWNER/REPO[@REVISION][:FILE-or-QUANT]
//
// Only the syntax lives in the core: the pipeline checks ids while parsing and keeps them as written.
// Resolving one into a local path (the Hub API, downloads, the Hugging Face cache) is the model hub's
// work (apps/hub, specula/hub.hpp), which the applications link; the core opens local paths only.
#pragma once

#include <string>
#include <string_view>

namespace specula::core::hub {

inline constexpr std::string_view kScheme = "hf://";

// One model id.
struct ModelRef {
  std::string repo;               // OWNER/REPO
  std::string revision = "main";  // branch, tag or commit hash
  std::string selector;           // a file of the repo or a GGUF quantization (Q4_K_M); "" = what the format needs
  bool explicit_revision = false; // @REVISION was written

  std::string str() const;        // hf://OWNER/REPO[@REVISION][:SELECTOR]
};

// Whether `text` is an id (starts with hf://).
bool is_ref(std::string_view text);
// Parses hf://OWNER/REPO[@REVISION][:SELECTOR]; with `scheme_optional` also OWNER/REPO... (`specula pull`).
// Throws naming what is wrong with it.
ModelRef parse_ref(std::string_view text, bool scheme_optional = false);

}  // namespace specula::core::hub

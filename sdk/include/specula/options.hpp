// Plugin option schemas: what a plugin's `options` section may hold (names, types, ranges, defaults,
// one-line docs). A plugin declares one per kind in its PluginFactories; the host checks the pipeline's
// options against it before calling the factory, so every plugin kind reports a typo or a bad value
// the same way (file:line, the closest valid name), and `specula plugins --options NAME` prints it.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace specula {

enum class OptionType { Bool, Integer, Number, String, IntegerOrString };

struct OptionSpec {
  std::string name;
  OptionType type = OptionType::String;
  std::string doc;                     // one line
  nlohmann::json default_value;        // shown by `specula plugins --options`; null = none
  std::optional<double> min, max;      // Integer, Number (and the integer form of IntegerOrString)
  std::vector<std::string> choices;    // String: the accepted values (empty = any string)
};
using OptionSchema = std::vector<OptionSpec>;

// Where each option key was written ("p.yaml:4:12", "command line (--threads)"); "" = the section.
using OptionLocations = std::map<std::string, std::string>;

// Checks `options` (a JSON object, or null for none) against `schema`. Throws specula::Error starting
// with the key's location, naming `owner` (e.g. "backend plugin 'cpu'"), the key, the value and what
// was expected; an unknown key gets the closest valid one suggested.
void check_options(const OptionSchema& schema, const nlohmann::json& options, std::string_view owner,
                   const OptionLocations& where = {});

// "an integer between 0 and 1024", "one of auto, avx2, avx512", ...
std::string describe_option_type(const OptionSpec& spec);

// The candidate closest to `word` by edit distance, or "" when none is reasonably close.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace specula

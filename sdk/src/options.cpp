#include "specula/options.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "specula/error.hpp"
#include "specula/metadata.hpp"

namespace specula {

namespace {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

std::string number_text(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);
}

std::string range_text(const OptionSpec& s) {
  if (s.min && s.max) return fmt::format(" between {} and {}", number_text(*s.min), number_text(*s.max));
  if (s.min) return fmt::format(" >= {}", number_text(*s.min));
  if (s.max) return fmt::format(" <= {}", number_text(*s.max));
  return {};
}

bool in_range(const OptionSpec& s, double v) { return (!s.min || v >= *s.min) && (!s.max || v <= *s.max); }

// Whether `v` fits `s`.
bool fits(const OptionSpec& s, const nlohmann::json& v) {
  switch (s.type) {
    case OptionType::Bool: return v.is_boolean();
    case OptionType::Integer: return v.is_number_integer() && in_range(s, v.get<double>());
    case OptionType::Number: return v.is_number() && in_range(s, v.get<double>());
    case OptionType::String:
      return v.is_string() &&
             (s.choices.empty() || std::find(s.choices.begin(), s.choices.end(), v.get<std::string>()) != s.choices.end());
    case OptionType::IntegerOrString: return v.is_string() || (v.is_number_integer() && in_range(s, v.get<double>()));
  }
  return false;
}

}  // namespace

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Suggest only when at most about a third of the word differs (typos, not unrelated words).
  size_t limit = std::max<size_t>(2, word.size() / 3);
  return best_d <= limit ? best : std::string();
}

std::string describe_option_type(const OptionSpec& s) {
  switch (s.type) {
    case OptionType::Bool: return "true or false";
    case OptionType::Integer: return "an integer" + range_text(s);
    case OptionType::Number: return "a number" + range_text(s);
    case OptionType::String: return s.choices.empty() ? "a string" : "one of " + join(s.choices);
    case OptionType::IntegerOrString: return "an integer" + range_text(s) + " or a string";
  }
  return {};
}

void check_options(const OptionSchema& schema, const nlohmann::json& options, std::string_view owner,
                   const OptionLocations& where) {
  auto at = [&](const std::string& key) {
    auto it = where.find(key);
    if (it == where.end()) it = where.find("");
    return it == where.end() ? std::string() : it->second + ": ";
  };
  if (options.is_null()) return;
  if (!options.is_object()) fail("{}options of {} must be a mapping, got {}", at(""), owner, json_text(options));
  std::vector<std::string> names;
  for (const auto& s : schema) names.push_back(s.name);
  const std::string valid = names.empty() ? std::string("it takes no options") : "valid options: " + join(names);
  for (const auto& [key, value] : options.items()) {
    // An init-capture: clang before 16 cannot capture a structured binding.
    auto spec = std::find_if(schema.begin(), schema.end(), [&name = key](const OptionSpec& s) { return s.name == name; });
    if (spec == schema.end()) {
      const std::string hint = closest_match(key, names);
      if (!hint.empty()) fail("{}unknown option '{}' of {}; did you mean '{}'? ({})", at(key), key, owner, hint, valid);
      fail("{}unknown option '{}' of {} ({})", at(key), key, owner, valid);
    }
    if (!fits(*spec, value))
      fail("{}option '{}' of {} must be {}, got {}", at(key), key, owner, describe_option_type(*spec), json_text(value));
  }
}

}  // namespace specula

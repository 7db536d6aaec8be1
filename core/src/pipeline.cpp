#include "specula/core/pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "specula/core/plugin_host.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"

namespace fs = std::filesystem;

namespace specula::core {

std::string expand_env(std::string_view text, std::string_view where) {
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    if (text[i] == '$' && i + 1 < text.size() && text[i + 1] == '{') {
      // The matching brace: defaults may hold ${...} themselves.
      size_t close = std::string_view::npos;
      for (size_t k = i + 2, depth = 1; k < text.size(); ++k) {
        if (text[k] == '{') ++depth;
        if (text[k] == '}' && --depth == 0) {
          close = k;
          break;
        }
      }
      if (close == std::string_view::npos) {
        fail("{}: unterminated '${{' in '{}' (expected ${{NAME}} or ${{NAME:-default}})", where, text);
      }
      std::string_view body = text.substr(i + 2, close - i - 2);
      std::string name(body);
      std::optional<std::string> fallback;
      if (size_t dash = body.find(":-"); dash != std::string_view::npos) {
        name = std::string(body.substr(0, dash));
        fallback = std::string(body.substr(dash + 2));
      }
      if (name.empty()) fail("{}: empty variable name in '{}'", where, text);
      const char* value = std::getenv(name.c_str());
      if (value && *value) {
        out += value;
      } else if (fallback) {
        out += expand_env(*fallback, where);  // only when used: it may name unset variables itself
      } else {
        fail("{}: environment variable '{}' is not set (used in '{}'; write ${{{}:-default}} for a default)", where,
             name, text, name);
      }
      i = close + 1;
    } else {
      out += text[i++];
    }
  }
  return out;
}

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

namespace {

enum class Kind { String, Path, Int, Float, Bool, PathList, Map };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::String: return "a string";
    case Kind::Path: return "a path (string)";
    case Kind::Int: return "an integer";
    case Kind::Float: return "a number";
    case Kind::Bool: return "true or false";
    case Kind::PathList: return "a list of paths";
    case Kind::Map: return "a mapping";
  }
  return "";
}

struct Key {
  std::string name;
  Kind kind;
  bool required = false;
};

class Reader {
 public:
  Reader(fs::path source, fs::path base) : source_(std::move(source)), base_(std::move(base)) {}

  std::string where(const YAML::Node& n) const {
    const auto m = n.Mark();
    if (m.line < 0) return source_.string();
    return fmt::format("{}:{}:{}", source_.string(), m.line + 1, m.column + 1);
  }

  // Checks a mapping against its keys: unknown keys (with a suggestion), missing required keys.
  void check_section(const YAML::Node& node, const std::string& section, const std::vector<Key>& keys) const {
    if (!node.IsMap()) {
      fail("{}: '{}' must be a mapping of keys ({}), not {}", where(node), section, key_list(keys), describe(node));
    }
    std::vector<std::string> names;
    for (const auto& k : keys) names.push_back(k.name);
    for (const auto& item : node) {
      const std::string key = item.first.as<std::string>();
      if (std::find(names.begin(), names.end(), key) != names.end()) continue;
      std::string hint = closest_match(key, names);
      std::string label = section.empty() ? "at the top level" : "in section '" + section + "'";
      if (!hint.empty()) {
        fail("{}: unknown key '{}' {}; did you mean '{}'? (valid keys: {})", where(item.first), key, label, hint,
             key_list(keys));
      }
      fail("{}: unknown key '{}' {} (valid keys: {})", where(item.first), key, label, key_list(keys));
    }
    for (const auto& k : keys) {
      if (k.required && !node[k.name]) {
        std::string label = section.empty() ? "at the top level" : "in section '" + section + "'";
        fail("{}: missing required key '{}' {} (expected {})", where(node), k.name, label, kind_name(k.kind));
      }
    }
  }

  static std::string key_list(const std::vector<Key>& keys) {
    std::string s;
    for (const auto& k : keys) s += (s.empty() ? "" : ", ") + k.name;
    return s;
  }

  static std::string describe(const YAML::Node& n) {
    if (n.IsMap()) return "a mapping";
    if (n.IsSequence()) return "a list";
    if (n.IsNull()) return "empty";
    return "'" + n.Scalar() + "'";
  }

  [[noreturn]] void wrong_type(const YAML::Node& n, const std::string& key, Kind kind) const {
    fail("{}: key '{}' must be {}, got {}", where(n), key, kind_name(kind), describe(n));
  }

  std::string string(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) wrong_type(n, key, Kind::String);
    return expand_env(n.Scalar(), where(n));
  }
  fs::path path(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) wrong_type(n, key, Kind::Path);
    fs::path p = expand_env(n.Scalar(), where(n));
    if (p.empty()) fail("{}: key '{}' must be a path, got an empty string", where(n), key);
    return p.is_absolute() ? p : (base_ / p).lexically_normal();
  }
  int64_t integer(const YAML::Node& n, const std::string& key, int64_t lo, int64_t hi) const {
    if (!n.IsScalar()) wrong_type(n, key, Kind::Int);
    std::string text = expand_env(n.Scalar(), where(n));
    int64_t v = 0;
    size_t used = 0;
    try {
      v = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size()) wrong_type(n, key, Kind::Int);
    if (v < lo || v > hi) fail("{}: key '{}' must be between {} and {}, got {}", where(n), key, lo, hi, v);
    return v;
  }
  double number(const YAML::Node& n, const std::string& key, double lo, double hi) const {
    if (!n.IsScalar()) wrong_type(n, key, Kind::Float);
    std::string text = expand_env(n.Scalar(), where(n));
    double v = 0;
    size_t used = 0;
    try {
      v = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() || !std::isfinite(v)) wrong_type(n, key, Kind::Float);
    if (v < lo || v > hi) fail("{}: key '{}' must be between {} and {}, got {}", where(n), key, lo, hi, text);
    return v;
  }
  bool boolean(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) wrong_type(n, key, Kind::Bool);
    std::string t = expand_env(n.Scalar(), where(n));
    if (t == "true" || t == "True" || t == "yes" || t == "on") return true;
    if (t == "false" || t == "False" || t == "no" || t == "off") return false;
    wrong_type(n, key, Kind::Bool);
  }
  std::vector<fs::path> path_list(const YAML::Node& n, const std::string& key) const {
    std::vector<fs::path> out;
    if (n.IsScalar()) {
      out.push_back(path(n, key));
      return out;
    }
    if (!n.IsSequence()) wrong_type(n, key, Kind::PathList);
    for (const auto& item : n) out.push_back(path(item, key));
    return out;
  }

  // Plugin option sections go to the factories as JSON; the plugin checks its own keys.
  nlohmann::json json(const YAML::Node& n, const std::string& key) const {
    if (n.IsNull()) return nlohmann::json::object();
    if (!n.IsMap()) wrong_type(n, key, Kind::Map);
    return to_json(n);
  }
  nlohmann::json to_json(const YAML::Node& n) const {
    switch (n.Type()) {
      case YAML::NodeType::Map: {
        nlohmann::json j = nlohmann::json::object();
        for (const auto& item : n) j[item.first.as<std::string>()] = to_json(item.second);
        return j;
      }
      case YAML::NodeType::Sequence: {
        nlohmann::json j = nlohmann::json::array();
        for (const auto& item : n) j.push_back(to_json(item));
        return j;
      }
      case YAML::NodeType::Scalar: {
        std::string text = expand_env(n.Scalar(), where(n));
        if (n.Tag() == "!") return text;  // quoted: always a string
        if (text == "true" || text == "false") return text == "true";
        if (text == "null" || text == "~") return nullptr;
        size_t used = 0;
        try {
          long long v = std::stoll(text, &used);
          if (used == text.size()) return v;
        } catch (const std::exception&) {
        }
        try {
          double v = std::stod(text, &used);
          if (used == text.size()) return v;
        } catch (const std::exception&) {
        }
        return text;
      }
      default:
        return nullptr;
    }
  }

 private:
  fs::path source_;
  fs::path base_;
};

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

}  // namespace

Pipeline parse_pipeline(std::string_view yaml_text, const fs::path& source, const fs::path& base_dir) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    fail("{}:{}:{}: not valid YAML: {}", source.string(), e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  Reader r(source, base_dir);
  if (!root || root.IsNull()) fail("{}: the pipeline is empty (expected sections backend, target, sampler, ...)",
                                   source.string());
  r.check_section(root, "", {{"plugin_paths", Kind::PathList}, {"backend", Kind::Map, true},
                             {"target", Kind::Map, true}, {"drafter", Kind::Map}, {"sampler", Kind::Map},
                             {"chat", Kind::Map}});
  Pipeline p;
  p.source = source;
  if (auto n = root["plugin_paths"]) p.plugin_paths = r.path_list(n, "plugin_paths");

  {
    auto s = root["backend"];
    r.check_section(s, "backend", {{"plugin", Kind::String, true}, {"options", Kind::Map}});
    p.backend.plugin = r.string(s["plugin"], "backend.plugin");
    if (auto o = s["options"]) p.backend.options = r.json(o, "backend.options");
  }
  {
    auto s = root["target"];
    r.check_section(s, "target", {{"model", Kind::Path, true}, {"format", Kind::String}, {"plugin", Kind::String},
                                  {"context_length", Kind::Int}, {"options", Kind::Map}});
    p.target.model = r.path(s["model"], "target.model");
    if (auto n = s["format"]) p.target.format = r.string(n, "target.format");
    if (auto n = s["plugin"]) p.target.plugin = r.string(n, "target.plugin");
    if (auto n = s["context_length"]) p.target.context_length = r.integer(n, "target.context_length", 0, kMaxInt);
    if (auto o = s["options"]) p.target.options = r.json(o, "target.options");
  }
  if (auto s = root["drafter"]; s && !s.IsNull()) {
    r.check_section(s, "drafter", {{"model", Kind::Path, true}, {"format", Kind::String}, {"plugin", Kind::String},
                                   {"draft_tokens", Kind::Int}, {"options", Kind::Map}});
    DrafterConfig d;
    d.model = r.path(s["model"], "drafter.model");
    if (auto n = s["format"]) d.format = r.string(n, "drafter.format");
    if (auto n = s["plugin"]) d.plugin = r.string(n, "drafter.plugin");
    if (auto n = s["draft_tokens"]) d.draft_tokens = static_cast<int>(r.integer(n, "drafter.draft_tokens", 1, 64));
    if (auto o = s["options"]) d.options = r.json(o, "drafter.options");
    p.drafter = d;
  }
  if (auto s = root["sampler"]; s && !s.IsNull()) {
    r.check_section(s, "sampler", {{"plugin", Kind::String}, {"temperature", Kind::Float}, {"top_k", Kind::Int},
                                   {"top_p", Kind::Float}, {"repetition_penalty", Kind::Float},
                                   {"penalty_window", Kind::Int}, {"min_length", Kind::Int}, {"seed", Kind::Int},
                                   {"max_tokens", Kind::Int}, {"device", Kind::String}, {"options", Kind::Map}});
    auto& sp = p.sampler.params;
    if (auto n = s["plugin"]) p.sampler.plugin = r.string(n, "sampler.plugin");
    if (auto n = s["temperature"]) sp.temperature = static_cast<float>(r.number(n, "sampler.temperature", 0, 100));
    if (auto n = s["top_k"]) sp.top_k = static_cast<int32_t>(r.integer(n, "sampler.top_k", 0, kMaxInt));
    if (auto n = s["top_p"]) sp.top_p = static_cast<float>(r.number(n, "sampler.top_p", 0, 1));
    if (auto n = s["repetition_penalty"]) {
      sp.repetition_penalty = static_cast<float>(r.number(n, "sampler.repetition_penalty", 0.01, 100));
    }
    if (auto n = s["penalty_window"]) sp.penalty_window = static_cast<int32_t>(r.integer(n, "sampler.penalty_window", 0, kMaxInt));
    if (auto n = s["min_length"]) sp.min_length = static_cast<int32_t>(r.integer(n, "sampler.min_length", 0, kMaxInt));
    if (auto n = s["seed"]) sp.seed = static_cast<uint64_t>(r.integer(n, "sampler.seed", 0, std::numeric_limits<int64_t>::max()));
    if (auto n = s["max_tokens"]) p.sampler.max_tokens = static_cast<int>(r.integer(n, "sampler.max_tokens", 1, kMaxInt));
    if (auto o = s["options"]) p.sampler.options = r.json(o, "sampler.options");
    if (auto n = s["device"]) {
      const std::string d = r.string(n, "sampler.device");
      if (d == "auto") sp.device = SamplingDevice::Auto;
      else if (d == "on") sp.device = SamplingDevice::On;
      else if (d == "off") sp.device = SamplingDevice::Off;
      else fail("{}: key 'sampler.device' must be auto, on or off, got '{}'", r.where(n), d);
    }
  }
  if (auto s = root["chat"]; s && !s.IsNull()) {
    r.check_section(s, "chat", {{"system", Kind::String}, {"enable_thinking", Kind::Bool}, {"show_thoughts", Kind::Bool}});
    if (auto n = s["system"]) p.chat.system = r.string(n, "chat.system");
    if (auto n = s["enable_thinking"]) p.chat.enable_thinking = r.boolean(n, "chat.enable_thinking");
    if (auto n = s["show_thoughts"]) p.chat.show_thoughts = r.boolean(n, "chat.show_thoughts");
  }
  return p;
}

Pipeline load_pipeline(const fs::path& yaml_file) {
  std::ifstream in(yaml_file, std::ios::binary);
  if (!in) fail("pipeline file {} cannot be read (does it exist?)", yaml_file.string());
  std::stringstream text;
  text << in.rdbuf();
  fs::path base = fs::absolute(yaml_file).parent_path();
  return parse_pipeline(text.str(), yaml_file, base);
}

BuiltPipeline build_pipeline(const Pipeline& p, const PluginHost& host, const BuildOptions& options) {
  BuiltPipeline b;
  const std::string src = p.source.empty() ? std::string("command line") : p.source.string();
  auto section = [&](const char* name, auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      fail("{}: section '{}': {}", src, name, e.what());
    }
  };
  section("backend", [&] { b.backend = host.make_backend(p.backend.plugin, p.backend.options); });
  section("target", [&] {
    b.target_file = host.open_model(p.target.model, p.target.format);
    auto loader = p.target.plugin.empty() ? host.find_model_loader(*b.target_file, p.target.options)
                                          : host.make_model_loader(p.target.plugin, p.target.options);
    if (!p.target.plugin.empty() && !loader->accepts(*b.target_file)) {
      fail("model plugin '{}' ({}) does not accept {} (its architecture: '{}')", p.target.plugin,
           loader->architecture(), p.target.model.string(), declared_architecture(*b.target_file));
    }
    b.target = loader->load(b.target_file, b.backend, p.target.options);
    if (!b.target) fail("model plugin returned no model for {}", p.target.model.string());
  });
  if (p.drafter && options.load_drafter) {
    section("drafter", [&] {
      b.drafter_file = host.open_model(p.drafter->model, p.drafter->format);
      auto loader = p.drafter->plugin.empty() ? host.find_drafter_loader(*b.drafter_file, p.drafter->options)
                                              : host.make_drafter_loader(p.drafter->plugin, p.drafter->options);
      if (!p.drafter->plugin.empty() && !loader->accepts(*b.drafter_file)) {
        fail("drafter plugin '{}' ({}) does not accept {} (its architecture: '{}')", p.drafter->plugin,
             loader->architecture(), p.drafter->model.string(), declared_architecture(*b.drafter_file));
      }
      b.drafter = loader->load(b.drafter_file, b.backend, b.target->info(), p.drafter->options);
      if (!b.drafter) fail("drafter plugin returned no drafter for {}", p.drafter->model.string());
    });
  }
  section("sampler", [&] { b.sampler = host.make_sampler(p.sampler.plugin, p.sampler.params, p.sampler.options); });
  return b;
}

}  // namespace specula::core

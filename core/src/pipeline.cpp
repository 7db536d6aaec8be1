#include "specula/core/pipeline.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "specula/core/draft_length.hpp"
#include "specula/core/model_ref.hpp"
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

enum class Kind { String, Path, Int, IntOrAuto, Float, Bool, PathList, StringList, Map };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::String: return "a string";
    case Kind::Path: return "a path (string)";
    case Kind::Int: return "an integer";
    case Kind::IntOrAuto: return "an integer or auto";
    case Kind::Float: return "a number";
    case Kind::Bool: return "true or false";
    case Kind::PathList: return "a list of paths";
    case Kind::StringList: return "a string or a list of strings";
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
  Reader(fs::path source, fs::path base, const std::vector<Override>& overrides)
      : source_(std::move(source)), base_(std::move(base)) {
    for (const auto& o : overrides) flags_[o.key] = o.flag;
  }

  std::string where(const YAML::Node& n) const {
    const auto m = n.Mark();
    if (m.line < 0) return source_.string();
    return fmt::format("{}:{}:{}", source_.string(), m.line + 1, m.column + 1);
  }
  // The place a key's value came from: its command-line flag when overridden, else its line.
  std::string where(const YAML::Node& n, const std::string& key) const {
    auto it = flags_.find(key);
    return it != flags_.end() ? it->second : where(n);
  }

  // yaml-cpp keeps a repeated key and answers lookups with the first: refuse it, naming both lines.
  // Also bounds the document: aliases can make a few lines stand for billions of nodes ("billion
  // laughs"), which every later walk (options to JSON) would expand.
  void check_duplicates(const YAML::Node& n, size_t* nodes, size_t depth = 0) const {
    if (++*nodes > kMaxNodes || depth > kMaxDepth)
      fail("{}: the pipeline nests deeper than {} or expands to more than {} values (through aliases?); a "
           "pipeline is a few dozen keys", where(n), kMaxDepth, kMaxNodes);
    if (n.IsSequence()) {
      for (const auto& item : n) check_duplicates(item, nodes, depth + 1);
    }
    if (!n.IsMap()) return;
    std::map<std::string, YAML::Mark> seen;
    for (const auto& item : n) {
      if (!item.first.IsScalar())  // later reads take every key as a string
        fail("{}: a key must be a plain name, not {}", where(item.first), describe(item.first));
      const std::string key = item.first.Scalar();
      auto [it, fresh] = seen.emplace(key, item.first.Mark());
      if (!fresh) {
        fail("{}: duplicate key '{}' (first at line {}, again at line {}); each key may appear once in a mapping",
             where(item.first), key, it->second.line + 1, item.first.Mark().line + 1);
      }
      check_duplicates(item.second, nodes, depth + 1);
    }
  }
  static constexpr size_t kMaxNodes = 100000, kMaxDepth = 64;

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
    fail("{}: key '{}' must be {}, got {}", where(n, key), key, kind_name(kind), describe(n));
  }

  std::string string(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) wrong_type(n, key, Kind::String);
    return expand_env(n.Scalar(), where(n, key));
  }
  // A string that must be one of `choices`.
  std::string choice(const YAML::Node& n, const std::string& key, const std::vector<std::string>& choices) const {
    const std::string v = string(n, key);
    if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
    std::string list;
    for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
    fail("{}: key '{}' must be one of {}, got '{}'", where(n, key), key, list, v);
  }
  fs::path path(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) wrong_type(n, key, Kind::Path);
    fs::path p = expand_env(n.Scalar(), where(n, key));
    if (p.empty()) fail("{}: key '{}' must be a path, got an empty string", where(n, key), key);
    return p.is_absolute() ? p : (base_ / p).lexically_normal();
  }
  // A model: a path, an hf:// id (kept as written; the application's ModelLocator resolves it) or, for the
  // drafter, `auto` (the target's -assistant repository).
  fs::path model_path(const YAML::Node& n, const std::string& key, bool allow_auto) const {
    if (!n.IsScalar()) wrong_type(n, key, Kind::Path);
    const std::string text = expand_env(n.Scalar(), where(n, key));
    if (allow_auto && text == kAutoDrafter) return text;
    if (!hub::is_ref(text)) return path(n, key);
    try {
      hub::parse_ref(text);
    } catch (const Error& e) {
      fail("{}: key '{}': {}", where(n, key), key, e.what());
    }
    return text;
  }
  // An integer in [lo, hi], or (integer_or_auto) the word auto: nullopt.
  std::optional<int64_t> integer_or_auto(const YAML::Node& n, const std::string& key, int64_t lo, int64_t hi) const {
    if (n.IsScalar() && expand_env(n.Scalar(), where(n, key)) == "auto") return std::nullopt;
    return integer(n, key, lo, hi, Kind::IntOrAuto);
  }
  int64_t integer(const YAML::Node& n, const std::string& key, int64_t lo, int64_t hi, Kind kind = Kind::Int) const {
    if (!n.IsScalar()) wrong_type(n, key, kind);
    std::string text = expand_env(n.Scalar(), where(n, key));
    int64_t v = 0;
    size_t used = 0;
    try {
      v = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size()) wrong_type(n, key, kind);
    if (v < lo || v > hi) fail("{}: key '{}' must be between {} and {}, got {}", where(n, key), key, lo, hi, v);
    return v;
  }
  double number(const YAML::Node& n, const std::string& key, double lo, double hi) const {
    if (!n.IsScalar()) wrong_type(n, key, Kind::Float);
    std::string text = expand_env(n.Scalar(), where(n, key));
    double v = 0;
    size_t used = 0;
    try {
      v = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() || !std::isfinite(v)) wrong_type(n, key, Kind::Float);
    if (v < lo || v > hi) fail("{}: key '{}' must be between {} and {}, got {}", where(n, key), key, lo, hi, text);
    return v;
  }
  bool boolean(const YAML::Node& n, const std::string& key) const {
    if (!n.IsScalar()) wrong_type(n, key, Kind::Bool);
    std::string t = expand_env(n.Scalar(), where(n, key));
    if (t == "true" || t == "True" || t == "yes" || t == "on") return true;
    if (t == "false" || t == "False" || t == "no" || t == "off") return false;
    wrong_type(n, key, Kind::Bool);
  }
  std::vector<std::string> string_list(const YAML::Node& n, const std::string& key) const {
    if (n.IsScalar()) return {string(n, key)};
    if (!n.IsSequence()) wrong_type(n, key, Kind::StringList);
    std::vector<std::string> out;
    for (const auto& item : n) {
      if (!item.IsScalar()) wrong_type(item, key, Kind::StringList);
      out.push_back(string(item, key));
    }
    return out;
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

  // Plugin option sections go to the factories as JSON; the host checks them against the plugin's
  // schema, with the place of each key from `at`.
  nlohmann::json json(const YAML::Node& n, const std::string& key, OptionLocations& at) const {
    at[""] = where(n, key);
    if (n.IsNull()) return nlohmann::json::object();
    if (!n.IsMap()) wrong_type(n, key, Kind::Map);
    for (const auto& item : n) {
      const std::string name = item.first.Scalar();
      at[name] = where(item.first, key + "." + name);
    }
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
  std::map<std::string, std::string> flags_;  // overridden key -> "command line (--flag)"
};

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream in(key);
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  return parts;
}

// Sets root[a][b]... = value, creating the mappings on the way.
void set_key(YAML::Node node, const std::vector<std::string>& parts, size_t i, const Override& o) {
  if (i + 1 == parts.size()) {
    if (!o.append) {
      node[parts[i]] = o.value;
      return;
    }
    // A single value written in the YAML becomes the list's first entry.
    if (!node[parts[i]].IsSequence()) {
      const std::string first = node[parts[i]].IsScalar() ? node[parts[i]].Scalar() : std::string();
      node[parts[i]] = YAML::Node(YAML::NodeType::Sequence);
      if (!first.empty()) node[parts[i]].push_back(first);
    }
    node[parts[i]].push_back(o.value);
    return;
  }
  if (!node[parts[i]].IsMap()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
  set_key(node[parts[i]], parts, i + 1, o);
}

void apply_overrides(YAML::Node& root, const std::vector<Override>& overrides) {
  const YAML::Node& const_root = root;
  const bool has_drafter = (const_root["drafter"] && !const_root["drafter"].IsNull()) ||
                           std::any_of(overrides.begin(), overrides.end(),
                                       [](const Override& o) { return o.key == "drafter.model"; });
  for (const auto& o : overrides) {
    const auto parts = split_key(o.key);
    if (parts.size() < 2) fail("{}: '{}' is not a section.key", o.flag, o.key);
    if (parts[0] == "drafter" && !has_drafter)
      fail("{}: needs a drafter (--drafter PATH or a drafter section in the pipeline)", o.flag);
    set_key(root, parts, 0, o);
  }
}

// Every check and conversion of the keys, on a document with the overrides applied.
Pipeline read_pipeline(YAML::Node root, const fs::path& source, const Reader& r);

constexpr int64_t kMaxInt = std::numeric_limits<int32_t>::max();

}  // namespace

Pipeline parse_pipeline(std::string_view yaml_text, const fs::path& source, const fs::path& base_dir,
                        const std::vector<Override>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    fail("{}:{}:{}: not valid YAML: {}", source.string(), e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  Reader r(source, base_dir, overrides);
  if (!root || root.IsNull()) fail("{}: the pipeline is empty (expected sections backend, target, sampler, ...)",
                                   source.string());
  size_t nodes = 0;
  r.check_duplicates(root, &nodes);
  if (root.IsMap()) apply_overrides(root, overrides);
  return read_pipeline(root, source, r);
}

Pipeline default_pipeline(const std::vector<Override>& overrides) {
  YAML::Node root(YAML::NodeType::Map);
  root["backend"]["plugin"] = "cpu";
  if (std::none_of(overrides.begin(), overrides.end(), [](const Override& o) { return o.key == "target.model"; }))
    fail("no model: give a pipeline YAML (e.g. configs/default.yaml), a model file or directory, or --model PATH");
  apply_overrides(root, overrides);
  return read_pipeline(root, "", Reader("command line", fs::current_path(), overrides));
}

namespace {
Pipeline read_pipeline(YAML::Node root, const fs::path& source, const Reader& r) {
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
    // The CPU backend was the plugin "onednn" until it was renamed "cpu" (oneDNN serves only its float
    // GEMM); pipelines and --backend flags that still say onednn get it.
    if (p.backend.plugin == "onednn") p.backend.plugin = "cpu";
    if (auto o = s["options"]) p.backend.options = r.json(o, "backend.options", p.backend.options_at);
  }
  {
    auto s = root["target"];
    r.check_section(s, "target", {{"model", Kind::Path, true}, {"format", Kind::String}, {"plugin", Kind::String},
                                  {"lm_head", Kind::String}, {"attention", Kind::String}, {"context_length", Kind::Int},
                                  {"options", Kind::Map}});
    p.target.model = r.model_path(s["model"], "target.model", false);
    if (auto n = s["format"]) p.target.format = r.string(n, "target.format");
    if (auto n = s["plugin"]) p.target.plugin = r.string(n, "target.plugin");
    if (auto n = s["lm_head"]) p.target.lm_head = r.string(n, "target.lm_head");
    if (auto n = s["attention"]) p.target.attention = r.string(n, "target.attention");
    if (auto n = s["context_length"]) p.target.context_length = r.integer(n, "target.context_length", 0, kMaxInt);
    if (auto o = s["options"]) p.target.options = r.json(o, "target.options", p.target.options_at);
  }
  if (auto s = root["drafter"]; s && !s.IsNull()) {
    r.check_section(s, "drafter", {{"model", Kind::Path, true}, {"format", Kind::String}, {"plugin", Kind::String},
                                   {"lm_head", Kind::String}, {"attention", Kind::String}, {"draft_tokens", Kind::IntOrAuto}, {"draft_max", Kind::Int},
                                   {"convention", Kind::String}, {"options", Kind::Map}});
    DrafterConfig d;
    d.model = r.model_path(s["model"], "drafter.model", true);
    if (d.model == kAutoDrafter && !hub::is_ref(p.target.model.string()))
      fail("{}: drafter.model auto pairs an hf:// target with its -assistant repository, and target.model {} is a "
           "path; give the drafter's file or id", r.where(s["model"], "drafter.model"), p.target.model.string());
    if (auto n = s["format"]) d.format = r.string(n, "drafter.format");
    if (auto n = s["plugin"]) d.plugin = r.string(n, "drafter.plugin");
    if (auto n = s["lm_head"]) d.lm_head = r.string(n, "drafter.lm_head");
    if (auto n = s["attention"]) d.attention = r.string(n, "drafter.attention");
    if (auto n = s["draft_tokens"]) {
      const auto k = r.integer_or_auto(n, "drafter.draft_tokens", 1, 64);
      d.draft_auto = !k;
      if (k) d.draft_tokens = static_cast<int>(*k);
    }
    if (auto n = s["draft_max"]) d.draft_max = static_cast<int>(r.integer(n, "drafter.draft_max", 1, DraftLength::kMax));
    if (auto n = s["convention"]) {
      if (r.choice(n, "drafter.convention", {"specula", "llamacpp"}) == "llamacpp") {
        d.convention = DraftConvention::LlamaCpp;
        if (d.draft_auto)
          fail("{}: drafter.convention llamacpp drafts a fixed number of tokens per round, as llama.cpp does; give "
               "drafter.draft_tokens a number, not auto", r.where(n, "drafter.convention"));
      }
    }
    if (auto o = s["options"]) d.options = r.json(o, "drafter.options", d.options_at);
    p.drafter = d;
  }
  if (auto s = root["sampler"]; s && !s.IsNull()) {
    r.check_section(s, "sampler", {{"plugin", Kind::String}, {"temperature", Kind::Float}, {"top_k", Kind::Int},
                                   {"top_p", Kind::Float}, {"min_p", Kind::Float}, {"repetition_penalty", Kind::Float},
                                   {"presence_penalty", Kind::Float}, {"frequency_penalty", Kind::Float},
                                   {"logit_bias", Kind::Map},
                                   {"penalty_window", Kind::Int}, {"min_length", Kind::Int}, {"seed", Kind::Int},
                                   {"max_tokens", Kind::Int}, {"device", Kind::String}, {"stop", Kind::StringList},
                                   {"options", Kind::Map}});
    auto& sp = p.sampler.params;
    for (const char* key : {"temperature", "top_k", "top_p", "min_p", "repetition_penalty"})
      if (s[key]) p.sampler.given.push_back(key);
    if (auto n = s["plugin"]) p.sampler.plugin = r.string(n, "sampler.plugin");
    if (auto n = s["temperature"]) sp.temperature = static_cast<float>(r.number(n, "sampler.temperature", 0, 100));
    if (auto n = s["top_k"]) sp.top_k = static_cast<int32_t>(r.integer(n, "sampler.top_k", 0, kMaxInt));
    if (auto n = s["top_p"]) sp.top_p = static_cast<float>(r.number(n, "sampler.top_p", 0, 1));
    if (auto n = s["min_p"]) sp.min_p = static_cast<float>(r.number(n, "sampler.min_p", 0, 1));
    if (auto n = s["repetition_penalty"]) {
      sp.repetition_penalty = static_cast<float>(r.number(n, "sampler.repetition_penalty", 0.01, 100));
    }
    if (auto n = s["presence_penalty"]) sp.presence_penalty = static_cast<float>(r.number(n, "sampler.presence_penalty", -2, 2));
    if (auto n = s["frequency_penalty"])
      sp.frequency_penalty = static_cast<float>(r.number(n, "sampler.frequency_penalty", -2, 2));
    if (auto n = s["logit_bias"]; n && !n.IsNull()) {  // token id: bias, as the server's logit_bias
      if (!n.IsMap()) fail("{}: key 'sampler.logit_bias' must be a map of token id to bias", r.where(n, "sampler.logit_bias"));
      sp.logit_bias.clear();
      for (const auto& item : n) {
        const int64_t id = r.integer(item.first, "sampler.logit_bias", 0, kMaxInt);
        sp.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(r.number(item.second, "sampler.logit_bias", -100, 100)));
      }
    }
    if (auto n = s["penalty_window"]) sp.penalty_window = static_cast<int32_t>(r.integer(n, "sampler.penalty_window", 0, kMaxInt));
    if (auto n = s["min_length"]) sp.min_length = static_cast<int32_t>(r.integer(n, "sampler.min_length", 0, kMaxInt));
    if (auto n = s["seed"]) {
      const int64_t seed = r.integer(n, "sampler.seed", -1, std::numeric_limits<int64_t>::max());
      p.sampler.random_seed = seed == -1;  // as llama.cpp: -1 draws one (the commands print it)
      sp.seed = seed == -1 ? std::random_device{}() : static_cast<uint64_t>(seed);
    }
    if (auto n = s["max_tokens"]) p.sampler.max_tokens = static_cast<int>(r.integer(n, "sampler.max_tokens", 1, kMaxInt));
    if (auto n = s["stop"]) p.sampler.stop = r.string_list(n, "sampler.stop");
    if (auto o = s["options"]) p.sampler.options = r.json(o, "sampler.options", p.sampler.options_at);
    if (auto n = s["device"]) {
      const std::string d = r.choice(n, "sampler.device", {"auto", "on", "off"});
      sp.device = d == "auto" ? SamplingDevice::Auto : d == "on" ? SamplingDevice::On : SamplingDevice::Off;
    }
  }
  if (auto s = root["chat"]; s && !s.IsNull()) {
    r.check_section(s, "chat", {{"system", Kind::String}, {"enable_thinking", Kind::Bool}, {"show_thoughts", Kind::Bool},
                                {"context_full", Kind::String}});
    if (auto n = s["context_full"]) p.chat.drop_old_turns = r.choice(n, "chat.context_full", {"drop", "error"}) == "drop";
    if (auto n = s["system"]) p.chat.system = r.string(n, "chat.system");
    if (auto n = s["enable_thinking"]) p.chat.enable_thinking = r.boolean(n, "chat.enable_thinking");
    if (auto n = s["show_thoughts"]) p.chat.show_thoughts = r.boolean(n, "chat.show_thoughts");
  }
  return p;
}
}  // namespace

Pipeline load_pipeline(const fs::path& yaml_file, const std::vector<Override>& overrides) {
  std::ifstream in(yaml_file, std::ios::binary);
  if (!in) fail("pipeline file {} cannot be read (does it exist?)", yaml_file.string());
  std::stringstream text;
  text << in.rdbuf();
  fs::path base = fs::absolute(yaml_file).parent_path();
  return parse_pipeline(text.str(), yaml_file, base, overrides);
}

std::shared_ptr<ComputeBackend> make_backend(const Pipeline& p, const PluginHost& host) {
  return host.make_backend(p.backend.plugin, p.backend.options, p.backend.options_at);
}

namespace {
// The local path of a model the pipeline names: the locator's, else as written (PluginHost::open_model
// refuses an id).
fs::path locate_model(const ModelLocator& locate, const fs::path& model) {
  return locate.model ? locate.model(model) : model;
}
}  // namespace

std::shared_ptr<const ModelFile> open_target(const Pipeline& p, const PluginHost& host, const ModelLocator& locate) {
  return host.open_model(locate_model(locate, p.target.model), p.target.format);
}

std::shared_ptr<ModelLoader> target_loader(const Pipeline& p, const PluginHost& host, const ModelFile& file) {
  const auto& t = p.target;
  if (t.plugin.empty()) return host.find_model_loader(file, t.options, t.options_at);
  auto loader = host.make_model_loader(t.plugin, t.options, t.options_at);
  if (!loader->accepts(file)) {
    fail("model plugin '{}' ({}) does not accept {} (its architecture: '{}')", t.plugin, loader->architecture(),
         t.model.string(), file.architecture());
  }
  return loader;
}

namespace {
void check_context_length(const Pipeline& p, const ModelInfo& info) {
  if (p.target.context_length > 0 && info.context_length > 0 && p.target.context_length > info.context_length) {
    fail("context length {} exceeds the model's {} tokens ({}); lower target.context_length (--ctx-size)",
         p.target.context_length, info.context_length, p.target.model.string());
  }
}
}  // namespace

ModelInfo check_target(const Pipeline& p, const ModelLoader& loader, const ModelFile& file, const ComputeBackend& backend) {
  ModelInfo info = loader.check(file, backend, p.target.options);
  check_context_length(p, info);
  return info;
}

std::shared_ptr<const ModelFile> open_drafter(const Pipeline& p, const PluginHost& host, const ModelLocator& locate) {
  if (p.drafter->model != kAutoDrafter) return host.open_model(locate_model(locate, p.drafter->model), p.drafter->format);
  if (!locate.assistant)
    fail("drafter.model auto: {}'s -assistant repository is found by the model hub (specula/hub.hpp), and this "
         "program resolves no Hugging Face id", p.target.model.string());
  return host.open_model(locate.assistant(p.target.model), p.drafter->format);
}

std::shared_ptr<DrafterLoader> drafter_loader(const Pipeline& p, const PluginHost& host, const ModelFile& file) {
  const auto& d = *p.drafter;
  if (d.plugin.empty()) return host.find_drafter_loader(file, d.options, d.options_at);
  auto loader = host.make_drafter_loader(d.plugin, d.options, d.options_at);
  if (!loader->accepts(file)) {
    fail("drafter plugin '{}' ({}) does not accept {} (its architecture: '{}')", d.plugin, loader->architecture(),
         d.model.string(), file.architecture());
  }
  return loader;
}

void check_drafter(const Pipeline& p, const DrafterLoader& loader, const ModelFile& file, const ComputeBackend& backend,
                   const ModelInfo& target) {
  loader.check(file, backend, target, p.drafter->options);
}

std::shared_ptr<Sampler> make_sampler(const Pipeline& p, const PluginHost& host, const SamplingParams& params) {
  return host.make_sampler(p.sampler.plugin, params, p.sampler.options, p.sampler.options_at);
}

std::shared_ptr<Sampler> make_sampler(const Pipeline& p, const PluginHost& host) {
  return make_sampler(p, host, p.sampler.params);
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
  // Every check first, so that a bad pipeline fails before a weight is read (as `specula validate` does).
  std::shared_ptr<ModelLoader> target;
  std::shared_ptr<DrafterLoader> drafter;
  ModelParts target_parts, drafter_parts;  // empty: the standard parts
  ModelInfo info;
  section("backend", [&] { b.backend = make_backend(p, host); });
  section("target", [&] {
    b.target_file = open_target(p, host, options.locate);
    target = target_loader(p, host, *b.target_file);
    if (!p.target.lm_head.empty()) target_parts.lm_head = host.make_lm_head(p.target.lm_head);
    if (!p.target.attention.empty()) target_parts.attention = host.make_attention(p.target.attention);
    info = check_target(p, *target, *b.target_file, *b.backend);
  });
  const bool with_drafter = p.drafter && options.load_drafter;
  if (with_drafter) {
    section("drafter", [&] {
      b.drafter_file = open_drafter(p, host, options.locate);
      drafter = drafter_loader(p, host, *b.drafter_file);
      if (!p.drafter->lm_head.empty()) drafter_parts.lm_head = host.make_lm_head(p.drafter->lm_head);
      if (!p.drafter->attention.empty()) drafter_parts.attention = host.make_attention(p.drafter->attention);
      check_drafter(p, *drafter, *b.drafter_file, *b.backend, info);
    });
  }
  section("sampler", [&] {
    b.sampling = generation_defaults(p, b.target_file.get());
    b.sampler = make_sampler(p, host, b.sampling);
  });
  section("target", [&] {
    b.target = target->load(b.target_file, b.backend, p.target.options, target_parts);
    if (!b.target) fail("model plugin returned no model for {}", p.target.model.string());
    check_context_length(p, b.target->info());  // for model plugins whose check() knows nothing
  });
  if (with_drafter) {
    section("drafter", [&] {
      b.drafter = drafter->load(b.drafter_file, b.backend, b.target->info(), p.drafter->options, drafter_parts);
      if (!b.drafter) fail("drafter plugin returned no drafter for {}", p.drafter->model.string());
    });
  }
  return b;
}

SamplingParams generation_defaults(const Pipeline& p, const ModelFile* target_file) {
  SamplingParams s = p.sampler.params;
  if (!target_file) return s;
  const auto& md = target_file->metadata();
  const auto& given = p.sampler.given;
  auto is_given = [&](const char* key) { return std::find(given.begin(), given.end(), key) != given.end(); };
  // A value within its range, for a key the pipeline leaves unset; anything else is ignored.
  auto number = [&](const nlohmann::json& from, const char* name, const char* key, auto& out, double lo, double hi) {
    if (is_given(key)) return;
    auto it = from.find(name);
    if (it == from.end() || !it->is_number()) return;
    const double v = it->template get<double>();
    if (!(v >= lo && v <= hi)) return;
    out = static_cast<std::decay_t<decltype(out)>>(v);
  };
  // A GGUF's general.sampling.* keys (llama.cpp's names, written by its converter from generation_config.json).
  number(md, "general.sampling.temp", "temperature", s.temperature, 0, 100);
  number(md, "general.sampling.top_k", "top_k", s.top_k, 0, 1 << 30);
  number(md, "general.sampling.top_p", "top_p", s.top_p, 1e-6, 1);
  number(md, "general.sampling.min_p", "min_p", s.min_p, 0, 1);
  number(md, "general.sampling.penalty_repeat", "repetition_penalty", s.repetition_penalty, 0.01, 100);
  // A checkpoint directory's generation_config.json.
  const auto g = md.find("generation_config");
  if (g == md.end() || !g->is_object()) return s;
  number(*g, "temperature", "temperature", s.temperature, 0, 100);
  number(*g, "top_k", "top_k", s.top_k, 0, 1 << 30);
  number(*g, "top_p", "top_p", s.top_p, 1e-6, 1);
  number(*g, "min_p", "min_p", s.min_p, 0, 1);
  number(*g, "repetition_penalty", "repetition_penalty", s.repetition_penalty, 0.01, 100);
  const auto d = g->find("do_sample");
  if (d != g->end() && d->is_boolean() && !d->get<bool>() && !is_given("temperature")) s.temperature = 0.0f;
  return s;
}

void apply_drafting(const Pipeline& p, GenerationOptions& o) {
  if (!p.drafter) return;
  o.draft_tokens = p.drafter->draft_tokens;  // with draft_auto: the first length (DraftLength clamps it)
  o.draft_auto = p.drafter->draft_auto;
  o.draft_max = p.drafter->draft_max;
  o.convention = p.drafter->convention;
}

}  // namespace specula::core

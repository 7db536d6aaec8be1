#include "cli_common.hpp"

#include <iostream>
#include <sstream>

#include <fmt/format.h>

#include "specula/error.hpp"
#include "specula/log.hpp"

namespace specula::cli {

bool parse_args(const std::vector<std::string>& args, const po::options_description& desc,
                const po::positional_options_description& pos, po::variables_map& vm) {
  try {
    po::store(po::command_line_parser(args).options(desc).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << desc << "\n";
      return false;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    fail("{} (see --help)", e.what());
  }
  apply_log_options(vm);
  return true;
}

void add_log_options(po::options_description& desc) {
  desc.add_options()("verbose,v", po::bool_switch(), "log debug messages (plugin discovery, timings)")(
      "quiet,q", po::bool_switch(), "log warnings and errors only");
}

void apply_log_options(const po::variables_map& vm) {
  if (vm.count("verbose") && vm["verbose"].as<bool>()) set_log_level(LogLevel::Debug);
  if (vm.count("quiet") && vm["quiet"].as<bool>()) set_log_level(LogLevel::Warn);
}

void add_model_options(po::options_description& desc, ModelArgs& a) {
  desc.add_options()
      ("pipeline", po::value(&a.pipeline), "pipeline YAML (also the first positional argument)")
      ("model,m", po::value(&a.model), "target checkpoint (GGUF file or safetensors directory); overrides target.model")
      ("backend,b", po::value(&a.backend), "compute backend plugin (default onednn); overrides backend.plugin")
      ("drafter", po::value(&a.drafter), "drafter checkpoint for speculative decoding; overrides drafter.model")
      ("sampler", po::value(&a.sampler), "sampler plugin (default standard); overrides sampler.plugin")
      ("plugin-path", po::value(&a.plugin_paths)->composing(), "directory searched for plugins first (repeatable)")
      ("context-length", po::value(&a.context_length), "context length in tokens (default: the model's)")
      ("draft-tokens", po::value(&a.draft_tokens), "tokens drafted per speculative step (default 3)");
}

void add_sampling_options(po::options_description& desc, SamplingArgs& a) {
  desc.add_options()
      ("temperature,t", po::value<float>()->notifier([&a](float v) { a.temperature = v; }), "0 = greedy (default)")
      ("top-k", po::value<int32_t>()->notifier([&a](int32_t v) { a.top_k = v; }), "keep the k most likely tokens (0 = off)")
      ("top-p", po::value<float>()->notifier([&a](float v) { a.top_p = v; }), "nucleus sampling mass (1 = off)")
      ("repeat-penalty", po::value<float>()->notifier([&a](float v) { a.repeat_penalty = v; }), "repetition penalty (1 = off)")
      ("seed", po::value<uint64_t>()->notifier([&a](uint64_t v) { a.seed = v; }), "random seed")
      ("max-tokens,n", po::value<int>()->notifier([&a](int v) { a.max_tokens = v; }), "tokens to generate at most (default 256)");
}

void apply_sampling_args(const SamplingArgs& a, core::SamplerConfig& s) {
  if (a.temperature) {
    if (*a.temperature < 0) fail("--temperature must be >= 0, got {}", *a.temperature);
    s.params.temperature = *a.temperature;
  }
  if (a.top_k) {
    if (*a.top_k < 0) fail("--top-k must be >= 0, got {}", *a.top_k);
    s.params.top_k = *a.top_k;
  }
  if (a.top_p) {
    if (*a.top_p <= 0 || *a.top_p > 1) fail("--top-p must be in (0, 1], got {}", *a.top_p);
    s.params.top_p = *a.top_p;
  }
  if (a.repeat_penalty) {
    if (*a.repeat_penalty <= 0) fail("--repeat-penalty must be > 0, got {}", *a.repeat_penalty);
    s.params.repetition_penalty = *a.repeat_penalty;
  }
  if (a.seed) s.params.seed = *a.seed;
  if (a.max_tokens) {
    if (*a.max_tokens < 1) fail("--max-tokens must be >= 1, got {}", *a.max_tokens);
    s.max_tokens = *a.max_tokens;
  }
}

core::Pipeline resolve_pipeline(const ModelArgs& a) {
  core::Pipeline p;
  if (!a.pipeline.empty()) {
    p = core::load_pipeline(a.pipeline);
  } else if (a.model.empty()) {
    fail("no model: give a pipeline YAML (e.g. configs/default.yaml) or --model PATH");
  }
  namespace fs = std::filesystem;
  if (!a.model.empty()) p.target.model = fs::absolute(a.model).lexically_normal();
  if (!a.backend.empty()) p.backend.plugin = a.backend;
  if (!a.sampler.empty()) p.sampler.plugin = a.sampler;
  if (!a.drafter.empty()) {
    if (!p.drafter) p.drafter = core::DrafterConfig{};
    p.drafter->model = fs::absolute(a.drafter).lexically_normal();
  }
  if (a.context_length < 0) fail("--context-length must be >= 0, got {}", a.context_length);
  if (a.context_length > 0) p.target.context_length = a.context_length;
  if (a.draft_tokens < 0) fail("--draft-tokens must be >= 0, got {}", a.draft_tokens);
  if (a.draft_tokens > 0) {
    if (!p.drafter) fail("--draft-tokens needs a drafter (--drafter PATH or a drafter section)");
    p.drafter->draft_tokens = a.draft_tokens;
  }
  return p;
}

std::unique_ptr<core::PluginHost> make_host(const core::Pipeline& pipeline, const std::vector<std::string>& plugin_paths) {
  std::vector<std::filesystem::path> first(plugin_paths.begin(), plugin_paths.end());
  first.insert(first.end(), pipeline.plugin_paths.begin(), pipeline.plugin_paths.end());
  auto host = std::make_unique<core::PluginHost>();
  host->discover(core::plugin_search_path(first));
  for (const auto& r : host->rejected()) log_debug("{}", r.reason);
  return host;
}

Session open_session(const ModelArgs& args, const SamplingArgs* sampling, bool load_drafter) {
  Session s;
  s.pipeline = resolve_pipeline(args);
  if (sampling) apply_sampling_args(*sampling, s.pipeline.sampler);
  s.host = make_host(s.pipeline, args.plugin_paths);
  core::BuildOptions options;
  options.load_drafter = load_drafter;
  s.built = core::build_pipeline(s.pipeline, *s.host, options);
  return s;
}

std::vector<int32_t> parse_token_list(const std::string& text) {
  std::vector<int32_t> ids;
  std::string item;
  auto flush = [&] {
    if (item.empty()) return;
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v < 0 || v > INT32_MAX) {
      fail("token list '{}': '{}' is not a token id (expected non-negative integers separated by commas)", text, item);
    }
    ids.push_back(static_cast<int32_t>(v));
    item.clear();
  };
  for (char c : text) {
    if (c == ',' || c == ' ' || c == '\t' || c == '\n') {
      flush();
    } else {
      item += c;
    }
  }
  flush();
  if (ids.empty()) fail("token list '{}' holds no token id", text);
  return ids;
}

}  // namespace specula::cli

#include "cli_common.hpp"

#include <unistd.h>

#include <csignal>
#include <fstream>
#include <iostream>
#include <sstream>

#include <fmt/format.h>

#include "specula/hub.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"

namespace specula::cli {

namespace {
// `--seed -1`: program_options would read "-1" as an option; join a negative number to its flag.
std::vector<std::string> join_negative_values(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    const bool flag = a.size() > 2 && a.rfind("--", 0) == 0 && a.find('=') == std::string::npos;
    const bool negative = i + 1 < args.size() && args[i + 1].size() > 1 && args[i + 1][0] == '-' &&
                          (std::isdigit(static_cast<unsigned char>(args[i + 1][1])) || args[i + 1][1] == '.');
    if (flag && negative) {
      out.push_back(a + "=" + args[++i]);
    } else {
      out.push_back(a);
    }
  }
  return out;
}
}  // namespace

bool parse_args(const std::vector<std::string>& args, const po::options_description& desc,
                const po::positional_options_description& pos, po::variables_map& vm) {
  try {
    po::store(po::command_line_parser(join_negative_values(args)).options(desc).positional(pos).run(), vm);
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

namespace {

// A flag that sets pipeline key `key`; `path` values become absolute (they are relative to the working
// directory, not to the YAML file).
void add_key(po::options_description& desc, ModelArgs& a, const char* names, const char* key, const char* help,
             bool path = false, bool append = false) {
  std::string long_name = names;
  long_name = long_name.substr(0, long_name.find(','));
  const std::string flag = fmt::format("command line (--{})", long_name);
  auto add = [&a, key, flag, path, append](const std::string& v) {
    std::string value = v;
    // hf:// ids and `--drafter auto` are not paths (specula/hub.hpp).
    const bool not_a_path = core::hub::is_ref(v) || (std::string_view(key) == "drafter.model" && v == core::kAutoDrafter);
    if (path && !v.empty() && !not_a_path) value = std::filesystem::absolute(v).lexically_normal().string();
    a.overrides.push_back({key, value, flag, append});
  };
  if (append) {
    desc.add_options()(names, po::value<std::vector<std::string>>()->composing()->notifier(
                                  [add](const std::vector<std::string>& vs) { for (const auto& v : vs) add(v); }), help);
  } else {
    desc.add_options()(names, po::value<std::string>()->notifier(add), help);
  }
}

// A pipeline argument that is a checkpoint rather than a YAML file: a directory, or not *.yaml / *.yml.
bool is_model_path(const std::string& arg) {
  if (core::hub::is_ref(arg)) return true;
  const std::filesystem::path p(arg);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) return true;
  const std::string ext = p.extension().string();
  return ext != ".yaml" && ext != ".yml";
}

}  // namespace

void add_model_options(po::options_description& desc, ModelArgs& a) {
  desc.add_options()("pipeline", po::value(&a.pipeline),
                     "pipeline YAML, or a model file or directory to run with the default pipeline (also the first "
                     "positional argument)");
  add_key(desc, a, "model,m", "target.model",
          "target checkpoint (GGUF file, safetensors directory or hf://OWNER/REPO[@REV][:QUANT]); overrides target.model", true);
  add_key(desc, a, "backend,b", "backend.plugin", "compute backend plugin (default cpu); overrides backend.plugin");
  add_key(desc, a, "threads,t", "backend.options.threads", "backend threads (backend option threads; 0 = all cores)");
  add_key(desc, a, "drafter", "drafter.model",
          "drafter checkpoint for speculative decoding (a path, an hf:// id, or auto: the hf:// target's -assistant "
          "repository); overrides drafter.model", true);
  add_key(desc, a, "model-draft", "drafter.model", "the same as --drafter (llama.cpp's name)", true);
  add_key(desc, a, "sampler", "sampler.plugin", "sampler plugin (default standard); overrides sampler.plugin");
  desc.add_options()("plugin-path", po::value(&a.plugin_paths)->composing(), "directory searched for plugins first (repeatable)");
  add_key(desc, a, "ctx-size,c", "target.context_length", "context length in tokens (0 = the model's)");
  add_key(desc, a, "context-length", "target.context_length", "the same as --ctx-size");
  add_key(desc, a, "draft-max", "drafter.draft_tokens", "tokens drafted per speculative step, 1..64 (default 3)");
  add_key(desc, a, "draft-tokens", "drafter.draft_tokens", "the same as --draft-max");
  add_key(desc, a, "mtp-convention", "drafter.convention",
          "speculative loop: specula (default) or llamacpp (llama.cpp's draft-mtp loop; docs/gemma4-assistant.md)");
}

void add_sampling_options(po::options_description& desc, ModelArgs& a) {
  add_key(desc, a, "temp", "sampler.temperature", "temperature, 0 = greedy (default)");
  add_key(desc, a, "temperature", "sampler.temperature", "the same as --temp");
  add_key(desc, a, "top-k", "sampler.top_k", "keep the k most likely tokens (0 = off)");
  add_key(desc, a, "top-p", "sampler.top_p", "nucleus sampling mass (1 = off)");
  add_key(desc, a, "min-p", "sampler.min_p", "drop tokens below min-p times the most likely one's probability (0 = off)");
  add_key(desc, a, "repeat-penalty", "sampler.repetition_penalty", "repetition penalty (1 = off)");
  add_key(desc, a, "presence-penalty", "sampler.presence_penalty",
          "subtract X from the logit of every token already generated, -2..2 (0 = off; host sampling)");
  add_key(desc, a, "frequency-penalty", "sampler.frequency_penalty",
          "subtract X times its count from the logit of every generated token, -2..2 (0 = off; host sampling)");
  add_key(desc, a, "repeat-last-n", "sampler.penalty_window", "how many recent tokens the penalty looks at (default 64)");
  add_key(desc, a, "seed", "sampler.seed", "random seed (-1 = a random one, printed)");
  add_key(desc, a, "n-predict,n", "sampler.max_tokens", "tokens to generate at most (default 256)");
  add_key(desc, a, "max-tokens", "sampler.max_tokens", "the same as --n-predict");
  add_key(desc, a, "stop", "sampler.stop", "stop string: generation ends before it (repeatable)", false, true);
}

bool parse_model_command(const std::vector<std::string>& args, po::options_description& desc, ModelArgs& model,
                         po::variables_map& vm, bool sampling) {
  add_model_options(desc, model);
  if (sampling) add_sampling_options(desc, model);
  add_log_options(desc);
  po::positional_options_description pos;
  pos.add("pipeline", 1);
  if (!parse_args(args, desc, pos, vm)) return false;
  if (vm.count("system")) model.overrides.push_back({"chat.system", vm["system"].as<std::string>(), "command line (--system)"});
  return true;
}

core::Pipeline resolve_pipeline(const ModelArgs& a) {
  std::vector<core::Override> overrides = a.overrides;
  if (!a.pipeline.empty() && is_model_path(a.pipeline)) {
    for (const auto& o : overrides) {
      if (o.key == "target.model") fail("{} and --model both name the model; give one", a.pipeline);
    }
    const std::string model =
        core::hub::is_ref(a.pipeline) ? a.pipeline : std::filesystem::absolute(a.pipeline).lexically_normal().string();
    overrides.insert(overrides.begin(), {"target.model", model,
                                         fmt::format("command line (model {})", a.pipeline)});
    return core::default_pipeline(overrides);
  }
  if (a.pipeline.empty()) return core::default_pipeline(overrides);
  return core::load_pipeline(a.pipeline, overrides);
}

std::unique_ptr<core::PluginHost> make_host(const core::Pipeline& pipeline, const std::vector<std::string>& plugin_paths) {
  std::vector<std::filesystem::path> first(plugin_paths.begin(), plugin_paths.end());
  first.insert(first.end(), pipeline.plugin_paths.begin(), pipeline.plugin_paths.end());
  auto host = std::make_unique<core::PluginHost>();
  host->discover(core::plugin_search_path(first));
  for (const auto& r : host->rejected()) log_debug("{}", r.reason);
  return host;
}

Session open_session(const ModelArgs& args, bool load_drafter) {
  Session s;
  s.pipeline = resolve_pipeline(args);
  if (s.pipeline.sampler.random_seed) {
    log_info("seed: {} (drawn at random; --seed {} repeats it)", s.pipeline.sampler.params.seed,
             s.pipeline.sampler.params.seed);
  }
  s.host = make_host(s.pipeline, args.plugin_paths);
  core::BuildOptions options;
  options.load_drafter = load_drafter;
  options.locate = core::hub::model_locator();  // hf:// ids and drafter auto
  s.built = core::build_pipeline(s.pipeline, *s.host, options);
  return s;
}

std::string read_text_file(const std::string& path, const std::string& flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{} {}: cannot be read (does it exist?)", flag, path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

namespace {
std::atomic<bool> g_interrupted{false};
std::atomic<int> g_signals{0};
void on_sigint(int) {
  if (g_signals.fetch_add(1) >= 1) _exit(130);  // the second Ctrl+C: leave now
  g_interrupted = true;
}
}  // namespace

void install_interrupt_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a read of the chat prompt returns, so Ctrl+C there ends the chat
  sigaction(SIGINT, &sa, nullptr);
}

const std::atomic<bool>* interrupt_flag() { return &g_interrupted; }

void clear_interrupt() {
  g_interrupted = false;
  g_signals = 0;
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

// `specula tokenize`: text to token ids with a checkpoint's tokenizer (GGUF file, safetensors directory,
// or a directory / file holding just tokenizer.json), and an encode throughput benchmark.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/hub.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/tokenizer.hpp"

namespace {

namespace cli = specula::cli;
namespace fs = std::filesystem;

// A ModelFile that is only a tokenizer.json (+ tokenizer_config.json beside it): lets the command read
// tokenizer-only directories that no format plugin opens, through the same make_tokenizer() path.
class TokenizerJsonFile final : public specula::ModelFile {
 public:
  explicit TokenizerJsonFile(const fs::path& json) : path_(json) {
    md_["tokenizer_json_path"] = json.string();
    const fs::path config = json.parent_path() / "tokenizer_config.json";
    if (fs::exists(config)) {
      std::ifstream in(config);
      try {
        md_["tokenizer_config"] = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        specula::fail("{}: not valid JSON: {}", config.string(), e.what());
      }
    }
  }
  std::string format() const override { return "tokenizer.json"; }
  fs::path path() const override { return path_; }
  const nlohmann::json& metadata() const override { return md_; }
  const std::vector<specula::TensorInfo>& tensors() const override { return tensors_; }
  const specula::TensorInfo* find(const std::string&) const override { return nullptr; }

 private:
  fs::path path_;
  nlohmann::json md_ = nlohmann::json::object();
  std::vector<specula::TensorInfo> tensors_;
};

std::shared_ptr<const specula::Tokenizer> open_tokenizer(const std::string& path, const std::vector<std::string>& plugin_paths) {
  const fs::path p(path);
  if (!specula::core::hub::is_ref(path) && !fs::exists(p)) specula::fail("--model {}: no such file or directory", path);
  if (p.filename() == "tokenizer.json") return specula::make_tokenizer(TokenizerJsonFile(p));
  specula::core::PluginHost host;
  std::vector<fs::path> first(plugin_paths.begin(), plugin_paths.end());
  host.discover(specula::core::plugin_search_path(first));
  try {
    auto file = host.open_model(specula::core::hub::local_path(p));  // an hf:// id: resolved first
    return specula::make_tokenizer(*file);
  } catch (const specula::Error& e) {
    // A directory with only the tokenizer files is fine for tokenizing.
    if (fs::is_directory(p) && fs::exists(p / "tokenizer.json")) {
      specula::log_debug("{}: {}; reading {}", path, e.what(), (p / "tokenizer.json").string());
      return specula::make_tokenizer(TokenizerJsonFile(p / "tokenizer.json"));
    }
    throw;
  }
}

// Pieces are shown with control characters escaped so the table stays one line per token.
std::string printable(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out;
}

int run_tokenize(const std::vector<std::string>& args) {
  std::string model, text, file;
  std::vector<std::string> plugin_paths;
  bool bos = false, parse_special = false, as_json = false, bench = false;
  cli::po::options_description desc(
      "usage: specula tokenize --model PATH [--bos] [--parse-special] [--json] [--] TEXT\n"
      "       specula tokenize --model PATH --file TEXT_FILE [--bench]\n\n"
      "Prints the token ids of TEXT. PATH is a GGUF file, a safetensors checkpoint directory, or a\n"
      "directory (or file) with tokenizer.json. No BOS is added unless --bos; text spelling a control\n"
      "token (<bos>, <|turn>, ...) is only read as that token with --parse-special.\n\noptions");
  desc.add_options()("help,h", "show this help")("model,m", cli::po::value(&model), "checkpoint or tokenizer path")(
      "text", cli::po::value(&text), "the text (positional)")("file,f", cli::po::value(&file), "read the text from a file")(
      "bos", cli::po::bool_switch(&bos), "prepend the BOS token")(
      "parse-special", cli::po::bool_switch(&parse_special), "read special-token text as special tokens")(
      "json", cli::po::bool_switch(&as_json), "print {\"ids\": [...], \"pieces\": [...]}")(
      "bench", cli::po::bool_switch(&bench), "measure encode throughput (MB/s) on the text instead")(
      "plugin-path", cli::po::value(&plugin_paths)->composing(), "directory searched for plugins first");
  cli::add_log_options(desc);
  cli::po::positional_options_description pos;
  pos.add("text", 1);
  cli::po::variables_map vm;
  if (!cli::parse_args(args, desc, pos, vm)) return 0;
  if (model.empty()) specula::fail("--model PATH is required");
  if (!file.empty()) {
    if (vm.count("text")) specula::fail("give either TEXT or --file, not both");
    std::ifstream in(file, std::ios::binary);
    if (!in) specula::fail("--file {}: cannot open", file);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  } else if (!vm.count("text")) {
    specula::fail("no TEXT given (use -- TEXT for text starting with '-', or --file)");
  }

  const auto load_start = std::chrono::steady_clock::now();
  const auto tok = open_tokenizer(model, plugin_paths);
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();

  if (bench) {
    if (text.empty()) specula::fail("--bench needs some text");
    size_t tokens = 0;
    int rounds = 0;
    const auto t0 = std::chrono::steady_clock::now();
    double seconds = 0;
    // Whole passes over the text until at least one second has gone by.
    do {
      tokens = tok->encode(text, bos, parse_special).size();
      ++rounds;
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } while (seconds < 1.0);
    const double mb = static_cast<double>(text.size()) * rounds / 1e6;
    fmt::print("tokenizer load {:.3f} s; encode: {:.3f} MB -> {} tokens, {} passes in {:.3f} s: {:.2f} MB/s, {:.0f} tokens/s\n",
               load_s, text.size() / 1e6, tokens, rounds, seconds, mb / seconds, tokens * rounds / seconds);
    return 0;
  }

  const auto ids = tok->encode(text, bos, parse_special);
  if (as_json) {
    nlohmann::json j;
    j["ids"] = ids;
    j["pieces"] = nlohmann::json::array();
    for (int32_t id : ids) j["pieces"].push_back(tok->piece(id));
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  fmt::print("{:>6}  {:>7}  {}\n", "#", "id", "piece");
  for (size_t i = 0; i < ids.size(); ++i) fmt::print("{:>6}  {:>7}  {}\n", i, ids[i], printable(tok->piece(ids[i])));
  fmt::print("{} tokens\n", ids.size());
  return 0;
}

}  // namespace

SPECULA_COMMAND("tokenize", "print the token ids of a text (GGUF / safetensors / tokenizer.json)", run_tokenize);

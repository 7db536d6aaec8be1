// `specula inspect FILE_OR_DIR`: metadata (long arrays and strings summarised), tensor table and totals of
// any checkpoint a format plugin can open (GGUF, Hugging Face safetensors, MLX).
#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/error.hpp"
#include "specula/hub.hpp"
#include "specula/model_file.hpp"

namespace {

using nlohmann::json;

constexpr size_t kArrayHead = 8;     // elements shown of a long array
constexpr size_t kLongArray = 16;    // arrays longer than this are summarised
constexpr size_t kLongString = 160;  // strings longer than this are cut

// A copy of `v` with long arrays reduced to their first elements and long strings cut. Without `notes`
// (text output) a cut array ends with a note string; with it (--json) arrays stay typed and each cut
// is recorded in `notes` under its key path: {"shown": 8, "length": 30}.
json summarise(const json& v, json* notes = nullptr, const std::string& path = "") {
  if (v.is_array()) {
    json out = json::array();
    const size_t n = v.size() > kLongArray ? kArrayHead : v.size();
    for (size_t i = 0; i < n; ++i) out.push_back(summarise(v[i], notes, fmt::format("{}[{}]", path, i)));
    if (n < v.size()) {
      if (notes) (*notes)[path] = {{"shown", n}, {"length", v.size()}};
      else out.push_back(fmt::format("... ({} more, {} in all)", v.size() - n, v.size()));
    }
    return out;
  }
  if (v.is_object()) {
    json out = json::object();
    for (auto it = v.begin(); it != v.end(); ++it)
      out[it.key()] = summarise(*it, notes, path.empty() ? it.key() : path + "." + it.key());
    return out;
  }
  if (v.is_string() && v.get_ref<const std::string&>().size() > kLongString) {
    const auto& s = v.get_ref<const std::string&>();
    if (notes) {
      (*notes)[path] = {{"shown", kLongString}, {"length", s.size()}};
      return s.substr(0, kLongString);
    }
    return s.substr(0, kLongString) + fmt::format("... ({} chars)", s.size());
  }
  return v;
}

std::string dump(const json& v, int indent = -1) { return v.dump(indent, ' ', false, json::error_handler_t::replace); }

uint64_t tensor_bytes(const specula::TensorInfo& t) {
  return t.data.size() + t.quant.scales.size() + t.quant.biases.size();
}

std::string type_label(const specula::TensorInfo& t) {
  if (t.type != specula::DType::MLX_AFFINE) return std::string(specula::dtype_name(t.type));
  return fmt::format("MLX{}b/g{}/{}", t.quant.bits, t.quant.group_size, specula::dtype_name(t.quant.scale_type));
}

std::string shape_label(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.2f} {}", v, units[u]);
}

int run_inspect(const std::vector<std::string>& args) {
  namespace cli = specula::cli;
  std::string path, format;
  std::vector<std::string> plugin_paths;
  bool as_json = false, full = false, no_tensors = false;
  cli::po::options_description desc(
      "usage: specula inspect FILE_OR_DIR [--json] [--format NAME] [--full] [--no-tensors]\n\n"
      "Opens a checkpoint with the format plugins (GGUF file, split GGUF, Hugging Face or MLX safetensors\n"
      "file or directory) and prints its metadata, a tensor table (name, type, shape, bytes) and totals.\n"
      "Arrays longer than 16 elements and strings longer than 160 characters are summarised unless --full.\n\n"
      "options");
  desc.add_options()("help,h", "show this help")("path", cli::po::value(&path), "checkpoint file or directory")(
      "json", cli::po::bool_switch(&as_json), "print one JSON object")(
      "format", cli::po::value(&format), "use this format plugin instead of asking each one (gguf, safetensors)")(
      "full", cli::po::bool_switch(&full), "print metadata in full (no summarising)")(
      "no-tensors", cli::po::bool_switch(&no_tensors), "omit the tensor table")(
      "plugin-path", cli::po::value(&plugin_paths)->composing(), "directory searched first for plugins (repeatable)");
  cli::add_log_options(desc);
  cli::po::positional_options_description pos;
  pos.add("path", 1);
  cli::po::variables_map vm;
  if (!cli::parse_args(args, desc, pos, vm)) return 0;
  if (path.empty()) specula::fail("inspect: give a checkpoint file or directory (see --help)");

  specula::core::PluginHost host;
  host.discover(specula::core::plugin_search_path({plugin_paths.begin(), plugin_paths.end()}));
  const auto file = host.open_model(specula::core::hub::local_path(path), format);  // an hf:// id: resolved first

  uint64_t total_bytes = 0, total_elems = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> by_type;  // label -> (tensors, bytes)
  for (const auto& t : file->tensors()) {
    const uint64_t b = tensor_bytes(t);
    total_bytes += b;
    total_elems += static_cast<uint64_t>(t.elements());
    auto& e = by_type[std::string(specula::dtype_name(t.type))];
    e.first += 1;
    e.second += b;
  }
  json summarised = json::object();  // --json: what was cut, by key path
  const json metadata = full ? file->metadata() : summarise(file->metadata(), as_json ? &summarised : nullptr);

  if (as_json) {
    json j;
    j["path"] = file->path().string();
    j["format"] = file->format();
    j["metadata"] = metadata;
    if (!summarised.empty()) j["metadata_summarised"] = summarised;  // arrays stay typed; --full shows all
    if (!no_tensors) {
      j["tensors"] = json::array();
      for (const auto& t : file->tensors()) {
        json e = {{"name", t.name}, {"type", std::string(specula::dtype_name(t.type))}, {"shape", t.shape},
                  {"bytes", tensor_bytes(t)}};
        if (t.type == specula::DType::MLX_AFFINE)
          e["quant"] = {{"bits", t.quant.bits}, {"group_size", t.quant.group_size},
                        {"scale_type", std::string(specula::dtype_name(t.quant.scale_type))}};
        j["tensors"].push_back(std::move(e));
      }
    }
    json types = json::object();
    for (const auto& [k, v] : by_type) types[k] = {{"tensors", v.first}, {"bytes", v.second}};
    j["totals"] = {{"tensors", file->tensors().size()}, {"elements", total_elems}, {"bytes", total_bytes},
                   {"by_type", types}};
    fmt::print("{}\n", dump(j, 2));
    return 0;
  }

  fmt::print("{}\nformat: {}\n\nmetadata ({} keys):\n", file->path().string(), file->format(), metadata.size());
  for (auto it = metadata.begin(); it != metadata.end(); ++it) {
    if (it->is_object()) {
      fmt::print("  {}:\n", it.key());
      for (auto jt = it->begin(); jt != it->end(); ++jt) fmt::print("    {} = {}\n", jt.key(), dump(*jt));
    } else {
      fmt::print("  {} = {}\n", it.key(), dump(*it));
    }
  }
  if (!no_tensors) {
    size_t w = 4;
    for (const auto& t : file->tensors()) w = std::max(w, t.name.size());
    fmt::print("\ntensors ({}):\n  {:<{}}  {:<18}  {:<22}  {:>12}\n", file->tensors().size(), "name", w, "type", "shape",
               "bytes");
    for (const auto& t : file->tensors())
      fmt::print("  {:<{}}  {:<18}  {:<22}  {:>12}\n", t.name, w, type_label(t), shape_label(t.shape), tensor_bytes(t));
  }
  fmt::print("\ntotals: {} tensors, {} elements, {} ({} bytes)\n", file->tensors().size(), total_elems,
             human_bytes(total_bytes), total_bytes);
  for (const auto& [k, v] : by_type) fmt::print("  {:<12} {:>6} tensors  {}\n", k, v.first, human_bytes(v.second));
  return 0;
}

}  // namespace

SPECULA_COMMAND("inspect", "show a checkpoint's metadata, tensors and totals (GGUF, safetensors, MLX)", run_inspect);

// `specula convert SRC --out FILE.gguf`: a Hugging Face or MLX checkpoint to GGUF. The format plugins open
// SRC, the converter plugin that accepts it (the model plugins provide them) plans the file, and the SDK
// streams it through the format plugin that writes GGUF: one tensor at a time, row chunks dequantized and
// converted to the out type.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/convert.hpp"
#include "specula/error.hpp"
#include "specula/hub.hpp"

namespace {

namespace fs = std::filesystem;

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

int run_convert(const std::vector<std::string>& args) {
  namespace cli = specula::cli;
  std::string src, out, outtype_name = "auto", schema, name;
  std::vector<std::string> plugin_paths;
  cli::po::options_description desc(
      "usage: specula convert SRC --out FILE.gguf [--outtype f32|f16|bf16|q8_0|auto] [--schema NAME] [--name NAME]\n\n"
      "Converts a Hugging Face safetensors directory (one file or shards with model.safetensors.index.json)\n"
      "or an MLX directory (quantized weights are dequantized) to GGUF in llama.cpp's layout. The converter\n"
      "comes from the model plugin that knows SRC's architecture (config.json): gemma4 for Gemma 4 targets,\n"
      "gemma4-assistant for their MTP drafters (--schema seed, the default, or upstream).\n"
      "--outtype follows llama.cpp's converter: 1-D tensors, norms and the MoE router stay F32; Q8_0 rows\n"
      "that are not whole 32-value blocks are written as F16; auto (the default) keeps the checkpoint's\n"
      "16-bit type (BF16 or F16). The file appears only once complete.\n\n"
      "options");
  desc.add_options()("help,h", "show this help")("src", cli::po::value(&src), "checkpoint directory (or .safetensors file)")(
      "out,o", cli::po::value(&out), "the GGUF file to write")(
      "outtype", cli::po::value(&outtype_name), "tensor type: f32, f16, bf16, q8_0 or auto (default: the checkpoint's BF16/F16)")(
      "schema", cli::po::value(&schema), "GGUF layout, where the converter offers several (gemma4-assistant: seed, upstream)")(
      "name", cli::po::value(&name), "general.name (default: the checkpoint directory's name)")(
      "plugin-path", cli::po::value(&plugin_paths)->composing(), "directory searched first for plugins (repeatable)");
  cli::add_log_options(desc);
  cli::po::positional_options_description pos;
  pos.add("src", 1);
  cli::po::variables_map vm;
  if (!cli::parse_args(args, desc, pos, vm)) return 0;
  if (src.empty()) specula::fail("convert: give the checkpoint directory to convert (see --help)");
  if (out.empty()) specula::fail("convert: give the output file with --out FILE.gguf (see --help)");
  auto outtype = specula::convert_outtype(outtype_name);
  if (!outtype && outtype_name != "auto")
    specula::fail("convert: --outtype '{}' is not one of f32, f16, bf16, q8_0, auto", outtype_name);
  const fs::path out_path = fs::absolute(out);
  std::error_code ec;
  if (!fs::is_directory(out_path.parent_path(), ec))
    specula::fail("convert: the output directory {} does not exist", out_path.parent_path().string());
  if (fs::is_directory(out_path, ec)) specula::fail("convert: --out {} is a directory; give a file name", out);

  const auto start = std::chrono::steady_clock::now();
  specula::core::PluginHost host;
  host.discover(specula::core::plugin_search_path({plugin_paths.begin(), plugin_paths.end()}));
  const auto file = host.open_model(specula::core::hub::local_path(src));  // an hf:// id: resolved first
  if (file->format() == "gguf")
    specula::fail("convert: {} is already GGUF; convert reads Hugging Face and MLX checkpoints", src);
  if (!file->metadata().contains("config"))
    specula::fail("convert: {} has no config.json; a Hugging Face or MLX checkpoint names its architecture there",
                  src);
  const auto converter = host.find_converter(*file);
  if (!outtype) outtype = specula::auto_outtype(*file);
  const auto schemas = converter->schemas();
  if (!schema.empty() && std::find(schemas.begin(), schemas.end(), schema) == schemas.end())
    specula::fail("convert: --schema '{}' is not a layout of the {} converter ({})", schema, converter->architecture(),
                  schemas.empty() ? std::string("it has only one") : "expected " + join(schemas));

  const auto writer = host.make_writer("gguf");
  specula::gguf::Metadata metadata;
  const specula::ConvertOptions options{*outtype, schema, name};
  const auto tensors = converter->plan(*file, options, metadata);

  const bool tty = isatty(fileno(stderr));
  uint64_t bytes = 0;
  std::map<std::string, size_t> by_type;
  specula::write_converted(*writer, metadata, tensors, *outtype, out_path, [&](size_t i) {
    const auto type = specula::convert_tensor_type(tensors[i], *outtype);
    ++by_type[std::string(specula::dtype_name(type))];
    uint64_t tensor_bytes = *specula::dtype_row_bytes(type, static_cast<uint64_t>(tensors[i].shape.back()));
    for (size_t d = 0; d + 1 < tensors[i].shape.size(); ++d) tensor_bytes *= static_cast<uint64_t>(tensors[i].shape[d]);
    bytes += tensor_bytes;
    if (tty) fmt::print(stderr, "\r\033[K[{}/{}] {}", i + 1, tensors.size(), tensors[i].name);
  });
  if (tty) fmt::print(stderr, "\r\033[K");
  std::string types;
  for (const auto& [t, n] : by_type) types += fmt::format("{}{} {}", types.empty() ? "" : ", ", n, t);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print("converted {} ({} {}) to {}: {} tensors ({}), {:.1f} MiB of tensor data, in {:.1f} s\n", src,
             file->format(), converter->architecture(), out_path.string(), tensors.size(), types,
             static_cast<double>(bytes) / (1024.0 * 1024.0), seconds);
  return 0;
}

}  // namespace

SPECULA_COMMAND("convert", "convert a Hugging Face or MLX checkpoint to GGUF (llama.cpp's layout)", run_convert);

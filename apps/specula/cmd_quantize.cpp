// `specula quantize IN.gguf OUT.gguf TYPE`: llama-quantize's file types and per-tensor rules
// (specula/quantize.hpp, apps/quantize), streamed one slab of rows at a time, rows quantized on all cores. The GGUF is read
// and written through the `gguf` format plugin.
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/core/plugin_host.hpp"
#include "specula/quantize.hpp"
#include "specula/error.hpp"
#include "specula/hub.hpp"
#include "specula/log.hpp"

namespace {

namespace cli = specula::cli;
namespace core = specula::core;
using specula::dtype_name;

std::string type_list() {
  std::string out;
  for (const auto& t : core::quant_file_types())
    out += fmt::format("  {:<7} {:>2}  {}\n", t.name, t.ftype, t.summary);
  return out;
}

std::string mib(uint64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20)); }

// `--dry-run`: the type each tensor would get, without writing.
void print_plan(const core::PluginHost& host, const std::string& input, const core::QuantFileType& type, bool pure) {
  const auto file = core::open_quantize_input(host, core::hub::local_path(input));  // an hf:// id: resolved first
  for (const auto& p : core::plan_quantization(file->metadata(), file->tensors(), type, pure, input)) {
    std::string shape;
    for (const int64_t d : p.shape) shape += (shape.empty() ? "" : " x ") + std::to_string(d);
    fmt::print("{:<40} {:<18} {:>6} -> {}{}\n", p.name, shape, dtype_name(p.from), dtype_name(p.to),
               p.fallback ? "  (fallback: rows are not whole blocks)" : "");
  }
}

// One line on stderr, rewritten in place at most ten times a second.
class ProgressLine {
 public:
  void operator()(const core::QuantizeProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.bytes_written < p.bytes_total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    const double s = std::chrono::duration<double>(now - start_).count();
    std::fprintf(stderr, "\r[%4zu/%zu] %s / %s written, %.0f MiB/s  %.*s\x1b[K", p.tensor, p.tensors,
                 mib(p.bytes_written).c_str(), mib(p.bytes_total).c_str(),
                 s > 0 ? static_cast<double>(p.bytes_written) / (1 << 20) / s : 0.0, static_cast<int>(p.name.size()),
                 p.name.data());
    shown_ = true;
  }
  // Clears the line (before the summary, or an error message on the way out).
  void finish() {
    if (shown_) std::fputs("\r\x1b[K", stderr);
    shown_ = false;
  }
  ~ProgressLine() { finish(); }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_{};
  bool shown_ = false;
};

int run_quantize(const std::vector<std::string>& args) {
  std::string input, output, type_name;
  unsigned threads = 0;
  bool pure = false, dry_run = false;
  std::vector<std::string> plugin_paths;
  cli::po::options_description desc(
      "usage: specula quantize IN.gguf OUT.gguf TYPE [--threads N] [--pure] [--dry-run] [--plugin-path DIR]\n\n"
      "Quantizes a GGUF file the way llama.cpp's llama-quantize does: the same file types and per-tensor\n"
      "rules (1-D tensors and norms are kept, embeddings and attn_v / ffn_down get more bits in the mixes,\n"
      "rows that are not whole blocks fall back to a smaller block type or F16), the same tensor order and\n"
      "metadata (general.file_type, general.quantization_version). Already quantized tensors are\n"
      "dequantized and quantized again. The input is memory-mapped and the output streamed: memory stays\n"
      "at about one slab of rows, whatever the model's size.\n\n"
      "TYPE (case-insensitive, or llama.cpp's file type number):\n" +
      type_list() + "\noptions");
  desc.add_options()("help,h", "show this help")("input", cli::po::value(&input), "the GGUF file to quantize")(
      "output", cli::po::value(&output), "the GGUF file to write")("type", cli::po::value(&type_name),
                                                                   "the file type (see above)")(
      "threads,t", cli::po::value(&threads), "threads quantizing rows (default: all cores)")(
      "pure", cli::po::bool_switch(&pure),
      "every quantizable tensor gets TYPE's base type (llama-quantize --pure); fallbacks still apply")(
      "dry-run", cli::po::bool_switch(&dry_run), "print the type each tensor would get; write nothing")(
      "plugin-path", cli::po::value(&plugin_paths)->composing(),
      "directory searched first for plugins (repeatable; the gguf format plugin reads and writes the files)");
  cli::add_log_options(desc);
  cli::po::positional_options_description pos;
  pos.add("input", 1).add("output", 1).add("type", 1);
  cli::po::variables_map vm;
  if (!cli::parse_args(args, desc, pos, vm)) return 0;
  // With --dry-run the output may be left out: `quantize IN TYPE --dry-run`.
  if (dry_run && type_name.empty() && !output.empty()) std::swap(type_name, output);
  if (input.empty() || type_name.empty() || (output.empty() && !dry_run))
    specula::fail("quantize: give IN.gguf OUT.gguf TYPE (see --help)");
  const core::QuantFileType* type = core::find_quant_file_type(type_name);
  if (!type)
    specula::fail("quantize: unknown TYPE '{}'; expected one of {} (or llama.cpp's file type number)", type_name,
                  core::quant_file_type_names());
  core::PluginHost host;
  host.discover(core::plugin_search_path({plugin_paths.begin(), plugin_paths.end()}));
  if (dry_run) {
    print_plan(host, input, *type, pure);
    return 0;
  }

  core::QuantizeOptions options;
  options.type = type;
  options.pure = pure;
  options.threads = threads;
  cli::install_interrupt_handler();
  options.cancel = cli::interrupt_flag();
  ProgressLine progress;
  if (isatty(STDERR_FILENO) && specula::log_enabled(specula::LogLevel::Info))
    options.on_progress = [&](const core::QuantizeProgress& p) { progress(p); };
  const core::QuantizeStats stats = core::quantize_gguf(host, core::hub::local_path(input), output, options);
  progress.finish();

  std::string counts;
  for (const auto& [t, n] : stats.type_counts) counts += fmt::format("{}{} {}", counts.empty() ? "" : ", ", n, dtype_name(t));
  specula::log_info("{} ({}) -> {} ({}) as {}{}: {} tensors ({}), {} converted{} in {:.1f} s", input,
                    mib(stats.input_bytes), output, mib(stats.output_bytes), type->name, pure ? " --pure" : "",
                    stats.tensors, counts, stats.converted,
                    stats.requantized ? fmt::format(" ({} requantized)", stats.requantized) : "", stats.seconds);
  return 0;
}

}  // namespace

SPECULA_COMMAND("quantize", "quantize a GGUF file with llama.cpp's types and rules (Q4_K_M, Q8_0, ...)",
                run_quantize);

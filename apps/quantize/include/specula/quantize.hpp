// Quantizing a GGUF file as llama.cpp's `llama-quantize` does: its file types (Q4_K_M, Q8_0, ...),
// its per-tensor type rules (which tensors are quantized at all, embeddings and output, the attn_v /
// ffn_down upgrades by layer position, the fallbacks for rows that are not whole blocks), its tensor
// order and its metadata (general.file_type, general.quantization_version). These are conventions of
// the GGUF format and llama.cpp's tensor names, not of one model. The input is opened and the output
// written through the `gguf` format plugin (the plugin host's open_model and make_writer): the input is
// memory-mapped and the output streamed, so memory stays at about one slab of rows, never the model.
// A library of the applications (apps/quantize, specula_quantize), not of the core: it reads and writes
// local files only (`specula quantize` resolves an hf:// input with the model hub first); the namespace
// is still the one it had in the core.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/dtype.hpp"
#include "specula/model_file.hpp"

namespace specula::core {

class PluginHost;

// One of llama.cpp's file types (LLAMA_FTYPE_*) whose tensor types Specula can all write.
struct QuantFileType {
  std::string_view name;     // llama-quantize's spelling, e.g. "Q4_K_M"
  uint32_t ftype;            // the general.file_type value
  DType base;                // the type of most quantized tensors
  std::string_view summary;  // what the rules give, for --help and errors
};
// In llama-quantize's order; Q4_K and Q5_K are its aliases of Q4_K_M and Q5_K_M.
const std::vector<QuantFileType>& quant_file_types();
// By name (case-insensitive) or general.file_type number; nullptr when neither matches.
const QuantFileType* find_quant_file_type(std::string_view name);
// "F32, F16, BF16, Q8_0, ..." for messages.
std::string quant_file_type_names();

// The type one tensor is written with.
struct TensorPlan {
  size_t input_index = 0;      // position in the input's tensor list
  std::string name;
  std::vector<int64_t> shape;  // as written: outermost 1-sized dims dropped, as llama.cpp does
  DType from = DType::F32;
  DType to = DType::F32;
  bool fallback = false;       // the rows are not whole blocks of the type the rules chose
};

// llama.cpp's rules for every tensor, in the order the output lists them (llama.cpp's: tensors outside
// blk.N first, then by layer, by name within each). `metadata` supplies general.architecture and
// <arch>.block_count / expert_count / attention.head_count(_kv); `tensors` needs names, types and
// shapes only. `pure` skips the mix rules (llama-quantize --pure): every quantizable tensor gets the
// base type, fallbacks still apply. `source` names the file in errors.
std::vector<TensorPlan> plan_quantization(const nlohmann::json& metadata, const std::vector<TensorInfo>& tensors,
                                          const QuantFileType& type, bool pure, const std::string& source);

struct QuantizeProgress {
  size_t tensor = 0;           // 1-based index of the tensor being written
  size_t tensors = 0;
  std::string_view name;
  uint64_t bytes_written = 0;  // output bytes so far
  uint64_t bytes_total = 0;    // the output's size
};

struct QuantizeOptions {
  const QuantFileType* type = nullptr;
  bool pure = false;
  unsigned threads = 0;                 // rows are quantized on this many threads; 0 = all cores
  std::function<void(const QuantizeProgress&)> on_progress;  // after each slab of rows
  const std::atomic<bool>* cancel = nullptr;                 // set: stop, remove the partial output
};

struct QuantizeStats {
  uint64_t input_bytes = 0, output_bytes = 0;  // file sizes
  std::map<DType, size_t> type_counts;         // output tensors per type
  size_t tensors = 0, converted = 0, requantized = 0, fallbacks = 0;
  double seconds = 0;
};

// The input of quantize_gguf, opened through `host`'s format plugins (a local path): a GGUF
// file with its typed keys (ModelFile::gguf_metadata). Throws naming the file when it is missing, when
// it is a checkpoint of another format (convert it first) or one shard of a split model.
std::shared_ptr<const ModelFile> open_quantize_input(const PluginHost& host, const std::filesystem::path& input);

// Writes `output` through the host's GGUF writer (through `<output>.part`, renamed when complete; nothing
// is left behind on error). Throws specula::Error naming the file, the tensor and the type.
QuantizeStats quantize_gguf(const PluginHost& host, const std::filesystem::path& input,
                            const std::filesystem::path& output, const QuantizeOptions& options);

}  // namespace specula::core

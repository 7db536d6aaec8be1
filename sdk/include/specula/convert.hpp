// Checkpoint conversion to GGUF (`specula convert`). A converter plugin (kind "converter") knows one
// architecture: given a ModelFile opened by any format plugin (Hugging Face safetensors, MLX), it accepts
// it or not and returns a plan: the GGUF metadata (written into a gguf::Metadata) and the ordered output
// tensors, each made of source tensor rows. write_converted() then streams the plan through a format
// plugin that writes GGUF: one tensor at a time is dequantized row by row, converted to the out type and
// written, so memory stays bounded by a row chunk, never the model.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "specula/dtype.hpp"
#include "specula/gguf_metadata.hpp"
#include "specula/model_file.hpp"

namespace specula {

// --outtype: "f32", "f16", "bf16", "q8_0" (llama.cpp convert_hf_to_gguf's types); nullopt otherwise.
std::optional<DType> convert_outtype(std::string_view name);
// --outtype auto (llama.cpp's default): BF16 or F16 as the checkpoint's first tensor of two or more
// dimensions is stored (an MLX tensor: its scales' type), else F16.
DType auto_outtype(const ModelFile& file);
// general.file_type (llama.cpp's LlamaFileType) of a file converted to `outtype`: 0, 1, 32 or 7.
uint32_t llama_file_type(DType outtype);

// One output tensor. Its rows (shape seen as [elements / last dim, last dim]) are the rows of `sources`
// concatenated along `concat_axis` (every other dim equal; one source: the first rows of it, so a
// converter may drop trailing rows), then `transform` is applied to each row. No source: the rows start
// as zeros and `transform` generates them (e.g. rope_freqs).
struct ConvertTensor {
  std::string name;                        // GGUF name
  std::vector<int64_t> shape;              // outermost-first (written reversed as GGUF ne)
  std::vector<const TensorInfo*> sources;  // tensors of the ModelFile the plan was made from
  size_t concat_axis = 0;                  // < shape.size() - 1
  bool keep_f32 = false;                   // stays F32 whatever the out type (llama.cpp: 1-D, norms, router)
  std::function<void(int64_t row, std::span<float> values)> transform;
};

// The type a tensor is written as, by llama.cpp's converter rules: F32 when keep_f32, else the out type,
// with F16 in place of Q8_0 when a row is not a whole number of 32-value blocks.
DType convert_tensor_type(const ConvertTensor& t, DType outtype);

struct ConvertOptions {
  DType outtype = DType::F16;
  std::string schema;  // a layout the converter offers (Converter::schemas()); empty = its default
  std::string name;    // general.name; empty = the checkpoint directory's name (llama.cpp's fallback)
};

// Plugin kind "converter".
class Converter {
 public:
  virtual ~Converter() = default;
  virtual std::string architecture() const = 0;
  // The GGUF layouts it can write (for --schema), default first; empty when there is only one.
  virtual std::vector<std::string> schemas() const { return {}; }
  // Cheap check (config.json architecture / model_type) whether this converter handles `file`.
  virtual bool accepts(const ModelFile& file) const = 0;
  // Sets the metadata keys on `out`, in the order they are to be written, and returns the tensors in
  // file order. Every missing or misshaped tensor or key is a specula::Error naming the file, the tensor
  // or key and what was expected, thrown before anything is written.
  virtual std::vector<ConvertTensor> plan(const ModelFile& file, const ConvertOptions& options,
                                          gguf::Metadata& out) const = 0;
};

// --- helpers for converter plugins ---

// llama.cpp's converter stores these as F32 whatever the out type: tensors of at most one dimension,
// names ending in "_norm.weight" or not ending in ".weight", and the MoE router (ffn_gate_inp*).
bool llama_keeps_f32(const std::string& gguf_name, size_t dims);

// general.name when ConvertOptions::name is empty: the checkpoint directory's name.
std::string default_model_name(const ModelFile& file, const ConvertOptions& options);

// Tokenizer keys from a checkpoint's tokenizer.json, tokenizer_config.json and config.json, as llama.cpp's
// LlamaHfVocab + SpecialVocab write them: tokenizer.ggml.model = `model`, tokens (by id, added tokens
// beyond the vocabulary appended), scores (all -1000), token_type (BYTE for <0xNN>, USER_DEFINED for
// `user_defined`, CONTROL for special added tokens and the tokens tokenizer_config.json names (*_token,
// additional/extra_special_tokens; transformers' all_special_ids), else NORMAL), merges ("left right"),
// the bos/eos/unk/sep/pad/mask ids (tokenizer_config.json through added_tokens, then config.json),
// add_bos/add_eos (post-processor, tokenizer_config.json) and tokenizer.chat_template
// (tokenizer_config.json, chat_template.jinja or chat_template.json). Returns the number of tokens.
int64_t add_hf_tokenizer(const ModelFile& file, gguf::Metadata& out, const std::string& model,
                         const std::vector<std::string>& user_defined);

// --- running a plan (the CLI) ---

// Called once per tensor as it is written (index into `tensors`).
using ConvertProgress = std::function<void(size_t index)>;
// Checks the plan (shapes against sources, readable source types) and writes `metadata` and every tensor,
// as its convert_tensor_type, to `path` through `writer` (a format plugin that can_write GGUF:
// PluginHost::make_writer("gguf")), which leaves nothing behind on failure.
void write_converted(const ModelFormat& writer, const gguf::Metadata& metadata,
                     const std::vector<ConvertTensor>& tensors, DType outtype, const std::filesystem::path& path,
                     const ConvertProgress& progress = {});

}  // namespace specula

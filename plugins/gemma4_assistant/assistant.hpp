// The Gemma 4 "assistant" MTP drafter (gemma4-assistant-spec.md §2, §3): a 4-layer Q-only decoder that
// reads the target's KV caches, its final-normed last hidden state and its token embedding through
// TargetView, and proposes K tokens, one graph run per draft step. It is a DrafterBase: this plugin
// writes the step graph, the weights and the configuration; the SDK binds the target, caches the
// graphs and runs the K steps (on the backend, or on the host for traces and host sampling).
//
// Checkpoints: GGUF in the upstream llama.cpp layout (nextn.pre_projection / nextn.post_projection,
// dense head), GGUF in the fork layout of shared/seeds/gemma4-assistant.md (assist_pre_proj,
// assist_post_proj, assist_embed_centroids, assist_token_ordering) or with ollama's
// masked_embd_centroids / masked_embd_ordering, and Hugging Face Gemma4AssistantForCausalLM safetensors.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rope.hpp"
#include "specula/drafter_base.hpp"
#include "specula/model.hpp"
#include "specula/options.hpp"

namespace specula::gemma4_assistant {

// RoPE per attention type, read by the shared Gemma 4 reader (plugins/gemma4/rope.hpp).
using Rope = gemma4::RopeConfig;

struct Layer {
  bool full = false;
  int64_t head_dim = 0;
  int64_t ffn = 0;
};

struct Config {
  std::string layout;          // "gguf", "gguf-seed", "gguf-ollama", "hf"
  int64_t hidden = 0;          // Hd, the drafter's width
  int64_t backbone = 0;        // Hb, the target's hidden size
  int64_t vocab = 0;
  int64_t heads = 0;           // query heads Nq
  int64_t window = 0;          // sliding window of the sliding layers
  int64_t context = 0;
  float eps = 1e-6f;
  Rope rope_sliding, rope_full;
  std::vector<Layer> layers;
  // Centroid-masked head (§2.6): present when the file carries centroids and a token ordering.
  bool has_centroids = false;
  bool use_ordered_embeddings = false;
  int64_t centroids = 0;       // C
  int64_t centroid_top_k = 0;  // clusters kept per step
  nlohmann::json to_json() const;
};

// Reads the hyper-parameters (GGUF keys or config.json); throws naming the file and key.
Config read_config(const ModelFile& file);

// True when `file` holds a gemma4-assistant drafter (GGUF arch "gemma4-assistant" or config.json
// model_type "gemma4_assistant").
bool is_assistant(const ModelFile& file);

struct Options {
  std::string head = "auto";   // auto | dense | centroid
  int query_offset = 0;        // query RoPE position = p - query_offset: 0 ("p", HF/llama.cpp) or 1 ("p-1")
};
// Parses the pipeline's drafter options; unknown keys and bad values are errors.
Options parse_options(const nlohmann::json& options);
// The options, for the host's check and `specula plugins --options gemma4-assistant`.
const OptionSchema& option_schema();

// What load_drafter checks before loading a weight (DrafterLoader::check): the configuration, the
// options against it, and the pairing with `target` (backbone hidden size, vocabulary, and for each
// layer the head dim of the target's KV cache of its attention type). Target fields that are 0 (a
// model plugin that reports nothing before loading) are not compared.
void check(const ModelFile& file, const ModelInfo& target, const nlohmann::json& options);
void check_pairing(const Config& config, const Options& options, const ModelInfo& target, const std::string& where);

// One draft step as the drafter computed it, for tests and debugging.
struct StepTrace {
  int32_t token = -1;            // the draft (argmax)
  std::vector<int32_t> ids;      // centroid head: the candidate vocab ids; dense: empty (all ids)
  std::vector<float> logits;     // centroid head: logits of `ids`; dense: [vocab]
  std::vector<float> h_next;     // post_projection output [backbone], the next step's h
};

class AssistantDrafter : public DrafterBase {
 public:
  using DrafterBase::DrafterBase;
  // Runs n steps like draft() and returns everything each step produced. When `forced` is given, step
  // k + 1 embeds forced[k] instead of step k's draft (to compare against a reference step by step).
  virtual std::vector<StepTrace> trace(const TargetView& target, int32_t last_token, int n,
                                       std::span<const int32_t> forced = {}) = 0;
  virtual const Config& config() const = 0;
  virtual bool centroid_head() const = 0;
};

// `parts.lm_head` computes the draft logits (dense or centroid-masked; the standard head when empty).
std::shared_ptr<AssistantDrafter> load_drafter(std::shared_ptr<const ModelFile> file,
                                               std::shared_ptr<ComputeBackend> backend, const ModelInfo& target,
                                               const nlohmann::json& options, const ModelParts& parts = {});

// The centroid head's full-vocabulary output (§2.6 step 5): every id not selected gets
// min(selected) - 1 (HF's filler), the selected ids their logits.
using specula::scatter_logits;

}  // namespace specula::gemma4_assistant

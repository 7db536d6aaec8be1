// The gemma4 converter: a Hugging Face (Gemma4ForCausalLM / Gemma4ForConditionalGeneration text tower) or
// MLX checkpoint to GGUF in llama.cpp's layout, as its convert_hf_to_gguf.py (conversion/gemma.py,
// Gemma4Model) writes it: the same keys in the same order, rope_freqs generated first, then the text
// tower's tensors in the checkpoint's order under their GGUF names; vision/audio towers are left out.
#include "converter.hpp"

#include "config.hpp"
#include "convert_common.hpp"
#include "model.hpp"
#include "names.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"
#include "weights.hpp"

namespace specula::gemma4 {
namespace {

using json = nlohmann::json;

const std::string kGate = "ffn_gate_exps.weight", kUp = "ffn_up_exps.weight";

class Gemma4Converter final : public Converter {
 public:
  std::string architecture() const override { return "gemma4"; }

  bool accepts(const ModelFile& file) const override {
    if (file.format() == "gguf" || !is_gemma4(file)) return false;
    // An assistant's text_config is gemma4_text too; the gemma4-assistant converter takes it.
    return file.metadata()["config"].value("model_type", std::string()).find("assistant") == std::string::npos;
  }

  std::vector<ConvertTensor> plan(const ModelFile& file, const ConvertOptions& options, gguf::Metadata& out) const override {
    const std::string where = file.path().string();
    if (!options.schema.empty())
      fail("{}: --schema {} does not apply to a Gemma 4 target (it has one GGUF layout)", where, options.schema);
    const Config c = config_from_hf(file);
    check_weights(file, c);  // every tensor the model needs is there, with its shape
    const json& root = file.metadata()["config"];
    const json& tc = root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;

    TextKeys k;
    k.layers = static_cast<int64_t>(c.layers.size());
    k.context = c.context;
    k.hidden = c.hidden;
    k.ffn = tc.value("intermediate_size", int64_t{9216});
    k.heads = c.heads;
    k.kv_heads = tc.value("num_key_value_heads", int64_t{4});
    const bool global_kv = tc.contains("num_global_key_value_heads") && !tc["num_global_key_value_heads"].is_null();
    for (const LayerConfig& l : c.layers) {
      if (tc.value("use_double_wide_mlp", false)) k.ffn_per_layer.push_back(l.ffn);
      if (global_kv) k.kv_heads_per_layer.push_back(l.full ? tc["num_global_key_value_heads"].get<int64_t>() : k.kv_heads);
      k.sliding.push_back(!l.full);
    }
    k.rope_theta = c.rope_full.theta;
    k.rope_theta_swa = c.rope_sliding.theta;
    k.eps = c.eps;
    k.softcap = c.softcap;
    k.experts = c.experts;
    k.experts_used = c.experts_used;
    k.expert_ffn = c.expert_ffn;
    k.head_dim_full = c.head_dim_full;
    k.head_dim_swa = c.head_dim_sliding;
    k.window = c.window;
    k.shared_kv_layers = c.shared_kv_layers;
    k.per_layer_input = c.ple;

    out.set_string("general.architecture", "gemma4");
    out.set_string("general.type", "model");
    out.set_string("general.name", default_model_name(file, options));
    add_text_keys(out, "gemma4.", k, options.outtype);
    out.set_u32("general.quantization_version", 2);
    const int64_t tokens = add_gemma4_tokenizer(file, out);

    std::vector<ConvertTensor> plan{rope_freqs(c.head_dim_full, c.rope_full.rotated_pairs)};
    const std::string prefix = text_prefix(file);
    size_t skipped = 0;
    for (const TensorInfo& t : file.tensors()) {
      if (t.name.rfind(prefix, 0) != 0) {
        log_debug("{}: '{}' is outside the text tower; not converted", where, t.name);
        ++skipped;
        continue;
      }
      const std::string hf = t.name.substr(prefix.size());
      const std::string name = gguf_name_of(hf);
      if (name.empty())
        fail("{}: tensor '{}' is not a Gemma 4 text-model tensor this converter knows (gemma4-formats-spec §5.2, "
             "§6.4, under '{}')", where, t.name, prefix);
      if (name.ends_with(kUp)) continue;  // fused with its gate
      if (!name.ends_with(kGate)) {
        plan.push_back(from_file(file, t, name, tokens));
        continue;
      }
      // Split experts (MLX's switch_glu) become llama.cpp's fused gate_up, as a Hugging Face file gives.
      const std::string layer = hf.substr(0, hf.find('.', 7) + 1);  // "layers.N."
      const TensorInfo* up = nullptr;
      for (const std::string& n : layer_names().at(kUp))
        if (!up) up = file.find(prefix + layer + n);
      if (!up) fail("{}: tensor '{}' has no matching up projection under '{}'", where, t.name, prefix + layer);
      ConvertTensor fused;
      fused.name = name.substr(0, name.size() - kGate.size()) + "ffn_gate_up_exps.weight";
      fused.shape = t.shape;
      fused.sources = {&t, up};
      fused.concat_axis = 1;
      if (t.shape.size() == 3 && up->shape.size() == 3) fused.shape[1] += up->shape[1];
      plan.push_back(std::move(fused));
    }
    if (skipped) log_info("{}: {} tensors outside the text tower (vision, audio) are not converted", where, skipped);
    return plan;
  }
};

}  // namespace

std::unique_ptr<Converter> make_converter() { return std::make_unique<Gemma4Converter>(); }

}  // namespace specula::gemma4

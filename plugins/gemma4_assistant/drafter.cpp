// The gemma4-assistant drafter (gemma4-assistant-spec.md §2-§3): its weights in three layouts and one
// draft step's graph. DrafterBase (the SDK) binds the target, caches the graphs and runs the K steps.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "assistant.hpp"
#include "names.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/weight_lookup.hpp"

namespace specula::gemma4_assistant {
namespace {

using json = nlohmann::json;

struct LayerWeights {
  BackendTensorPtr attn_norm, q, q_norm, o, post_attn_norm, ffn_norm, gate, up, down, post_ffw_norm, scalar;
};

// The names a drafter tensor has in the file's layout: GGUF (the nextn.* schema, then the assist_* one)
// or Hugging Face / MLX (with or without the "model." prefix).
WeightLookup::Names file_names(const ModelFile& file) {
  if (file.format() == "gguf")
    return [](const std::string& what) -> std::vector<std::string> {
      if (what == "embed") return {"token_embd.weight"};
      if (what == "norm") return {"output_norm.weight"};
      if (what == "pre") return {"nextn.pre_projection.weight", "assist_pre_proj.weight"};
      if (what == "post") return {"nextn.post_projection.weight", "assist_post_proj.weight"};
      if (what == "centroids") return {"assist_embed_centroids.weight", "masked_embd_centroids.weight"};
      if (what == "ordering") return {"assist_token_ordering.weight", "masked_embd_ordering"};
      return {what};  // blk.N.*
    };
  return [](const std::string& what) -> std::vector<std::string> {
    auto both = [](const std::string& n) { return std::vector<std::string>{n, "model." + n}; };
    if (what == "embed") return both("embed_tokens.weight");
    if (what == "norm") return both("norm.weight");
    if (what == "pre") return both("pre_projection.weight");
    if (what == "post") return both("post_projection.weight");
    if (what == "centroids") return both("masked_embedding.centroids.weight");
    if (what == "ordering") return both("masked_embedding.token_ordering");
    // blk.N.suffix -> model.layers.N.<hf suffix>, by the Gemma 4 name table the target plugin uses.
    const size_t d1 = what.find('.'), d2 = what.find('.', d1 + 1);
    const std::string idx = what.substr(d1 + 1, d2 - d1 - 1), suffix = what.substr(d2 + 1);
    if (auto it = gemma4::layer_names().find(suffix); it != gemma4::layer_names().end()) {
      const std::string& h = it->second.front();
      return {"model.layers." + idx + "." + h, "layers." + idx + "." + h};
    }
    return {what};
  };
}

// token_ordering as int32, checked to be a permutation of [0, vocab) (§2.6: row c of its [C, S] view
// lists the vocab ids of cluster c).
std::vector<int32_t> read_ordering(const ModelFile& file, const TensorInfo& t, int64_t vocab) {
  const std::string where = file.path().string();
  if (t.elements() != vocab || t.shape.size() != 1)
    fail("{}: tensor '{}' has shape {}, but the token ordering must be [{}] (one entry per vocabulary id)", where,
         t.name, shape_str(t.shape), vocab);
  std::vector<int32_t> out(static_cast<size_t>(vocab));
  std::vector<bool> seen(static_cast<size_t>(vocab), false);
  for (int64_t i = 0; i < vocab; ++i) {
    double v;
    const std::byte* p = t.data.data();
    if (t.type == DType::F32) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      v = f;
    } else if (t.type == DType::I32) {
      int32_t x;
      std::memcpy(&x, p + 4 * i, 4);
      v = x;
    } else if (t.type == DType::I64) {
      int64_t x;
      std::memcpy(&x, p + 8 * i, 8);
      v = static_cast<double>(x);
    } else {
      fail("{}: tensor '{}' is {}; the token ordering must be F32 (integer values), I32 or I64", where, t.name,
           dtype_name(t.type));
    }
    if (!(v >= 0 && v < static_cast<double>(vocab)) || v != std::floor(v))
      fail("{}: tensor '{}' is not a permutation of the vocabulary: entry {} is {}, expected an integer in [0, {})",
           where, t.name, i, v, vocab);
    const auto id = static_cast<int32_t>(v);
    if (seen[static_cast<size_t>(id)])
      fail("{}: tensor '{}' is not a permutation of the vocabulary: id {} appears twice (again at entry {})", where,
           t.name, id, i);
    seen[static_cast<size_t>(id)] = true;
    out[static_cast<size_t>(i)] = id;
  }
  return out;
}

class Drafter final : public AssistantDrafter {
 public:
  Drafter(std::shared_ptr<const ModelFile> file, std::shared_ptr<ComputeBackend> compute, const Config& config,
          const Options& options, const ModelParts& parts)
      : AssistantDrafter(std::move(compute), setup_for(*file, config, options)),
        file_(std::move(file)),
        opt_(options),
        cfg_(config) {
    const std::string where = file_->path().string();
    const Config& c = cfg_;
    centroid_ = opt_.head == "centroid" || (opt_.head == "auto" && c.has_centroids && c.use_ordered_embeddings);

    WeightLookup t(*file_, &backend(), file_names(*file_), "drafter");
    const int64_t Hd = c.hidden, Hb = c.backbone;
    pre_ = t.need("pre", {Hd, 2 * Hb});
    post_ = t.need("post", {Hb, Hd});
    norm_ = t.need("norm", {Hd});
    layers_.resize(c.layers.size());
    for (size_t l = 0; l < c.layers.size(); ++l) {
      const Layer& ly = c.layers[l];
      LayerWeights& w = layers_[l];
      auto n = [&](const char* s) { return fmt::format("blk.{}.{}", l, s); };
      const int64_t D = ly.head_dim, I = ly.ffn;
      w.attn_norm = t.need(n("attn_norm.weight"), {Hd});
      w.q = t.need(n("attn_q.weight"), {c.heads * D, Hd});
      w.q_norm = t.need(n("attn_q_norm.weight"), {D});
      w.o = t.need(n("attn_output.weight"), {Hd, c.heads * D});
      w.post_attn_norm = t.need(n("post_attention_norm.weight"), {Hd});
      w.ffn_norm = t.need(n("ffn_norm.weight"), {Hd});
      w.gate = t.need(n("ffn_gate.weight"), {I, Hd});
      w.up = t.need(n("ffn_up.weight"), {I, Hd});
      w.down = t.need(n("ffn_down.weight"), {Hd, I});
      w.post_ffw_norm = t.need(n("post_ffw_norm.weight"), {Hd});
      w.scalar = t.optional(n("layer_output_scale.weight"), {1});
      for (const char* kv : {"attn_k.weight", "attn_v.weight"})
        if (t.find(n(kv)))
          fail("{}: tensor '{}' exists, but gemma4-assistant layers are Q-only (K/V come from the target)", where, n(kv));
    }

    const TensorInfo& embed = t.info("embed", {c.vocab, Hd});
    if (centroid_) {
      const TensorInfo* ord = t.find("ordering");
      if (!ord)
        fail("{}: tensor '{}' is missing; the centroid head needs the token ordering with shape [{}]", where,
             t.names("ordering").front(), c.vocab);
      ordering_ = read_ordering(*file_, *ord, c.vocab);
      centroids_ = t.need("centroids", {c.centroids, Hd});
      // The embedding rows in cluster order (sglang's load-time reorder): row i = old row ordering[i], so
      // cluster k's S rows are one row of a [C, S * Hd] table that GetRows fetches by cluster id. An MLX
      // table's scales and biases are per row too (groups never cross a row), so they move with it.
      const int64_t S = c.vocab / c.centroids;
      TensorInfo oi = embed;
      oi.name = "gemma4_assistant.embd_cluster_order";
      oi.shape = {c.centroids, S * Hd};
      oi.data = cluster_order(embed, embed.data, ordered_);
      if (embed.type == DType::MLX_AFFINE) {
        oi.quant.scales = cluster_order(embed, embed.quant.scales, ordered_scales_);
        oi.quant.biases = cluster_order(embed, embed.quant.biases, ordered_biases_);
      }
      head_weights_ = {backend().load_weight(oi), 0.0f, centroids_, c.centroid_top_k};
      // The ordering on the backend too, as a [C, S] table: a step maps its candidates to vocab ids there.
      ordering_table_ = backend().allocate("gemma4_assistant.token_ordering", DType::I32, {c.centroids, S});
      backend().write(*ordering_table_, bytes_of(ordering_));
    } else {
      head_weights_ = {backend().load_weight(embed), 0.0f, {}, 0};  // no softcap (§2.5)
    }
    head_ = choose_lm_head(parts.lm_head, head_weights_, fmt::format("gemma4-assistant ({})", where));
    attention_ = parts.attention ? parts.attention : standard_attention();
    h_ = backend().allocate("gemma4_assistant.h", DType::F32, {1, Hb});
    log_info("gemma4-assistant: {} layers, hidden {}, backbone {}, {} head{} ({}, query position {})", c.layers.size(),
             Hd, Hb, centroid_ ? "centroid" : "dense",
             centroid_ ? fmt::format(" (top {} of {} clusters)", c.centroid_top_k, c.centroids) : std::string(),
             c.layout, opt_.query_offset ? "p-1" : "p");
  }

  std::vector<StepTrace> trace(const TargetView& target, int32_t last, int n,
                               std::span<const int32_t> forced) override {
    std::vector<StepTrace> steps;
    run_steps(target, last, n, [&](int k, const HostStep& step) {
      StepTrace st{step.token(), step.ids(), step.logits(), std::vector<float>(static_cast<size_t>(cfg_.backbone))};
      backend().read(*h_, std::as_writable_bytes(std::span(st.h_next)));
      steps.push_back(std::move(st));
      return k < static_cast<int>(forced.size()) ? forced[static_cast<size_t>(k)] : step.token();
    });
    return steps;
  }

  const Config& config() const override { return cfg_; }
  bool centroid_head() const override { return centroid_; }

 private:
  static Setup setup_for(const ModelFile& file, const Config& c, const Options& o) {
    Setup s{fmt::format("gemma4-assistant ({})", file.path().string()), c.vocab, o.query_offset, {}};
    bool any_full = false, any_sliding = false;
    for (const Layer& l : c.layers) (l.full ? any_full : any_sliding) = true;
    if (any_sliding) s.attention_types.push_back("sliding");
    if (any_full) s.attention_types.push_back("full");
    return s;
  }

  // The target's caches must hold each layer's head dim with a divisor of its query heads, and its
  // hidden state and embedding the backbone width.
  void check_target(const DraftTarget& t) const override {
    const Config& c = cfg_;
    const std::string& name = setup().name;
    for (size_t l = 0; l < c.layers.size(); ++l) {
      const char* type = c.layers[l].full ? "full" : "sliding";
      const KvView& kv = t.cache(type);
      const Shape& ks = kv.k->shape();
      if (ks.size() != 3 || ks[2] != c.layers[l].head_dim || kv.v->shape().size() != 3 ||
          kv.v->shape()[2] != c.layers[l].head_dim)
        fail("{}: drafter layer {} ({}) has query head dim {}, but the target's {} KV cache '{}' is {} (slots, KV "
             "heads, head dim); the drafter belongs to another target", name, l, type, c.layers[l].head_dim, type,
             kv.k->name(), shape_str(ks));
      if (c.heads % ks[1] != 0)
        fail("{}: drafter layer {} has {} query heads, not a multiple of the target's {} {} KV heads", name, l,
             c.heads, ks[1], type);
    }
    if (t.hidden->shape() != Shape{c.backbone})
      fail("{}: the target's last hidden state is {}, expected F32 [{}]", name, shape_str(t.hidden->shape()),
           c.backbone);
    if (t.embed.table->shape()[1] != c.backbone)
      fail("{}: the target's token embedding is {}, expected [vocab, {}]", name, shape_str(t.embed.table->shape()),
           c.backbone);
    // A target ring sized for a smaller window may not hold every key the drafter's window reaches.
    if (t.kv.contains("sliding") && t.kv.at("sliding").window > 0 && t.kv.at("sliding").window < c.window)
      log_warn("{}: the drafter's sliding window {} is wider than the target's {}; keys the target's cache has "
               "dropped are not seen", name, c.window, t.kv.at("sliding").window);
  }

  // One draft step (§2.2-§2.6).
  DraftHead build_step(Graph& g, const DraftTarget& t, const DraftStepInputs& in) const override {
    const Config& c = cfg_;
    // §2.2-2.3: e = E_target[x] * target scale; u = W_pre [e, h] (embedding first), h the target's last
    // hidden state in the round's first step, then the drafter's own.
    Value e = g.scale(g.get_rows(g.constant(t.embed.table), in.token), t.embed.scale);
    Value h = in.first ? g.reshape(g.constant(t.hidden), {1, c.backbone}) : g.constant(h_);
    Value r = g.named(g.matmul(g.constant(pre_), g.concat(e, h)), "pre_projection");
    for (size_t l = 0; l < c.layers.size(); ++l) {
      const Layer& ly = c.layers[l];
      const LayerWeights& w = layers_[l];
      const Rope& rope = ly.full ? c.rope_full : c.rope_sliding;
      const KvView& kv = t.cache(ly.full ? "full" : "sliding");
      Value a = g.rms_norm(r, g.constant(w.attn_norm), c.eps);
      Value q = g.reshape(g.matmul(g.constant(w.q), a), {1, c.heads, ly.head_dim});
      q = g.rms_norm(q, g.constant(w.q_norm), c.eps);
      q = g.rope(q, in.position, rope.rotated_pairs, rope.theta, rope.exponent_divisor, rope.freq_scale);
      // Scale 1, no mask beyond the window: causality comes from what the target's cache holds (§2.4).
      Value o = attention_->build(g, {q, g.constant(kv.k), g.constant(kv.v), g.constant(kv.positions), in.position,
                                      1.0f, ly.full ? 0 : c.window, false, in.slots_in_use});
      r = g.add(r, g.rms_norm(g.matmul(g.constant(w.o), o), g.constant(w.post_attn_norm), c.eps));
      Value f = g.rms_norm(r, g.constant(w.ffn_norm), c.eps);
      Value m = g.matmul(g.constant(w.down),
                         g.mul(g.gelu_tanh(g.matmul(g.constant(w.gate), f)), g.matmul(g.constant(w.up), f)));
      r = g.add(r, g.rms_norm(m, g.constant(w.post_ffw_norm), c.eps));
      if (w.scalar) r = g.mul(r, g.constant(w.scalar));  // scales the whole residual stream
      r = g.named(r, fmt::format("blk.{}.out", l));
    }
    Value n = g.named(g.rms_norm(r, g.constant(norm_), c.eps), "norm");
    // §2.5: the next step's h is post_projection(n), kept on the backend.
    g.mark_output(g.write_rows(h_, g.matmul(g.constant(post_), n), in.row0));
    // §2.5-2.6: dense logits [1, V], or the centroid head's [1, K * S] over the best K clusters' tokens.
    const LmHeadOutput head = head_->build(g, n, head_weights_);
    if (!head.clusters) return {head.logits, {}};
    const int64_t K = c.centroid_top_k, S = c.vocab / c.centroids;
    return {head.logits, g.reshape(g.get_rows(g.constant(ordering_table_), g.reshape(head.clusters, {K})), {K * S})};
  }

  // `bytes` (one row per vocabulary id, e.g. a table's data or its MLX scales) in cluster order, in `out`.
  std::span<const std::byte> cluster_order(const TensorInfo& table, std::span<const std::byte> bytes,
                                           std::vector<std::byte>& out) const {
    const size_t rows = ordering_.size(), row = bytes.size() / rows;
    if (row == 0 || bytes.size() % rows != 0)
      fail("{}: tensor '{}' holds {} bytes, not a whole number of bytes per row for its {} rows",
           file_->path().string(), table.name, bytes.size(), rows);
    out.resize(bytes.size());
    for (size_t i = 0; i < rows; ++i)
      std::memcpy(out.data() + i * row, bytes.data() + static_cast<size_t>(ordering_[i]) * row, row);
    return out;
  }

  std::shared_ptr<const ModelFile> file_;
  Options opt_;
  Config cfg_;
  bool centroid_ = false;
  BackendTensorPtr pre_, post_, norm_, centroids_;
  BackendTensorPtr h_;               // F32 [1, backbone]: the drafter's recurrent state (§2.5)
  BackendTensorPtr ordering_table_;  // centroid: ordering_ as I32 [C, S] on the backend
  std::shared_ptr<const LmHead> head_;
  LmHeadWeights head_weights_;
  std::shared_ptr<const Attention> attention_;
  std::vector<LayerWeights> layers_;
  std::vector<int32_t> ordering_;
  std::vector<std::byte> ordered_;  // the reordered head; the CPU backend maps weights in place
  std::vector<std::byte> ordered_scales_, ordered_biases_;  // the same for an MLX head's scales and biases
};

}  // namespace

std::shared_ptr<AssistantDrafter> load_drafter(std::shared_ptr<const ModelFile> file,
                                               std::shared_ptr<ComputeBackend> backend, const ModelInfo& target,
                                               const nlohmann::json& options, const ModelParts& parts) {
  if (!file || !backend) fail("gemma4-assistant: load() needs a file and a backend");
  const Options o = parse_options(options);
  const Config c = read_config(*file);
  check_pairing(c, o, target, file->path().string());
  return std::make_shared<Drafter>(std::move(file), std::move(backend), c, o, parts);
}

}  // namespace specula::gemma4_assistant

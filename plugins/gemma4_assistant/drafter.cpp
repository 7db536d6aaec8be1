// The gemma4-assistant drafter: weights (three layouts), one graph per draft step, the K-step loop
// (gemma4-assistant-spec.md §2-§3): greedy on the backend, or each step's logits read back and the
// engine's pick embedded next (sampled drafting, traces).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>

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

// A graph for one draft step. `first`: h comes from the target's last hidden state, else from the
// drafter's own persistent h (the previous step's post_projection). `device`: the drafts stay on the
// backend (DraftRequest::buffers): step k writes its vocab id into row k of that tensor, and a
// later step embeds row k - 1 from there.
struct Built {
  Graph graph;
  std::unique_ptr<CompiledGraph> plan;  // after `graph`: destroyed before it
  Value x, qpos, zero;
  Value prev_row, draft_row;  // device: I32 [1], the row step k reads (k - 1) and writes (k)
  Value in_use;  // I32 [1]: the target cache's slots in use (its position)
  Value token;   // I32 [1, 1]: argmax over the head's logits (dense: a vocab id; centroid: a candidate index)
  Value top;     // centroid: I32 [1, Kc] selected clusters
  Value logits;  // dense: [1, V]; centroid: [1, Kc * S]
  Value uniform;  // sampled on the device: F32 [1], the draw's uniform
  std::string why;  // sampled on the device: why the sampler's device form cannot run (no graph then)
};

// Where a device step leaves its draft: `drafts` (I32 [N, 1], row k); sampled drafting also writes the
// vocabulary-wide logits into `logits` (F32 [n, V], row k) and draws the token with `sampler`.
struct DeviceOut {
  BackendTensorPtr drafts, logits;
  const Sampler* sampler = nullptr;
  SamplingState state;
};

class Drafter final : public AssistantDrafter {
 public:
  Drafter(std::shared_ptr<const ModelFile> file, std::shared_ptr<ComputeBackend> backend, const ModelInfo& target,
          const Options& options, const ModelParts& parts)
      : file_(std::move(file)), backend_(std::move(backend)), opt_(options) {
    const std::string where = file_->path().string();
    cfg_ = read_config(*file_);
    const Config& c = cfg_;
    check_pairing(c, opt_, target, where);
    centroid_ = opt_.head == "centroid" || (opt_.head == "auto" && c.has_centroids && c.use_ordered_embeddings);

    WeightLookup t(*file_, backend_.get(), file_names(*file_), "drafter");
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
      head_weights_ = {backend_->load_weight(oi), 0.0f, centroids_, c.centroid_top_k};
      // The ordering on the backend too, as a [C, S] table: a step maps its candidate to a vocab id there.
      ordering_table_ = backend_->allocate("gemma4_assistant.token_ordering", DType::I32, {c.centroids, S});
      backend_->write(*ordering_table_, std::as_bytes(std::span<const int32_t>(ordering_)));
      // Zeros over the vocabulary: sampled drafting on the backend spreads the candidates' logits over it.
      zeros_ = backend_->allocate("gemma4_assistant.zeros", DType::F32, {c.vocab});
      const std::vector<float> zeros(static_cast<size_t>(c.vocab), 0.0f);
      backend_->write(*zeros_, std::as_bytes(std::span(zeros)));
    } else {
      head_weights_ = {backend_->load_weight(embed), 0.0f, {}, 0};  // no softcap (§2.5)
    }
    head_ = choose_lm_head(parts.lm_head, head_weights_, fmt::format("gemma4-assistant ({})", where));
    attention_ = parts.attention ? parts.attention : standard_attention();
    h_ = backend_->allocate("gemma4_assistant.h", DType::F32, {1, Hb});
    log_info("gemma4-assistant: {} layers, hidden {}, backbone {}, {} head{} ({}, query position {})", c.layers.size(),
             Hd, Hb, centroid_ ? "centroid" : "dense",
             centroid_ ? fmt::format(" (top {} of {} clusters)", c.centroid_top_k, c.centroids) : std::string(),
             c.layout, opt_.query_offset ? "p-1" : "p");
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

  std::vector<DraftStep> draft(const TargetView& target, const DraftRequest& request) override {
    std::vector<DraftStep> out;
    const bool logits = request.logits || static_cast<bool>(request.pick);
    const bool sampled_on_device = request.buffers.logits && request.rule.sampler && !request.logits &&
                                   static_cast<int>(request.rule.uniforms.size()) >= request.n;
    if (request.buffers.tokens && (!logits || sampled_on_device) && can_keep_drafts(*request.buffers.tokens, request.n) &&
        run_on_device(target, request)) {
      out.resize(static_cast<size_t>(std::max(0, request.n)));  // tokens -1: on the backend
      return out;
    }
    run(target, request.last_token, request.n, [&](int k, const Built& b, int32_t token) {
      DraftStep st{token, {}};
      if (logits) {
        const StepLogits l = step_logits(b);
        st.logits = centroid_ ? scatter_logits(cfg_.vocab, l.ids, l.logits) : l.logits;
      }
      if (request.pick) st.token = request.pick(k, st.logits);
      out.push_back(std::move(st));
      return out.back().token;
    });
    return out;
  }

  std::vector<StepTrace> trace(const TargetView& target, int32_t last, int n,
                               std::span<const int32_t> forced) override {
    std::vector<StepTrace> steps;
    run(target, last, n, [&](int k, const Built& b, int32_t token) {
      StepTrace st;
      st.token = token;
      StepLogits l = step_logits(b);
      st.ids = std::move(l.ids);
      st.logits = std::move(l.logits);
      st.h_next.resize(static_cast<size_t>(cfg_.backbone));
      backend_->read(*h_, std::as_writable_bytes(std::span(st.h_next)));
      steps.push_back(std::move(st));
      return k < static_cast<int>(forced.size()) ? forced[static_cast<size_t>(k)] : token;
    });
    return steps;
  }

  const Config& config() const override { return cfg_; }
  bool centroid_head() const override { return centroid_; }

 private:
  // The target tensors a graph reads; graphs are rebuilt when they change (another context).
  struct Bound {
    KvView sliding, full;
    BackendTensorPtr hidden;
    TokenEmbedding embed;
    std::vector<const void*> key() const {
      return {sliding.k.get(), sliding.v.get(), sliding.positions.get(), full.k.get(), full.v.get(),
              full.positions.get(), hidden.get(), embed.table.get()};
    }
  };

  Bound bind(const TargetView& target) const {
    const Config& c = cfg_;
    const std::string where = file_->path().string();
    Bound b;
    auto kv_of = [&](bool full) {
      const char* type = full ? "full" : "sliding";
      KvView kv;
      try {
        kv = target.kv(type);
      } catch (const Error& e) {
        fail("gemma4-assistant ({}): the target has no {}-attention KV cache, which the drafter's {} layers read: {}",
             where, type, type, e.what());
      }
      if (!kv.k || !kv.v || !kv.positions)
        fail("gemma4-assistant ({}): the target exposes no {}-attention KV cache tensors", where, type);
      for (size_t l = 0; l < c.layers.size(); ++l) {
        if (c.layers[l].full != full) continue;
        const Shape& ks = kv.k->shape();
        if (ks.size() != 3 || ks[2] != c.layers[l].head_dim || kv.v->shape().size() != 3 ||
            kv.v->shape()[2] != c.layers[l].head_dim)
          fail("gemma4-assistant ({}): drafter layer {} ({}) has query head dim {}, but the target's {} KV cache "
               "'{}' is {} (slots, KV heads, head dim); the drafter belongs to another target", where, l, type,
               c.layers[l].head_dim, type, kv.k->name(), shape_str(ks));
        if (c.heads % ks[1] != 0)
          fail("gemma4-assistant ({}): drafter layer {} has {} query heads, not a multiple of the target's {} {} "
               "KV heads", where, l, c.heads, ks[1], type);
      }
      return kv;
    };
    bool any_full = false, any_sliding = false;
    for (const Layer& l : c.layers) (l.full ? any_full : any_sliding) = true;
    if (any_sliding) b.sliding = kv_of(false);
    if (any_full) b.full = kv_of(true);
    b.hidden = target.last_hidden();
    if (!b.hidden || b.hidden->shape() != Shape{c.backbone})
      fail("gemma4-assistant ({}): the target's last hidden state is {}, expected F32 [{}]", where,
           b.hidden ? shape_str(b.hidden->shape()) : "missing", c.backbone);
    b.embed = target.token_embedding();
    if (!b.embed.table || b.embed.table->shape().size() != 2 || b.embed.table->shape()[1] != c.backbone)
      fail("gemma4-assistant ({}): the target's token embedding is {}, expected [vocab, {}]", where,
           b.embed.table ? shape_str(b.embed.table->shape()) : "missing", c.backbone);
    return b;
  }

  void build(Built& b, const Bound& t, bool first, const DeviceOut* device) const {
    const Config& c = cfg_;
    Graph& g = b.graph;
    const BackendTensorPtr drafts = device ? device->drafts : nullptr;
    const int64_t Hb = c.backbone;
    if (drafts && !first) {  // the previous step's draft, read where it wrote it
      b.prev_row = g.input(DType::I32, {1}, "previous_draft_row");
      b.x = g.reshape(g.get_rows(g.constant(drafts), b.prev_row), {1});
    } else {
      b.x = g.input(DType::I32, {1}, "token");
    }
    b.qpos = g.input(DType::I32, {1}, "query_position");
    b.zero = g.input(DType::I32, {1}, "row0");
    b.in_use = g.input(DType::I32, {1}, "slots_in_use");
    // §2.2-2.3: e = E_target[x] * target scale; u = W_pre [e, h] (embedding first).
    Value e = g.scale(g.get_rows(g.constant(t.embed.table), b.x), t.embed.scale);
    Value h = first ? g.reshape(g.constant(t.hidden), {1, Hb}) : g.constant(h_);
    Value r = g.named(g.matmul(g.constant(pre_), g.concat(e, h)), "pre_projection");
    for (size_t l = 0; l < c.layers.size(); ++l) {
      const Layer& ly = c.layers[l];
      const LayerWeights& w = layers_[l];
      const Rope& rope = ly.full ? c.rope_full : c.rope_sliding;
      const KvView& kv = ly.full ? t.full : t.sliding;
      const int64_t D = ly.head_dim;
      Value a = g.rms_norm(r, g.constant(w.attn_norm), c.eps);
      Value q = g.reshape(g.matmul(g.constant(w.q), a), {1, c.heads, D});
      q = g.rms_norm(q, g.constant(w.q_norm), c.eps);
      q = g.rope(q, b.qpos, rope.rotated_pairs, rope.theta, rope.exponent_divisor, rope.freq_scale);
      // Scale 1, no mask beyond the window: causality comes from what the target's cache holds (§2.4).
      Value o = attention_->build(g, {q, g.constant(kv.k), g.constant(kv.v), g.constant(kv.positions), b.qpos, 1.0f,
                                      ly.full ? 0 : c.window, false, b.in_use});
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
    g.mark_output(g.write_rows(h_, g.matmul(g.constant(post_), n), b.zero));
    const LmHeadOutput head = head_->build(g, n, head_weights_);  // dense [1, V]; centroid [1, K * S]
    b.top = head.clusters;
    if (b.top) g.mark_output(b.top);
    b.logits = g.named(head.logits, "logits");
    if (drafts) {
      // The vocab id stays here: centroid candidates map through the ordering (ids of ids).
      const int64_t K = c.centroid_top_k, S = centroid_ ? c.vocab / c.centroids : 0;
      const Value candidates =  // centroid: the vocab id of each logit, [K * S]
          b.top ? g.reshape(g.get_rows(g.constant(ordering_table_), g.reshape(b.top, {K})), {K * S}) : Value{};
      b.draft_row = g.input(DType::I32, {1}, "draft_row");
      Value id;
      if (device->sampler) {
        // Sampled: the logits over the whole vocabulary (as DraftStep::logits) go to row k of device->logits
        // for the verification, and the token is the sampler's draw from them.
        const Value row = b.top ? vocab_row(g, b.logits, candidates) : g.reshape(b.logits, {c.vocab});
        g.mark_output(g.write_rows(device->logits, g.reshape(row, {1, c.vocab}), b.draft_row));
        b.uniform = g.input(DType::F32, {1}, "uniform");
        id = device->sampler->sample_in_graph(g, row, {}, b.uniform, device->state, *backend_, &b.why);
        if (!id) return;
      } else {
        b.token = g.argmax(b.logits);
        id = b.top ? g.get_rows(g.reshape(candidates, {K * S, 1}), g.reshape(b.token, {1})) : b.token;
      }
      g.mark_output(g.write_rows(drafts, g.reshape(id, {1, 1}), b.draft_row));
      return;
    }
    b.token = g.argmax(b.logits);
    g.mark_output(b.logits);
    g.mark_output(b.token);
  }

  // The centroid head's candidate logits spread over the vocabulary as scatter_logits does on the host:
  // every other id gets min(logits) - 1.
  Value vocab_row(Graph& g, Value logits, Value candidates) const {
    const int64_t V = cfg_.vocab, KS = g.shape(candidates)[0];
    const Value flat = g.reshape(logits, {KS});
    const Value lowest = g.reshape(g.argmax(g.scale(flat, -1.0f)), {1});  // ties: any holds the minimum
    const Value low = g.reshape(g.get_rows(g.reshape(flat, {KS, 1}), lowest), {1});
    const Value filler = g.add(low, g.clamp(low, -1.0f, -1.0f));  // min + (-1), as the host's min - 1
    return g.scatter(g.add(g.constant(zeros_), filler), candidates, flat);
  }

  // One step's logits as the head computed them: dense, [vocab] (ids empty); centroid, the candidates'
  // vocab ids and logits.
  struct StepLogits {
    std::vector<int32_t> ids;
    std::vector<float> logits;
  };
  StepLogits step_logits(const Built& b) const {
    const Config& c = cfg_;
    StepLogits out;
    const int64_t S = centroid_ ? c.vocab / c.centroids : 0, K = c.centroid_top_k;
    out.logits.resize(static_cast<size_t>(centroid_ ? K * S : c.vocab));
    b.plan->read(b.logits, std::as_writable_bytes(std::span(out.logits)));
    if (centroid_)
      for (int32_t cl : read_top(b))
        for (int64_t j = 0; j < S; ++j) out.ids.push_back(ordering_[static_cast<size_t>(cl * S + j)]);
    return out;
  }
  std::vector<int32_t> read_top(const Built& b) const {
    std::vector<int32_t> top(static_cast<size_t>(cfg_.centroid_top_k));
    b.plan->read(b.top, std::as_writable_bytes(std::span(top)));
    return top;
  }

  // Runs up to `n` steps from x = `last`. After step k's graph has run, `next(k, graph, token)` sees it
  // with its greedy token (a vocab id) and returns the token step k + 1 embeds.
  void run(const TargetView& target, int32_t last, int n,
           const std::function<int32_t(int, const Built&, int32_t)>& next) {
    if (n <= 0) return;
    const Config& c = cfg_;
    const Bound t = prepare(target, nullptr);
    const int64_t vocab_t = t.embed.table->shape()[0];
    const StepInputs si = step_inputs(target);
    int32_t x = last;
    const int64_t S = centroid_ ? c.vocab / c.centroids : 0;
    for (int k = 0; k < n; ++k) {
      if (x < 0 || x >= vocab_t)
        fail("gemma4-assistant: token {} is outside the target's embedding table [0, {})", x, vocab_t);
      Built& b = *graphs_[k == 0 ? 1 : 0];
      RunInputs in = si.of(b);
      in.inputs.emplace_back(b.x, std::as_bytes(std::span(&x, 1)));
      b.plan->run(in);
      int32_t am = 0;
      b.plan->read(b.token, std::as_writable_bytes(std::span(&am, 1)));
      int32_t token = am;
      if (centroid_) {
        const int32_t cluster = read_top(b)[static_cast<size_t>(am / S)];
        token = ordering_[static_cast<size_t>(cluster * S + am % S)];
      }
      x = next(k, b, token);
    }
  }

  // Whether `drafts` can take n drafts from this drafter's device graphs (an I32 [N >= n, 1] tensor on a
  // backend that gathers I32 rows).
  bool can_keep_drafts(const BackendTensor& drafts, int n) const {
    return drafts.type() == DType::I32 && drafts.shape().size() == 2 && drafts.shape()[1] == 1 &&
           drafts.shape()[0] >= n && backend_->supports(Op::GetRows, DType::I32).ok;
  }

  // The steps with the drafts kept on the backend: no reads, each step's id written into row k of
  // request.buffers.tokens and embedded from there by step k + 1; sampled steps draw it with the request's
  // sampler and write their logits too. False (nothing run) when the sampler's device form cannot run here.
  bool run_on_device(const TargetView& target, const DraftRequest& request) {
    const int n = request.n;
    if (n <= 0) return true;
    const int32_t last = request.last_token;
    const bool sampled = request.buffers.logits && request.rule.sampler;
    const Bound t = prepare(target, sampled ? nullptr : request.buffers.tokens);  // the greedy device steps
    Built* steps[2] = {graphs_[3].get(), graphs_[2].get()};  // [0]: the first step, [1]: the others
    if (sampled) {
      Sampled& s = sampled_steps(t, request);
      if (!s.why.empty()) return false;
      steps[0] = s.first.get();
      steps[1] = s.next.get();
    }
    const int64_t vocab_t = t.embed.table->shape()[0];
    if (last < 0 || last >= vocab_t)
      fail("gemma4-assistant: token {} is outside the target's embedding table [0, {})", last, vocab_t);
    const StepInputs si = step_inputs(target);
    for (int32_t k = 0; k < n; ++k) {
      Built& b = *steps[k == 0 ? 0 : 1];
      RunInputs in = si.of(b);
      const int32_t prev = k - 1;
      if (k == 0)
        in.inputs.emplace_back(b.x, std::as_bytes(std::span(&last, 1)));
      else
        in.inputs.emplace_back(b.prev_row, std::as_bytes(std::span(&prev, 1)));
      in.inputs.emplace_back(b.draft_row, std::as_bytes(std::span(&k, 1)));
      if (sampled) in.inputs.emplace_back(b.uniform, std::as_bytes(request.rule.uniforms.subspan(static_cast<size_t>(k), 1)));
      b.plan->run(in);
    }
    return true;
  }

  // The sampled device steps for a request's tensors and sampler, built once; `why` says when the sampler's
  // device form cannot run on this backend (then the engine's `pick` drafts on the host).
  struct Sampled {
    std::unique_ptr<Built> first, next;
    std::string why;
  };
  Sampled& sampled_steps(const Bound& t, const DraftRequest& r) {
    const std::string key = fmt::format("{}/{}/{}", static_cast<const void*>(r.buffers.tokens.get()),
                                        static_cast<const void*>(r.buffers.logits.get()), r.rule.sampler->device_key(r.rule.state));
    Sampled& s = sampled_[key];
    if (s.first || !s.why.empty()) return s;
    if (!r.rule.sampler->device_ids(r.rule.state).empty()) {
      s.why = "the sampler's rules read the history here (penalty or suppression)";
      return s;
    }
    const DeviceOut out{r.buffers.tokens, r.buffers.logits, r.rule.sampler, r.rule.state};
    for (int first = 0; first < 2; ++first) {
      auto b = std::make_unique<Built>();
      build(*b, t, first == 1, &out);
      if (!b->why.empty()) {
        s.why = b->why;
        break;
      }
      try {
        b->plan = backend_->compile(b->graph);
      } catch (const Error& e) {
        s.why = fmt::format("the backend cannot run the sampling graph: {}", e.what());
        break;
      }
      (first ? s.first : s.next) = std::move(b);
    }
    if (!s.why.empty()) {
      s.first.reset();
      s.next.reset();
      log_debug("gemma4-assistant: drafts are sampled on the host: {}", s.why);
    }
    return s;
  }

  // Binds (and checks) the target once per set of target tensors, so the checks then cost nothing, and
  // builds the step graphs: host ones, or device ones writing into `drafts`.
  Bound prepare(const TargetView& target, const BackendTensorPtr& drafts) {
    const Config& c = cfg_;
    Bound t = bind(target);
    if (t.key() != key_) {
      for (auto& g : graphs_) g.reset();
      sampled_.clear();
      key_ = t.key();
      // A target ring sized for a smaller window may not hold every key the drafter's window reaches.
      if (t.sliding.window > 0 && t.sliding.window < c.window)
        log_warn("gemma4-assistant ({}): the drafter's sliding window {} is wider than the target's {}; keys the "
                 "target's cache has dropped are not seen", file_->path().string(), c.window, t.sliding.window);
    }
    if (drafts && drafts != device_drafts_) {
      graphs_[2].reset();
      graphs_[3].reset();
      device_drafts_ = drafts;
    }
    const int base = drafts ? 2 : 0;
    const DeviceOut out{drafts, nullptr, nullptr, {}};
    for (int first = 0; first < 2; ++first)
      if (!graphs_[base + first]) {
        graphs_[base + first] = std::make_unique<Built>();
        build(*graphs_[base + first], t, first == 1, drafts ? &out : nullptr);
        graphs_[base + first]->plan = backend_->compile(graphs_[base + first]->graph);
      }
    return t;
  }

  // The inputs every step graph takes: the query position, row 0 and the target's slots in use.
  struct StepInputs {
    int32_t qpos = 0, zero = 0, in_use = 0;
    RunInputs of(const Built& b) const {
      RunInputs in;
      in.inputs = {{b.qpos, std::as_bytes(std::span(&qpos, 1))}, {b.zero, std::as_bytes(std::span(&zero, 1))},
                   {b.in_use, std::as_bytes(std::span(&in_use, 1))}};
      return in;
    }
  };
  StepInputs step_inputs(const TargetView& target) const {
    StepInputs si;
    si.qpos = static_cast<int32_t>(std::max<int64_t>(0, target.position() - opt_.query_offset));
    si.in_use = static_cast<int32_t>(target.position());
    return si;
  }

  std::shared_ptr<const ModelFile> file_;
  std::shared_ptr<ComputeBackend> backend_;
  Options opt_;
  Config cfg_;
  bool centroid_ = false;
  BackendTensorPtr pre_, post_, norm_, centroids_, h_;
  BackendTensorPtr ordering_table_;  // centroid: ordering_ as I32 [C, S] on the backend
  BackendTensorPtr device_drafts_;   // the tensor graphs_[2..3] write into
  std::shared_ptr<const LmHead> head_;
  LmHeadWeights head_weights_;
  std::shared_ptr<const Attention> attention_;
  std::vector<LayerWeights> layers_;
  std::vector<int32_t> ordering_;
  std::vector<std::byte> ordered_;  // the reordered head; the CPU backend maps weights in place
  std::vector<std::byte> ordered_scales_, ordered_biases_;  // the same for an MLX head's scales and biases
  std::vector<const void*> key_;
  // [0]: h from the drafter's own state, [1]: from the target; [2], [3]: the same keeping drafts on the backend.
  std::unique_ptr<Built> graphs_[4];
  std::map<std::string, Sampled> sampled_;   // sampled device steps by (tensors, sampler key)
  BackendTensorPtr zeros_;                   // centroid: F32 [vocab] zeros (sampled drafting on the backend)
};

}  // namespace

std::shared_ptr<AssistantDrafter> load_drafter(std::shared_ptr<const ModelFile> file,
                                               std::shared_ptr<ComputeBackend> backend, const ModelInfo& target,
                                               const nlohmann::json& options, const ModelParts& parts) {
  if (!file || !backend) fail("gemma4-assistant: load() needs a file and a backend");
  const Options o = parse_options(options);
  return std::make_shared<Drafter>(std::move(file), std::move(backend), target, o, parts);
}

std::vector<float> scatter_logits(int64_t vocab, std::span<const int32_t> ids, std::span<const float> logits) {
  if (ids.size() != logits.size() || ids.empty())
    fail("gemma4-assistant: scatter_logits: {} ids for {} logits", ids.size(), logits.size());
  const float filler = *std::min_element(logits.begin(), logits.end()) - 1.0f;
  std::vector<float> out(static_cast<size_t>(vocab), filler);
  for (size_t i = 0; i < ids.size(); ++i) out[static_cast<size_t>(ids[i])] = logits[i];
  return out;
}

}  // namespace specula::gemma4_assistant

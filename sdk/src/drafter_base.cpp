// DrafterBase: binding to the target, the step graphs and the K-step loop (drafter_base.hpp).
#include "specula/drafter_base.hpp"

#include <algorithm>

#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/sampler.hpp"

namespace specula {

struct DrafterBase::Step {
  Graph graph;
  std::unique_ptr<CompiledGraph> plan;  // after `graph`: destroyed before it
  // Inputs: `token` (host drafts and every first step) or `previous_row` (later backend steps, which
  // embed the draft the previous step wrote); `draft_row` and `uniform` for backend drafts.
  Value token, previous_row, position, slots_in_use, row0, draft_row, uniform;
  Value logits, ids;  // the head (host steps read them)
  Value draft;        // host steps: the greedy draft, a vocabulary id
  std::string why;    // sampled on the backend: why the sampler's device form cannot run here (no plan)
};

DrafterBase::DrafterBase(std::shared_ptr<ComputeBackend> backend, Setup setup)
    : backend_(std::move(backend)), setup_(std::move(setup)) {}

DrafterBase::~DrafterBase() = default;

std::vector<DraftStep> DrafterBase::draft(const TargetView& target, const DraftRequest& request) {
  const int n = request.n;
  if (n <= 0) return {};
  const BackendTensorPtr& drafts = request.buffers.tokens;
  const bool sampled = request.buffers.logits && request.rule.sampler;
  const bool on_backend = drafts && !request.logits &&
                          (sampled ? static_cast<int>(request.rule.uniforms.size()) >= n : !request.pick) &&
                          drafts->type() == DType::I32 && drafts->shape().size() == 2 && drafts->shape()[1] == 1 &&
                          drafts->shape()[0] >= n && backend_->supports(Op::GetRows, DType::I32).ok;
  if (on_backend) {
    bind(target);
    if (draft_on_backend(request)) return std::vector<DraftStep>(static_cast<size_t>(n));  // tokens -1: on the backend
  }
  const bool logits = request.logits || static_cast<bool>(request.pick);
  std::vector<DraftStep> out;
  run_steps(target, request.last_token, n, [&](int k, const HostStep& step) {
    DraftStep st{step.token(), logits ? step.vocab_logits() : std::vector<float>{}};
    if (request.pick) st.token = request.pick(k, st.logits);
    out.push_back(std::move(st));
    return out.back().token;
  });
  return out;
}

void DrafterBase::run_steps(const TargetView& target, int32_t last, int n,
                            const std::function<int32_t(int, const HostStep&)>& next) {
  if (n <= 0) return;
  bind(target);
  int32_t x = last;
  for (int k = 0; k < n; ++k) {
    check_token(x);
    Kind kind;
    kind.first = k == 0;
    Step& s = step(kind, nullptr);
    RunInputs in = inputs(s);
    in.inputs.emplace_back(s.token, std::as_bytes(std::span(&x, 1)));
    s.plan->run(in);
    HostStep h;
    h.base_ = this;
    h.step_ = &s;
    s.plan->read(s.draft, std::as_writable_bytes(std::span(&h.token_, 1)));
    x = next(k, h);
  }
}

// The steps with the drafts kept on the backend: nothing read back; step k writes its draft into row k
// of request.buffers.tokens and step k + 1 embeds it from there. False (nothing run) when the request's
// sampler has no device form here; the request then drafts on the host.
bool DrafterBase::draft_on_backend(const DraftRequest& r) {
  const bool sampled = r.buffers.logits && r.rule.sampler;
  Kind kind;
  kind.drafts = r.buffers.tokens.get();
  if (sampled) {
    kind.logits = r.buffers.logits.get();
    kind.sampler = r.rule.sampler->device_key(r.rule.state);
  }
  Step* steps[2] = {&step({true, kind.drafts, kind.logits, kind.sampler}, &r),
                    &step({false, kind.drafts, kind.logits, kind.sampler}, &r)};
  if (!steps[0]->plan || !steps[1]->plan) return false;
  check_token(r.last_token);
  for (int32_t k = 0; k < r.n; ++k) {
    Step& s = *steps[k == 0 ? 0 : 1];
    RunInputs in = inputs(s);
    const int32_t previous = k - 1;
    if (k == 0)
      in.inputs.emplace_back(s.token, std::as_bytes(std::span(&r.last_token, 1)));
    else
      in.inputs.emplace_back(s.previous_row, std::as_bytes(std::span(&previous, 1)));
    in.inputs.emplace_back(s.draft_row, std::as_bytes(std::span(&k, 1)));
    if (sampled) in.inputs.emplace_back(s.uniform, std::as_bytes(r.rule.uniforms.subspan(static_cast<size_t>(k), 1)));
    s.plan->run(in);
  }
  return true;
}

// Reads the target's tensors and makes their set current: checked and given its own graphs the first
// time it is seen.
void DrafterBase::bind(const TargetView& target) {
  DraftTarget t;
  for (const std::string& type : setup_.attention_types) {
    KvView kv;
    try {
      kv = target.kv(type);
    } catch (const Error& e) {
      fail("{}: the target has no {}-attention KV cache, which the drafter's {} layers read: {}", setup_.name, type,
           type, e.what());
    }
    if (!kv.k || !kv.v || !kv.positions)
      fail("{}: the target exposes no {}-attention KV cache tensors", setup_.name, type);
    t.kv[type] = kv;
  }
  t.hidden = target.last_hidden();
  t.embed = target.token_embedding();
  if (!t.hidden) fail("{}: the target exposes no last hidden state, which a draft step reads", setup_.name);
  if (!t.embed.table || t.embed.table->shape().size() != 2)
    fail("{}: the target's token embedding is {}, expected a [vocab, hidden] table", setup_.name,
         t.embed.table ? shape_str(t.embed.table->shape()) : "missing");
  std::vector<const void*> key{t.hidden.get(), t.embed.table.get()};
  for (const auto& [type, kv] : t.kv) key.insert(key.end(), {kv.k.get(), kv.v.get(), kv.positions.get()});
  auto it = bound_.find(key);
  if (it == bound_.end()) {
    check_target(t);
    std::erase_if(bound_, [](const auto& b) { return b.second.target.hidden.use_count() <= b.second.refs; });
    if (bound_.size() >= kBoundTargets)
      bound_.erase(std::min_element(bound_.begin(), bound_.end(),
                                    [](const auto& a, const auto& b) { return a.second.used < b.second.used; }));
    it = bound_.emplace(std::move(key), Bound{std::move(t), {}, 0}).first;
  }
  current_ = &it->second;
  current_->used = ++uses_;
  in_use_ = static_cast<int32_t>(target.position());
  position_ = static_cast<int32_t>(std::max<int64_t>(0, target.position() - setup_.query_offset));
}

DrafterBase::Step& DrafterBase::step(const Kind& kind, const DraftRequest* request) {
  std::unique_ptr<Step>& s = current_->steps[kind];
  if (!s && kind.logits && !zeros_) zeros_ = backend_->allocate("drafter.zeros", DType::F32, {setup_.vocab});
  if (!s) {
    const long before = current_->target.hidden.use_count();
    s = build(kind, request);
    current_->refs += current_->target.hidden.use_count() - before;  // what the graph and its plan hold
  }
  return *s;
}

std::unique_ptr<DrafterBase::Step> DrafterBase::build(const Kind& kind, const DraftRequest* request) const {
  auto s = std::make_unique<Step>();
  Graph& g = s->graph;
  const BackendTensorPtr drafts = kind.drafts ? request->buffers.tokens : nullptr;
  const Sampler* sampler = kind.logits ? request->rule.sampler : nullptr;
  if (sampler && !sampler->device_ids(request->rule.state).empty()) {
    s->why = "the sampler's rules read the history here (penalty or suppression)";
  } else {
    DraftStepInputs in;
    in.first = kind.first;
    if (drafts && !kind.first) {  // the previous step's draft, read where it wrote it
      s->previous_row = g.input(DType::I32, {1}, "previous_draft_row");
      in.token = g.reshape(g.get_rows(g.constant(drafts), s->previous_row), {1});
    } else {
      in.token = s->token = g.input(DType::I32, {1}, "token");
    }
    in.position = s->position = g.input(DType::I32, {1}, "query_position");
    in.row0 = s->row0 = g.input(DType::I32, {1}, "row0");
    in.slots_in_use = s->slots_in_use = g.input(DType::I32, {1}, "slots_in_use");
    const DraftHead head = build_step(g, current_->target, in);
    s->logits = g.named(head.logits, "logits");
    s->ids = head.ids;
    const int64_t N = g.shape(head.logits).back();
    // The greedy draft as a vocabulary id: the argmax, through the candidate ids when there are some.
    auto greedy = [&] {
      const Value best = g.argmax(s->logits);
      return s->ids ? g.get_rows(g.reshape(s->ids, {N, 1}), g.reshape(best, {1})) : best;
    };
    Value id;
    if (sampler) {
      // The logits over the vocabulary (as DraftStep::logits) go to row k of the round's logits for the
      // verification, and the draft is the sampler's draw from them.
      const int64_t V = setup_.vocab;
      Value row = g.reshape(s->logits, {N});
      if (s->ids) {  // every other id gets min(logits) - 1, as scatter_logits
        const Value lowest = g.reshape(g.argmax(g.scale(row, -1.0f)), {1});
        const Value low = g.reshape(g.get_rows(g.reshape(row, {N, 1}), lowest), {1});
        row = g.scatter(g.add(g.constant(zeros_), g.add(low, g.clamp(low, -1.0f, -1.0f))), s->ids, row);
      }
      s->draft_row = g.input(DType::I32, {1}, "draft_row");
      g.mark_output(g.write_rows(request->buffers.logits, g.reshape(row, {1, V}), s->draft_row));
      s->uniform = g.input(DType::F32, {1}, "uniform");
      id = sampler->sample_in_graph(g, row, {}, s->uniform, request->rule.state, *backend_, &s->why);
    } else {
      id = greedy();
    }
    if (id && drafts) {
      if (!s->draft_row) s->draft_row = g.input(DType::I32, {1}, "draft_row");
      g.mark_output(g.write_rows(drafts, g.reshape(id, {1, 1}), s->draft_row));
    } else if (id) {
      s->draft = id;
      g.mark_output(id);
      g.mark_output(s->logits);
      if (s->ids) g.mark_output(s->ids);
    }
  }
  if (s->why.empty()) {
    try {
      s->plan = backend_->compile(g);
    } catch (const Error& e) {
      if (!sampler) throw;
      s->why = fmt::format("the backend cannot run the sampling graph: {}", e.what());
    }
  }
  if (!s->why.empty()) log_debug("{}: drafts are sampled on the host: {}", setup_.name, s->why);
  return s;
}

RunInputs DrafterBase::inputs(const Step& s) const {
  static const int32_t zero = 0;
  RunInputs in;
  in.inputs = {{s.position, std::as_bytes(std::span(&position_, 1))},
               {s.row0, std::as_bytes(std::span(&zero, 1))},
               {s.slots_in_use, std::as_bytes(std::span(&in_use_, 1))}};
  return in;
}

void DrafterBase::check_token(int32_t token) const {
  const int64_t vocab = current_->target.embed.table->shape()[0];
  if (token < 0 || token >= vocab)
    fail("{}: token {} is outside the target's embedding table [0, {})", setup_.name, token, vocab);
}

std::vector<int32_t> DrafterBase::HostStep::ids() const {
  if (!step_->ids) return {};
  std::vector<int32_t> out(static_cast<size_t>(step_->graph.shape(step_->ids)[0]));
  step_->plan->read(step_->ids, std::as_writable_bytes(std::span(out)));
  return out;
}

std::vector<float> DrafterBase::HostStep::logits() const {
  std::vector<float> out(static_cast<size_t>(step_->graph.shape(step_->logits).back()));
  step_->plan->read(step_->logits, std::as_writable_bytes(std::span(out)));
  return out;
}

std::vector<float> DrafterBase::HostStep::vocab_logits() const {
  if (!step_->ids) return logits();
  return scatter_logits(base_->setup_.vocab, ids(), logits());
}

std::vector<float> scatter_logits(int64_t vocab, std::span<const int32_t> ids, std::span<const float> logits) {
  if (ids.size() != logits.size() || ids.empty())
    fail("scatter_logits: {} ids for {} logits", ids.size(), logits.size());
  const float filler = *std::min_element(logits.begin(), logits.end()) - 1.0f;
  std::vector<float> out(static_cast<size_t>(vocab), filler);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) fail("scatter_logits: id {} is outside the vocabulary [0, {})", ids[i], vocab);
    out[static_cast<size_t>(ids[i])] = logits[i];
  }
  return out;
}

}  // namespace specula

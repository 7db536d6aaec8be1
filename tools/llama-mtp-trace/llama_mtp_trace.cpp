// llama-mtp-trace: llama.cpp's draft-mtp speculative decoding, one JSON line per round.
//
// A development tool that makes the goldens of tests/gemma4_assistant/golden/llamacpp-mtp (not part of
// the Specula build; CI has no llama.cpp). It links the prebuilt libllama and libllama-common of
// node-llama-cpp (llama.cpp v0.5.0) and drives the draft-mtp implementation of common/speculative.cpp
// through its public calls (common_speculative_draft / _process / _accept) with the decode loop of
// examples/speculative-simple (prefill all prompt ids but the last; each round verifies
// [id_last, drafts]; stop once more than -n tokens were produced), greedy only. What it adds is the
// trace: the drafter's logits of every draft step, captured by an eval callback on the draft context
// ("result_output"), as their top-20 log-softmax, and the target's greedy token at every verified row.
//
// usage: llama-mtp-trace (--ids 2,105,... | -p TEXT) --trace FILE.jsonl [--time] [llama.cpp flags: -m TARGET
//        -md ASSISTANT --spec-type draft-mtp --spec-draft-n-max K -n N --temp 0 -ctk f32 -ctv f32 -c 512 -t 2]
// Output lines (tools/llama-mtp-trace/README.md, docs/cli.md "--trace-json"):
//   {"round": r, "n_past": p, "id_last": t, "draft": [...], "ids": [...], "n_accepted": a, "steps": [...]}
//   {"summary": {"n_predict": N, "n_drafted": D, "n_accept": A, "generated": [...], ...}}
// --time: no logit capture (it would slow the drafter); each round line adds its times in ms (draft:
// common_speculative_draft; verify: the target's decode of [id_last, drafts], all logits; process:
// common_speculative_process; sample: common_sampler_sample_and_accept_n), and the summary adds their
// medians over the rounds that drafted the full K, plus decode_ms: the median of 16 plain single-token
// decodes timed after the loop, on the same context (bench/compare_llama.sh --mtp reads these).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "arg.h"
#include "common.h"
#include "ggml-backend.h"
#include "llama.h"
#include "sampling.h"
#include "speculative.h"

namespace {

// Every "result_output" (logits) tensor the draft context computes, in order.
struct Capture {
  std::vector<std::vector<float>> logits;
};

bool capture_logits(ggml_tensor* t, bool ask, void* user) {
  const bool wanted = std::strcmp(t->name, "result_output") == 0;
  if (ask) return wanted;
  if (wanted) {
    auto* c = static_cast<Capture*>(user);
    std::vector<float> row(static_cast<size_t>(ggml_nelements(t)));
    ggml_backend_tensor_get(t, row.data(), 0, ggml_nbytes(t));
    c->logits.push_back(std::move(row));
  }
  return true;
}

int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// The 20 highest entries of log_softmax(x) (natural log), highest first, ties by lower id.
std::string top20(const std::vector<float>& x) {
  const double mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (float v : x) sum += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(sum);
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  const size_t k = std::min<size_t>(20, x.size());
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return x[a] != x[b] ? x[a] > x[b] : a < b; });
  std::string s = "[";
  for (size_t i = 0; i < k; ++i) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s[%d, %.9g]", i ? ", " : "", order[i], static_cast<double>(x[order[i]]) - lse);
    s += buf;
  }
  return s + "]";
}

std::string list(const std::vector<llama_token>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<llama_token> parse_ids(const std::string& text) {
  std::vector<llama_token> ids;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find(',', at);
    if (end == std::string::npos) end = text.size();
    ids.push_back(static_cast<llama_token>(std::stol(text.substr(at, end - at))));
    at = end + 1;
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<llama_token> inp;
  std::string trace_path;
  bool timing = false;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--time") timing = true;
    else if (a == "--ids" && i + 1 < argc) inp = parse_ids(argv[++i]);
    else if (a == "--trace" && i + 1 < argc) trace_path = argv[++i];
    else rest.push_back(argv[i]);
  }
  if (trace_path.empty()) {
    std::fprintf(stderr, "usage: llama-mtp-trace (--ids ID,ID,... | -p TEXT) --trace FILE [llama.cpp flags]\n");
    return 1;
  }
  common_params params;
  common_init();
  if (!common_params_parse(static_cast<int>(rest.size()), rest.data(), params, LLAMA_EXAMPLE_SPECULATIVE)) return 1;
  if (params.sampling.temp > 0) {
    std::fprintf(stderr, "llama-mtp-trace traces greedy decoding only (--temp 0)\n");
    return 1;
  }
  const auto limits = common_speculative_get_output_limits(params.n_batch, params.n_parallel,
                                                           common_speculative_n_max(&params.speculative));
  params.n_outputs_max = limits.total;
  params.n_outputs_max_per_seq = limits.per_seq;

  ggml_backend_load_all_from_path(LLAMA_BINS);
  llama_backend_init();
  auto init_tgt = common_init_from_params(params);
  llama_model* model_tgt = init_tgt->model();
  llama_context* ctx_tgt = init_tgt->context();
  if (!model_tgt || !ctx_tgt) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model_tgt);
  const int64_t n_vocab = llama_vocab_n_tokens(vocab);
  if (inp.empty()) inp = common_tokenize(ctx_tgt, params.prompt, true, true);  // as speculative-simple
  if (inp.size() < 2) {
    std::fprintf(stderr, "the prompt needs at least 2 tokens\n");
    return 1;
  }

  // The draft (MTP) context, with the logits capture on it only.
  Capture capture;
  common_params params_dft = common_base_params_to_speculative(params);
  if (!timing) {
    params_dft.cb_eval = capture_logits;
    params_dft.cb_eval_user_data = &capture;
  }
  auto init_dft = common_speculative_init_from_params(params_dft, model_tgt, ctx_tgt);
  params.speculative.draft.ctx_tgt = ctx_tgt;
  params.speculative.draft.ctx_dft = init_dft->context();
  if (!params.speculative.draft.ctx_dft) return 1;
  llama_context* ctx_dft = params.speculative.draft.ctx_dft;

  common_sampler_ptr smpl(common_sampler_init(model_tgt, params.sampling));
  common_speculative* spec = common_speculative_init(params.speculative, 1);
  if (!spec) return 1;
  const llama_seq_id seq = 0;

  // Prefill every prompt id but the last, which the first round verifies.
  llama_batch batch_prompt = llama_batch_init(static_cast<int32_t>(inp.size()), 0, 1);
  for (size_t i = 0; i + 1 < inp.size(); ++i) common_batch_add(batch_prompt, inp[i], static_cast<llama_pos>(i), {seq}, false);
  if (llama_decode(ctx_tgt, batch_prompt) != 0 || !common_speculative_process(spec, batch_prompt)) return 1;
  llama_batch_free(batch_prompt);

  llama_token id_last = inp.back();
  llama_tokens committed(inp.begin(), inp.end() - 1);  // in the target's cache
  int n_past = static_cast<int>(inp.size()) - 1;
  common_speculative_begin(spec, seq, committed);

  FILE* out = std::fopen(trace_path.c_str(), "w");
  if (!out) return 1;
  llama_batch batch = llama_batch_init(llama_n_batch(ctx_tgt), 0, 1);
  int n_predict = 0, n_drafted = 0, n_accept = 0;
  std::vector<llama_token> generated;
  std::vector<int> accepted_by_position;
  using Clock = std::chrono::steady_clock;
  std::vector<double> draft_ms, verify_ms, process_ms, sample_ms;  // rounds that drafted the full K
  for (int round = 0;; ++round) {
    // The round's draft: at most what fits the context and the remaining budget (llama.cpp truncates
    // to that limit only when it is positive).
    int n_draft_max = static_cast<int>(llama_n_ctx(ctx_tgt)) - n_past - 2;
    if (params.n_predict >= 0) n_draft_max = std::min(n_draft_max, params.n_predict - n_predict - 1);
    n_draft_max = std::max(n_draft_max, 0);
    llama_tokens draft;
    capture.logits.clear();
    common_speculative_get_draft_params(spec, seq) = {true, n_draft_max, n_past, id_last, &committed, &draft};
    auto t = Clock::now();
    common_speculative_draft(spec);
    const double t_draft = ms_since(t);
    llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, n_past, -1);
    if (!timing && capture.logits.size() < draft.size()) {
      std::fprintf(stderr, "round %d: captured %zu drafter logit rows for %zu drafts\n", round, capture.logits.size(),
                   draft.size());
      return 1;
    }
    std::string steps = "[";
    for (size_t i = 0; i < (timing ? 0 : draft.size()); ++i) {
      const std::vector<float>& row = capture.logits[i];
      if (static_cast<int64_t>(row.size()) != n_vocab || argmax(row.data(), n_vocab) != draft[i]) {
        std::fprintf(stderr, "round %d step %zu: the captured logits do not give the draft %d\n", round, i, draft[i]);
        return 1;
      }
      steps += (i ? ", " : "") + std::string("{\"token\": ") + std::to_string(draft[i]) + ", \"top\": " + top20(row) + "}";
    }
    steps += "]";

    // Verify [id_last, drafts] in one target batch.
    common_batch_clear(batch);
    common_batch_add(batch, id_last, n_past, {seq}, true);
    for (size_t i = 0; i < draft.size(); ++i) common_batch_add(batch, draft[i], n_past + 1 + static_cast<llama_pos>(i), {seq}, true);
    t = Clock::now();
    if (llama_decode(ctx_tgt, batch) != 0) return 1;
    llama_synchronize(ctx_tgt);
    const double t_verify = ms_since(t);
    t = Clock::now();
    if (!common_speculative_process(spec, batch)) return 1;
    const double t_process = ms_since(t);
    std::vector<llama_token> greedy;
    for (size_t i = 0; i <= draft.size(); ++i) greedy.push_back(argmax(llama_get_logits_ith(ctx_tgt, static_cast<int32_t>(i)), n_vocab));
    t = Clock::now();
    const std::vector<llama_token> ids = common_sampler_sample_and_accept_n(smpl.get(), ctx_tgt, draft);
    const double t_sample = ms_since(t);
    const int accepted = static_cast<int>(ids.size()) - 1;
    common_speculative_accept(spec, seq, static_cast<uint16_t>(accepted));
    std::string times;
    if (timing) {
      char buf[160];
      std::snprintf(buf, sizeof buf, ", \"draft_ms\": %.4f, \"verify_ms\": %.4f, \"process_ms\": %.4f, \"sample_ms\": %.4f",
                    t_draft, t_verify, t_process, t_sample);
      times = buf;
      if (static_cast<int>(draft.size()) == params.speculative.draft.n_max) {
        draft_ms.push_back(t_draft), verify_ms.push_back(t_verify);
        process_ms.push_back(t_process), sample_ms.push_back(t_sample);
      }
    }
    std::fprintf(out, "{\"round\": %d, \"n_past\": %d, \"id_last\": %d, \"draft\": %s, \"ids\": %s, \"n_accepted\": %d, \"steps\": %s%s}\n",
                 round, n_past, id_last, list(draft).c_str(), list(greedy).c_str(), accepted, steps.c_str(), times.c_str());

    n_past += static_cast<int>(ids.size());
    n_drafted += static_cast<int>(draft.size());
    n_accept += accepted;
    n_predict += static_cast<int>(ids.size());
    // Per draft position, as llama-server's spec_decode_num_accepted_tokens_per_pos_total (sized by the
    // longest draft, as Specula's statistics are).
    accepted_by_position.resize(std::max(accepted_by_position.size(), draft.size()));
    for (int i = 0; i < accepted; ++i) ++accepted_by_position[i];
    bool eos = false;
    for (llama_token t : ids) {
      committed.push_back(id_last);
      id_last = t;
      generated.push_back(t);
      if (llama_vocab_is_eog(vocab, t)) {
        eos = true;
        break;
      }
    }
    llama_memory_seq_rm(llama_get_memory(ctx_tgt), seq, n_past, -1);
    llama_memory_seq_rm(llama_get_memory(ctx_dft), seq, n_past, -1);
    if ((params.n_predict >= 0 && n_predict > params.n_predict) || eos) {
      const int rounds = round + 1;
      std::string times;
      if (timing) {
        // Plain decode steps on the same context: the step the rounds are measured against.
        std::vector<double> decode_ms;
        llama_batch one = llama_batch_init(1, 0, 1);
        for (int i = 0; i < 16 && n_past + 1 < static_cast<int>(llama_n_ctx(ctx_tgt)); ++i, ++n_past) {
          common_batch_clear(one);
          common_batch_add(one, id_last, n_past, {seq}, true);
          t = Clock::now();
          if (llama_decode(ctx_tgt, one) != 0) return 1;
          llama_synchronize(ctx_tgt);
          decode_ms.push_back(ms_since(t));
          id_last = argmax(llama_get_logits_ith(ctx_tgt, 0), n_vocab);
        }
        llama_batch_free(one);
        char buf[256];
        std::snprintf(buf, sizeof buf, ", \"timed_rounds\": %zu, \"draft_ms\": %.4f, \"verify_ms\": %.4f, "
                      "\"process_ms\": %.4f, \"sample_ms\": %.4f, \"decode_ms\": %.4f", draft_ms.size(), median(draft_ms),
                      median(verify_ms), median(process_ms), median(sample_ms), median(decode_ms));
        times = buf;
      }
      std::fprintf(out, "{\"summary\": {\"n_predict\": %d, \"n_drafted\": %d, \"n_accept\": %d, \"generated\": %s, "
                        "\"prompt\": %s, \"max_tokens\": %d, \"draft_tokens\": %d, \"rounds\": %d, "
                        "\"accepted_by_position\": %s, \"mean_accepted_length\": %.9g%s}}\n",
                   n_predict, n_drafted, n_accept, list(generated).c_str(), list(inp).c_str(), params.n_predict,
                   params.speculative.draft.n_max, rounds, list(accepted_by_position).c_str(),
                   static_cast<double>(n_accept) / rounds, times.c_str());
      break;
    }
  }
  std::fclose(out);
  llama_batch_free(batch);
  common_speculative_free(spec);
  llama_backend_free();
  return 0;
}

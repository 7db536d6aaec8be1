// llama.cpp measured as `specula bench` measures, through the public llama.h API, for machines without
// node (bench/gpu_check.sh on a GPU machine; bench/llama_peer.mjs does the same through node-llama-cpp).
// Built by bench/gpu/bundle.sh against node-llama-cpp 3.22.1's prebuilt libllama (llama.cpp v0.5.0).
//
//   llama_peer MODEL [--pp 512] [--tg 128] [--reps 3] [--verify 2,3,5,9] [--ngl 999] [--threads N]
//
// One JSON object on stdout:
// - pp: one llama_decode of PP prompt tokens on an empty cache (n_batch 2048, n_ubatch 512), median of
//   REPS after one warm-up (llama-bench's pp);
// - tg: TG single-token decodes after that prompt (specula bench's tg: at depth PP, not on an empty cache);
// - verify: a forward of V tokens at depth PP with logits for every one of them (a speculative
//   verification of V - 1 drafts), then the cache cut back to PP; median ms and in decode steps.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
void quiet(ggml_log_level, const char*, void*) {}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}
[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "llama_peer: %s\n", what);
  std::exit(1);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: llama_peer MODEL [--pp N] [--tg N] [--reps N] [--verify 2,3,5,9] [--ngl N] [--threads N]\n");
    return 2;
  }
  const char* path = argv[1];
  int pp = 512, tg = 128, reps = 3, ngl = 999, threads = 4;
  std::vector<int> verify;
  for (int a = 2; a + 1 < argc; a += 2) {
    const std::string k = argv[a];
    const char* v = argv[a + 1];
    if (k == "--pp") pp = std::atoi(v);
    else if (k == "--tg") tg = std::atoi(v);
    else if (k == "--reps") reps = std::atoi(v);
    else if (k == "--ngl") ngl = std::atoi(v);
    else if (k == "--threads") threads = std::atoi(v);
    else if (k == "--verify") {
      for (const char* p = v; *p;) {
        verify.push_back(std::atoi(p));
        while (*p && *p != ',') ++p;
        if (*p == ',') ++p;
      }
    } else die(("unknown option " + k).c_str());
  }
  if (pp < 1 || tg < 1 || reps < 1) die("--pp, --tg and --reps must be at least 1");
  if (!std::getenv("LLVERBOSE")) llama_log_set(quiet, nullptr);
  if (const char* bins = std::getenv("LLBINS")) ggml_backend_load_all_from_path(bins);
  else ggml_backend_load_all();
  llama_backend_init();

  auto mp = llama_model_default_params();
  mp.n_gpu_layers = ngl;
  const double t_load = now();
  llama_model* model = llama_model_load_from_file(path, mp);
  if (!model) die("the model did not load (LLVERBOSE=1 shows llama.cpp's log)");
  const double load_s = now() - t_load;
  auto cp = llama_context_default_params();
  cp.n_ctx = 4096;
  cp.n_batch = 2048;
  cp.n_ubatch = 512;
  cp.n_threads = cp.n_threads_batch = threads;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("no context");
  const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::vector<llama_token> prompt(static_cast<size_t>(pp));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<llama_token>((i * 7919 + 13) % nv);
  llama_memory_t mem = llama_get_memory(ctx);

  auto decode = [&](llama_batch b) {
    if (llama_decode(ctx, b)) die("llama_decode failed");
    llama_synchronize(ctx);
  };
  auto prefill = [&]() {  // seconds
    llama_memory_clear(mem, true);
    const double a = now();
    decode(llama_batch_get_one(prompt.data(), pp));
    return now() - a;
  };
  auto generate = [&]() {  // seconds for tg tokens after the prompt
    prefill();
    llama_token t = prompt[0];
    const double a = now();
    for (int i = 0; i < tg; ++i) {
      decode(llama_batch_get_one(&t, 1));
      t = static_cast<llama_token>((t * 31 + 7) % nv);
    }
    return now() - a;
  };
  std::vector<double> vp, vt;
  prefill();
  for (int r = 0; r < reps; ++r) vp.push_back(pp / prefill());
  generate();
  for (int r = 0; r < reps; ++r) vt.push_back(tg / generate());
  const double step = 1.0 / median(vt);

  std::string vjson;
  if (!verify.empty()) {
    prefill();
    for (int v : verify) {
      llama_batch b = llama_batch_init(v, 0, 1);
      b.n_tokens = v;
      for (int i = 0; i < v; ++i) {
        b.token[i] = static_cast<llama_token>((i * 104729 + 3) % nv);
        b.pos[i] = pp + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;  // a verification scores every position
      }
      std::vector<double> ms;
      for (int r = 0; r < reps + 1; ++r) {  // the first is a warm-up (a new graph shape)
        const double a = now();
        decode(b);
        if (r > 0) ms.push_back(1e3 * (now() - a));
        llama_memory_seq_rm(mem, 0, pp, -1);
      }
      llama_batch_free(b);
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s{\"tokens\": %d, \"ms\": %.3f, \"steps\": %.3f}", vjson.empty() ? "" : ", ", v,
                    median(ms), median(ms) / 1e3 / step);
      vjson += buf;
    }
  }

  std::string devices;
  for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t d = ggml_backend_dev_get(i);
    if (ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_CPU) continue;
    devices += std::string(devices.empty() ? "" : "; ") + ggml_backend_dev_name(d) + " " + ggml_backend_dev_description(d);
  }
  std::printf("{\"engine\": \"llama.cpp v0.5.0\", \"device\": \"%s\", \"n_gpu_layers\": %d, \"load_s\": %.2f, "
              "\"prompt_tokens\": %d, \"gen_tokens\": %d, \"pp_tok_s\": %.3f, \"tg_tok_s\": %.3f, \"verify\": [%s], \"pp_all\": [",
              devices.c_str(), ngl, load_s, pp, tg, median(vp), median(vt), vjson.c_str());
  for (size_t i = 0; i < vp.size(); ++i) std::printf("%s%.3f", i ? ", " : "", vp[i]);
  std::printf("], \"tg_all\": [");
  for (size_t i = 0; i < vt.size(); ++i) std::printf("%s%.3f", i ? ", " : "", vt[i]);
  std::printf("]}\n");
  llama_free(ctx);
  llama_model_free(model);
  return 0;
}

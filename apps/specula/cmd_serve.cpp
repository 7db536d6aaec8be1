// `specula serve`: the OpenAI-compatible HTTP server (docs/serving.md). Listens first (GET /health is 503
// while the model loads), then loads the pipeline; SIGTERM or SIGINT shuts it down gracefully.
#include <pthread.h>
#include <unistd.h>
#include <signal.h>

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/api.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/serve/server.hpp"

namespace {

namespace cli = specula::cli;

int run_serve(const std::vector<std::string>& args) {
  cli::ModelArgs model;
  specula::serve::ServerOptions so;
  int drain_seconds = 10;
  cli::po::options_description desc(
      "usage: specula serve PIPELINE.yaml [options]\n"
      "       specula serve MODEL.gguf|MODEL_DIR [options]\n"
      "       specula serve --model PATH [options]\n\n"
      "An OpenAI-compatible server: POST /v1/chat/completions, /v1/completions (\"stream\": true for\n"
      "server-sent events), GET /v1/models, /health, /metrics (Prometheus), POST /tokenize, /detokenize.\n"
      "The pipeline's sampler section gives each request's defaults. SIGTERM / Ctrl+C: new requests get 503,\n"
      "running ones finish (for --shutdown-timeout seconds, then they are cancelled), exit 0.\n\noptions");
  desc.add_options()("help,h", "show this help")(
      "host", cli::po::value(&so.host)->default_value("127.0.0.1"), "address to listen on (0.0.0.0: every interface)")(
      "port", cli::po::value(&so.port)->default_value(8080), "port to listen on (0 = a free one, printed)")(
      "parallel", cli::po::value(&so.parallel)->default_value(1),
      "requests generated at once (slots, each with a context of its own)")(
      "queue-limit", cli::po::value(&so.queue_limit)->default_value(64),
      "requests waiting for a slot at most; beyond it requests get 429")(
      "alias,a", cli::po::value(&so.model_name), "the model's id in /v1/models and requests (default: the file's stem)")(
      "shutdown-timeout", cli::po::value(&drain_seconds)->default_value(10),
      "seconds running requests may take to finish at shutdown");
  cli::po::variables_map vm;
  if (!cli::parse_model_command(args, desc, model, vm)) return 0;
  if (so.port < 0 || so.port > 65535) specula::fail("--port must be between 0 and 65535, got {}", so.port);
  if (so.parallel < 1 || so.parallel > 256) specula::fail("--parallel must be between 1 and 256, got {}", so.parallel);
  if (so.queue_limit < 0) specula::fail("--queue-limit must not be negative, got {}", so.queue_limit);
  if (drain_seconds < 0) specula::fail("--shutdown-timeout must not be negative, got {}", drain_seconds);
  so.drain_timeout = std::chrono::seconds(drain_seconds);
  const specula::core::Pipeline pipeline = cli::resolve_pipeline(model);  // flag errors before listening

  // SIGTERM and SIGINT go to this thread's sigwait only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  specula::serve::Server server(so);
  const int port = server.start();
  specula::log_info("listening on http://{}:{} (loading the model; /health answers 503 until it is ready)", so.host, port);
  fmt::print("specula serve: listening on http://{}:{}\n", so.host, port);
  std::fflush(stdout);

  std::string load_error;
  std::thread loader([&] {
    try {
      specula::api::OpenOptions oo;
      oo.plugin_paths.assign(model.plugin_paths.begin(), model.plugin_paths.end());
      auto loaded = specula::api::Model::from_pipeline(pipeline, oo);
      // A few tokens before /health says ready: the first products on a backend may prepare their weights
      // (the CPU backend packs them), which would otherwise land on the first request's time to first token.
      specula::api::SamplingConfig warmup;
      warmup.max_tokens = 3;
      loaded->generate(loaded->tokenize("Hello"), warmup);
      server.set_model(std::move(loaded));
      specula::log_info("model loaded; ready");
    } catch (const std::exception& e) {
      load_error = e.what();
      kill(getpid(), SIGTERM);  // wake the main thread
    }
  });
  int sig = 0;
  sigwait(&signals, &sig);
  loader.join();
  if (!load_error.empty()) specula::fail("{}", load_error);
  specula::log_info("{}: shutting down (new requests get 503; running ones may finish for {} s)",
                    sig == SIGTERM ? "SIGTERM" : "SIGINT", drain_seconds);
  server.shutdown();
  return 0;
}

}  // namespace

SPECULA_COMMAND("serve", "OpenAI-compatible HTTP server with metrics (pipeline YAML or --model)", run_serve);

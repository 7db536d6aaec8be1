// `specula serve`: the OpenAI-compatible HTTP server (docs/serving.md). Listens first (GET /health is 503
// while the model loads), then loads the pipeline; SIGTERM or SIGINT shuts it down gracefully.
#include <pthread.h>
#include <unistd.h>
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
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

// The API keys of --api-key, --api-key-file (one per line; blank lines and # comments skipped) and
// SPECULA_API_KEY, all accepted. A key given on the command line shows in `ps`: prefer the file or the
// variable (the Kubernetes manifests set it from a Secret).
std::vector<std::string> api_keys(std::vector<std::string> keys, const std::string& file) {
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) specula::fail("--api-key-file {}: cannot read it", file);
    const size_t before = keys.size();
    for (std::string line; std::getline(in, line);) {
      const size_t b = line.find_first_not_of(" \t\r"), e = line.find_last_not_of(" \t\r");
      if (b == std::string::npos || line[b] == '#') continue;
      keys.push_back(line.substr(b, e - b + 1));
    }
    if (keys.size() == before) specula::fail("--api-key-file {}: no key in it (one key per line)", file);
  }
  if (const char* env = std::getenv("SPECULA_API_KEY"); env && *env) keys.emplace_back(env);
  for (const auto& k : keys)
    if (k.find_first_of(" \t\r\n") != std::string::npos) specula::fail("an API key holds whitespace; keys are single words");
  return keys;
}

int run_serve(const std::vector<std::string>& args) {
  cli::ModelArgs model;
  specula::serve::ServerOptions so;
  auto& limits = so.limits;
  int drain_seconds = 10, read_timeout = 30, idle_timeout = 60, write_timeout = 30;
  size_t header_kib = 16, body_mib = 4;
  std::string key_file;
  cli::po::options_description desc(
      "usage: specula serve PIPELINE.yaml [options]\n"
      "       specula serve MODEL.gguf|MODEL_DIR [options]\n"
      "       specula serve --model PATH [options]\n\n"
      "An OpenAI-compatible server: POST /v1/chat/completions, /v1/completions (\"stream\": true for\n"
      "server-sent events), GET /v1/models, /v1/models/{id}, /health, /metrics (Prometheus), POST /tokenize,\n"
      "/detokenize. The pipeline's sampler section gives each request's defaults. SIGTERM / Ctrl+C: new\n"
      "requests get 503, running ones finish (for --shutdown-timeout seconds, then they are cut: \"abort\"),\n"
      "exit 0. docs/serving.md, \"Security and limits\", explains every limit.\n\noptions");
  desc.add_options()("help,h", "show this help")(
      "host", cli::po::value(&so.host)->default_value("127.0.0.1"), "address to listen on (0.0.0.0: every interface)")(
      "port", cli::po::value(&so.port)->default_value(8080), "port to listen on (0 = a free one, printed)")(
      "parallel", cli::po::value(&so.parallel)->default_value(1),
      "requests generated at once (slots, each with a context of its own)")(
      "queue-limit", cli::po::value(&so.queue_limit)->default_value(64),
      "requests waiting for a slot at most (those being read included); beyond it requests get 429")(
      "alias,a", cli::po::value(&so.model_name), "the model's id in /v1/models and requests (default: the file's stem)")(
      "shutdown-timeout", cli::po::value(&drain_seconds)->default_value(10),
      "seconds running requests may take to finish at shutdown")(
      "api-key", cli::po::value(&so.api_keys)->composing(),
      "require 'Authorization: Bearer KEY' on every endpoint but /health and /metrics (repeatable; prefer "
      "--api-key-file or SPECULA_API_KEY, which `ps` does not show)")(
      "api-key-file", cli::po::value(&key_file), "a file of API keys, one per line")(
      "protect-metrics", cli::po::bool_switch(&so.protect_metrics), "/metrics needs the API key too")(
      "cors-origin", cli::po::value(&so.cors_origins)->composing(),
      "an origin browsers may call from (repeatable; '*' for any); default: none, no CORS headers")(
      "control-tokens-in-content", cli::po::bool_switch(&so.control_tokens_in_content),
      "message contents may spell control tokens (<|turn>, ...); default: they are text. For trusted callers only")(
      "max-connections", cli::po::value(&limits.max_connections)->default_value(limits.max_connections),
      "connections open at once; beyond it the oldest idle one is closed")(
      "max-header-kib", cli::po::value(&header_kib)->default_value(header_kib), "request line and header fields, KiB (431 beyond)")(
      "max-body-mib", cli::po::value(&body_mib)->default_value(body_mib), "request body, MiB, chunked or not (413 beyond)")(
      "read-timeout", cli::po::value(&read_timeout)->default_value(read_timeout),
      "seconds a request's header and body may take to arrive (408 after)")(
      "idle-timeout", cli::po::value(&idle_timeout)->default_value(idle_timeout),
      "seconds a kept-alive connection may wait for its next request")(
      "write-timeout", cli::po::value(&write_timeout)->default_value(write_timeout),
      "seconds a write may wait for a client that does not read (the connection closes after)");
  cli::po::variables_map vm;
  if (!cli::parse_model_command(args, desc, model, vm)) return 0;
  if (so.port < 0 || so.port > 65535) specula::fail("--port must be between 0 and 65535, got {}", so.port);
  if (so.parallel < 1 || so.parallel > 256) specula::fail("--parallel must be between 1 and 256, got {}", so.parallel);
  if (so.queue_limit < 0) specula::fail("--queue-limit must not be negative, got {}", so.queue_limit);
  if (drain_seconds < 0) specula::fail("--shutdown-timeout must not be negative, got {}", drain_seconds);
  for (auto [flag, seconds] : {std::pair{"--read-timeout", read_timeout}, {"--idle-timeout", idle_timeout},
                               {"--write-timeout", write_timeout}})
    if (seconds < 1 || seconds > 86400) specula::fail("{} must be between 1 and 86400 seconds, got {}", flag, seconds);
  if (header_kib < 1 || header_kib > 1024) specula::fail("--max-header-kib must be between 1 and 1024, got {}", header_kib);
  if (body_mib < 1 || body_mib > 1024) specula::fail("--max-body-mib must be between 1 and 1024, got {}", body_mib);
  so.drain_timeout = std::chrono::seconds(drain_seconds);
  limits.read_timeout = std::chrono::seconds(read_timeout);
  limits.idle_timeout = std::chrono::seconds(idle_timeout);
  limits.write_timeout = std::chrono::seconds(write_timeout);
  limits.max_header_bytes = header_kib << 10;
  limits.max_body_bytes = body_mib << 20;
  so.api_keys = api_keys(std::move(so.api_keys), key_file);
  if (so.protect_metrics && so.api_keys.empty())
    specula::fail("--protect-metrics needs an API key (--api-key, --api-key-file or SPECULA_API_KEY)");
  if (so.api_keys.empty() && so.host != "127.0.0.1" && so.host != "::1")
    specula::log_warn("listening on {} without an API key: anyone who reaches the port can use the server "
                      "(--api-key-file, SPECULA_API_KEY)", so.host);
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

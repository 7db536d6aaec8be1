// `specula serve`: an OpenAI-compatible HTTP server (docs/serving.md). Endpoints: POST /v1/chat/completions,
// /v1/completions (plain or streamed as server-sent events), GET /v1/models, /v1/models/{id}, /health,
// /metrics (Prometheus), POST /tokenize, /detokenize. Requests run on a Scheduler; the HTTP layer is
// event-driven (Boost.Beast), so idle and slow connections cost no thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "specula/api.hpp"
#include "specula/serve/http_limits.hpp"

namespace specula::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0 = a free port (Server::port() tells which)
  int parallel = 1;                // slots: requests generating at once
  int queue_limit = 64;            // requests waiting for a slot at most (with those being read); more get 429
  std::string model_name;          // the id of /v1/models and of the requests' "model"; "" = the model file's stem
  std::chrono::milliseconds drain_timeout{10000};  // shutdown: how long running requests may finish
  HttpLimits limits;
  // Bearer keys: with any, every endpoint but /health (and /metrics, unless protect_metrics) answers 401
  // to a request without one of them.
  std::vector<std::string> api_keys;
  bool protect_metrics = false;
  std::vector<std::string> cors_origins;  // origins browsers may call from ("*": any); none: no CORS
  // Message contents may spell control tokens (<|turn>, ...) that become those tokens: for trusted callers.
  bool control_tokens_in_content = false;
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();  // shutdown() if still running
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and serves on a thread of its own; /health answers 503 until set_model(). Returns
  // the port. Throws specula::Error when the address cannot be bound.
  int start();
  int port() const;
  // The loaded model: creates the slots and the scheduler; from now on /health is 200.
  void set_model(std::shared_ptr<api::Model> model);
  // Graceful: new requests get 503, queued and running ones may finish for drain_timeout (then they
  // are cancelled and end as "abort"), their answers are written, then the HTTP server stops. Idempotent.
  void shutdown();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula::serve

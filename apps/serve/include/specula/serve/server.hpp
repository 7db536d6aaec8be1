// `specula serve`: an OpenAI-compatible HTTP server on cpp-httplib (docs/serving.md). Endpoints:
// POST /v1/chat/completions, /v1/completions (plain or streamed as server-sent events), GET /v1/models,
// /health, /metrics (Prometheus), POST /tokenize, /detokenize. Requests run on a Scheduler.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "specula/api.hpp"
#include "specula/serve/metrics.hpp"
#include "specula/serve/scheduler.hpp"

namespace httplib {
class Server;
}

namespace specula::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                 // 0 = a free port (Server::port() tells which)
  int parallel = 1;                // slots: requests generating at once
  int queue_limit = 64;            // requests waiting for a slot at most; more get 429
  std::string model_name;          // the id of /v1/models and of the requests' "model"; "" = the model file's stem
  int http_threads = 0;            // 0 = parallel + queue_limit + 4 (a streaming request holds one)
  std::chrono::milliseconds drain_timeout{10000};  // shutdown: how long running requests may finish
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
  int port() const { return port_; }
  // The loaded model: creates the slots and the scheduler; from now on /health is 200.
  void set_model(std::shared_ptr<api::Model> model);
  // Graceful: new requests get 503, queued and running ones may finish for drain_timeout (then they
  // are cancelled), then the HTTP server stops. Idempotent.
  void shutdown();

 private:
  struct Routes;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
  Metrics metrics_;
  std::mutex mu_;  // model_, scheduler_
  std::shared_ptr<api::Model> model_;
  std::shared_ptr<Scheduler> scheduler_;
  std::string model_name_;
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> next_id_{1};
};

}  // namespace specula::serve

// The HTTP/1.1 layer of `specula serve`, on Boost.Beast and Asio: one I/O thread runs every connection
// as a state machine, so an idle or slow connection costs a socket, a small buffer and a timer, never a
// thread. It enforces the limits (header and body size, the chunked body counted as it arrives; the time
// to receive a request, to keep an idle connection, to complete a write; the number of connections) and
// knows nothing of OpenAI's API: a Handler answers the requests (apps/serve/src/server.cpp).
//
// At the connection limit a new connection is let in by closing the oldest idle one, else the one that
// has spent longest receiving its request (a slow sender); requests being answered are never closed for
// it. So a health probe always gets in while fewer connections than the limit are busy being answered,
// which the admission limit (--parallel + --queue-limit) keeps so.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include "specula/serve/http_limits.hpp"

namespace specula::serve::http {

namespace beast_http = boost::beast::http;
using Request = beast_http::request<beast_http::string_body>;

using Limits = HttpLimits;

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // Connection: close after it
};

// One request being answered: its methods may be called from any thread, at any time (they are posted
// to the I/O thread; calls after the connection went away do nothing).
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void respond(Response response) = 0;
  // A streamed answer: the status and headers now (and head.body, if any), then the body piece by piece
  // (chunked), then end().
  virtual void begin_stream(Response head) = 0;
  virtual void send(std::string piece) = 0;
  virtual void end() = 0;
  // Runs `work` on the I/O thread, after what was called before (work handed over from one generation
  // step goes over in one batch).
  virtual void run(std::function<void()> work) = 0;
};

class Handler {
 public:
  virtual ~Handler() = default;
  // The request's header has arrived: a Response refuses it without reading the body (the connection
  // closes after it); nullopt goes on. On the I/O thread: must not block.
  virtual std::optional<Response> on_header(const Request& header) = 0;
  // The whole request. `on_abandon`, set by the handler before it returns, is called once (on the I/O
  // thread) when the client goes away or stops reading before the answer is complete. On the I/O thread:
  // must not block; long work goes elsewhere and answers through `exchange`.
  virtual void on_request(Request request, std::shared_ptr<Exchange> exchange, std::function<void()>& on_abandon) = 0;
  // The answer to a request the HTTP layer refuses itself (431, 413, 408, 400 malformed, 503 too many
  // connections).
  virtual Response error(int status, std::string message) = 0;
  // Every answer's status as it is written (metrics).
  virtual void on_status(int status) = 0;
};

class Server {
 public:
  Server(Limits limits, Handler& handler);
  ~Server();  // stop()
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens; returns the port (a free one for port 0). Throws specula::Error naming the
  // address when it cannot.
  int listen(const std::string& host, int port);
  void start();  // runs the I/O thread
  // Stops accepting, closes idle connections, lets requests being answered finish for up to `grace`,
  // then closes the rest and joins the I/O thread. Idempotent.
  void stop(std::chrono::milliseconds grace);
  int connections() const;  // open now (a snapshot)
  const Limits& limits() const { return limits_; }

  class Connection;
  struct State;

 private:
  Limits limits_;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace specula::serve::http

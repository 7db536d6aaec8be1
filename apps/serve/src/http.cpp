#include "http.hpp"

#include <sys/resource.h>

#include <atomic>
#include <list>
#include <mutex>
#include <sstream>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/http/chunk_encode.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/write.hpp>

#include "specula/error.hpp"
#include "specula/log.hpp"

namespace specula::serve::http {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kReadChunk = 16 << 10;
// After an answer that closes the connection, what the client still sends (the body of a refused
// request) is read and dropped for this long: closing with unread data would reset the connection, and
// the client could lose the answer.
constexpr auto kLinger = std::chrono::seconds(2);
constexpr auto kAcceptRetry = std::chrono::milliseconds(20);

// The status line and fields; `length` empty for a streamed body (chunked on HTTP/1.1, delimited by
// closing the connection on HTTP/1.0).
std::string head_text(const Response& r, unsigned version, bool keep_alive, std::optional<size_t> length) {
  beast_http::response<beast_http::empty_body> res{static_cast<beast_http::status>(r.status), version};
  if (r.status != 204) res.set(beast_http::field::content_type, r.content_type);
  for (const auto& [name, value] : r.headers) res.set(name, value);
  if (length) {
    if (r.status != 204) res.content_length(*length);
  } else if (version >= 11) {
    res.chunked(true);
  }
  res.keep_alive(keep_alive);
  std::ostringstream os;
  os << res.base();
  return os.str();
}

bool expects_continue(const Request& r) {
  auto it = r.find(beast_http::field::expect);
  return r.version() >= 11 && it != r.end() && beast::iequals(it->value(), "100-continue");
}

}  // namespace

struct Server::State : std::enable_shared_from_this<State> {
  explicit State(Limits l, Handler& h) : limits(l), handler(h) {}
  net::io_context io{1};
  tcp::acceptor acceptor{io};
  net::steady_timer accept_retry{io};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  Limits limits;
  Handler& handler;
  std::list<Connection*> connections;  // on the I/O thread only
  std::atomic<int> count{0};
  bool stopping = false;

  void accept();
  bool make_room();  // closes one connection for a new one; false when every connection is answering

  // Work for the I/O thread from other threads, in order. A generation step hands over a piece for every
  // stream at once: they go over in one batch, waking the I/O thread once rather than once per stream.
  void hand_over(std::function<void()> work) {
    bool first = false;
    {
      std::lock_guard lock(outbox_mu);
      first = outbox.empty();
      outbox.push_back(std::move(work));
    }
    if (first) net::post(io, [this] { run_outbox(); });  // (runs only while the context, a member, lives)
  }
  void run_outbox() {
    std::vector<std::function<void()>> batch;
    {
      std::lock_guard lock(outbox_mu);
      batch.swap(outbox);
    }
    for (auto& work : batch) work();
  }
  std::mutex outbox_mu;
  std::vector<std::function<void()>> outbox;
};

class Server::Connection : public std::enable_shared_from_this<Connection> {
 public:
  // Idle: kept alive, no byte of the next request yet. Receiving: a request is arriving. Answering: it
  // is with the handler or being written. Closing: the answer is out; draining what the client sends.
  enum class Phase { Idle, Receiving, Answering, Closing };

  Connection(tcp::socket socket, std::shared_ptr<State> state)
      : socket_(std::move(socket)), state_(std::move(state)), deadline_(state_->io), write_timer_(state_->io) {
    self_ = state_->connections.insert(state_->connections.end(), this);
    ++state_->count;
  }

  ~Connection() {
    if (closed_) return;
    state_->connections.erase(self_);
    --state_->count;
  }

  Phase phase() const { return phase_; }
  Clock::time_point since() const { return since_; }

  void start() {
    beast::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);  // server-sent events go out as they are written
    next_request();
    read();
  }

  // Refuses the connection at once: the connection limit is reached and every connection is answering.
  void refuse(Response r) {
    new_parser();
    reject(std::move(r));
    read();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    socket_.close(ec);
    deadline_.cancel();
    write_timer_.cancel();
    state_->connections.erase(self_);
    --state_->count;
    if (phase_ == Phase::Answering && on_abandon_) {
      auto abandon = std::move(on_abandon_);
      on_abandon_ = {};
      abandon();
    }
  }

  // ---- the Exchange's calls, on the I/O thread; `n` is the request they answer ----
  void respond(uint64_t n, Response r) {
    if (!answering(n) || started_) return;
    started_ = done_ = true;
    if (r.close) keep_alive_ = false;
    state_->handler.on_status(r.status);
    write(head_text(r, version_, keep_alive_, r.body.size()) + r.body);
  }
  void begin_stream(uint64_t n, Response head) {
    if (!answering(n) || started_) return;
    started_ = streaming_ = true;
    chunked_ = version_ >= 11;
    if (!chunked_ || head.close) keep_alive_ = false;
    state_->handler.on_status(head.status);
    write(head_text(head, version_, keep_alive_, std::nullopt));
    if (!head.body.empty()) send(n, std::move(head.body));
  }
  void send(uint64_t n, std::string piece) {
    if (!answering(n) || !streaming_ || done_ || piece.empty()) return;
    write(chunked_ ? beast::buffers_to_string(beast_http::make_chunk(net::buffer(piece))) : std::move(piece));
  }
  void end(uint64_t n) {
    if (!answering(n) || !streaming_ || done_) return;
    done_ = true;
    if (chunked_) return write(beast::buffers_to_string(beast_http::make_chunk_last()));
    if (!writing_ && out_.empty()) answered();  // HTTP/1.0: the end is the connection closing
  }

 private:
  bool answering(uint64_t n) const { return !closed_ && phase_ == Phase::Answering && n == request_; }

  void set_phase(Phase p) {
    phase_ = p;
    since_ = Clock::now();
  }

  void new_parser() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(state_->limits.max_header_bytes));
    parser_->body_limit(state_->limits.max_body_bytes);
    parser_->eager(true);
    header_seen_ = false;
  }

  // Ready for the next request on this connection: what the client already sent is parsed now.
  void next_request() {
    new_parser();
    started_ = done_ = streaming_ = false;
    on_abandon_ = {};
    set_phase(Phase::Idle);
    arm(state_->limits.idle_timeout);
    if (buffer_.size() > 0) begin_receiving();
  }

  void begin_receiving() {
    set_phase(Phase::Receiving);
    arm(state_->limits.read_timeout);
    parse();
  }

  // A read is always pending while the connection is open: it takes the next request, notices a client
  // that goes away while its answer is made, and keeps the connection alive (its handler holds it).
  void read() {
    if (reading_ || closed_) return;
    reading_ = true;
    socket_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = shared_from_this()](beast::error_code ec, size_t n) { self->on_read(ec, n); });
  }

  void on_read(beast::error_code ec, size_t n) {
    reading_ = false;
    if (closed_) return;
    if (ec) {  // the client closed its side or the connection broke: an answer in progress is abandoned
      close();
      return;
    }
    buffer_.commit(n);
    switch (phase_) {
      case Phase::Idle: begin_receiving(); break;
      case Phase::Receiving: parse(); break;
      case Phase::Answering:  // the next request, sent before this answer (pipelining): kept, up to a header
        if (buffer_.size() > state_->limits.max_header_bytes) return close();
        break;
      case Phase::Closing: buffer_.consume(buffer_.size()); break;
    }
    read();
  }

  void parse() {
    while (phase_ == Phase::Receiving && buffer_.size() > 0) {
      beast::error_code ec;
      const size_t used = parser_->put(buffer_.data(), ec);
      buffer_.consume(used);
      if (ec && ec != beast_http::error::need_more) return malformed(ec);
      if (!header_seen_ && parser_->is_header_done()) {
        header_seen_ = true;
        std::optional<Response> refused;
        try {
          refused = state_->handler.on_header(parser_->get());
        } catch (const std::exception& e) {  // (nothing may escape into the I/O loop)
          refused = state_->handler.error(500, e.what());
        }
        if (refused) return reject(std::move(*refused));
        if (!parser_->is_done() && expects_continue(parser_->get())) write("HTTP/1.1 100 Continue\r\n\r\n");
      }
      if (parser_->is_done()) return dispatch();
      if (used == 0) return;  // more bytes needed
    }
  }

  void malformed(beast::error_code ec) {
    if (ec == beast_http::error::header_limit)
      return reject(state_->handler.error(431, fmt::format("the request header is larger than {} bytes",
                                                            state_->limits.max_header_bytes)));
    if (ec == beast_http::error::body_limit)
      return reject(state_->handler.error(413, fmt::format("the request body is larger than {} bytes",
                                                            state_->limits.max_body_bytes)));
    reject(state_->handler.error(400, fmt::format("malformed HTTP request: {}", ec.message())));
  }

  // An answer before the request was read to its end: the connection closes after it.
  void reject(Response r) {
    ++request_;
    set_phase(Phase::Answering);
    deadline_.cancel();
    version_ = parser_->is_header_done() ? parser_->get().version() : 11;
    keep_alive_ = false;
    r.close = true;
    respond(request_, std::move(r));
  }

  void dispatch();  // the request is in: to the handler

  void write(std::string bytes) {
    out_ += bytes;
    flush();
  }

  void flush() {
    if (writing_ || closed_ || out_.empty()) return;
    writing_ = true;
    write_started_ = Clock::now();
    sending_.swap(out_);
    out_.clear();
    watch_write();
    net::async_write(socket_, net::buffer(sending_), [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_written(ec);
    });
  }

  // The write timeout, without a timer operation per write (a stream writes every token): the watch is
  // armed when a write starts and none is armed; when it fires, a write pending for the whole timeout
  // closes the connection (the client stopped reading), a later one is watched again.
  void watch_write() {
    if (write_watched_) return;
    write_watched_ = true;
    write_timer_.expires_at(write_started_ + state_->limits.write_timeout);
    write_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      self->write_watched_ = false;
      if (ec || self->closed_ || !self->writing_) return;
      if (Clock::now() - self->write_started_ >= self->state_->limits.write_timeout) return self->close();
      self->watch_write();
    });
  }

  void on_written(beast::error_code ec) {
    writing_ = false;
    sending_.clear();
    if (closed_) return;
    if (ec) return close();
    if (!out_.empty()) return flush();
    if (phase_ == Phase::Answering && done_) answered();
  }

  void answered() {
    on_abandon_ = {};
    if (!keep_alive_ || state_->stopping) return linger();
    next_request();
    read();
  }

  void linger() {
    set_phase(Phase::Closing);
    beast::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    buffer_.consume(buffer_.size());
    arm(kLinger);
    read();
  }

  // The deadline of the phase: idle and closing connections close, a request that does not arrive in
  // time gets 408.
  void arm(Clock::duration d) {
    deadline_.expires_after(d);
    deadline_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_ || self->deadline_.expiry() > Clock::now()) return;  // cancelled or re-armed
      if (self->phase_ == Phase::Receiving)
        return self->reject(self->state_->handler.error(
            408, fmt::format("the request did not arrive within {} s", 
                             std::chrono::duration_cast<std::chrono::seconds>(self->state_->limits.read_timeout).count())));
      if (self->phase_ != Phase::Answering) self->close();
    });
  }

  class ExchangeImpl;

  tcp::socket socket_;
  std::shared_ptr<State> state_;
  net::steady_timer deadline_, write_timer_;
  beast::flat_buffer buffer_;
  std::optional<beast_http::request_parser<beast_http::string_body>> parser_;
  std::string out_, sending_;  // queued, being written
  std::list<Connection*>::iterator self_;
  Phase phase_ = Phase::Idle;
  Clock::time_point since_ = Clock::now();
  uint64_t request_ = 0;  // the request being answered; an Exchange of an earlier one is ignored
  unsigned version_ = 11;
  Clock::time_point write_started_;
  bool reading_ = false, writing_ = false, write_watched_ = false, closed_ = false, header_seen_ = false;
  bool keep_alive_ = true, started_ = false, streaming_ = false, chunked_ = false, done_ = false;
  std::function<void()> on_abandon_;
};

class Server::Connection::ExchangeImpl final : public Exchange {
 public:
  ExchangeImpl(std::shared_ptr<State> state, std::weak_ptr<Connection> connection, uint64_t request)
      : state_(std::move(state)), connection_(std::move(connection)), request_(request) {}
  void respond(Response r) override {
    post([r = std::move(r)](Connection& c, uint64_t n) mutable { c.respond(n, std::move(r)); });
  }
  void begin_stream(Response head) override {
    post([head = std::move(head)](Connection& c, uint64_t n) mutable { c.begin_stream(n, std::move(head)); });
  }
  void send(std::string piece) override {
    post([piece = std::move(piece)](Connection& c, uint64_t n) mutable { c.send(n, std::move(piece)); });
  }
  void end() override {
    post([](Connection& c, uint64_t n) { c.end(n); });
  }
  void run(std::function<void()> work) override { state_->hand_over(std::move(work)); }

 private:
  template <typename F>
  void post(F f) {
    state_->hand_over([c = connection_, n = request_, f = std::move(f)]() mutable {
      if (auto connection = c.lock()) f(*connection, n);
    });
  }
  std::shared_ptr<State> state_;  // keeps the I/O context alive for late calls
  std::weak_ptr<Connection> connection_;
  uint64_t request_;
};

void Server::Connection::dispatch() {
  ++request_;
  set_phase(Phase::Answering);
  deadline_.cancel();
  Request request = parser_->release();
  parser_.reset();
  version_ = request.version();
  keep_alive_ = request.keep_alive() && !state_->stopping;
  auto exchange = std::make_shared<ExchangeImpl>(state_, weak_from_this(), request_);
  try {
    state_->handler.on_request(std::move(request), exchange, on_abandon_);
  } catch (const std::exception& e) {  // (nothing may escape into the I/O loop)
    exchange->respond(state_->handler.error(500, e.what()));
  }
}

bool Server::State::make_room() {
  // Lingering connections first, then the longest idle, then the one receiving longest (a slow sender).
  auto rank = [](Connection::Phase p) {
    switch (p) {
      case Connection::Phase::Closing: return 0;
      case Connection::Phase::Idle: return 1;
      case Connection::Phase::Receiving: return 2;
      case Connection::Phase::Answering: return 3;
    }
    return 3;
  };
  Connection* victim = nullptr;
  for (Connection* c : connections) {
    if (rank(c->phase()) == 3) continue;
    if (!victim || rank(c->phase()) < rank(victim->phase()) ||
        (rank(c->phase()) == rank(victim->phase()) && c->since() < victim->since()))
      victim = c;
  }
  if (!victim) return false;
  victim->close();
  return true;
}

void Server::State::accept() {
  acceptor.async_accept(io, [this](beast::error_code ec, tcp::socket socket) {
    if (stopping) return;
    if (ec) {
      // Out of file descriptors (or another transient failure): free one if we can, and retry shortly
      // rather than spin.
      if (ec == net::error::no_descriptors) make_room();
      log_warn("serve: accepting a connection failed: {}", ec.message());
      accept_retry.expires_after(kAcceptRetry);
      accept_retry.async_wait([this](beast::error_code e) {
        if (!e && !stopping) accept();
      });
      return;
    }
    if (count >= limits.max_connections && !make_room()) {
      // Every connection is being answered: this one is told so, unless refusals pile up too.
      if (count >= 2 * limits.max_connections) {
        beast::error_code ignored;
        socket.close(ignored);
      } else {
        std::make_shared<Connection>(std::move(socket), shared_from_this())
            ->refuse(handler.error(503, fmt::format("the server has {} connections open, its limit; retry later", count.load())));
      }
    } else {
      std::make_shared<Connection>(std::move(socket), shared_from_this())->start();
    }
    accept();
  });
}

Server::Server(Limits limits, Handler& handler) : limits_(limits), state_(std::make_shared<State>(limits, handler)) {}

Server::~Server() { stop(std::chrono::milliseconds(0)); }

int Server::connections() const { return state_->count; }

// Each connection holds a descriptor: the soft limit (ulimit -n, often 1024) is raised toward the hard
// one when max_connections needs more; past the hard limit, fewer connections are served, and said so.
static int fit_descriptor_limit(int max_connections) {
  constexpr rlim_t kReserve = 64;  // the model files, plugins, logs, the listening socket
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return max_connections;
  const rlim_t want = static_cast<rlim_t>(max_connections) + kReserve;
  if (lim.rlim_cur < want) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max == RLIM_INFINITY ? want : std::min(want, lim.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  if (lim.rlim_cur >= want) return max_connections;
  const int fit = lim.rlim_cur > kReserve ? static_cast<int>(lim.rlim_cur - kReserve) : 1;
  log_warn("serve: --max-connections {} needs {} file descriptors and the limit is {} (ulimit -n); serving at most {} "
           "connections", max_connections, want, lim.rlim_cur, fit);
  return fit;
}

int Server::listen(const std::string& host, int port) {
  limits_.max_connections = state_->limits.max_connections = fit_descriptor_limit(limits_.max_connections);
  beast::error_code ec;
  tcp::resolver resolver(state_->io);
  const auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || found.empty()) fail("--host {}: not an address of this machine ({})", host, ec ? ec.message() : "no address");
  const tcp::endpoint endpoint = found.begin()->endpoint();
  auto& a = state_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(endpoint, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    fail("cannot listen on {}:{}: {} (in use, or not an address of this machine); pick another --host/--port", host, port,
         ec.message());
  return a.local_endpoint().port();
}

void Server::start() {
  if (thread_.joinable()) fail("the HTTP server is already started");
  state_->work.emplace(state_->io.get_executor());
  net::post(state_->io, [s = state_] { s->accept(); });
  thread_ = std::thread([s = state_] { s->io.run(); });
}

void Server::stop(std::chrono::milliseconds grace) {
  if (!thread_.joinable()) return;
  auto s = state_;
  // Every connection not answering closes now; the answering ones close after their answer.
  net::post(s->io, [s] {
    s->stopping = true;
    beast::error_code ignored;
    s->acceptor.close(ignored);
    s->accept_retry.cancel();
    for (Connection* c : std::vector<Connection*>(s->connections.begin(), s->connections.end()))
      if (c->phase() != Connection::Phase::Answering) c->close();
  });
  for (const auto end = Clock::now() + grace; s->count > 0 && Clock::now() < end;)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  net::post(s->io, [s] {
    for (Connection* c : std::vector<Connection*>(s->connections.begin(), s->connections.end())) c->close();
    s->work.reset();  // run() returns once the closed connections' last handlers ran
  });
  thread_.join();
}

}  // namespace specula::serve::http

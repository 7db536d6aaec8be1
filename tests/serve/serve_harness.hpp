// What the serve tests share: the server in-process on 127.0.0.1 (a free port) with the shipped tiny pair,
// cpp-httplib's client for ordinary requests, raw sockets for what no well-behaved client sends, and
// /metrics read by series. Every wait is bounded.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "specula/api.hpp"
#include "specula/serve/server.hpp"

namespace serve_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace std::chrono_literals;

inline const fs::path kPipeline = fs::path(SPECULA_SOURCE_DIR) / "configs/default.yaml";
inline const std::string kModel = "specula-tiny-kjv-q8_0";

inline std::shared_ptr<specula::api::Model> tiny() {
  static auto model = specula::api::Model::open(kPipeline);
  return model;
}

struct Running {
  explicit Running(specula::serve::ServerOptions o = {}, bool load = true) : server([&] {
      o.port = 0;
      return o;
    }()) {
    port = server.start();
    if (load) server.set_model(tiny());
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(20, 0);  // nothing may hang a test
    c.set_connection_timeout(5, 0);
    return c;
  }
  specula::serve::Server server;
  int port = 0;
};

struct Reply {
  int status = 0;
  json body;
  std::string raw;
  httplib::Headers headers;
};

inline Reply post(const Running& s, const std::string& path, const std::string& body, const httplib::Headers& headers = {},
                  const char* content_type = "application/json") {
  auto c = s.client();
  auto r = c.Post(path.c_str(), headers, body, content_type);
  if (!r) return {-1, {}, httplib::to_string(r.error()), {}};
  Reply out{r->status, {}, r->body, r->headers};
  out.body = json::parse(r->body, nullptr, false);
  return out;
}
inline Reply post(const Running& s, const std::string& path, const json& body) { return post(s, path, body.dump()); }

// A response header's value, "" when absent.
inline std::string header(const Reply& r, const std::string& name) {
  auto it = r.headers.find(name);
  return it == r.headers.end() ? std::string() : it->second;
}

inline int get_status(const Running& s, const std::string& path, const httplib::Headers& headers = {}) {
  auto c = s.client();
  auto r = c.Get(path.c_str(), headers);
  return r ? r->status : -1;
}

inline std::string metrics(const Running& s) {
  auto c = s.client();
  auto r = c.Get("/metrics");
  return r && r->status == 200 ? r->body : std::string();
}

// The value of one sample ("name{labels} value"), -1 when absent. The model_name label every sample
// carries is left out of `series`: "specula:num_requests_running", "specula:request_success_total{finished_reason=\"stop\"}".
inline double sample(const std::string& text, const std::string& series) {
  static const std::regex model_label("model_name=\"[^\"]*\",?");
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::string l = std::regex_replace(line, model_label, "");
    if (const size_t empty = l.find("{}"); empty != std::string::npos) l.erase(empty, 2);
    if (const size_t comma = l.find(",}"); comma != std::string::npos) l.erase(comma, 1);
    if (l.rfind(series + " ", 0) == 0) return std::stod(l.substr(series.size() + 1));
  }
  return -1;
}

// Polls /metrics until `series` satisfies `ok` or 20 s pass.
inline bool wait_metric(const Running& s, const std::string& series, const std::function<bool(double)>& ok) {
  for (auto end = std::chrono::steady_clock::now() + 20s; std::chrono::steady_clock::now() < end;) {
    if (ok(sample(metrics(s), series))) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

inline json chat_body(const std::string& user, int max_tokens) {
  return {{"model", kModel},
          {"messages", json::array({{{"role", "user"}, {"content", user}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

// The `data:` payloads of a server-sent event stream, checking the framing.
inline std::vector<std::string> events(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at < body.size()) {
    const size_t end = body.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "an event without its blank line: " << body.substr(at);
    if (end == std::string::npos) break;
    const std::string e = body.substr(at, end - at);
    EXPECT_EQ(e.rfind("data: ", 0), 0u) << e;
    out.push_back(e.substr(6));
    at = end + 2;
  }
  return out;
}

// Resident memory of this process, from /proc/self/status.
inline long resident_mib() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6)) / 1024;
  }
  return -1;
}

inline int threads_of_this_process() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// A raw TCP connection to the server, for what no well-behaved client sends. Reads time out (5 s by
// default) rather than hang.
class Socket {
 public:
  explicit Socket(int port, int timeout_seconds = 5) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    timeval tv{timeout_seconds, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Socket() { close(); }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)), connected_(o.connected_) {}

  bool connected() const { return connected_; }
  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }
  // What arrives until the peer closes, `until` is seen, or the read times out.
  std::string receive(const std::string& until = {}) {
    std::string out;
    char buf[4096];
    while (until.empty() || out.find(until) == std::string::npos) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      out.append(buf, static_cast<size_t>(n));
    }
    return out;
  }
  // Whether the server closed the connection (end of stream) within the read timeout.
  bool closed_by_peer() {
    char b;
    return ::recv(fd_, &b, 1, 0) == 0;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  bool connected_ = false;
};

// The status code of a raw HTTP answer ("HTTP/1.1 413 ..."), -1 when there is none.
inline int status_of(const std::string& reply) {
  std::smatch m;
  return std::regex_search(reply, m, std::regex(R"(^HTTP/1\.[01] (\d{3}))")) ? std::stoi(m[1]) : -1;
}

inline std::string request_text(const std::string& method, const std::string& path, const std::string& body,
                                 const std::string& extra_headers = {}) {
  return method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + extra_headers +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace serve_test

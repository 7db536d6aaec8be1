// `specula serve` under abuse, bounded (loopback, seconds; docs/serving.md, "Security and limits"): a
// 100,000-deep JSON body, numbers out of range, idle and slow connections while /health is asked, bodies
// and headers past their limits (chunked too), the connection limit, missing and wrong API keys, bodies
// that are not JSON, CORS, the queue limit with keep-alive clients, a client that leaves a non-streaming
// request, and SIGTERM in the middle of a stream. The checks count answers and threads rather than time
// them: a loaded two-core machine running the sanitizer build must pass them as an idle one does.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <mutex>
#include <vector>

#include "serve_harness.hpp"

namespace {

using namespace serve_test;

std::string nested(const std::string& field, int depth) {
  return "{\"prompt\": \"And God said\", \"" + field + "\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
}

TEST(ServeAbuse, A100000DeepJsonBodyIsA400NamingTheFieldAndTheServerLives) {
  Running s;
  for (const std::string field : {"temperature", "prompt", "stop", "frobnicate"}) {
    const auto r = post(s, "/v1/completions", nested(field, 100000));
    EXPECT_EQ(r.status, 400) << field << ": " << r.raw.substr(0, 300);
    EXPECT_EQ(r.body["error"]["param"], field) << r.raw.substr(0, 300);
    EXPECT_NE(r.body["error"]["message"].get<std::string>().find("deeper than"), std::string::npos) << r.raw.substr(0, 300);
  }
  const auto chat = post(s, "/v1/chat/completions",
                         "{\"messages\": [{\"role\": \"user\", \"content\": " + std::string(100000, '[') +
                             std::string(100000, ']') + "}]}");
  EXPECT_EQ(chat.status, 400) << chat.raw.substr(0, 300);
  EXPECT_EQ(chat.body["error"]["param"], "messages");
  // Shallow nesting in a typed field is refused by type, as before.
  const auto shallow = post(s, "/v1/completions", nested("temperature", 3));
  EXPECT_EQ(shallow.status, 400);
  EXPECT_EQ(shallow.body["error"]["param"], "temperature");
  EXPECT_EQ(post(s, "/v1/chat/completions", chat_body("And God said", 2)).status, 200);
}

TEST(ServeAbuse, OutOfRangeAndWrongValuesNameTheFieldAndQuoteOnlyAShortPrefix) {
  Running s;
  auto expect_400 = [&](const std::string& body, const std::string& param) {
    const auto r = post(s, "/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << body.substr(0, 200) << " -> " << r.raw.substr(0, 300);
    EXPECT_EQ(r.body["error"]["param"], param) << r.raw.substr(0, 300);
    EXPECT_LT(r.raw.size(), 600u) << "the error quotes too much: " << r.raw.substr(0, 600);
    return r;
  };
  const std::string messages = R"("messages": [{"role": "user", "content": "Hi"}])";
  expect_400("{" + messages + R"(, "temperature": 1e400})", "temperature");
  expect_400("{" + messages + R"(, "top_p": -1e999})", "top_p");
  expect_400("{" + messages + R"(, "max_tokens": 1e400})", "max_tokens");
  expect_400("{" + messages + R"(, "seed": 123456789012345678901234567890})", "seed");
  expect_400("{" + messages + R"(, "temperature": ")" + std::string(100000, 'x') + "\"}", "temperature");
  expect_400("{" + messages + R"(, "stop": [")" + std::string(10000, 's') + "\"]}", "stop");
  expect_400(R"({"messages": [{"role": "user", "content": [{"type": 7, "text": "Hi"}]}]})", "messages[0].content[0]");
  expect_400(R"({"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": 1}})", "response_format");
  expect_400(R"({"messages": [{"role": ")" + std::string(50000, 'r') + R"(", "content": "Hi"}]})", "messages[0].role");
  const auto r = expect_400("{" + messages + R"(, "max_tokens": 4, "min_tokens": 9})", "min_tokens");
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("max_tokens"), std::string::npos);
  // Not JSON at all: the message says where, not what.
  const auto garbage = post(s, "/v1/chat/completions", "{\"messages\": " + std::string(100000, '@'));
  EXPECT_EQ(garbage.status, 400);
  EXPECT_LT(garbage.raw.size(), 600u) << garbage.raw.substr(0, 600);
  EXPECT_EQ(post(s, "/v1/chat/completions", chat_body("And God said", 2)).status, 200);
}

TEST(ServeAbuse, IdleAndSlowConnectionsCostNoThreadAndDoNotHoldUpHealthOrACompletion) {
  Running s;
  ASSERT_EQ(post(s, "/v1/chat/completions", chat_body("And God said", 2)).status, 200);
  const int threads_before = threads_of_this_process();
  std::vector<Socket> held;
  for (int i = 0; i < 200; ++i) held.emplace_back(s.port);  // idle: connected, nothing sent
  for (int i = 0; i < 60; ++i) {                              // slow: half a request line, then nothing
    held.emplace_back(s.port);
    held.back().send("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n");
  }
  for (const auto& h : held) ASSERT_TRUE(h.connected());
  // cpp-httplib gave each of these a thread of its pool, and /health waited behind them (72 threads:
  // 75 slow senders held every request). Now they are sockets: no thread more, and every probe answers.
  EXPECT_LE(threads_of_this_process(), threads_before + 1);
  int answered = 0;
  for (int i = 0; i < 20; ++i) {
    auto c = s.client();
    c.set_read_timeout(5, 0);
    auto r = c.Get("/health");
    answered += r && r->status == 200;
  }
  EXPECT_EQ(answered, 20);
  const auto completion = post(s, "/v1/chat/completions", chat_body("And God said", 8));
  EXPECT_EQ(completion.status, 200) << completion.raw;
  const std::string m = metrics(s);
  EXPECT_GE(sample(m, "specula:http_connections"), 260);
}

TEST(ServeAbuse, BodiesPastTheLimitAre413ChunkedOrNotWithoutBeingRead) {
  specula::serve::ServerOptions o;
  o.limits.max_body_bytes = 1 << 20;
  Running s(o);
  const long rss_before = resident_mib();
  {  // chunked: counted as the chunks arrive, answered before the body ends (it never does here)
    Socket c(s.port, 10);
    ASSERT_TRUE(c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Transfer-Encoding: chunked\r\n\r\n"));
    const std::string piece(64 << 10, 'x');
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", piece.size());
    for (int i = 0; i < 32; ++i) ASSERT_TRUE(c.send(std::string(size) + piece + "\r\n"));  // 2 MiB, no last chunk
    const std::string reply = c.receive("\r\n\r\n");
    EXPECT_EQ(status_of(reply), 413) << reply.substr(0, 300);
    // What the client still sends is read and dropped, not kept (the server lingers so that the client
    // reads its answer rather than a reset).
    for (int i = 0; i < 224 && c.send(std::string(size) + piece + "\r\n"); ++i) {
    }
  }
  {  // a Content-Length of 10 GB: refused on its header, at once
    Socket c(s.port, 10);
    ASSERT_TRUE(c.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: 10000000000\r\n\r\n{\"prompt\": "));
    const std::string reply = c.receive("\r\n\r\n");
    EXPECT_EQ(status_of(reply), 413) << reply.substr(0, 300);
  }
#if !defined(__SANITIZE_ADDRESS__)  // AddressSanitizer's quarantine keeps freed memory on purpose
  EXPECT_LT(resident_mib() - rss_before, 32) << "resident memory grew from " << rss_before << " MiB";
#endif
  (void)rss_before;
  EXPECT_EQ(post(s, "/v1/chat/completions", chat_body("And God said", 2)).status, 200);
}

TEST(ServeAbuse, AHeaderPastItsLimitIs431) {
  Running s;
  Socket c(s.port);
  ASSERT_TRUE(c.send("GET /health HTTP/1.1\r\nHost: x\r\nX-Padding: " + std::string(40000, 'a') + "\r\n\r\n"));
  const std::string reply = c.receive("\r\n\r\n");
  EXPECT_EQ(status_of(reply), 431) << reply.substr(0, 300);
}

TEST(ServeAbuse, AtTheConnectionLimitTheOldestIdleConnectionMakesRoom) {
  specula::serve::ServerOptions o;
  o.queue_limit = 2;
  o.limits.max_connections = 16;
  Running s(o);
  std::vector<Socket> idle;
  for (int i = 0; i < 16; ++i) {
    idle.emplace_back(s.port);
    std::this_thread::sleep_for(2ms);  // the first is the oldest
  }
  for (int i = 0; i < 5; ++i) EXPECT_EQ(get_status(s, "/health"), 200) << "a probe could not get in at the limit";
  EXPECT_TRUE(idle.front().closed_by_peer()) << "the oldest idle connection makes room";
  EXPECT_LE(sample(metrics(s), "specula:http_connections"), 16);
}

TEST(ServeAbuse, ApiKeysGuardEverythingButHealthAndMetrics) {
  specula::serve::ServerOptions o;
  o.api_keys = {"first-key", "second-key"};
  Running s(o);
  const std::string body = chat_body("And God said", 2).dump();
  for (const auto& headers : {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer wrong-key"}},
                              httplib::Headers{{"Authorization", "Bearer first-key-but-longer"}},
                              httplib::Headers{{"Authorization", "first-key"}}}) {
    const auto r = post(s, "/v1/chat/completions", body, headers);
    EXPECT_EQ(r.status, 401) << r.raw;
    EXPECT_EQ(r.body["error"]["type"], "invalid_request_error");
    EXPECT_EQ(r.body["error"]["code"], "invalid_api_key");
    EXPECT_EQ(header(r, "WWW-Authenticate"), "Bearer");
  }
  for (const char* key : {"Bearer first-key", "bearer second-key"})
    EXPECT_EQ(post(s, "/v1/chat/completions", body, {{"Authorization", key}}).status, 200) << key;
  EXPECT_EQ(get_status(s, "/v1/models"), 401);
  EXPECT_EQ(get_status(s, "/v1/models", {{"Authorization", "Bearer first-key"}}), 200);
  EXPECT_EQ(post(s, "/tokenize", std::string(R"({"content": "Hi"})")).status, 401);
  EXPECT_EQ(get_status(s, "/health"), 200);
  EXPECT_EQ(get_status(s, "/metrics"), 200);
  // A refused request's body is not read: a big one is answered at once.
  Socket big(s.port, 10);
  ASSERT_TRUE(big.send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: 3000000\r\n\r\n{"));
  EXPECT_EQ(status_of(big.receive("\r\n\r\n")), 401);

  o.protect_metrics = true;
  Running p(o);
  EXPECT_EQ(get_status(p, "/metrics"), 401);
  EXPECT_EQ(get_status(p, "/metrics", {{"Authorization", "Bearer second-key"}}), 200);
  EXPECT_EQ(get_status(p, "/health"), 200);
}

TEST(ServeAbuse, PostsMustBeJsonAndCorsIsOffUnlessAnOriginIsNamed) {
  Running s;
  const std::string body = chat_body("And God said", 2).dump();
  for (const char* type : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"}) {
    const auto r = post(s, "/v1/chat/completions", body, {}, type);
    EXPECT_EQ(r.status, 415) << type << ": " << r.raw;
    EXPECT_EQ(r.body["error"]["type"], "invalid_request_error");
  }
  EXPECT_EQ(post(s, "/v1/chat/completions", body, {}, "application/json; charset=utf-8").status, 200);
  auto c = s.client();
  const httplib::Headers from_page = {{"Origin", "https://evil.example"}};
  auto r = c.Get("/v1/models", from_page);
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
  auto preflight = c.Options("/v1/chat/completions", from_page);
  ASSERT_TRUE(preflight);
  EXPECT_FALSE(preflight->has_header("Access-Control-Allow-Origin"));

  specula::serve::ServerOptions o;
  o.cors_origins = {"https://app.example"};
  Running named(o);
  auto nc = named.client();
  r = nc.Options("/v1/chat/completions", {{"Origin", "https://app.example"}, {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 204);
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_NE(r->get_header_value("Access-Control-Allow-Headers").find("Authorization"), std::string::npos);
  r = nc.Get("/v1/models", {{"Origin", "https://app.example"}});
  EXPECT_EQ(r->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  r = nc.Get("/v1/models", from_page);
  EXPECT_FALSE(r->has_header("Access-Control-Allow-Origin"));
}

// A streamed chat request over a raw socket that runs until the socket closes (990 tokens: most of the context).
Socket start_long_stream(int port) {
  json body = chat_body("And God said", 990);
  body["min_tokens"] = 990;
  body["stream"] = true;
  Socket c(port, 20);
  c.send(request_text("POST", "/v1/chat/completions", body.dump()));
  c.receive("data: ");  // the stream began
  return c;
}

TEST(ServeAbuse, TheQueueLimitHoldsForKeepAliveClients) {
  specula::serve::ServerOptions o;
  o.parallel = 1;
  o.queue_limit = 2;
  Running s(o);
  Socket holder = start_long_stream(s.port);  // holds the one slot
  ASSERT_TRUE(wait_metric(s, "specula:num_requests_running", [](double v) { return v == 1; }));
  constexpr int kClients = 12;
  std::mutex mu;
  std::vector<Reply> replies;
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&] {
      auto c = s.client();
      c.set_keep_alive(true);
      c.set_read_timeout(60, 0);
      c.Get("/health");  // the connection is kept alive from here
      auto r = c.Post("/v1/chat/completions", chat_body("And Moses said", 2).dump(), "application/json");
      std::lock_guard lock(mu);
      replies.push_back(r ? Reply{r->status, {}, r->body, r->headers} : Reply{-1, {}, httplib::to_string(r.error()), {}});
    });
  }
  auto answered = [&] {
    std::lock_guard lock(mu);
    return replies.size();
  };
  for (auto end = std::chrono::steady_clock::now() + 30s; answered() < kClients - 2 && std::chrono::steady_clock::now() < end;)
    std::this_thread::sleep_for(10ms);
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(replies.size(), size_t(kClients - 2)) << "all but the two the queue holds are answered at once";
    for (const auto& r : replies) {
      EXPECT_EQ(r.status, 429) << r.raw;
      EXPECT_EQ(header(r, "Retry-After"), "1");
    }
  }
  EXPECT_TRUE(wait_metric(s, "specula:num_requests_waiting", [](double v) { return v == 2; }));
  holder.close();  // the slot frees; the queued requests run
  for (auto& t : clients) t.join();
  int ok = 0;
  for (const auto& r : replies) ok += r.status == 200;
  EXPECT_EQ(ok, 2);
  EXPECT_EQ(sample(metrics(s), "specula:request_rejected_total{reason=\"queue_full\"}"), kClients - 2);
}

TEST(ServeAbuse, ANonStreamingRequestWhoseClientLeftIsCancelled) {
  Running s;
  json body = chat_body("And God said", 990);
  body["min_tokens"] = 990;
  {
    Socket c(s.port);
    ASSERT_TRUE(c.send(request_text("POST", "/v1/chat/completions", body.dump())));
    ASSERT_TRUE(wait_metric(s, "specula:num_requests_running", [](double v) { return v == 1; }));
  }  // the client closes its connection without waiting for the answer
  ASSERT_TRUE(wait_metric(s, "specula:num_requests_running", [](double v) { return v == 0; }));
  const std::string m = metrics(s);
  EXPECT_EQ(sample(m, "specula:request_success_total{finished_reason=\"abort\"}"), 1);
  EXPECT_LT(sample(m, "specula:generation_tokens_total"), 990);
}

// `specula serve` started as a process (with `env` added to this one's environment); its port from the
// first line it prints.
struct Process {
  pid_t pid = -1;
  int port = 0;
  explicit Process(std::vector<std::string> args, std::vector<std::string> env = {}) {
    int out[2];
    if (pipe(out) != 0) return;
    std::vector<char*> argv = {const_cast<char*>(SPECULA_CLI), const_cast<char*>("serve")};
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (char** e = environ; *e; ++e) envp.push_back(*e);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid = fork();
    if (pid == 0) {
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      execve(SPECULA_CLI, argv.data(), envp.data());
      _exit(127);
    }
    close(out[1]);
    std::string line;
    char ch;
    while (read(out[0], &ch, 1) == 1 && ch != '\n') line += ch;
    close(out[0]);
    std::smatch m;
    if (std::regex_search(line, m, std::regex(R"(127\.0\.0\.1:(\d+))"))) port = std::stoi(m[1]);
  }
  // The exit status after `sig`, or -1 when it had to be killed after 30 s.
  int stop(int sig) {
    kill(pid, sig);
    int status = -1;
    for (int i = 0; i < 1500; ++i) {
      if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      std::this_thread::sleep_for(20ms);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
  }
};

TEST(ServeAbuse, SigtermMidStreamEndsTheStreamWithAnErrorEventAndANonStreamingOneWith503Abort) {
  Process p({kPipeline.string(), "--port", "0", "--parallel", "2", "--shutdown-timeout", "0", "-q"});
  ASSERT_GT(p.port, 0);
  httplib::Client c("127.0.0.1", p.port);
  c.set_read_timeout(20, 0);
  bool healthy = false;
  for (int i = 0; i < 1500 && !healthy; ++i) {
    auto r = c.Get("/health");
    healthy = r && r->status == 200;
    if (!healthy) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(healthy);
  json plain = chat_body("And Moses said", 990);
  plain["min_tokens"] = 990;
  Socket waiting(p.port, 30);
  ASSERT_TRUE(waiting.send(request_text("POST", "/v1/chat/completions", plain.dump())));
  Socket stream = start_long_stream(p.port);
  bool both_running = false;
  for (int i = 0; i < 1000 && !both_running; ++i) {
    auto m = c.Get("/metrics");
    both_running = m && sample(m->body, "specula:num_requests_running") == 2;
    if (!both_running) std::this_thread::sleep_for(10ms);
  }
  ASSERT_TRUE(both_running);
  std::string streamed;
  EXPECT_EQ(p.stop(SIGTERM), 0);
  streamed += stream.receive();
  // The stream is cut, and says so: an error event, then [DONE]; no finish_reason passes it off as whole.
  EXPECT_NE(streamed.find("data: {\"error\""), std::string::npos) << streamed.substr(streamed.size() > 600 ? streamed.size() - 600 : 0);
  EXPECT_NE(streamed.find("\"code\":\"shutting_down\""), std::string::npos);
  EXPECT_NE(streamed.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(streamed.find("\"finish_reason\":\"stop\""), std::string::npos);
  EXPECT_EQ(streamed.find("\"finish_reason\":\"length\""), std::string::npos);
  const std::string reply = waiting.receive();
  EXPECT_EQ(status_of(reply), 503) << reply.substr(0, 400);
  const json answer = json::parse(reply.substr(reply.find("\r\n\r\n") + 4), nullptr, false);
  EXPECT_EQ(answer["choices"][0]["finish_reason"], "abort") << reply.substr(0, 600);
  EXPECT_EQ(answer["error"]["code"], "shutting_down");
}

TEST(ServeAbuse, TheBinaryTakesKeysFromItsFlagsAFileAndTheEnvironment) {
  const fs::path file = fs::temp_directory_path() / ("specula-keys-" + std::to_string(getpid()));
  std::ofstream(file) << "# the keys of the test\n\n  file-key  \n";
  Process p({kPipeline.string(), "--port", "0", "--api-key", "flag-key", "--api-key-file", file.string(), "-q"},
            {"SPECULA_API_KEY=env-key"});
  ASSERT_GT(p.port, 0);
  httplib::Client c("127.0.0.1", p.port);
  c.set_read_timeout(20, 0);
  bool healthy = false;  // /health needs no key
  for (int i = 0; i < 1500 && !healthy; ++i) {
    auto r = c.Get("/health");
    healthy = r && r->status == 200;
    if (!healthy) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(healthy);
  auto models = [&](const std::string& key) {
    auto r = c.Get("/v1/models", {{"Authorization", "Bearer " + key}});
    return r ? r->status : -1;
  };
  EXPECT_EQ(models("flag-key"), 200);
  EXPECT_EQ(models("file-key"), 200);
  EXPECT_EQ(models("env-key"), 200);
  EXPECT_EQ(models("# the keys of the test"), 401);
  EXPECT_EQ(models("other"), 401);
  EXPECT_EQ(p.stop(SIGTERM), 0);
  fs::remove(file);
}

}  // namespace

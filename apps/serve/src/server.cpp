#include "specula/serve/server.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <ctime>
#include <mutex>
#include <random>

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "http.hpp"
#include "request.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/metadata.hpp"
#include "specula/serve/metrics.hpp"
#include "specula/serve/scheduler.hpp"

namespace specula::serve {

using json = nlohmann::json;
namespace net = boost::asio;
namespace bhttp = boost::beast::http;
using Header = std::pair<std::string, std::string>;

namespace {

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

http::Response json_response(int status, const json& body) { return {status, "application/json", dump(body), {}, false}; }

http::Response error_response(const HttpError& e) {
  http::Response r{e.status, "application/json", error_body(e), {}, false};
  if (e.status == 429) r.headers.emplace_back("Retry-After", "1");
  if (e.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
  return r;
}

const HttpError kShuttingDown{503, "the server is shutting down; retry on another replica", "service_unavailable", "",
                              "shutting_down"};
const HttpError kLoading{503, "the model is loading; retry when GET /health answers 200", "service_unavailable", "", "loading"};

// 64 bits from OpenSSL's CSPRNG: seeds and request ids that no client can predict or repeat.
uint64_t random_u64() {
  uint64_t v = 0;
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&v), sizeof v) != 1) v = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  return v;
}

std::string request_id(const char* prefix) { return fmt::format("{}-{:016x}{:016x}", prefix, random_u64(), random_u64()); }

}  // namespace

// (ApiKeys and CompletionAnswer are members' types of Server::Impl, so outside the anonymous namespace.)

// API keys, compared in constant time: the presented key is hashed (SHA-256) and its digest compared
// with every stored one by CRYPTO_memcmp, so the time taken shows neither a key's bytes nor its length.
class ApiKeys {
 public:
  explicit ApiKeys(const std::vector<std::string>& keys) {
    for (const auto& k : keys) digests_.push_back(digest(k));
  }
  bool empty() const { return digests_.empty(); }
  // `authorization`: the header's value, "Bearer KEY".
  bool accept(std::string_view authorization) const {
    constexpr std::string_view kScheme = "bearer ";
    if (authorization.size() <= kScheme.size()) return false;
    for (size_t i = 0; i < kScheme.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(authorization[i])) != kScheme[i]) return false;
    const Digest d = digest(authorization.substr(kScheme.size()));
    bool match = false;
    for (const Digest& k : digests_) match |= CRYPTO_memcmp(k.data(), d.data(), d.size()) == 0;
    return match;
  }

 private:
  using Digest = std::array<unsigned char, 32>;
  static Digest digest(std::string_view s) {
    Digest d{};
    unsigned int n = 0;
    if (EVP_Digest(s.data(), s.size(), d.data(), &n, EVP_sha256(), nullptr) != 1) fail("serve: SHA-256 failed (OpenSSL)");
    return d;
  }
  std::vector<Digest> digests_;
};

namespace {

enum class Route { None, Health, Metrics, Models, Model, Chat, Completions, Tokenize, Detokenize };

Route route_of(std::string_view path) {
  if (path == "/health") return Route::Health;
  if (path == "/metrics") return Route::Metrics;
  if (path == "/v1/models") return Route::Models;
  if (path.rfind("/v1/models/", 0) == 0 && path.size() > 11) return Route::Model;
  if (path == "/v1/chat/completions") return Route::Chat;
  if (path == "/v1/completions") return Route::Completions;
  if (path == "/tokenize") return Route::Tokenize;
  if (path == "/detokenize") return Route::Detokenize;
  return Route::None;
}

bool is_post(Route r) { return r == Route::Chat || r == Route::Completions || r == Route::Tokenize || r == Route::Detokenize; }

// "%2F" and the like in a model id taken from the path.
std::string percent_decoded(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// application/json, with or without parameters (charset=utf-8). Requiring it makes a browser preflight
// a cross-origin POST, which fails unless --cors-origin allows the page: no web page a user opens can
// drive the server with a "simple" form or text/plain request.
bool is_json(std::string_view content_type) {
  std::string_view type = content_type.substr(0, content_type.find(';'));
  while (!type.empty() && type.back() == ' ') type.remove_suffix(1);
  constexpr std::string_view kJson = "application/json";
  if (type.size() != kJson.size()) return false;
  for (size_t i = 0; i < type.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(type[i])) != kJson[i]) return false;
  return true;
}

// An exchange whose answers carry extra headers (CORS).
class WithHeaders final : public http::Exchange {
 public:
  WithHeaders(std::shared_ptr<http::Exchange> inner, std::vector<Header> headers)
      : inner_(std::move(inner)), headers_(std::move(headers)) {}
  void respond(http::Response r) override { inner_->respond(add(std::move(r))); }
  void begin_stream(http::Response head) override { inner_->begin_stream(add(std::move(head))); }
  void send(std::string piece) override { inner_->send(std::move(piece)); }
  void end() override { inner_->end(); }
  void run(std::function<void()> work) override { inner_->run(std::move(work)); }

 private:
  http::Response add(http::Response r) const {
    r.headers.insert(r.headers.end(), headers_.begin(), headers_.end());
    return r;
  }
  std::shared_ptr<http::Exchange> inner_;
  std::vector<Header> headers_;
};

}  // namespace

// Writes one completion request's answer as its jobs produce it (one job per choice, `n`): server-sent
// events as the text comes (one `data: {chunk}` per piece, with its choice's index; each choice's finish
// chunk as it ends; the usage chunk when asked and `data: [DONE]` once every choice ended), or the whole
// answer at the end. The scheduler's thread only hands the jobs' updates over (watch()); the answer is
// written on the I/O thread, off the generation's path. The connection owns the answer while it answers
// (a client that leaves takes it along); the jobs only point at it.
class CompletionAnswer : public std::enable_shared_from_this<CompletionAnswer> {
 public:
  CompletionAnswer(std::shared_ptr<http::Exchange> exchange, bool chat, std::string model,
                   std::function<std::string(int32_t)> token_bytes)
      : exchange_(std::move(exchange)), chat_(chat), id_(request_id(chat ? "chatcmpl" : "cmpl")),
        model_(std::move(model)), created_(static_cast<int64_t>(std::time(nullptr))), token_bytes_(std::move(token_bytes)) {}

  // What the request asks for; one job per choice (choice i sampled with seed + i), whose updates are
  // then handed to the I/O thread. Before they are submitted.
  const std::vector<std::shared_ptr<Job>>& watch(const CompletionRequest& r) {
    stream_ = r.stream;
    include_usage_ = r.include_usage;
    parallel_tool_calls_ = r.parallel_tool_calls;
    reasoning_ = r.sampling.reasoning;
    logprobs_ = r.sampling.logprobs >= 0;
    std::lock_guard lock(jobs_mu_);
    for (int i = 0; i < r.n; ++i) {
      auto job = std::make_shared<Job>();
      job->prompt = r.prompt;
      job->sampling = r.sampling;
      job->sampling.seed = r.sampling.seed + static_cast<uint64_t>(i);
      job->cancel = cancelled_;
      job->on_update = [answer = weak_from_this(), exchange = exchange_] {
        exchange->run([answer] {
          if (auto a = answer.lock()) a->pump();
        });
      };
      Choice choice;
      choice.job = job;
      choices_.push_back(std::move(choice));
      jobs_.push_back(std::move(job));
    }
    return jobs_;
  }

  // The client went away: every choice stops after its current step.
  void cancel() {
    std::lock_guard lock(jobs_mu_);
    cancelled_ = true;
    for (const auto& job : jobs_) job->cancel = true;
  }

  // The stream's status, headers and first events (chat: each choice's assistant role).
  http::Response stream_head() const {
    http::Response head{200, "text/event-stream", {}, {{"Cache-Control", "no-cache"}}, false};
    if (chat_)
      for (size_t i = 0; i < choices_.size(); ++i) head.body += event(chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr));
    return head;
  }

  // What the jobs produced since the last call, written; the end once every one is done.
  void pump() {
    if (ended_) return;
    try {
      bool all_done = true;
      for (size_t i = 0; i < choices_.size(); ++i) all_done = write_output(i) && all_done;
      if (!all_done) return;
      ended_ = true;
      std::vector<std::unique_lock<std::mutex>> locks;
      for (auto& c : choices_) locks.emplace_back(c.job->mu);
      stream_ ? end_stream() : respond();
    } catch (const std::exception& e) {  // (nothing may escape into the I/O loop)
      ended_ = true;
      exchange_->respond(error_response({500, e.what(), "server_error", "", ""}));
    }
  }

 private:
  // One choice: its job and what was written of it.
  struct Choice {
    std::shared_ptr<Job> job;
    std::vector<json> calls;               // the tool calls returned so far
    std::string text, reasoning;           // a plain answer's output so far
    int64_t text_offset = 0;               // completions' logprobs: bytes of the tokens reported so far
    bool done = false;
  };

  // Choice i's output since the last call, written (streamed: its chunks, and its finish chunk once done);
  // whether it is done.
  bool write_output(size_t i) {
    Choice& c = choices_[i];
    if (c.done) return true;
    Job::Output out = c.job->take();
    if (stream_) {
      std::string events;
      if (!out.reasoning.empty()) events += event(chunk(i, json{{"reasoning_content", out.reasoning}}, nullptr));
      // A token's logprobs ride on the chunk of text it produced (an empty one when its text is held back).
      if (!out.text.empty() || !out.logprobs.empty()) {
        json ch = chunk(i, chat_ ? json{{"content", out.text}} : json(out.text), nullptr);
        if (!out.logprobs.empty()) ch["choices"][0]["logprobs"] = logprobs_json(c, out.logprobs);
        events += event(ch);
      }
      // Each tool call as one delta, whole (id, name and arguments), as soon as its closing token is out.
      for (json& call : new_calls(c, out.tool_calls)) events += event(chunk(i, json{{"tool_calls", json::array({std::move(call)})}}, nullptr));
      if (out.done && !cut(c)) events += event(chunk(i, chat_ ? json::object() : json(""), finish_reason(c)));
      if (!events.empty()) exchange_->send(std::move(events));
    } else {
      c.text += out.text;
      c.reasoning += out.reasoning;
      new_calls(c, out.tool_calls);
    }
    c.done = out.done;
    return c.done;
  }

  static std::string event(const json& j) { return "data: " + dump(j) + "\n\n"; }

  // OpenAI's logprobs object: chat {"content": [{token, logprob, bytes, top_logprobs}]}; completions
  // {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset} (offsets in bytes of the
  // tokens' text, counted over the whole answer).
  json logprobs_json(Choice& c, const std::vector<core::TokenLogprob>& lps) {
    auto bytes_of = [](const std::string& s) {
      json b = json::array();
      for (unsigned char ch : s) b.push_back(static_cast<int>(ch));
      return b;
    };
    if (chat_) {
      json content = json::array();
      for (const auto& lp : lps) {
        const std::string t = token_bytes_(lp.token);
        json top = json::array();
        for (const auto& [id, v] : lp.top) {
          const std::string s = token_bytes_(id);
          top.push_back({{"token", s}, {"logprob", v}, {"bytes", bytes_of(s)}});
        }
        content.push_back({{"token", t}, {"logprob", lp.logprob}, {"bytes", bytes_of(t)}, {"top_logprobs", std::move(top)}});
      }
      return {{"content", std::move(content)}};
    }
    json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
    for (const auto& lp : lps) {
      const std::string t = token_bytes_(lp.token);
      tokens.push_back(t);
      values.push_back(lp.logprob);
      json top = json::object();
      for (const auto& [id, v] : lp.top) top[token_bytes_(id)] = v;
      tops.push_back(std::move(top));
      offsets.push_back(c.text_offset);
      c.text_offset += static_cast<int64_t>(t.size());
    }
    return {{"tokens", std::move(tokens)}, {"token_logprobs", std::move(values)}, {"top_logprobs", std::move(tops)},
            {"text_offset", std::move(offsets)}};
  }

  // The tool calls parsed since the last update, as OpenAI's tool_calls entries (kept for the plain
  // answer); with parallel_tool_calls false only the first call of the answer is returned.
  std::vector<json> new_calls(Choice& c, const std::vector<api::ToolCall>& calls) {
    std::vector<json> out;
    if (!chat_) return out;
    for (const auto& tc : calls) {
      if (!parallel_tool_calls_ && !c.calls.empty()) break;
      json call = {{"index", c.calls.size()},
                   {"id", "call_" + request_id("").substr(1, 24)},
                   {"type", "function"},
                   {"function", {{"name", tc.name}, {"arguments", tc.arguments}}}};
      c.calls.push_back(call);
      out.push_back(std::move(call));
    }
    return out;
  }

  // finish_reason: "tool_calls" when the model stopped after calling tools.
  static std::string finish_reason(const Choice& c) {
    return c.job->finish_reason == "stop" && !c.calls.empty() ? "tool_calls" : c.job->finish_reason;
  }

  json chunk(size_t index, json delta_or_text, json finish) const {
    json choice = {{"index", index}, {"finish_reason", std::move(finish)}, {"logprobs", nullptr}};
    choice[chat_ ? "delta" : "text"] = std::move(delta_or_text);
    json c = {{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
              {"model", model_}, {"choices", json::array({std::move(choice)})}};
    if (include_usage_) c["usage"] = nullptr;
    return c;
  }

  // OpenAI's usage of all choices: the prompt counted once, the completions summed. The speculative counts
  // and why rounds ran on the host (a response_format, penalties: nothing turns off silently) summed and
  // taken from the first choice that has one.
  json usage() const {
    int64_t completion = 0, accepted = 0, drafted = 0;
    const api::Result* first = nullptr;
    std::string host_reason;
    for (const Choice& c : choices_) {
      if (!c.job->result) continue;
      const api::Result& r = *c.job->result;
      if (!first) first = &r;
      completion += static_cast<int64_t>(r.tokens.size());
      accepted += r.stats.accepted_tokens;
      drafted += r.stats.drafted_tokens;
      if (host_reason.empty()) host_reason = r.stats.host_sampling_reason;
    }
    if (!first) return nullptr;
    const auto prompt = first->stats.prompt_tokens + first->cached_tokens;
    json u = {{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", first->cached_tokens}}}};
    if (drafted > 0)
      u["completion_tokens_details"] = {{"accepted_prediction_tokens", accepted}, {"rejected_prediction_tokens", drafted - accepted}};
    if (!host_reason.empty()) u["host_sampling_reason"] = host_reason;
    return u;
  }

  // Cut short by shutdown (503) or a failure (500): never passed off as a complete answer.
  static bool cut(const Choice& c) { return c.job->finish_reason == "abort" || c.job->finish_reason == "error"; }
  const Choice* first_cut() const {
    for (const Choice& c : choices_)
      if (cut(c)) return &c;
    return nullptr;
  }
  static HttpError cut_error(const Choice& c) {
    const bool shutdown = c.job->finish_reason == "abort";
    return {shutdown ? 503 : 500, c.job->error.empty() ? "the request ended early" : c.job->error,
            shutdown ? "service_unavailable" : "server_error", "", shutdown ? "shutting_down" : ""};
  }

  void end_stream() {
    std::string events;
    if (const Choice* c = first_cut()) {
      events += "data: " + error_body(cut_error(*c)) + "\n\n";
    } else if (include_usage_) {
      events += event({{"id", id_}, {"object", chat_ ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
                       {"model", model_}, {"choices", json::array()}, {"usage", usage()}});
    }
    exchange_->send(events + "data: [DONE]\n\n");
    exchange_->end();
  }

  void respond() {
    json choices = json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& c = choices_[i];
      const api::Result* r = c.job->result ? &*c.job->result : nullptr;
      json choice = {{"index", i}, {"finish_reason", cut(c) ? "abort" : finish_reason(c)}, {"logprobs", nullptr}};
      if (logprobs_ && r) choice["logprobs"] = logprobs_json(c, r->logprobs);
      if (chat_) {
        std::string content = r ? r->text : c.text;
        json message = {{"role", "assistant"}, {"content", content}};
        if (!c.calls.empty()) {
          if (content.empty()) message["content"] = nullptr;
          json calls = json::array();
          for (json call : c.calls) {
            call.erase("index");
            calls.push_back(std::move(call));
          }
          message["tool_calls"] = std::move(calls);
        }
        if (reasoning_) message["reasoning_content"] = r ? r->reasoning : c.reasoning;
        choice["message"] = std::move(message);
      } else {
        choice["text"] = r ? r->text : c.text;
      }
      choices.push_back(std::move(choice));
    }
    json out = {{"id", id_}, {"object", chat_ ? "chat.completion" : "text_completion"}, {"created", created_},
                {"model", model_}, {"choices", std::move(choices)}, {"usage", usage()}};
    int status = 200;
    if (const Choice* c = first_cut()) {  // the answer so far, marked "abort", with the error that cut it, under its status
      const HttpError e = cut_error(*c);
      status = e.status;
      out["error"] = json::parse(error_body(e))["error"];
    }
    exchange_->respond(json_response(status, out));
  }

  std::shared_ptr<http::Exchange> exchange_;
  bool chat_, stream_ = false, include_usage_ = false, reasoning_ = false, parallel_tool_calls_ = true, logprobs_ = false;
  std::string id_, model_;
  int64_t created_;
  std::function<std::string(int32_t)> token_bytes_;
  std::vector<Choice> choices_;           // touched on the I/O thread once submitted
  std::mutex jobs_mu_;                    // guards jobs_ and cancelled_ (cancel() runs on the I/O thread)
  std::vector<std::shared_ptr<Job>> jobs_;
  bool cancelled_ = false;
  bool ended_ = false;
};

struct Server::Impl final : http::Handler {
  explicit Impl(ServerOptions o)
      : options(std::move(o)), keys(options.api_keys), workers(2), http(options.limits, *this) {}

  ServerOptions options;
  ApiKeys keys;
  Metrics metrics;
  // Request bodies into prompts (parsing and tokenizing up to --max-body-mib), so that this holds up
  // neither the I/O thread (which answers /health) nor the scheduler's thread (which generates).
  net::thread_pool workers;
  http::Server http;
  int port = 0;
  std::atomic<bool> ready{false}, shutting_down{false};
  std::mutex shutdown_mu;  // a second shutdown() waits for the first
  bool stopped = false;
  std::mutex mu;  // the three below
  std::shared_ptr<api::Model> model;
  std::shared_ptr<const ServedModel> served;
  std::shared_ptr<Scheduler> scheduler;

  struct Loaded {
    std::shared_ptr<api::Model> model;
    std::shared_ptr<const ServedModel> served;
    std::shared_ptr<Scheduler> scheduler;
  };
  Loaded loaded() {
    std::lock_guard lock(mu);
    return {model, served, scheduler};
  }

  // The CORS headers a request's Origin earns: none unless --cors-origin names it (or "*").
  std::vector<Header> cors(const http::Request& h, bool preflight) const {
    const auto origin = h[bhttp::field::origin];
    if (options.cors_origins.empty() || origin.empty()) return {};
    const bool any = std::count(options.cors_origins.begin(), options.cors_origins.end(), "*") > 0;
    if (!any && std::count(options.cors_origins.begin(), options.cors_origins.end(), origin) == 0) return {};
    std::vector<Header> out = {{"Access-Control-Allow-Origin", any ? "*" : std::string(origin)}, {"Vary", "Origin"}};
    if (preflight) {
      out.push_back({"Access-Control-Allow-Methods", "GET, POST, OPTIONS"});
      out.push_back({"Access-Control-Allow-Headers", "Authorization, Content-Type"});
      out.push_back({"Access-Control-Max-Age", "600"});
    }
    return out;
  }

  std::optional<http::Response> refuse(const http::Request& h, const HttpError& e) {
    http::Response r = error_response(e);
    for (auto& header : cors(h, false)) r.headers.push_back(std::move(header));
    return r;
  }

  // ---- http::Handler ----

  std::optional<http::Response> on_header(const http::Request& h) override {
    const std::string_view target = h.target();
    const std::string_view path = target.substr(0, target.find('?'));
    const Route route = route_of(path);
    if (route == Route::None)
      return refuse(h, {404, fmt::format("{} {}: no such endpoint", std::string_view(h.method_string()).substr(0, 16),
                                         path.substr(0, 80)), "invalid_request_error", "", ""});
    if (h.method() == bhttp::verb::options) return std::nullopt;  // CORS preflight: carries no key
    const bhttp::verb method = is_post(route) ? bhttp::verb::post : bhttp::verb::get;
    if (h.method() != method) {
      auto r = refuse(h, {405, fmt::format("{} takes {} requests", path, bhttp::to_string(method)), "invalid_request_error",
                          "", ""});
      r->headers.emplace_back("Allow", std::string(bhttp::to_string(method)) + ", OPTIONS");
      return r;
    }
    const bool open = route == Route::Health || (route == Route::Metrics && !options.protect_metrics);
    if (!open && !keys.empty() && !keys.accept(h[bhttp::field::authorization]))
      return refuse(h, {401, "a valid API key is required: send the header 'Authorization: Bearer KEY'",
                        "invalid_request_error", "", "invalid_api_key"});
    if (method == bhttp::verb::post && !is_json(h[bhttp::field::content_type]))
      return refuse(h, {415, "the request body must be JSON: send the header 'Content-Type: application/json'",
                        "invalid_request_error", "", "unsupported_media_type"});
    if (route == Route::Health || route == Route::Metrics) return std::nullopt;
    if (shutting_down) {
      if (route == Route::Chat || route == Route::Completions) metrics.rejected("shutting_down");
      return refuse(h, kShuttingDown);
    }
    auto l = loaded();
    if (!l.scheduler) return refuse(h, kLoading);
    if ((route == Route::Chat || route == Route::Completions) && l.scheduler->full()) {
      metrics.rejected("queue_full");
      return refuse(h, queue_full());
    }
    return std::nullopt;
  }

  void on_request(http::Request request, std::shared_ptr<http::Exchange> exchange,
                  std::function<void()>& on_abandon) override {
    const std::string_view target = request.target();
    const std::string path(target.substr(0, target.find('?')));
    const bool preflight = request.method() == bhttp::verb::options;
    if (auto headers = cors(request, preflight); !headers.empty())
      exchange = std::make_shared<WithHeaders>(std::move(exchange), std::move(headers));
    if (preflight) return exchange->respond({204, "", "", {{"Allow", "GET, POST, OPTIONS"}}, false});
    switch (route_of(path)) {
      case Route::Health: return health(*exchange);
      case Route::Metrics: return metrics_page(*exchange);
      case Route::Models:
      case Route::Model: return models(path, *exchange);
      case Route::Chat: return completion(std::move(request.body()), std::move(exchange), on_abandon, true);
      case Route::Completions: return completion(std::move(request.body()), std::move(exchange), on_abandon, false);
      case Route::Tokenize:
      case Route::Detokenize: return tokens(route_of(path), std::move(request.body()), std::move(exchange));
      case Route::None: break;
    }
  }

  http::Response error(int status, std::string message) override {
    return error_response({status, std::move(message), "invalid_request_error", "", ""});
  }

  void on_status(int status) override { metrics.response(status); }

  // ---- endpoints ----

  static HttpError queue_full() {
    return {429, "the server holds as many requests as --parallel and --queue-limit allow; retry later", "rate_limit_exceeded",
            "", "queue_full"};
  }

  // On the I/O thread and touching only atomics: no request load can hold it up.
  void health(http::Exchange& ex) {
    const char* status = shutting_down ? "shutting_down" : ready ? "ok" : "loading";
    ex.respond(json_response(std::string_view(status) == "ok" ? 200 : 503, {{"status", status}}));
  }

  void metrics_page(http::Exchange& ex) {
    auto l = loaded();
    Gauges g = l.scheduler ? l.scheduler->gauges() : Gauges{};
    g.connections = http.connections();
    ex.respond({200, "text/plain; version=0.0.4; charset=utf-8", metrics.render(g, l.served ? l.served->name : ""), {}, false});
  }

  void models(const std::string& path, http::Exchange& ex) {
    auto l = loaded();
    if (shutting_down || !l.served) return ex.respond(error_response(shutting_down ? kShuttingDown : kLoading));
    const json entry = {{"id", l.served->name}, {"object", "model"}, {"created", 0}, {"owned_by", "specula"},
                        {"max_model_len", l.served->context_length}};
    if (route_of(path) == Route::Models) return ex.respond(json_response(200, {{"object", "list"}, {"data", json::array({entry})}}));
    const std::string id = percent_decoded(std::string_view(path).substr(11));
    if (id != l.served->name)
      return ex.respond(error_response({404, fmt::format("the model {} does not exist; this server serves '{}'",
                                                         json_text(json(id), 40), l.served->name),
                                        "invalid_request_error", "model", "model_not_found"}));
    ex.respond(json_response(200, entry));
  }

  void completion(std::string body, std::shared_ptr<http::Exchange> ex, std::function<void()>& on_abandon, bool chat) {
    auto l = loaded();
    if (!l.scheduler) return ex->respond(error_response(kLoading));
    Scheduler::Ticket ticket = l.scheduler->reserve();
    if (!ticket) {
      metrics.rejected(shutting_down ? "shutting_down" : "queue_full");
      return ex->respond(error_response(shutting_down ? kShuttingDown : queue_full()));
    }
    auto tok = l.model->built().target->tokenizer();
    auto answer = std::make_shared<CompletionAnswer>(ex, chat, l.served->name, [tok](int32_t id) {
      return tok ? tok->token_bytes(id) : std::string();
    });
    // A client that left frees its slots after the current step; till then the connection keeps the answer.
    on_abandon = [answer] { answer->cancel(); };
    net::post(workers, [this, answer, ex, chat, l, body = std::move(body), ticket = std::move(ticket)]() mutable {
      try {
        prepare(*answer, ex, chat, l, std::move(body), std::move(ticket));
      } catch (const std::exception& e) {  // (nothing may escape into the worker pool)
        ex->respond(error_response({500, e.what(), "server_error", "", ""}));
      }
    });
  }

  // On a worker: the body read into a prompt, the stream begun, the jobs submitted (one per choice, each
  // with a place in the queue: a request of n choices takes n places, or is refused whole).
  void prepare(CompletionAnswer& answer, std::shared_ptr<http::Exchange> ex, bool chat, const Loaded& l, std::string body,
               Scheduler::Ticket ticket) {
    CompletionRequest r;
    try {
      r = read_completion(parse_json_body(body), chat, *l.served, random_u64(), body);
    } catch (const HttpError& e) {
      return ex->respond(error_response(e));
    } catch (const Error& e) {  // the tokenizer's or chat format's errors: the request's text
      return ex->respond(error_response({400, e.what(), "invalid_request_error", "", ""}));
    }
    body = {};
    std::vector<Scheduler::Ticket> tickets;
    tickets.push_back(std::move(ticket));
    while (static_cast<int>(tickets.size()) < r.n) {
      tickets.push_back(l.scheduler->reserve());
      if (!tickets.back()) {
        metrics.rejected(shutting_down ? "shutting_down" : "queue_full");
        return ex->respond(error_response(shutting_down ? kShuttingDown : queue_full()));
      }
    }
    const auto jobs = answer.watch(r);
    if (r.stream) ex->begin_stream(answer.stream_head());
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (l.scheduler->submit(jobs[i], std::move(tickets[i])) == Scheduler::Admission::ShuttingDown) {
        metrics.rejected("shutting_down");
        if (i > 0) {  // those submitted end as "abort"; the others end so, here: the answer says why
          answer.cancel();
          for (size_t j = i; j < jobs.size(); ++j) {
            {
              std::lock_guard lock(jobs[j]->mu);
              jobs[j]->done = true;
              jobs[j]->finish_reason = "abort";
              jobs[j]->error = kShuttingDown.message;
            }
            jobs[j]->notify();
          }
          return;
        }
        if (r.stream) {
          ex->send("data: " + error_body(kShuttingDown) + "\n\ndata: [DONE]\n\n");
          return ex->end();
        }
        return ex->respond(error_response(kShuttingDown));
      }
    }
  }

  void tokens(Route route, std::string body, std::shared_ptr<http::Exchange> ex) {
    net::post(workers, [ex, route, l = loaded(), body = std::move(body)] {
      try {
        const json b = parse_json_body(body);
        if (route == Route::Detokenize)
          return ex->respond(json_response(200, {{"content", l.model->detokenize(read_detokenize(b, *l.served), false)}}));
        const TokenizeRequest t = read_tokenize(b, *l.served);
        json tokens = json::array();
        const auto tok = l.model->built().target->tokenizer();
        for (int32_t id : t.tokens) {
          if (t.with_pieces) tokens.push_back({{"id", id}, {"piece", tok->token_bytes(id)}});
          else tokens.push_back(id);
        }
        ex->respond(json_response(200, {{"tokens", tokens}, {"count", t.tokens.size()}, {"max_model_len", l.served->context_length}}));
      } catch (const HttpError& e) {
        ex->respond(error_response(e));
      } catch (const std::exception& e) {
        ex->respond(error_response({400, e.what(), "invalid_request_error", "", ""}));
      }
    });
  }
};

Server::Server(ServerOptions options) {
  if (options.parallel < 1) fail("--parallel must be at least 1, got {}", options.parallel);
  if (options.queue_limit < 0) fail("--queue-limit must not be negative, got {}", options.queue_limit);
  // Connections being answered are never closed to make room: the limit must leave room beyond them for
  // health probes and idle clients.
  const int answering = options.parallel + options.queue_limit;
  if (options.limits.max_connections <= answering + 8)
    fail("--max-connections {} leaves no room beside the {} requests --parallel and --queue-limit admit; give at least {}",
         options.limits.max_connections, answering, answering + 9);
  for (const auto& k : options.api_keys)
    if (k.empty()) fail("an API key is empty; give a non-empty --api-key, --api-key-file line or SPECULA_API_KEY");
  impl_ = std::make_unique<Impl>(std::move(options));
}

Server::~Server() { shutdown(); }

int Server::start() {
  impl_->port = impl_->http.listen(impl_->options.host, impl_->options.port);
  impl_->http.start();
  return impl_->port;
}

int Server::port() const { return impl_->port; }

void Server::set_model(std::shared_ptr<api::Model> model) {
  auto& o = impl_->options;
  SchedulerOptions so;
  so.parallel = o.parallel;
  so.queue_limit = o.queue_limit;
  auto scheduler = std::make_shared<Scheduler>(model, so, impl_->metrics);
  auto served = std::make_shared<ServedModel>();
  served->name = o.model_name.empty() ? model->pipeline().target.model.stem().string() : o.model_name;
  served->vocab_size = model->info().vocab_size;
  served->context_length = model->context_length();
  served->bos = model->built().target->tokenizer()->bos();
  served->defaults = model->default_sampling();
  served->has_drafter = model->has_drafter();
  if (model->built().target->chat_format()) {
    const auto content = o.control_tokens_in_content ? api::ContentTokens::Parsed : api::ContentTokens::Text;
    served->chat_prompt = [model, content](std::span<const ChatMessage> m, std::optional<bool> thinking,
                                           std::string_view tools) {
      return model->chat_prompt(m, thinking, content, tools);
    };
  }
  served->tokenize = [model](std::string_view text) { return model->tokenize(text, true); };
  {
    std::lock_guard lock(impl_->mu);
    impl_->served = std::move(served);
    impl_->scheduler = std::move(scheduler);
    impl_->model = std::move(model);
  }
  impl_->ready = true;
}

void Server::shutdown() {
  auto& s = *impl_;
  std::lock_guard once(s.shutdown_mu);
  if (s.stopped) return;
  s.stopped = true;
  s.shutting_down = true;
  auto l = s.loaded();
  // Queued and running requests finish (or are cut as "abort" after drain_timeout); their answers are
  // written as they end, and the HTTP server lets connections that are answering finish.
  if (l.scheduler) l.scheduler->drain(s.options.drain_timeout);
  s.http.stop(std::chrono::seconds(5));
  {
    std::lock_guard lock(s.mu);
    s.scheduler.reset();
  }
  l.scheduler.reset();  // joins the scheduler's thread
  s.workers.join();
}

}  // namespace specula::serve

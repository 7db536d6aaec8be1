#include "specula/serve/server.hpp"

#include <httplib.h>
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "specula/error.hpp"
#include "specula/log.hpp"

namespace specula::serve {

using json = nlohmann::json;

namespace {

// An OpenAI-style error: {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct HttpError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // "" = null
  std::string code;   // "" = null
};

[[noreturn]] void bad(std::string message, std::string param = {}, std::string code = {}) {
  throw HttpError{400, std::move(message), "invalid_request_error", std::move(param), std::move(code)};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const HttpError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json() : json(e.param)},
              {"code", e.code.empty() ? json() : json(e.code)}};
  res.status = e.status;
  res.set_content(dump({{"error", err}}), "application/json");
}

json parse_body(const httplib::Request& req) {
  if (req.body.empty()) bad("the request body is empty; send a JSON object");
  try {
    json j = json::parse(req.body);
    if (!j.is_object()) bad("the request body must be a JSON object");
    return j;
  } catch (const json::parse_error& e) {
    bad(fmt::format("the request body is not valid JSON: {}", e.what()));
  }
}

// Checks that `body` holds only `allowed` keys (OpenAI answers unknown ones with 400 as well).
void only_keys(const json& body, const std::set<std::string>& allowed) {
  for (const auto& [key, value] : body.items()) {
    if (!allowed.count(key)) bad(fmt::format("unknown field '{}'", key), key);
  }
}

// Typed readers: a missing or null field keeps `out`.
bool present(const json& b, const char* key) { return b.contains(key) && !b[key].is_null(); }

void read_bool(const json& b, const char* key, bool& out) {
  if (!present(b, key)) return;
  if (!b[key].is_boolean()) bad(fmt::format("'{}' must be a boolean, got {}", key, dump(b[key])), key);
  out = b[key].get<bool>();
}

double read_number(const json& b, const char* key, double lo, double hi) {
  const json& v = b[key];
  if (!v.is_number()) bad(fmt::format("'{}' must be a number, got {}", key, dump(v)), key);
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) bad(fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, dump(v)), key);
  return d;
}

int64_t read_int(const json& b, const char* key, int64_t lo, int64_t hi) {
  const json& v = b[key];
  if (!v.is_number_integer()) bad(fmt::format("'{}' must be an integer, got {}", key, dump(v)), key);
  const int64_t i = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())
                        ? std::numeric_limits<int64_t>::max()
                        : v.get<int64_t>();
  if (i < lo || i > hi) bad(fmt::format("'{}' must be between {} and {}, got {}", key, lo, hi, dump(v)), key);
  return i;
}

std::string read_string(const json& v, const std::string& what) {
  if (!v.is_string()) bad(fmt::format("'{}' must be a string, got {}", what, dump(v)), what);
  return v.get<std::string>();
}

// What a completion request asks for, once checked.
struct Ask {
  bool chat = true;
  std::vector<int32_t> prompt;
  api::SamplingConfig sampling;
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;
};

// The fields both endpoints share (OpenAI's names; top_k, min_p, min_tokens, repetition_penalty as vLLM
// and llama-server add them).
const std::set<std::string> kCommonKeys = {
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "n",
    "user", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_tokens", "logprobs"};

void read_sampling(const json& b, Ask& a) {
  auto& s = a.sampling;
  if (present(b, "temperature")) s.temperature = static_cast<float>(read_number(b, "temperature", 0, 2));
  if (present(b, "top_p")) {
    s.top_p = static_cast<float>(read_number(b, "top_p", 0, 1));
    if (s.top_p <= 0) bad("'top_p' must be above 0 (1 = off)", "top_p");
  }
  if (present(b, "top_k")) {
    const int64_t k = read_int(b, "top_k", -1, std::numeric_limits<int32_t>::max());
    s.top_k = k < 0 ? 0 : static_cast<int32_t>(k);  // -1: off, as vLLM
  }
  if (present(b, "min_p")) s.min_p = static_cast<float>(read_number(b, "min_p", 0, 1));
  if (present(b, "repetition_penalty"))
    s.repetition_penalty = static_cast<float>(read_number(b, "repetition_penalty", 0.01, 100));
  if (present(b, "seed"))
    s.seed = static_cast<uint64_t>(read_int(b, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (!present(b, key)) continue;
    s.max_tokens = static_cast<int>(read_int(b, key, 1, std::numeric_limits<int32_t>::max()));
    a.max_tokens_given = true;
  }
  if (present(b, "min_tokens")) s.min_tokens = static_cast<int32_t>(read_int(b, "min_tokens", 0, std::numeric_limits<int32_t>::max()));
  if (present(b, "stop")) {
    const json& v = b["stop"];
    s.stop.clear();
    if (v.is_string()) {
      s.stop.push_back(v.get<std::string>());
    } else if (v.is_array()) {
      if (v.size() > 4) bad("'stop' holds at most 4 strings", "stop");
      for (const auto& item : v) s.stop.push_back(read_string(item, "stop"));
    } else {
      bad(fmt::format("'stop' must be a string or a list of strings, got {}", dump(v)), "stop");
    }
    for (const auto& stop : s.stop)
      if (stop.empty()) bad("'stop' strings must not be empty", "stop");
  }
  if (present(b, "n") && read_int(b, "n", 1, 128) != 1) bad("only n = 1 is supported", "n");
  for (const char* key : {"frequency_penalty", "presence_penalty"}) {
    if (present(b, key) && read_number(b, key, -2, 2) != 0)
      bad(fmt::format("'{}' is not supported; use repetition_penalty", key), key);
  }
  if (present(b, "logprobs")) {
    const json& v = b["logprobs"];
    if (!(v.is_boolean() && !v.get<bool>()) && !(v.is_number_integer() && v.get<int64_t>() == 0))
      bad("'logprobs' is not supported", "logprobs");
  }
  if (present(b, "user")) read_string(b["user"], "user");
  read_bool(b, "stream", a.stream);
  if (present(b, "stream_options")) {
    const json& o = b["stream_options"];
    if (!o.is_object()) bad("'stream_options' must be an object", "stream_options");
    if (!a.stream) bad("'stream_options' is only allowed with \"stream\": true", "stream_options");
    only_keys(o, {"include_usage"});
    read_bool(o, "include_usage", a.include_usage);
  }
}

std::string message_content(const json& m, size_t i) {
  const std::string where = fmt::format("messages[{}].content", i);
  if (!m.contains("content") || m["content"].is_null()) return {};
  const json& c = m["content"];
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) bad(fmt::format("'{}' must be a string or a list of text parts", where), where);
  std::string text;
  for (const auto& part : c) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      bad(fmt::format("'{}': only parts {{\"type\": \"text\", \"text\": ...}} are supported", where), where);
    text += part["text"].get<std::string>();
  }
  return text;
}

std::vector<api::ChatMessage> read_messages(const json& b) {
  if (!b.contains("messages")) bad("'messages' is required", "messages");
  const json& ms = b["messages"];
  if (!ms.is_array() || ms.empty()) bad("'messages' must be a non-empty list of {\"role\", \"content\"}", "messages");
  std::vector<api::ChatMessage> out;
  for (size_t i = 0; i < ms.size(); ++i) {
    const json& m = ms[i];
    const std::string where = fmt::format("messages[{}]", i);
    if (!m.is_object() || !m.contains("role")) bad(fmt::format("'{}' must be an object with a role", where), where);
    std::string role = read_string(m["role"], where + ".role");
    if (role == "developer") role = "system";  // OpenAI's newer name for it
    if (role != "system" && role != "user" && role != "assistant")
      bad(fmt::format("'{}.role' must be system, user or assistant, got '{}'", where, role), where + ".role");
    for (const auto& [key, value] : m.items())
      if (key != "role" && key != "content" && key != "name") bad(fmt::format("unknown field '{}.{}'", where, key), where + "." + key);
    out.push_back({role, message_content(m, i)});
  }
  return out;
}

std::string finish_reason_of(const Job& job) { return job.finish_reason == "abort" ? "stop" : job.finish_reason; }

}  // namespace

struct Server::Routes {
  Server& s;

  std::shared_ptr<api::Model> model() {
    std::lock_guard lock(s.mu_);
    return s.model_;
  }
  std::shared_ptr<Scheduler> scheduler() {
    std::lock_guard lock(s.mu_);
    return s.scheduler_;
  }
  // The loaded model, or 503 while loading / shutting down.
  std::shared_ptr<api::Model> ready() {
    if (s.shutting_down_) throw HttpError{503, "the server is shutting down", "service_unavailable", "", "shutting_down"};
    auto m = model();
    if (!m) throw HttpError{503, "the model is loading; retry when GET /health answers 200", "service_unavailable", "", "loading"};
    return m;
  }
  void check_model_name(const json& b) {
    if (!present(b, "model")) return;
    const std::string name = read_string(b["model"], "model");
    if (name != s.model_name_)
      throw HttpError{404, fmt::format("the model '{}' does not exist; this server serves '{}' (GET /v1/models)", name,
                                       s.model_name_), "invalid_request_error", "model", "model_not_found"};
  }

  Ask read_completion(const json& b, bool chat, const api::Model& m) {
    std::set<std::string> keys = kCommonKeys;
    if (chat) keys.insert({"messages", "max_completion_tokens", "include_reasoning", "chat_template_kwargs", "response_format"});
    else keys.insert({"prompt", "echo", "suffix", "best_of"});
    only_keys(b, keys);
    check_model_name(b);
    Ask a;
    a.chat = chat;
    a.sampling = m.default_sampling();
    read_sampling(b, a);
    if (chat) {
      const auto messages = read_messages(b);
      std::optional<bool> thinking;
      if (present(b, "chat_template_kwargs")) {
        const json& k = b["chat_template_kwargs"];
        if (!k.is_object()) bad("'chat_template_kwargs' must be an object", "chat_template_kwargs");
        only_keys(k, {"enable_thinking"});
        bool t = false;
        read_bool(k, "enable_thinking", t);
        if (present(k, "enable_thinking")) thinking = t;
      }
      read_bool(b, "include_reasoning", a.sampling.reasoning);
      if (present(b, "response_format")) {
        const json& f = b["response_format"];
        if (!f.is_object() || f.value("type", "") != "text") bad("only response_format {\"type\": \"text\"} is supported", "response_format");
      }
      try {
        a.prompt = m.chat_prompt(messages, thinking);
      } catch (const std::exception& e) {  // the chat format's own errors (a plugin's Error type)
        bad(e.what(), "messages");
      }
    } else {
      if (!b.contains("prompt")) bad("'prompt' is required", "prompt");
      json p = b["prompt"];
      if (p.is_array() && p.size() == 1 && p[0].is_string()) p = p[0];
      if (p.is_string()) {
        if (p.get<std::string>().empty()) bad("'prompt' is empty", "prompt");
        a.prompt = m.tokenize(p.get<std::string>(), true);
      } else if (p.is_array() && !p.empty() && std::all_of(p.begin(), p.end(), [](const json& v) { return v.is_number_integer(); })) {
        const int64_t vocab = m.info().vocab_size;
        for (const auto& v : p) {
          const int64_t id = v.get<int64_t>();
          if (id < 0 || id >= vocab) bad(fmt::format("'prompt' token id {} is outside the vocabulary of {} tokens", id, vocab), "prompt");
          a.prompt.push_back(static_cast<int32_t>(id));
        }
      } else {
        bad("'prompt' must be a string, a list of one string, or a list of token ids", "prompt");
      }
      bool echo = false;
      read_bool(b, "echo", echo);
      if (echo) bad("'echo' is not supported", "echo");
      if (present(b, "suffix")) bad("'suffix' is not supported", "suffix");
      if (present(b, "best_of") && read_int(b, "best_of", 1, 128) != 1) bad("only best_of = 1 is supported", "best_of");
    }
    if (a.prompt.empty()) bad("the prompt is empty after tokenization", chat ? "messages" : "prompt");
    const int64_t capacity = m.context_length();
    const int64_t n = static_cast<int64_t>(a.prompt.size());
    if (!a.max_tokens_given) a.sampling.max_tokens = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(a.sampling.max_tokens, capacity - n)));
    if (n >= capacity || n + a.sampling.max_tokens > capacity)
      throw HttpError{400, fmt::format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                                       "({} in the prompt, {} in the completion). Please reduce the length of the {} or "
                                       "the completion.", capacity, n + a.sampling.max_tokens, n, a.sampling.max_tokens,
                                       chat ? "messages" : "prompt"),
                      "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded"};
    return a;
  }

  json usage(const api::Result& r) const {
    const auto prompt = r.stats.prompt_tokens + r.cached_tokens;
    const auto completion = static_cast<int64_t>(r.tokens.size());
    return {{"prompt_tokens", prompt},
            {"completion_tokens", completion},
            {"total_tokens", prompt + completion},
            {"prompt_tokens_details", {{"cached_tokens", r.cached_tokens}}}};
  }

  void completion(const httplib::Request& req, httplib::Response& res, bool chat) {
    auto m = ready();
    const json body = parse_body(req);
    Ask ask = read_completion(body, chat, *m);
    auto sched = scheduler();
    if (!sched) throw HttpError{503, "the model is loading", "service_unavailable", "", "loading"};
    auto job = std::make_shared<Job>();
    job->prompt = std::move(ask.prompt);
    job->sampling = ask.sampling;
    switch (sched->submit(job)) {
      case Scheduler::Admission::Queued: break;
      case Scheduler::Admission::QueueFull:
        s.metrics_.rejected("queue_full");
        throw HttpError{429, "the server's request queue is full; retry later", "rate_limit_exceeded", "", "queue_full"};
      case Scheduler::Admission::ShuttingDown:
        s.metrics_.rejected("shutting_down");
        throw HttpError{503, "the server is shutting down", "service_unavailable", "", "shutting_down"};
    }
    const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", s.next_id_++);
    const int64_t created = static_cast<int64_t>(std::time(nullptr));
    const std::string name = s.model_name_;
    const bool reasoning = ask.sampling.reasoning;

    if (!ask.stream) {
      // Bounded by the request itself; a lost client is noticed only when the answer is written.
      while (true) {
        job->wait_done(std::chrono::milliseconds(1000));
        std::lock_guard lock(job->mu);
        if (job->done) break;
      }
      std::lock_guard lock(job->mu);
      if (!job->result) {
        throw HttpError{job->finish_reason == "abort" ? 503 : 500, job->error.empty() ? "the request was cancelled" : job->error,
                        job->finish_reason == "abort" ? "service_unavailable" : "server_error", "", ""};
      }
      const api::Result& r = *job->result;
      json choice = {{"index", 0}, {"finish_reason", finish_reason_of(*job)}, {"logprobs", nullptr}};
      if (chat) {
        json message = {{"role", "assistant"}, {"content", r.text}};
        if (reasoning) message["reasoning_content"] = r.reasoning;
        choice["message"] = message;
      } else {
        choice["text"] = r.text;
      }
      json out = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
                  {"model", name}, {"choices", json::array({choice})}, {"usage", usage(r)}};
      res.set_content(dump(out), "application/json");
      return;
    }

    // Server-sent events: one `data: {chunk}` per piece of text, the finish chunk, the usage chunk when
    // asked, then `data: [DONE]`.
    const bool include_usage = ask.include_usage;
    auto chunk = [=](json delta_or_text, json finish) {
      json choice = {{"index", 0}, {"finish_reason", finish}, {"logprobs", nullptr}};
      if (chat) choice["delta"] = std::move(delta_or_text);
      else choice["text"] = std::move(delta_or_text);
      json c = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                {"model", name}, {"choices", json::array({choice})}};
      if (include_usage) c["usage"] = nullptr;
      return c;
    };
    auto started = std::make_shared<bool>(false);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [=, this](size_t, httplib::DataSink& sink) {
          auto write = [&](const json& j) {
            const std::string line = "data: " + dump(j) + "\n\n";
            if (!sink.write(line.data(), line.size())) {
              job->cancel = true;  // the client went away: free the slot
              return false;
            }
            return true;
          };
          if (chat && !*started) {
            *started = true;
            return write(chunk({{"role", "assistant"}, {"content", ""}}, nullptr));
          }
          Job::Output out = job->take(std::chrono::milliseconds(100));
          if (!out.reasoning.empty() && !write(chunk(json{{"reasoning_content", out.reasoning}}, nullptr))) return false;
          if (!out.text.empty() && !write(chunk(chat ? json{{"content", out.text}} : json(out.text), nullptr))) return false;
          if (!out.done) return true;
          std::lock_guard lock(job->mu);
          if (!job->result) {
            const json err = {{"error", {{"message", job->error.empty() ? "the request was cancelled" : job->error},
                                         {"type", "server_error"}, {"param", nullptr}, {"code", nullptr}}}};
            if (!write(err)) return false;
          } else {
            if (!write(chunk(chat ? json::object() : json(""), finish_reason_of(*job)))) return false;
            if (include_usage) {
              json u = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
                        {"model", name}, {"choices", json::array()}, {"usage", usage(*job->result)}};
              if (!write(u)) return false;
            }
          }
          static const std::string kDone = "data: [DONE]\n\n";
          if (!sink.write(kDone.data(), kDone.size())) return false;
          sink.done();
          return true;
        },
        [job](bool success) {
          if (!success) job->cancel = true;
        });
  }

  void tokenize(const httplib::Request& req, httplib::Response& res) {
    auto m = ready();
    const json b = parse_body(req);
    only_keys(b, {"model", "content", "prompt", "messages", "add_special", "with_pieces"});
    check_model_name(b);
    bool with_pieces = false, add_special = false;
    read_bool(b, "with_pieces", with_pieces);
    read_bool(b, "add_special", add_special);
    std::vector<int32_t> ids;
    if (b.contains("messages")) {
      try {
        ids = m->chat_prompt(read_messages(b));
      } catch (const std::exception& e) {  // the chat format's own errors (a plugin's Error type)
        bad(e.what(), "messages");
      }
    } else {
      const char* key = b.contains("content") ? "content" : "prompt";
      if (!b.contains(key)) bad("give 'content' (text) or 'messages'", "content");
      ids = m->tokenize(read_string(b[key], key), true);
      if (add_special) ids.insert(ids.begin(), m->built().target->tokenizer()->bos());
    }
    json tokens = json::array();
    const auto tok = m->built().target->tokenizer();
    for (int32_t id : ids) {
      if (with_pieces) tokens.push_back({{"id", id}, {"piece", tok->token_bytes(id)}});
      else tokens.push_back(id);
    }
    res.set_content(dump({{"tokens", tokens}, {"count", ids.size()}, {"max_model_len", m->context_length()}}),
                    "application/json");
  }

  void detokenize(const httplib::Request& req, httplib::Response& res) {
    auto m = ready();
    const json b = parse_body(req);
    only_keys(b, {"model", "tokens"});
    check_model_name(b);
    if (!b.contains("tokens") || !b["tokens"].is_array()) bad("'tokens' must be a list of token ids", "tokens");
    std::vector<int32_t> ids;
    const int64_t vocab = m->info().vocab_size;
    for (const auto& v : b["tokens"]) {
      if (!v.is_number_integer()) bad(fmt::format("'tokens' must hold integers, got {}", dump(v)), "tokens");
      const int64_t id = v.get<int64_t>();
      if (id < 0 || id >= vocab) bad(fmt::format("token id {} is outside the vocabulary of {} tokens", id, vocab), "tokens");
      ids.push_back(static_cast<int32_t>(id));
    }
    res.set_content(dump({{"content", m->detokenize(ids, false)}}), "application/json");
  }

  void models(httplib::Response& res) {
    auto m = ready();
    json entry = {{"id", s.model_name_}, {"object", "model"}, {"created", 0}, {"owned_by", "specula"},
                  {"max_model_len", m->context_length()}};
    res.set_content(dump({{"object", "list"}, {"data", json::array({entry})}}), "application/json");
  }

  void health(httplib::Response& res) {
    const char* status = s.shutting_down_ ? "shutting_down" : model() ? "ok" : "loading";
    res.status = std::string(status) == "ok" ? 200 : 503;
    res.set_content(dump({{"status", status}}), "application/json");
  }

  void metrics(httplib::Response& res) {
    auto sched = scheduler();
    Gauges g = sched ? sched->gauges() : Gauges{};
    res.set_content(s.metrics_.render(g), "text/plain; version=0.0.4; charset=utf-8");
  }
};

Server::Server(ServerOptions options) : options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
  if (options_.parallel < 1) fail("--parallel must be at least 1, got {}", options_.parallel);
  if (options_.queue_limit < 0) fail("--queue-limit must not be negative, got {}", options_.queue_limit);
  // A client that goes away mid-stream must fail a write, not kill the process.
  ::signal(SIGPIPE, SIG_IGN);
  const int threads = options_.http_threads > 0 ? options_.http_threads : options_.parallel + options_.queue_limit + 4;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(16u << 20);  // 16 MiB: a long conversation, not a flood
  http_->set_read_timeout(30);
  http_->set_write_timeout(30);

  auto routes = std::make_shared<Routes>(Routes{*this});
  // Every handler answers errors as OpenAI does; nothing a client sends escapes as an exception.
  auto guarded = [](auto fn) {
    return [fn](const httplib::Request& req, httplib::Response& res) {
      try {
        fn(req, res);
      } catch (const HttpError& e) {
        send_error(res, e);
      } catch (const Error& e) {
        send_error(res, {400, e.what(), "invalid_request_error", "", ""});
      } catch (const std::exception& e) {
        send_error(res, {500, e.what(), "server_error", "", ""});
      }
    };
  };
  http_->Post("/v1/chat/completions", guarded([routes](const auto& q, auto& r) { routes->completion(q, r, true); }));
  http_->Post("/v1/completions", guarded([routes](const auto& q, auto& r) { routes->completion(q, r, false); }));
  http_->Post("/tokenize", guarded([routes](const auto& q, auto& r) { routes->tokenize(q, r); }));
  http_->Post("/detokenize", guarded([routes](const auto& q, auto& r) { routes->detokenize(q, r); }));
  http_->Get("/v1/models", guarded([routes](const auto&, auto& r) { routes->models(r); }));
  http_->Get("/health", guarded([routes](const auto&, auto& r) { routes->health(r); }));
  http_->Get("/metrics", guarded([routes](const auto&, auto& r) { routes->metrics(r); }));
  http_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    HttpError e{res.status, fmt::format("{} {}: no such endpoint", req.method, req.path), "invalid_request_error", "", ""};
    if (res.status == 413) e.message = "the request body is too large (16 MiB at most)";
    send_error(res, e);
  });
}

Server::~Server() { shutdown(); }

int Server::start() {
  if (thread_.joinable()) fail("the server is already started");
  port_ = options_.port == 0 ? http_->bind_to_any_port(options_.host) : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port_ < 0)
    fail("cannot listen on {}:{} (in use, or not an address of this machine); pick another --host/--port", options_.host,
         options_.port);
  thread_ = std::thread([this] { http_->listen_after_bind(); });
  return port_;
}

void Server::set_model(std::shared_ptr<api::Model> model) {
  SchedulerOptions so;
  so.parallel = options_.parallel;
  so.queue_limit = options_.queue_limit;
  auto scheduler = std::make_shared<Scheduler>(model, so, metrics_);
  std::string name = options_.model_name;
  if (name.empty()) name = model->pipeline().target.model.stem().string();
  std::lock_guard lock(mu_);
  model_name_ = name;
  scheduler_ = std::move(scheduler);
  model_ = std::move(model);
}

void Server::shutdown() {
  if (shutting_down_.exchange(true)) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  if (auto sched = [&] { std::lock_guard lock(mu_); return scheduler_; }()) sched->drain(options_.drain_timeout);
  http_->stop();
  if (thread_.joinable()) thread_.join();
  std::shared_ptr<Scheduler> sched;
  {
    std::lock_guard lock(mu_);
    sched = std::move(scheduler_);
  }
  sched.reset();  // joins the scheduler thread
}

}  // namespace specula::serve

// A Hugging Face Hub on 127.0.0.1 for the hub tests (no machine that builds Specula reaches the
// internet): the API listing and the file-resolution layout the real Hub serves, with its headers.
//
//   GET  /api/models/OWNER/REPO/revision/REV[?blobs=true]   {"sha", "siblings": [{rfilename, size, blobId, lfs}]}
//   HEAD|GET /OWNER/REPO/resolve/REV/FILE                    regular file: 200, ETag = git blob id
//                                                            LFS file: 302 to /lfs/SHA256 (absolute URL),
//                                                            X-Linked-Etag = sha256, X-Linked-Size
//   GET  /lfs/SHA256                                         the content (Range requests answered by httplib)
//
// Errors as the Hub gives them: 404 with X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound,
// 401 (no token) or 403 (another token) with X-Error-Code GatedRepo for a gated repository. Faults for
// the tests: a file whose first transfer stops halfway, a file served with other bytes of the same size.
#pragma once

#include <openssl/evp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

namespace hub_test {

inline std::string digest_hex(const std::string& data, const EVP_MD* md, const std::string& prefix = "") {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, md, nullptr);
  EVP_DigestUpdate(ctx, prefix.data(), prefix.size());
  EVP_DigestUpdate(ctx, data.data(), data.size());
  EVP_DigestFinal_ex(ctx, out, &len);
  EVP_MD_CTX_free(ctx);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", out[i]);
  return hex;
}
inline std::string sha256(const std::string& data) { return digest_hex(data, EVP_sha256()); }
// git's blob id: sha1 of "blob <size>\0" + content (the Hub's ETag of a regular file).
inline std::string git_blob_id(const std::string& data) {
  std::string prefix = fmt::format("blob {}", data.size());
  prefix.push_back('\0');
  return digest_hex(data, EVP_sha1(), prefix);
}

struct HubFile {
  std::string content;
  bool lfs = false;
  std::string sha, blob;  // computed once (the tiny model is 13.5 MB)
  HubFile() = default;
  HubFile(std::string c, bool l) : content(std::move(c)), lfs(l), sha(hub_test::sha256(content)), blob(git_blob_id(content)) {}
  const std::string& sha256() const { return sha; }
  const std::string& blob_id() const { return blob; }
};

struct HubRepo {
  std::string commit;                      // 40 hex digits
  std::map<std::string, std::string> refs; // revision -> commit ("main" -> commit)
  std::map<std::string, HubFile> files;
  std::string token;                       // non-empty: gated, this token has access
};

struct Request {
  std::string method, path, range, authorization;
};

class HubServer {
 public:
  HubServer() {
    server_.set_keep_alive_max_count(100);
    server_.Get(R"(/api/models/([^/]+/[^/]+)/revision/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      log(req);
      api(req.matches[1], req.matches[2], res);
    });
    server_.Get(R"(/([^/]+/[^/]+)/resolve/([^/]+)/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
      log(req);
      resolve(req, req.matches[1], req.matches[2], req.matches[3], res);
    });
    server_.Get(R"(/lfs/([0-9a-f]{64}))", [this](const httplib::Request& req, httplib::Response& res) {
      log(req);
      lfs(req, req.matches[1], res);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    if (port_ <= 0) throw std::runtime_error("the test Hub could not bind a port on 127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 500 && !server_.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ~HubServer() {
    server_.stop();
    thread_.join();
  }

  std::string endpoint() const { return fmt::format("http://127.0.0.1:{}", port_); }

  // Adds (or replaces) a repository; files are LFS when `lfs` names them.
  HubRepo& add(const std::string& id, const std::string& commit, std::map<std::string, std::string> files,
               const std::set<std::string>& lfs = {}) {
    std::lock_guard<std::mutex> lock(mu_);
    HubRepo& r = repos_[id];
    r = HubRepo{};
    r.commit = commit;
    r.refs["main"] = commit;
    for (auto& [name, content] : files) r.files[name] = HubFile{std::move(content), lfs.count(name) > 0};
    return r;
  }
  void gate(const std::string& id, const std::string& token) {
    std::lock_guard<std::mutex> lock(mu_);
    repos_.at(id).token = token;
  }
  // The next transfer of this LFS object without a Range header sends half of it, then drops the connection.
  void drop_once(const std::string& sha) {
    std::lock_guard<std::mutex> lock(mu_);
    drop_.insert(sha);
  }
  // This LFS object is served with one byte changed.
  void corrupt(const std::string& sha) {
    std::lock_guard<std::mutex> lock(mu_);
    corrupt_.insert(sha);
  }
  // Each /lfs/ transfer waits (up to 500 ms) until `n` transfers run at once: shows concurrent downloads.
  void expect_concurrency(int n) { want_parallel_ = n; }
  int max_parallel() const { return max_parallel_; }

  std::vector<Request> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return log_;
  }
  size_t count(const std::string& method, const std::string& path_prefix) const {
    size_t n = 0;
    for (const auto& r : requests()) n += r.method == method && r.path.rfind(path_prefix, 0) == 0;
    return n;
  }
  void clear_log() {
    std::lock_guard<std::mutex> lock(mu_);
    log_.clear();
  }

 private:
  void log(const httplib::Request& req) {
    std::lock_guard<std::mutex> lock(mu_);
    log_.push_back({req.method, req.path, req.get_header_value("Range"), req.get_header_value("Authorization")});
  }

  static void error(httplib::Response& res, int status, const std::string& code, const std::string& message) {
    res.status = status;
    res.set_header("X-Error-Code", code);
    res.set_header("X-Error-Message", message);
    res.set_content(nlohmann::json{{"error", message}}.dump(), "application/json");
  }

  // The repository and commit a request names, or an error answered.
  const HubRepo* find(const std::string& id, const std::string& revision, std::string* commit, httplib::Response& res) {
    auto it = repos_.find(id);
    if (it == repos_.end()) {
      error(res, 404, "RepoNotFound", "Repository not found");
      return nullptr;
    }
    const HubRepo& r = it->second;
    if (revision == r.commit) {
      *commit = r.commit;
    } else if (auto ref = r.refs.find(revision); ref != r.refs.end()) {
      *commit = ref->second;
    } else {
      error(res, 404, "RevisionNotFound", "Invalid rev id: " + revision);
      return nullptr;
    }
    return &r;
  }

  bool allowed(const HubRepo& r, const httplib::Request& req, httplib::Response& res) {
    if (r.token.empty()) return true;
    const std::string auth = req.get_header_value("Authorization");
    if (auth == "Bearer " + r.token) return true;
    if (auth.empty()) error(res, 401, "GatedRepo", "Access to this model is restricted. You must be authenticated.");
    else error(res, 403, "GatedRepo", "Access to this model is restricted and you are not in the authorized list.");
    return false;
  }

  void api(const std::string& id, const std::string& revision, httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string commit;
    const HubRepo* r = find(id, revision, &commit, res);
    if (!r) return;
    nlohmann::json siblings = nlohmann::json::array();
    for (const auto& [name, f] : r->files) {
      nlohmann::json s = {{"rfilename", name}, {"size", f.content.size()}, {"blobId", f.blob_id()}};
      if (f.lfs) s["lfs"] = {{"sha256", f.sha256()}, {"size", f.content.size()}, {"pointerSize", 134}};
      siblings.push_back(s);
    }
    res.set_content(nlohmann::json{{"id", id}, {"sha", commit}, {"siblings", siblings}}.dump(), "application/json");
  }

  void resolve(const httplib::Request& req, const std::string& id, const std::string& revision, const std::string& file,
               httplib::Response& res) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string commit;
    const HubRepo* r = find(id, revision, &commit, res);
    if (!r || !allowed(*r, req, res)) return;
    auto f = r->files.find(file);
    if (f == r->files.end()) {
      error(res, 404, "EntryNotFound", file + " does not exist on \"" + revision + "\"");
      return;
    }
    res.set_header("X-Repo-Commit", commit);
    if (f->second.lfs) {
      const std::string sha = f->second.sha256();
      res.status = 302;
      res.set_header("Location", endpoint() + "/lfs/" + sha);
      res.set_header("X-Linked-Etag", "\"" + sha + "\"");
      res.set_header("X-Linked-Size", std::to_string(f->second.content.size()));
      res.set_header("ETag", "\"pointer-" + f->second.blob_id() + "\"");  // the pointer's, not the file's
      return;
    }
    res.set_header("ETag", "\"" + f->second.blob_id() + "\"");
    res.set_content(f->second.content, "application/octet-stream");
  }

  void lfs(const httplib::Request& req, const std::string& sha, httplib::Response& res) {
    std::string content;
    bool drop = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, r] : repos_)
        for (const auto& [name, f] : r.files)
          if (f.lfs && f.sha256() == sha) content = f.content;
      if (content.empty()) {
        error(res, 404, "EntryNotFound", "no such object");
        return;
      }
      if (corrupt_.count(sha)) content[content.size() / 2] ^= 0x5a;
      drop = !req.has_header("Range") && drop_.erase(sha) > 0;
    }
    wait_for_company();
    if (drop) {
      // Content-Length says the whole file; the connection closes after half of it.
      auto shared = std::make_shared<std::string>(std::move(content));
      res.set_content_provider(shared->size(), "application/octet-stream",
                               [shared](size_t offset, size_t, httplib::DataSink& sink) {
                                 const size_t half = shared->size() / 2;
                                 if (offset < half) sink.write(shared->data() + offset, half - offset);
                                 return false;  // drops the connection
                               });
      return;
    }
    res.set_content(content, "application/octet-stream");
  }

  void wait_for_company() {
    if (want_parallel_ <= 1) return;
    std::unique_lock<std::mutex> lock(parallel_mu_);
    ++in_flight_;
    max_parallel_ = std::max(max_parallel_.load(), in_flight_);
    if (in_flight_ >= want_parallel_) together_ = true;  // a flag: the first to leave must not strand the others
    parallel_cv_.notify_all();
    parallel_cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return together_; });
    --in_flight_;
  }

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  mutable std::mutex mu_;
  std::map<std::string, HubRepo> repos_;
  std::set<std::string> drop_, corrupt_;
  std::vector<Request> log_;
  std::atomic<int> want_parallel_{0};
  std::mutex parallel_mu_;
  std::condition_variable parallel_cv_;
  int in_flight_ = 0;
  bool together_ = false;
  std::atomic<int> max_parallel_{0};
};

}  // namespace hub_test

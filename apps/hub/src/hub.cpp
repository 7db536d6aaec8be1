#include "specula/hub.hpp"

#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "specula/core/pipeline.hpp"
#include "specula/core/version.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"

namespace specula::core::hub {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// A failure to reach the server at all (as opposed to an HTTP answer): the cache may still serve.
class NetworkError : public Error {
 public:
  using Error::Error;
};
// The server says the repository does not exist (`drafter: auto` then tries the next candidate).
class RepoNotFound : public Error {
 public:
  using Error::Error;
};

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : std::string(sep)) + i;
  return out;
}

bool is_commit_hash(std::string_view s) {
  return s.size() == 40 && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); });
}

std::string getenv_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// huggingface_hub's truthy environment values.
bool env_true(const char* name) {
  const std::string v = lower(getenv_str(name));
  return v == "1" || v == "on" || v == "yes" || v == "true";
}

long env_seconds(const char* name, long fallback) {
  const std::string v = getenv_str(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (end == v.c_str() || *end != '\0' || !(d > 0) || d > 86400) fail("{}={}: expected a number of seconds", name, v);
  return std::max(1L, static_cast<long>(d + 0.5));
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// Percent-encoding as huggingface_hub's quote(): revisions with safe="" (refs/pr/1 -> refs%2Fpr%2F1),
// file names with safe="/".
std::string quote(std::string_view s, bool keep_slash) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("%{:02X}", c);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------
// HTTP through libcurl.

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) fail("libcurl could not be initialised");
  });
}

struct Curl {
  CURL* h = nullptr;
  curl_slist* headers = nullptr;
  Curl() {
    curl_init_once();
    h = curl_easy_init();
    if (!h) fail("libcurl could not create a request");
  }
  ~Curl() {
    if (headers) curl_slist_free_all(headers);
    if (h) curl_easy_cleanup(h);
  }
  Curl(const Curl&) = delete;
  Curl& operator=(const Curl&) = delete;
};

struct Response {
  long status = 0;
  std::map<std::string, std::string> headers;  // lower-case names, of the last response
  std::string body;
};

// scheme://host[:port] of a URL, to tell the Hub's own URLs (which get the token) from a CDN's.
std::string origin_of(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url;
  const size_t path = url.find('/', scheme + 3);
  return path == std::string::npos ? url : url.substr(0, path);
}

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<Response*>(user);
  std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {
    r->headers.clear();  // a new response (after a redirect or a 100 Continue)
    return size * n;
  }
  const size_t colon = line.find(':');
  if (colon != std::string::npos) r->headers[lower(line.substr(0, colon))] = trim(line.substr(colon + 1));
  return size * n;
}

constexpr size_t kMaxMetadataBody = 64u << 20;  // a repository listing; more is not an API answer

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* r = static_cast<Response*>(user);
  if (r->body.size() + size * n > kMaxMetadataBody) return 0;  // aborts the transfer
  r->body.append(data, size * n);
  return size * n;
}

struct Context {
  const Settings& settings;
  std::string what;  // "owner/repo" or "owner/repo file X", for messages
};

void common_options(Curl& c, const Settings& s, const std::string& url) {
  curl_easy_setopt(c.h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c.h, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for timeouts
  curl_easy_setopt(c.h, CURLOPT_CONNECTTIMEOUT, s.download_timeout_s);
  const std::string agent = fmt::format("specula/{}; hf_hub-compatible", version());
  curl_easy_setopt(c.h, CURLOPT_USERAGENT, agent.c_str());  // copied by libcurl
  c.headers = curl_slist_append(c.headers, "Accept-Encoding: identity");  // sizes are the files' own
  if (!s.token.empty() && origin_of(url) == origin_of(s.endpoint))
    c.headers = curl_slist_append(c.headers, ("Authorization: Bearer " + s.token).c_str());
}

[[noreturn]] void network_failure(const Context& ctx, const std::string& url, CURLcode code, const char* detail) {
  throw NetworkError(fmt::format(
      "{}: cannot reach {} ({}); check the network connection or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use "
      "only the cache",
      ctx.what, url, detail && *detail ? detail : curl_easy_strerror(code)));
}

// A metadata request: the API (GET, redirects followed) or a file's HEAD (redirects not followed, as
// huggingface_hub does: the 302 to the LFS storage carries the file's metadata).
Response metadata_request(const Context& ctx, const std::string& url, bool head) {
  Curl c;
  Response r;
  char error[CURL_ERROR_SIZE] = {0};
  common_options(c, ctx.settings, url);
  curl_easy_setopt(c.h, CURLOPT_HTTPHEADER, c.headers);
  curl_easy_setopt(c.h, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c.h, CURLOPT_TIMEOUT, ctx.settings.metadata_timeout_s);
  curl_easy_setopt(c.h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(c.h, CURLOPT_HEADERDATA, &r);
  curl_easy_setopt(c.h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(c.h, CURLOPT_WRITEDATA, &r);
  if (head) {
    curl_easy_setopt(c.h, CURLOPT_NOBODY, 1L);
  } else {
    curl_easy_setopt(c.h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c.h, CURLOPT_MAXREDIRS, 5L);
  }
  const CURLcode code = curl_easy_perform(c.h);
  if (code == CURLE_WRITE_ERROR) fail("{}: the answer of {} is larger than {}; not a Hub API answer", ctx.what, url, human_bytes(kMaxMetadataBody));
  if (code != CURLE_OK) network_failure(ctx, url, code, error);
  curl_easy_getinfo(c.h, CURLINFO_RESPONSE_CODE, &r.status);
  return r;
}

// What an HTTP error means for people. `kind` is what was asked for: "repository", "revision" or "file".
[[noreturn]] void http_failure(const Context& ctx, const ModelRef& ref, const Response& r, const std::string& kind,
                               const std::string& url) {
  const auto header = [&](const char* name) {
    auto it = r.headers.find(name);
    return it == r.headers.end() ? std::string() : it->second;
  };
  const std::string code = header("x-error-code");
  const std::string message = header("x-error-message");
  const std::string said = message.empty() ? "" : fmt::format(" (the server says: {})", message);
  const std::string page = fmt::format("{}/{}", ctx.settings.endpoint, ref.repo);
  if (code == "GatedRepo" || ((r.status == 401 || r.status == 403) && code != "RepoNotFound")) {
    if (ctx.settings.token.empty()) {
      fail("{}: HTTP {}: {} is gated or private{}; request access on {} and set HF_TOKEN to an access token of that "
           "account (https://huggingface.co/settings/tokens)",
           ctx.what, r.status, ref.repo, said, page);
    }
    fail("{}: HTTP {}: the token in HF_TOKEN has no access to {}{}; request access on {} with that account, or use "
         "another token",
         ctx.what, r.status, ref.repo, said, page);
  }
  if (r.status == 404 || r.status == 401 || code == "RepoNotFound") {
    if (code == "RepoNotFound" || (kind == "repository" && code.empty())) {
      throw RepoNotFound(fmt::format("{}: repository {} not found on {}{}{}", ctx.what, ref.repo, ctx.settings.endpoint,
                                     said, ctx.settings.token.empty() ? " (if it is private, set HF_TOKEN)" : ""));
    }
    if (code == "RevisionNotFound" || kind == "revision")
      fail("{}: revision '{}' not found in {}{}; give a branch, tag or commit of the repository", ctx.what,
           ref.revision, ref.repo, said);
    fail("{}: not found in {} at revision {}{}", ctx.what, ref.repo, ref.revision, said);
  }
  if (r.status >= 500)
    fail("{}: the server answered HTTP {} for {}{}; try again later", ctx.what, r.status, url, said);
  fail("{}: unexpected HTTP {} for {}{}", ctx.what, r.status, url, said);
}

// ---------------------------------------------------------------------------------------------------
// Repository metadata.

struct RemoteFile {
  std::string name;
  uint64_t size = 0;
  std::string sha256;   // LFS files
  std::string blob_id;  // git blob id (sha1)
};

struct RepoInfo {
  std::string commit;
  std::map<std::string, RemoteFile> files;
};

RepoInfo fetch_repo_info(const ModelRef& ref, const Settings& s) {
  const Context ctx{s, ref.str()};
  const std::string url =
      fmt::format("{}/api/models/{}/revision/{}?blobs=true", s.endpoint, ref.repo, quote(ref.revision, false));
  const Response r = metadata_request(ctx, url, false);
  if (r.status != 200) http_failure(ctx, ref, r, ref.explicit_revision ? "revision" : "repository", url);
  RepoInfo info;
  try {
    const json j = json::parse(r.body);
    info.commit = j.at("sha").get<std::string>();
    for (const auto& f : j.at("siblings")) {
      RemoteFile rf;
      rf.name = f.at("rfilename").get<std::string>();
      if (auto it = f.find("size"); it != f.end() && it->is_number_unsigned()) rf.size = it->get<uint64_t>();
      if (auto it = f.find("blobId"); it != f.end() && it->is_string()) rf.blob_id = it->get<std::string>();
      if (auto it = f.find("lfs"); it != f.end() && it->is_object()) {
        rf.sha256 = it->value("sha256", std::string());
        if (auto sz = it->find("size"); sz != it->end() && sz->is_number_unsigned()) rf.size = sz->get<uint64_t>();
      }
      info.files[rf.name] = rf;
    }
  } catch (const json::exception& e) {
    fail("{}: {} did not answer with a Hub repository listing ({}); is HF_ENDPOINT={} a Hub?", ref.str(), url,
         e.what(), s.endpoint);
  }
  if (!is_commit_hash(info.commit)) fail("{}: {} answered commit '{}', not a commit hash", ref.str(), url, info.commit);
  return info;
}

// A file's metadata as huggingface_hub's get_hf_file_metadata reads it: HEAD on the resolve URL,
// relative redirects followed (a renamed repository), the absolute one (LFS storage) kept as the
// download location. ETag: X-Linked-Etag (LFS) or ETag, quotes and W/ removed.
struct FileMetadata {
  std::string commit, etag, location;
  uint64_t size = 0;
};

std::string normalize_etag(std::string e) {
  if (e.rfind("W/", 0) == 0) e = e.substr(2);
  if (e.size() >= 2 && e.front() == '"' && e.back() == '"') e = e.substr(1, e.size() - 2);
  return e;
}

FileMetadata file_metadata(const ModelRef& ref, const std::string& commit, const std::string& file, const Settings& s) {
  const Context ctx{s, fmt::format("{} file {}", ref.str(), file)};
  std::string url = fmt::format("{}/{}/resolve/{}/{}", s.endpoint, ref.repo, commit, quote(file, true));
  std::map<std::string, std::string> seen;  // headers of every hop, the later ones winning
  for (int hop = 0;; ++hop) {
    const Response r = metadata_request(ctx, url, true);
    for (const auto& [k, v] : r.headers) seen[k] = v;
    auto location = r.headers.find("location");
    const bool redirect = r.status >= 300 && r.status < 400 && location != r.headers.end();
    if (redirect && location->second.rfind('/', 0) == 0 && hop < 5) {  // relative: follow
      url = origin_of(url) + location->second;
      continue;
    }
    if (!redirect && r.status != 200) http_failure(ctx, ref, r, "file", url);
    FileMetadata m;
    auto get = [&](const char* name) { auto it = seen.find(name); return it == seen.end() ? std::string() : it->second; };
    m.commit = get("x-repo-commit");
    m.etag = normalize_etag(!get("x-linked-etag").empty() ? get("x-linked-etag") : get("etag"));
    const std::string size = !get("x-linked-size").empty() ? get("x-linked-size") : get("content-length");
    m.size = size.empty() ? 0 : std::strtoull(size.c_str(), nullptr, 10);
    m.location = redirect ? location->second : url;
    if (m.etag.empty() || m.etag.find('/') != std::string::npos || m.etag.find("..") != std::string::npos)
      fail("{}: the server gave no usable ETag for {} (got '{}'); cannot place it in the cache", ctx.what, url, m.etag);
    return m;
  }
}

// ---------------------------------------------------------------------------------------------------
// Hashing (OpenSSL EVP): sha256 for LFS files, git's blob sha1 ("blob <size>\0" + content) otherwise.

std::string hash_file(const fs::path& path, bool git_blob) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!md || EVP_DigestInit_ex(md.get(), git_blob ? EVP_sha1() : EVP_sha256(), nullptr) != 1)
    fail("OpenSSL could not start a digest");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {} to verify it", path.string());
  if (git_blob) {
    const std::string prefix = fmt::format("blob {}", fs::file_size(path));
    EVP_DigestUpdate(md.get(), prefix.c_str(), prefix.size() + 1);  // with its NUL
  }
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(md.get(), buf.data(), static_cast<size_t>(in.gcount()));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(md.get(), digest, &len);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

// ---------------------------------------------------------------------------------------------------
// Progress: one line for all the files of a resolve, on a terminal only.

class Progress {
 public:
  Progress(bool enabled, std::string label, uint64_t total, size_t files)
      : enabled_(enabled), label_(std::move(label)), total_(total), files_(files), start_(Clock::now()) {}
  ~Progress() {
    if (enabled_ && drawn_) std::fputs("\n", stderr);
  }
  void add(uint64_t bytes) {
    done_ += bytes;
    draw(false);
  }
  void file_done() {
    ++files_done_;
    draw(true);
  }

 private:
  using Clock = std::chrono::steady_clock;
  void draw(bool force) {
    if (!enabled_) return;
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = Clock::now();
    if (!force && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    drawn_ = true;
    const uint64_t done = std::min<uint64_t>(done_, total_);
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double rate = secs > 0.05 ? static_cast<double>(done) / secs : 0;
    const double frac = total_ ? static_cast<double>(done) / static_cast<double>(total_) : 1.0;
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(frac * kWidth);
    std::string eta = "--:--";
    if (rate > 0 && total_ > done) {
      const auto left = static_cast<long>(static_cast<double>(total_ - done) / rate);
      eta = left >= 3600 ? fmt::format("{}:{:02}:{:02}", left / 3600, left / 60 % 60, left % 60)
                         : fmt::format("{:02}:{:02}", left / 60, left % 60);
    }
    fmt::print(stderr, "\r{} [{}{}] {:>3.0f}% {} / {}  {}/s  ETA {}  ({}/{} files)\x1b[K", label_,
               std::string(filled, '#'), std::string(kWidth - filled, '.'), frac * 100, human_bytes(done),
               human_bytes(total_), human_bytes(static_cast<uint64_t>(rate)), eta, files_done_.load(), files_);
    std::fflush(stderr);
  }

  const bool enabled_;
  const std::string label_;
  const uint64_t total_;
  const size_t files_;
  const Clock::time_point start_;
  std::atomic<uint64_t> done_{0};
  std::atomic<size_t> files_done_{0};
  std::mutex mu_;
  Clock::time_point last_{};
  bool drawn_ = false;
};

// ---------------------------------------------------------------------------------------------------
// The cache.

fs::path refs_file(const fs::path& repo, const std::string& revision) { return repo / "refs" / revision; }

void write_atomically(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  const fs::path tmp = path.string() + fmt::format(".tmp-{}-{}", getpid(), std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) fail("cannot write {}", tmp.string());
  }
  fs::rename(tmp, path);
}

std::string read_small_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// snapshots/<commit>/<file> -> ../../blobs/<etag> (one more ../ per directory of <file>), as
// huggingface_hub's _create_symlink writes it; replaced atomically when present.
void link_snapshot_file(const fs::path& repo, const std::string& commit, const std::string& file, const std::string& etag) {
  const fs::path link = repo / "snapshots" / commit / file;
  fs::create_directories(link.parent_path());
  const fs::path target = (repo / "blobs" / etag).lexically_relative(link.parent_path());
  const fs::path tmp = link.string() + fmt::format(".tmp-{}-{}", getpid(), std::hash<std::thread::id>{}(std::this_thread::get_id()));
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_symlink(target, tmp);
  fs::rename(tmp, link);
}

// A file in a snapshot that can be opened: a regular file or a symlink to one (a dangling link is missing).
bool usable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// An advisory lock shared with huggingface_hub (filelock uses flock on .locks/<repo dir>/<etag>.lock),
// so that two downloads of one blob never write the same .incomplete file.
class BlobLock {
 public:
  explicit BlobLock(const fs::path& path) {
    fs::create_directories(path.parent_path());
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create the lock file {}", path.string());
    if (::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fail("cannot lock {}", path.string());
    }
  }
  ~BlobLock() {
    ::flock(fd_, LOCK_UN);
    ::close(fd_);
  }
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;

 private:
  int fd_ = -1;
};

// ---------------------------------------------------------------------------------------------------
// One download.

struct Job {
  RemoteFile remote;
  FileMetadata meta;
};

struct Transfer {
  FILE* out = nullptr;
  uint64_t offset = 0;     // bytes already in the .incomplete file when the request began
  uint64_t written = 0;    // by this request
  bool restarted = false;  // the server ignored the Range: the file was truncated
  CURL* h = nullptr;
  Progress* progress = nullptr;
  const std::atomic<bool>* abort = nullptr;
};

size_t on_file_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  long status = 0;
  curl_easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &status);
  if (status != 200 && status != 206) return size * n;  // an error page: not the file (the status says why)
  if (status == 200 && t->offset > 0 && !t->restarted) {
    // A 200 to a Range request is the whole file: start over.
    if (std::fflush(t->out) != 0 || ::ftruncate(fileno(t->out), 0) != 0 || std::fseek(t->out, 0, SEEK_SET) != 0) return 0;
    t->restarted = true;
  }
  const size_t wrote = std::fwrite(data, 1, size * n, t->out);
  t->written += wrote;
  if (t->progress) t->progress->add(wrote);
  return wrote;
}

int on_file_progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  return t->abort && t->abort->load() ? 1 : 0;  // another file failed: stop (the .incomplete stays for later)
}

uint64_t file_size_or_zero(const fs::path& p) {
  std::error_code ec;
  const auto n = fs::file_size(p, ec);
  return ec ? 0 : n;
}

// Downloads one blob into blobs/<etag> through blobs/<etag>.incomplete, resuming and verifying.
void download_blob(const ModelRef& ref, const fs::path& repo, const Job& job, const Settings& s, Progress& progress,
                   const std::atomic<bool>& abort) {
  const std::string& file = job.remote.name;
  const Context ctx{s, fmt::format("{} file {}", ref.str(), file)};
  const fs::path blob = repo / "blobs" / job.meta.etag;
  const fs::path partial = blob.string() + ".incomplete";
  const uint64_t expected = job.remote.size ? job.remote.size : job.meta.size;
  fs::create_directories(blob.parent_path());
  BlobLock lock(repo.parent_path() / ".locks" / repo.filename() / (job.meta.etag + ".lock"));
  if (usable(blob)) {  // another process finished it while we waited
    progress.add(expected);
    return;
  }
  CURLcode code = CURLE_OK;
  std::string detail;
  for (int attempt = 0; attempt < std::max(1, s.attempts); ++attempt) {
    if (abort) fail("{}: stopped (another file failed)", ctx.what);
    uint64_t have = file_size_or_zero(partial);
    if (expected && have > expected) {
      fs::remove(partial);
      have = 0;
    }
    if (have > 0) log_info("{}: resuming at {} of {}", ctx.what, human_bytes(have), human_bytes(expected));
    if (attempt == 0) progress.add(have);  // later attempts continue bytes already counted
    Transfer t;
    long status = 0;
    if (!expected || have < expected) {
      Curl c;
      char error[CURL_ERROR_SIZE] = {0};
      t.out = std::fopen(partial.c_str(), "ab");
      if (!t.out) fail("{}: cannot write {}", ctx.what, partial.string());
      t.offset = have;
      t.h = c.h;
      t.progress = &progress;
      t.abort = &abort;
      common_options(c, s, job.meta.location);
      curl_easy_setopt(c.h, CURLOPT_HTTPHEADER, c.headers);
      curl_easy_setopt(c.h, CURLOPT_ERRORBUFFER, error);
      curl_easy_setopt(c.h, CURLOPT_FOLLOWLOCATION, 1L);
      curl_easy_setopt(c.h, CURLOPT_MAXREDIRS, 5L);
      curl_easy_setopt(c.h, CURLOPT_LOW_SPEED_LIMIT, 1L);  // a stalled connection fails after download_timeout_s
      curl_easy_setopt(c.h, CURLOPT_LOW_SPEED_TIME, s.download_timeout_s);
      curl_easy_setopt(c.h, CURLOPT_WRITEFUNCTION, on_file_body);
      curl_easy_setopt(c.h, CURLOPT_WRITEDATA, &t);
      curl_easy_setopt(c.h, CURLOPT_NOPROGRESS, 0L);
      curl_easy_setopt(c.h, CURLOPT_XFERINFOFUNCTION, on_file_progress);
      curl_easy_setopt(c.h, CURLOPT_XFERINFODATA, &t);
      const std::string range = fmt::format("{}-", have);
      if (have > 0) curl_easy_setopt(c.h, CURLOPT_RANGE, range.c_str());
      code = curl_easy_perform(c.h);
      detail = error;
      curl_easy_getinfo(c.h, CURLINFO_RESPONSE_CODE, &status);
      const bool closed = std::fclose(t.out) == 0;
      if (!closed && code == CURLE_OK) fail("{}: writing {} failed (disk full?)", ctx.what, partial.string());
      if (code == CURLE_ABORTED_BY_CALLBACK) fail("{}: stopped (another file failed)", ctx.what);
      if (code == CURLE_WRITE_ERROR) fail("{}: writing {} failed (disk full?)", ctx.what, partial.string());
      if (code == CURLE_OK && status == 416 && expected && file_size_or_zero(partial) != expected) {
        fs::remove(partial);  // the range was past the end of another file: begin again
        continue;
      }
      if (code == CURLE_OK && status != 200 && status != 206 && status != 416) {
        Response r;
        r.status = status;
        if (status >= 500 && attempt + 1 < s.attempts) continue;
        http_failure(ctx, ref, r, "file", job.meta.location);
      }
      if (code != CURLE_OK) {
        log_info("{}: the download was interrupted at {} ({}); {}", ctx.what, human_bytes(file_size_or_zero(partial)),
                 detail.empty() ? curl_easy_strerror(code) : detail,
                 attempt + 1 < s.attempts ? "resuming" : "giving up");
        continue;
      }
    }
    const uint64_t got = file_size_or_zero(partial);
    if (expected && got != expected) {
      if (got < expected) {  // the server ended early without an error: resume
        code = CURLE_PARTIAL_FILE;
        continue;
      }
      fs::remove(partial);
      fail("{}: the download is {} bytes, the Hub lists {} bytes; the partial file was removed, run again", ctx.what,
           got, expected);
    }
    // Verified against what the Hub's listing says the content is, before the file takes its name.
    const bool lfs = !job.remote.sha256.empty();
    const std::string want = lfs ? job.remote.sha256 : !job.remote.blob_id.empty() ? job.remote.blob_id : std::string();
    if (!want.empty()) {
      const std::string actual = hash_file(partial, !lfs);
      if (lower(actual) != lower(want)) {
        fs::remove(partial);
        fail("{}: checksum mismatch: expected {} {}, the download has {}; it was deleted (a broken mirror or "
             "proxy?), run again",
             ctx.what, lfs ? "sha256" : "git blob id", want, actual);
      }
    }
    fs::rename(partial, blob);
    return;
  }
  network_failure(ctx, job.meta.location, code == CURLE_OK ? CURLE_PARTIAL_FILE : code,
                  fmt::format("{} after {} attempts; {} of {} are kept and the next run resumes there",
                              detail.empty() ? curl_easy_strerror(code) : detail, s.attempts,
                              human_bytes(file_size_or_zero(partial)), human_bytes(expected))
                      .c_str());
}

// ---------------------------------------------------------------------------------------------------
// Choosing the files.

const std::regex& shard_pattern() {
  static const std::regex re(R"(^(.*)-(\d{5})-of-(\d{5})\.gguf$)", std::regex::icase);
  return re;
}

std::string basename_of(const std::string& file) {
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? file : file.substr(slash + 1);
}

// "gemma-4-E2B-it-Q4_K_M.gguf" holds quantization "q4_k_m": the name bounded by a non-alphanumeric
// character before and '.', '-' after (so Q4_K does not match Q4_K_M).
bool names_quant(const std::string& file, const std::string& quant) {
  const std::string name = lower(basename_of(file));
  const std::string q = lower(quant);
  for (size_t at = name.find(q); at != std::string::npos; at = name.find(q, at + 1)) {
    const bool before = at == 0 || !std::isalnum(static_cast<unsigned char>(name[at - 1]));
    const char after = at + q.size() < name.size() ? name[at + q.size()] : '.';
    if (before && (after == '.' || after == '-')) return true;
  }
  return false;
}

bool is_gguf(const std::string& f) { return ends_with(lower(f), ".gguf"); }
// Vision projectors share the repositories of the text GGUFs; they are never the model.
bool is_projector(const std::string& f) { return lower(basename_of(f)).find("mmproj") != std::string::npos; }

// The quantization a GGUF's name ends with ("...-Q4_K_M.gguf" -> "Q4_K_M"), for listing the choices.
std::string quant_label(const std::string& file) {
  std::string name = basename_of(file);
  std::smatch m;
  if (std::regex_match(name, m, shard_pattern())) name = m[1].str();
  else name = name.substr(0, name.size() - 5);
  const size_t dash = name.rfind('-');
  return dash == std::string::npos ? name : name.substr(dash + 1);
}

// All shards of the GGUF `file` names (itself if not split); throws naming a missing shard.
std::vector<std::string> gguf_group(const std::string& file, const std::set<std::string>& have, const std::string& what) {
  std::smatch m;
  if (!std::regex_match(file, m, shard_pattern())) return {file};
  const int count = std::stoi(m[3].str());
  std::vector<std::string> out;
  for (int i = 1; i <= count; ++i) {
    const std::string shard = fmt::format("{}-{:05}-of-{}.gguf", m[1].str(), i, m[3].str());
    if (!have.count(shard)) fail("{}: split GGUF {} lacks shard {} of {} ({})", what, m[1].str(), i, count, shard);
    out.push_back(shard);
  }
  return out;
}

const std::vector<std::string> kCheckpointFiles = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
    "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "model.safetensors.index.json"};

}  // namespace

// ---------------------------------------------------------------------------------------------------

Settings Settings::from_env() {
  Settings s;
  const std::string home = getenv_str("HOME");
  std::string hf_home = getenv_str("HF_HOME");
  if (hf_home.empty()) {
    const std::string xdg = getenv_str("XDG_CACHE_HOME");
    hf_home = ((xdg.empty() ? fs::path(home) / ".cache" : fs::path(xdg)) / "huggingface").string();
  }
  std::string cache = getenv_str("HF_HUB_CACHE");
  if (cache.empty()) cache = getenv_str("HUGGINGFACE_HUB_CACHE");  // huggingface_hub's older name
  s.cache_dir = cache.empty() ? fs::path(hf_home) / "hub" : fs::path(cache);
  if (const std::string e = getenv_str("HF_ENDPOINT"); !e.empty()) s.endpoint = e;
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  s.token = trim(getenv_str("HF_TOKEN"));
  if (s.token.empty()) {
    std::string token_path = getenv_str("HF_TOKEN_PATH");
    if (token_path.empty()) token_path = (fs::path(hf_home) / "token").string();
    std::error_code ec;
    if (fs::is_regular_file(token_path, ec)) s.token = trim(read_small_file(token_path));
  }
  s.offline = env_true("HF_HUB_OFFLINE");
  s.progress = ::isatty(STDERR_FILENO) && !env_true("HF_HUB_DISABLE_PROGRESS_BARS");
  s.metadata_timeout_s = env_seconds("HF_HUB_ETAG_TIMEOUT", s.metadata_timeout_s);
  s.download_timeout_s = env_seconds("HF_HUB_DOWNLOAD_TIMEOUT", s.download_timeout_s);
  return s;
}

fs::path repo_dir(const fs::path& cache_dir, const std::string& repo) {
  std::string name = "models--" + repo;
  for (size_t at = name.find('/'); at != std::string::npos; at = name.find('/', at)) name.replace(at, 1, "--");
  return cache_dir / name;
}

Selection select_files(const std::vector<std::string>& repo_files, const std::string& selector, const std::string& what) {
  const std::set<std::string> have(repo_files.begin(), repo_files.end());
  std::vector<std::string> ggufs;
  for (const auto& f : repo_files)
    if (is_gguf(f) && !is_projector(f)) ggufs.push_back(f);
  std::sort(ggufs.begin(), ggufs.end());
  // The quantizations on offer, for messages.
  const auto choices = [&] {
    std::set<std::string> labels;
    for (const auto& g : ggufs) labels.insert(quant_label(g));
    return labels.empty() ? std::string("none") : join(std::vector<std::string>(labels.begin(), labels.end()), ", ");
  };
  Selection sel;
  if (!selector.empty() && have.count(selector)) {  // a file of the repository
    sel.files = is_gguf(selector) ? gguf_group(selector, have, what) : std::vector<std::string>{selector};
    sel.open = sel.files.front();
    return sel;
  }
  if (!selector.empty()) {
    std::set<std::string> models;  // distinct GGUF models (a split one counts once) naming the quant
    std::string first;
    for (const auto& g : ggufs) {
      if (!names_quant(g, selector)) continue;
      std::smatch m;
      const bool split = std::regex_match(g, m, shard_pattern());
      models.insert(split ? m[1].str() : g);
      if (first.empty() || (split && std::stoi(m[2].str()) == 1 && !std::regex_match(first, shard_pattern()))) first = g;
    }
    if (models.empty()) {
      fail("{}: no GGUF file with quantization '{}' (the repository has: {}){}", what, selector, choices(),
           ggufs.empty() ? "; it holds no GGUF file, omit ':" + selector + "' for its checkpoint" : "");
    }
    if (models.size() > 1) {
      fail("{}: quantization '{}' names several GGUF files ({}); give the file name after ':'", what, selector,
           join(std::vector<std::string>(models.begin(), models.end()), ", "));
    }
    std::smatch m;
    if (std::regex_match(first, m, shard_pattern()))
      first = fmt::format("{}-00001-of-{}.gguf", m[1].str(), m[3].str());
    sel.files = gguf_group(first, have, what);
    sel.open = sel.files.front();
    return sel;
  }
  // No selector: a safetensors checkpoint (the directory), else the one GGUF model of the repository.
  std::vector<std::string> weights;
  for (const auto& f : repo_files)
    if (f.find('/') == std::string::npos && ends_with(lower(f), ".safetensors")) weights.push_back(f);
  if (!weights.empty()) {
    if (!have.count("config.json"))
      fail("{}: the repository has safetensors weights but no config.json; it is not a checkpoint Specula can open", what);
    for (const auto& f : kCheckpointFiles)
      if (have.count(f)) sel.files.push_back(f);
    std::sort(weights.begin(), weights.end());
    sel.files.insert(sel.files.end(), weights.begin(), weights.end());
    return sel;
  }
  std::set<std::string> models;
  for (const auto& g : ggufs) {
    std::smatch m;
    models.insert(std::regex_match(g, m, shard_pattern()) ? m[1].str() : g);
  }
  if (models.size() == 1) {
    std::string first = ggufs.front();
    std::smatch m;
    if (std::regex_match(first, m, shard_pattern())) first = fmt::format("{}-00001-of-{}.gguf", m[1].str(), m[3].str());
    sel.files = gguf_group(first, have, what);
    sel.open = sel.files.front();
    return sel;
  }
  if (models.size() > 1)
    fail("{}: the repository has several GGUF files; choose a quantization with ':QUANT' (one of: {})", what, choices());
  std::vector<std::string> listed(repo_files.begin(), repo_files.begin() + std::min<size_t>(repo_files.size(), 20));
  fail("{}: the repository holds neither a safetensors checkpoint (config.json + *.safetensors) nor a GGUF file "
       "(it has: {}{})",
       what, listed.empty() ? "no files" : join(listed, ", "), repo_files.size() > listed.size() ? ", ..." : "");
}

namespace {

// The safetensors shards an index names; each must be in the selection (offline: in the snapshot).
void check_index(const fs::path& snapshot, const std::vector<std::string>& files, const std::string& what) {
  if (std::find(files.begin(), files.end(), "model.safetensors.index.json") == files.end()) return;
  const std::set<std::string> have(files.begin(), files.end());
  try {
    const json index = json::parse(read_small_file(snapshot / "model.safetensors.index.json"));
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : index.at("weight_map").items()) shards.insert(shard.get<std::string>());
    for (const auto& s : shards)
      if (!have.count(s)) fail("{}: file {} is missing (model.safetensors.index.json names it)", what, s);
  } catch (const json::exception& e) {
    fail("{}: model.safetensors.index.json is not a safetensors index ({})", what, e.what());
  }
}

std::vector<std::string> snapshot_files(const fs::path& snapshot) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(snapshot, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec)) continue;
    if (usable(it->path())) out.push_back(it->path().lexically_relative(snapshot).generic_string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Resolved finish(const ModelRef& ref, const fs::path& repo, const std::string& commit, const Selection& sel) {
  Resolved r;
  r.ref = ref;
  r.commit = commit;
  r.snapshot = repo / "snapshots" / commit;
  r.files = sel.files;
  r.path = sel.open.empty() ? r.snapshot : r.snapshot / sel.open;
  for (const auto& f : sel.files) r.bytes += file_size_or_zero(r.snapshot / f);
  return r;
}

// HF_HUB_OFFLINE=1 (or the server unreachable): the snapshot the revision names, as huggingface_hub left it.
Resolved resolve_offline(const ModelRef& ref, const Settings& s) {
  const fs::path repo = repo_dir(s.cache_dir, ref.repo);
  const std::string what = ref.str();
  const std::string hint = fmt::format("run `specula pull {}` with network access first", ref.str());
  std::error_code ec;
  if (!fs::is_directory(repo, ec)) fail("{}: offline, and the cache {} holds no {} ({}); {}", what, s.cache_dir.string(), ref.repo, repo.filename().string(), hint);
  std::string commit;
  if (is_commit_hash(ref.revision) && fs::is_directory(repo / "snapshots" / ref.revision, ec)) {
    commit = ref.revision;
  } else {
    const fs::path ref_file = refs_file(repo, ref.revision);
    if (!fs::is_regular_file(ref_file, ec))
      fail("{}: offline, and the cache has no revision '{}' of {} (no {}); {}", what, ref.revision, ref.repo, ref_file.string(), hint);
    commit = trim(read_small_file(ref_file));
  }
  const fs::path snapshot = repo / "snapshots" / commit;
  if (!fs::is_directory(snapshot, ec))
    fail("{}: offline, and the cache lacks snapshot {} (refs/{} points at it); {}", what, snapshot.string(), ref.revision, hint);
  const auto files = snapshot_files(snapshot);
  // A file named explicitly must be there.
  if (ref.selector.find('.') != std::string::npos && !usable(snapshot / ref.selector))
    fail("{}: offline, and file {} is missing from the cached snapshot {}; {}", what, ref.selector, snapshot.string(), hint);
  Selection sel;
  try {
    sel = select_files(files, ref.selector, what + " (offline, cached snapshot " + commit.substr(0, 12) + ")");
    check_index(snapshot, sel.files, what + " (offline)");
  } catch (const Error& e) {
    fail("{}; {}", e.what(), hint);
  }
  return finish(ref, repo, commit, sel);
}

Resolved resolve_online(const ModelRef& ref, const Settings& s) {
  const RepoInfo info = fetch_repo_info(ref, s);
  std::vector<std::string> names;
  for (const auto& [name, f] : info.files) names.push_back(name);
  const Selection sel = select_files(names, ref.selector, ref.str());
  const fs::path repo = repo_dir(s.cache_dir, ref.repo);
  const fs::path snapshot = repo / "snapshots" / info.commit;

  // What the cache lacks. A blob huggingface_hub (or another revision) already fetched is linked, not fetched.
  std::vector<Job> jobs;
  uint64_t pending = 0;
  for (const auto& name : sel.files) {
    const RemoteFile& rf = info.files.at(name);
    if (usable(snapshot / name)) continue;
    const std::string known = !rf.sha256.empty() ? rf.sha256 : rf.blob_id;
    if (!known.empty() && usable(repo / "blobs" / known)) {
      link_snapshot_file(repo, info.commit, name, known);
      continue;
    }
    Job job{rf, file_metadata(ref, info.commit, name, s)};
    if (usable(repo / "blobs" / job.meta.etag)) {
      link_snapshot_file(repo, info.commit, name, job.meta.etag);
      continue;
    }
    pending += rf.size ? rf.size : job.meta.size;
    jobs.push_back(std::move(job));
  }

  uint64_t downloaded = 0;
  if (!jobs.empty()) {
    log_info("{}: downloading {} file{} ({}) into {}", ref.str(), jobs.size(), jobs.size() == 1 ? "" : "s",
             human_bytes(pending), repo.string());
    Progress progress(s.progress, ref.repo, pending, jobs.size());
    std::atomic<size_t> next{0};
    std::atomic<bool> abort{false};
    std::mutex mu;
    std::exception_ptr first_error;
    auto worker = [&] {
      for (size_t i = next++; i < jobs.size(); i = next++) {
        try {
          download_blob(ref, repo, jobs[i], s, progress, abort);
          link_snapshot_file(repo, info.commit, jobs[i].remote.name, jobs[i].meta.etag);
          progress.file_done();
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!first_error && !abort) first_error = std::current_exception();
          abort = true;
          return;
        }
      }
    };
    const size_t threads = std::min<size_t>(jobs.size(), static_cast<size_t>(std::max(1, s.parallel)));
    std::vector<std::thread> pool;
    for (size_t i = 1; i < threads; ++i) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    if (first_error) std::rethrow_exception(first_error);
    downloaded = pending;
  }
  if (ref.revision != info.commit) write_atomically(refs_file(repo, ref.revision), info.commit);
  Resolved r = finish(ref, repo, info.commit, sel);
  r.downloaded = downloaded;
  return r;
}

}  // namespace

Resolved resolve(const ModelRef& ref, const Settings& s) {
  if (s.offline) return resolve_offline(ref, s);
  try {
    return resolve_online(ref, s);
  } catch (const NetworkError& e) {
    // As huggingface_hub: without the network, a revision the cache holds is still served.
    try {
      Resolved r = resolve_offline(ref, s);
      log_warn("{}; using the cached snapshot {}", e.what(), r.commit);
      return r;
    } catch (const Error&) {
      throw Error(e.what());
    }
  }
}

std::vector<ModelRef> assistant_candidates(const ModelRef& target) {
  std::vector<ModelRef> out;
  const auto with = [&](std::string repo) {
    ModelRef r;
    r.repo = std::move(repo);
    r.selector = target.selector;
    out.push_back(r);
  };
  const std::string& repo = target.repo;
  if (ends_with(lower(repo), "-gguf")) with(repo.substr(0, repo.size() - 5) + "-assistant" + repo.substr(repo.size() - 5));
  with(repo + "-assistant");
  return out;
}

namespace {
// Whether a drafter candidate exists: on the server, or (offline, or the server unreachable) in the cache.
bool repo_exists(const ModelRef& ref, const Settings& s) {
  std::error_code ec;
  if (s.offline) return fs::is_directory(repo_dir(s.cache_dir, ref.repo), ec);
  try {
    fetch_repo_info(ref, s);
    return true;
  } catch (const NetworkError&) {
    return fs::is_directory(repo_dir(s.cache_dir, ref.repo), ec);
  } catch (const RepoNotFound&) {
    return false;
  }
}
}  // namespace

Resolved resolve_assistant(const ModelRef& target, const Settings& s) {
  std::vector<std::string> tried;
  for (ModelRef candidate : assistant_candidates(target)) {
    tried.push_back(candidate.repo);
    if (!repo_exists(candidate, s)) continue;
    try {
      return resolve(candidate, s);
    } catch (const Error& e) {
      // The target's quantization may not exist for the drafter: take the drafter repository's own choice.
      if (candidate.selector.empty() || std::string(e.what()).find("no GGUF file with quantization") == std::string::npos) throw;
      log_info("{}; trying the drafter repository without a quantization", e.what());
      candidate.selector.clear();
      return resolve(candidate, s);
    }
  }
  fail("drafter auto: no drafter repository for {} (tried {}); give the drafter's id or path with --drafter / "
       "drafter.model",
       target.str(), join(tried, ", "));
}

fs::path local_path(const fs::path& path_or_ref, const Settings& settings) {
  if (!is_ref(path_or_ref.string())) return path_or_ref;
  return resolve(parse_ref(path_or_ref.string()), settings).path;
}

fs::path local_path(const fs::path& path_or_ref) {
  if (!is_ref(path_or_ref.string())) return path_or_ref;
  return local_path(path_or_ref, Settings::from_env());
}

core::ModelLocator model_locator() {
  core::ModelLocator locate;
  locate.model = [](const fs::path& model) { return local_path(model); };
  locate.assistant = [](const fs::path& target) { return resolve_assistant(parse_ref(target.string())).path; };
  return locate;
}

std::vector<CachedRepo> list_cache(const fs::path& cache_dir) {
  std::vector<CachedRepo> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(cache_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("models--", 0) != 0 || !entry.is_directory(ec)) continue;
    CachedRepo c;
    c.dir = entry.path();
    c.repo = name.substr(8);
    for (size_t at = c.repo.find("--"); at != std::string::npos; at = c.repo.find("--", at + 1)) c.repo.replace(at, 2, "/");
    for (const auto& b : fs::directory_iterator(c.dir / "blobs", ec)) {
      if (!b.is_regular_file(ec)) continue;
      (ends_with(b.path().string(), ".incomplete") ? c.incomplete_bytes : c.bytes) += file_size_or_zero(b.path());
    }
    std::map<std::string, std::vector<std::string>> refs;  // commit -> revisions
    const fs::path refs_dir = c.dir / "refs";
    for (auto it = fs::recursive_directory_iterator(refs_dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      refs[trim(read_small_file(it->path()))].push_back(it->path().lexically_relative(refs_dir).generic_string());
    }
    for (const auto& snap : fs::directory_iterator(c.dir / "snapshots", ec)) {
      if (!snap.is_directory(ec)) continue;
      CachedRepo::Snapshot s;
      s.commit = snap.path().filename().string();
      s.refs = refs[s.commit];
      s.files = snapshot_files(snap.path()).size();
      c.snapshots.push_back(s);
    }
    std::sort(c.snapshots.begin(), c.snapshots.end(), [](const auto& a, const auto& b) { return a.commit < b.commit; });
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.repo < b.repo; });
  return out;
}

uint64_t remove_repo(const fs::path& cache_dir, const std::string& repo) {
  const ModelRef ref = parse_ref(repo, true);
  if (ref.explicit_revision || !ref.selector.empty())
    fail("specula rm removes a whole repository: give OWNER/REPO, not '{}'", repo);
  const fs::path dir = repo_dir(cache_dir, ref.repo);
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    fail("{} is not in the cache {} (`specula list` shows what it holds)", ref.repo, cache_dir.string());
  uint64_t bytes = 0;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) bytes += file_size_or_zero(it->path());
  fs::remove_all(dir);
  fs::remove_all(cache_dir / ".locks" / dir.filename(), ec);
  return bytes;
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

}  // namespace specula::core::hub

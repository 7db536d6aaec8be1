// The model hub (apps/hub, library specula_hub): a model named by its Hugging Face id instead of a path.
//
//   hf://OWNER/REPO[@REVISION][:FILE-or-QUANT]      (the syntax: specula/core/model_ref.hpp, in the core)
//
// resolves through the Hub's HTTP API (or a mirror: HF_ENDPOINT) into the standard Hugging Face cache,
// laid out exactly as huggingface_hub lays it out, so that files either tool fetched are reused by the
// other:
//
//   $HF_HUB_CACHE (else $HF_HOME/hub, else ~/.cache/huggingface/hub)
//     models--OWNER--REPO/blobs/<etag>                 the files, named by sha256 (LFS) or git blob id
//     models--OWNER--REPO/snapshots/<commit>/<file>    relative symlinks to ../../blobs/<etag>
//     models--OWNER--REPO/refs/<revision>              the commit the revision pointed at
//
// A download goes to blobs/<etag>.incomplete (resumed with an HTTP Range request after an interruption),
// is checked against the Hub's metadata (sha256 for LFS files, the git blob id otherwise) and only then
// renamed and linked into the snapshot: nothing half-written or unverified is ever opened.
//
// The core opens local paths only. The applications take these ids wherever they take a path (pipeline
// target.model and drafter.model, --model, --drafter, `specula inspect`, Model::open) by resolving them
// here first: `local_path` for one model, `model_locator()` for core::build_pipeline; `drafter.model:
// auto` pairs an hf:// target with its OWNER/REPO-assistant repository. The library links libcurl and
// OpenSSL's libcrypto; the namespace is still the one it had in the core. Every function throws
// specula::Error naming the id and the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "specula/core/model_ref.hpp"
#include "specula/core/pipeline.hpp"

namespace specula::core::hub {

// Where and how: from the environment as huggingface_hub reads it.
struct Settings {
  std::filesystem::path cache_dir;   // HF_HUB_CACHE, else HF_HOME/hub, else $HOME/.cache/huggingface/hub
  std::string endpoint = "https://huggingface.co";  // HF_ENDPOINT (no trailing slash)
  std::string token;                 // HF_TOKEN, else the file HF_TOKEN_PATH / HF_HOME/token
  bool offline = false;              // HF_HUB_OFFLINE=1: the cache only
  bool progress = false;             // a progress bar on stderr (when stderr is a terminal)
  int parallel = 4;                  // files downloaded at once
  long metadata_timeout_s = 10;      // HF_HUB_ETAG_TIMEOUT: API and HEAD requests, whole request
  long download_timeout_s = 10;      // HF_HUB_DOWNLOAD_TIMEOUT: connect, and the longest stall mid-file
  int attempts = 3;                  // tries per file; each one after the first resumes with a Range request

  static Settings from_env();
};

// What an id resolved to.
struct Resolved {
  ModelRef ref;
  std::string commit;                         // the snapshot
  std::filesystem::path snapshot;             // snapshots/<commit>
  std::filesystem::path path;                 // what to open: a GGUF file (its first shard) or the snapshot dir
  std::vector<std::string> files;             // repo-relative names used
  uint64_t bytes = 0;                         // their total size
  uint64_t downloaded = 0;                    // bytes fetched by this call (0: all were cached)
};

// Picks the files, downloads what the cache lacks (all at once, up to Settings::parallel), links the
// snapshot and writes refs/<revision>. Offline: the cache only, naming the first file it lacks.
Resolved resolve(const ModelRef& ref, const Settings& settings = Settings::from_env());

// `drafter.model: auto`: the drafter repositories tried for a target, in order (OWNER/REPO-assistant, and
// for OWNER/NAME-GGUF also OWNER/NAME-assistant-GGUF first), with the target's quantization.
std::vector<ModelRef> assistant_candidates(const ModelRef& target);
// The first candidate that exists (a missing repo moves on to the next; any other failure is reported).
Resolved resolve_assistant(const ModelRef& target, const Settings& settings = Settings::from_env());

// The local path of a model path or id: an id is resolved (downloading), anything else is returned as is.
// Without `settings`, the environment is read only for an id (a local path never depends on HF_*).
std::filesystem::path local_path(const std::filesystem::path& path_or_ref, const Settings& settings);
std::filesystem::path local_path(const std::filesystem::path& path_or_ref);
// What core::build_pipeline (core::open_target, core::open_drafter) calls to turn a pipeline's models into
// local paths: local_path for a path or an id, resolve_assistant for `drafter.model: auto`.
core::ModelLocator model_locator();

// The files a format needs, from a repository's file list (exposed for tests and `specula pull`):
// config.json, generation_config.json, tokenizer files, *.safetensors and their index; or the GGUF file
// (every shard of a split one) named by `selector` (a file name or a quantization, case-insensitive).
// `what` names the repository in messages. Throws listing what exists when nothing matches.
struct Selection {
  std::vector<std::string> files;
  std::string open;   // the file to open ("" = the snapshot directory)
};
Selection select_files(const std::vector<std::string>& repo_files, const std::string& selector, const std::string& what);

// The cache.
std::filesystem::path repo_dir(const std::filesystem::path& cache_dir, const std::string& repo);  // models--O--R
struct CachedRepo {
  std::string repo;                              // OWNER/REPO
  std::filesystem::path dir;
  uint64_t bytes = 0;                            // the blobs (complete ones)
  uint64_t incomplete_bytes = 0;                 // interrupted downloads (*.incomplete)
  struct Snapshot {
    std::string commit;
    std::vector<std::string> refs;               // revisions pointing at it (main, v1.0, ...)
    size_t files = 0;
  };
  std::vector<Snapshot> snapshots;
};
std::vector<CachedRepo> list_cache(const std::filesystem::path& cache_dir);
// Deletes models--OWNER--REPO; returns the bytes freed. Throws when the cache holds no such repository.
uint64_t remove_repo(const std::filesystem::path& cache_dir, const std::string& repo);

// 13.5 MB, 2.1 GB: sizes for people.
std::string human_bytes(uint64_t bytes);

}  // namespace specula::core::hub

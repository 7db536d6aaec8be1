// The model hub (core/hub.hpp, issue 14) against a Hub on 127.0.0.1 (hub_server.hpp): ids, file
// selection, the huggingface_hub cache layout, redirects, errors, gating, resume, verification,
// concurrency, offline mode, list/rm, and `specula run --model hf://...` end to end.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>

#include "hub_server.hpp"
#include "specula/api.hpp"
#include "specula/hub.hpp"
#include "specula/core/pipeline.hpp"
#include "specula/error.hpp"

namespace {

namespace fs = std::filesystem;
namespace hub = specula::core::hub;
using hub_test::HubServer;

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";
const std::string kCommit2 = "89abcdef0123456789abcdef0123456789abcdef";

std::string random_bytes(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// The message of the specula::Error `fn` throws ("" when it does not throw).
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const specula::Error& e) {
    return e.what();
  }
  return "";
}

class Hub : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / fmt::format("specula-hub-{}-{}", getpid(), info->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
    settings_.cache_dir = root_ / "hub";
    settings_.endpoint = server_.endpoint();
    settings_.token.clear();
    settings_.progress = false;
    settings_.metadata_timeout_s = 5;  // nothing can hang the suite
    settings_.download_timeout_s = 3;
    // A proxy from the environment (CI) must not stand between libcurl and 127.0.0.1.
    setenv("no_proxy", "127.0.0.1", 1);
    setenv("NO_PROXY", "127.0.0.1", 1);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A safetensors checkpoint: regular files and LFS weights, plus files the format does not need.
  void add_checkpoint(const std::string& id, const std::string& commit = kCommit) {
    server_.add(id, commit,
                {{"config.json", R"({"model_type": "gemma4"})"},
                 {"tokenizer.json", R"({"model": {}})"},
                 {"generation_config.json", R"({"do_sample": false})"},
                 {"model-00001-of-00002.safetensors", random_bytes(200000, 1)},
                 {"model-00002-of-00002.safetensors", random_bytes(100000, 2)},
                 {"model.safetensors.index.json",
                  R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})"},
                 {"README.md", "# a model card"},
                 {"original/consolidated.pth", "not needed"}},
                {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"});
  }
  fs::path repo_dir(const std::string& id) const { return hub::repo_dir(settings_.cache_dir, id); }

  HubServer server_;
  fs::path root_;
  hub::Settings settings_;
};

// ---------------------------------------------------------------------------------------------------

TEST(HubRef, ParsesEveryPart) {
  auto r = hub::parse_ref("hf://google/gemma-4-E2B-it");
  EXPECT_EQ(r.repo, "google/gemma-4-E2B-it");
  EXPECT_EQ(r.revision, "main");
  EXPECT_FALSE(r.explicit_revision);
  EXPECT_EQ(r.selector, "");
  r = hub::parse_ref("hf://ggml-org/gemma-4-E2B-it-GGUF@refs/pr/3:Q4_K_M");
  EXPECT_EQ(r.repo, "ggml-org/gemma-4-E2B-it-GGUF");
  EXPECT_EQ(r.revision, "refs/pr/3");
  EXPECT_TRUE(r.explicit_revision);
  EXPECT_EQ(r.selector, "Q4_K_M");
  EXPECT_EQ(r.str(), "hf://ggml-org/gemma-4-E2B-it-GGUF@refs/pr/3:Q4_K_M");
  r = hub::parse_ref("owner/repo:sub/dir/file.gguf", true);
  EXPECT_EQ(r.repo, "owner/repo");
  EXPECT_EQ(r.selector, "sub/dir/file.gguf");
  EXPECT_TRUE(hub::is_ref("hf://a/b"));
  EXPECT_FALSE(hub::is_ref("models/a.gguf"));
}

TEST(HubRef, RefusesMalformedIds) {
  for (const char* bad : {"hf://noslash", "hf://a/b/c", "hf:///b", "hf://a/", "hf://a--x/b", "hf://a/b@", "hf://a/b:",
                          "hf://a/b:../../etc/passwd", "hf://a/b@../x", "hf://a b/c", "hf://-a/b"}) {
    const std::string e = error_of([&] { hub::parse_ref(bad); });
    EXPECT_NE(e.find(bad), std::string::npos) << bad << ": " << e;  // names the id
    EXPECT_NE(e.find("hf://OWNER/REPO"), std::string::npos) << e;    // and the syntax
  }
  EXPECT_NE(error_of([] { hub::parse_ref("owner/repo"); }).find("not a model id"), std::string::npos);
}

TEST(HubSelect, PicksTheCheckpointFilesOfASafetensorsRepository) {
  const auto sel = hub::select_files({"README.md", "config.json", "model.safetensors", "tokenizer.json",
                                      "tokenizer_config.json", "original/params.safetensors", ".gitattributes"},
                                     "", "x");
  EXPECT_EQ(sel.open, "");  // the snapshot directory
  EXPECT_EQ(sel.files, (std::vector<std::string>{"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"}));
  EXPECT_NE(error_of([] { hub::select_files({"model.safetensors"}, "", "o/r"); }).find("no config.json"), std::string::npos);
}

TEST(HubSelect, PicksAGgufByQuantizationCaseInsensitively) {
  const std::vector<std::string> files = {"gemma-Q4_K.gguf", "gemma-Q4_K_M.gguf", "gemma-Q8_0.gguf",
                                          "mmproj-gemma-Q8_0.gguf", "README.md"};
  EXPECT_EQ(hub::select_files(files, "q4_k_m", "x").open, "gemma-Q4_K_M.gguf");
  EXPECT_EQ(hub::select_files(files, "Q4_K", "x").open, "gemma-Q4_K.gguf");  // not Q4_K_M
  EXPECT_EQ(hub::select_files(files, "Q8_0", "x").files, std::vector<std::string>{"gemma-Q8_0.gguf"});  // no mmproj
  EXPECT_EQ(hub::select_files(files, "mmproj-gemma-Q8_0.gguf", "x").open, "mmproj-gemma-Q8_0.gguf");  // a file by name
  const std::string missing = error_of([&] { hub::select_files(files, "IQ2_XS", "hf://o/r:IQ2_XS"); });
  EXPECT_NE(missing.find("hf://o/r:IQ2_XS"), std::string::npos) << missing;
  EXPECT_NE(missing.find("no GGUF file with quantization 'IQ2_XS'"), std::string::npos) << missing;
  EXPECT_NE(missing.find("Q4_K, Q4_K_M, Q8_0"), std::string::npos) << missing;  // what exists
  const std::string several = error_of([&] { hub::select_files(files, "", "o/r"); });
  EXPECT_NE(several.find("choose a quantization"), std::string::npos) << several;
  EXPECT_EQ(hub::select_files({"only-Q2_K.gguf"}, "", "x").open, "only-Q2_K.gguf");
}

TEST(HubSelect, TakesEveryShardOfASplitGguf) {
  const std::vector<std::string> files = {"Q4_K_M/big-Q4_K_M-00002-of-00003.gguf", "Q4_K_M/big-Q4_K_M-00001-of-00003.gguf",
                                          "Q4_K_M/big-Q4_K_M-00003-of-00003.gguf", "big-Q8_0.gguf"};
  const auto sel = hub::select_files(files, "Q4_K_M", "x");
  EXPECT_EQ(sel.open, "Q4_K_M/big-Q4_K_M-00001-of-00003.gguf");
  EXPECT_EQ(sel.files.size(), 3u);
  const std::string e = error_of([] {
    hub::select_files({"big-Q4_K_M-00001-of-00003.gguf", "big-Q4_K_M-00003-of-00003.gguf"}, "Q4_K_M", "hf://o/r");
  });
  EXPECT_NE(e.find("big-Q4_K_M-00002-of-00003.gguf"), std::string::npos) << e;  // names the missing shard
}

TEST(HubSelect, SaysWhatARepositoryWithoutAModelHolds) {
  const std::string e = error_of([] { hub::select_files({"README.md", "notes.txt"}, "", "hf://o/r"); });
  EXPECT_NE(e.find("README.md, notes.txt"), std::string::npos) << e;
}

// ---------------------------------------------------------------------------------------------------

TEST_F(Hub, DownloadsIntoTheHuggingFaceCacheLayout) {
  add_checkpoint("owner/ckpt");
  const hub::Resolved r = hub::resolve(hub::parse_ref("hf://owner/ckpt"), settings_);
  const fs::path repo = repo_dir("owner/ckpt");
  EXPECT_EQ(repo, settings_.cache_dir / "models--owner--ckpt");
  EXPECT_EQ(r.commit, kCommit);
  EXPECT_EQ(r.path, repo / "snapshots" / kCommit);  // a checkpoint opens as its directory
  EXPECT_EQ(r.files.size(), 6u);                    // not README.md, not original/
  EXPECT_EQ(read_file(repo / "refs" / "main"), kCommit);  // no newline, as huggingface_hub writes it

  const auto weights = random_bytes(200000, 1);
  const fs::path link = repo / "snapshots" / kCommit / "model-00001-of-00002.safetensors";
  ASSERT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(fs::read_symlink(link), fs::path("../../blobs") / hub_test::sha256(weights));  // LFS: named by sha256
  EXPECT_EQ(read_file(link), weights);
  const fs::path config = repo / "snapshots" / kCommit / "config.json";
  EXPECT_EQ(fs::read_symlink(config), fs::path("../../blobs") / hub_test::git_blob_id(R"({"model_type": "gemma4"})"));
  EXPECT_FALSE(fs::exists(repo / "snapshots" / kCommit / "README.md"));
  EXPECT_GT(r.downloaded, 300000u);
  // The LFS files came through the 302 to /lfs/, the regular ones from resolve/.
  EXPECT_EQ(server_.count("GET", "/lfs/"), 2u);
  EXPECT_EQ(server_.count("GET", "/owner/ckpt/resolve/" + kCommit + "/config.json"), 1u);
  for (const auto& blob : fs::directory_iterator(repo / "blobs"))
    EXPECT_EQ(blob.path().extension(), "") << blob.path();  // no .incomplete left

  // A second resolve only asks the API.
  server_.clear_log();
  const hub::Resolved again = hub::resolve(hub::parse_ref("hf://owner/ckpt"), settings_);
  EXPECT_EQ(again.downloaded, 0u);
  EXPECT_EQ(again.bytes, r.bytes);
  EXPECT_EQ(server_.requests().size(), 1u);
  EXPECT_EQ(server_.count("GET", "/api/models/owner/ckpt/revision/main"), 1u);
}

TEST_F(Hub, ReusesBlobsHuggingFaceHubDownloaded) {
  // huggingface_hub fetched the weights at another commit; the new commit changes only config.json.
  add_checkpoint("owner/ckpt", kCommit2);
  const auto weights1 = random_bytes(200000, 1), weights2 = random_bytes(100000, 2);
  const fs::path repo = repo_dir("owner/ckpt");
  write_file(repo / "blobs" / hub_test::sha256(weights1), weights1);
  write_file(repo / "blobs" / hub_test::sha256(weights2), weights2);
  const hub::Resolved r = hub::resolve(hub::parse_ref("hf://owner/ckpt"), settings_);
  EXPECT_EQ(server_.count("GET", "/lfs/"), 0u);  // linked, not fetched
  EXPECT_EQ(read_file(repo / "snapshots" / kCommit2 / "model-00002-of-00002.safetensors"), weights2);
  EXPECT_LT(r.downloaded, 1000u);
}

TEST_F(Hub, ResolvesAPinnedRevisionAndAGgufByQuantization) {
  server_.add("owner/gguf", kCommit, {{"m-Q8_0.gguf", "GGUF-q8"}, {"m-Q4_K_M.gguf", "GGUF-q4"}}, {"m-Q8_0.gguf", "m-Q4_K_M.gguf"})
      .refs["v1"] = kCommit;
  const hub::Resolved r = hub::resolve(hub::parse_ref("hf://owner/gguf@v1:q4_k_m"), settings_);
  EXPECT_EQ(r.path, repo_dir("owner/gguf") / "snapshots" / kCommit / "m-Q4_K_M.gguf");
  EXPECT_EQ(read_file(r.path), "GGUF-q4");
  EXPECT_EQ(read_file(repo_dir("owner/gguf") / "refs" / "v1"), kCommit);
  EXPECT_EQ(server_.count("GET", "/lfs/"), 1u);  // not the other quantization
  // A commit hash as the revision writes no ref.
  const hub::Resolved pinned = hub::resolve(hub::parse_ref("hf://owner/gguf@" + kCommit + ":Q4_K_M"), settings_);
  EXPECT_EQ(pinned.path, r.path);
  EXPECT_FALSE(fs::exists(repo_dir("owner/gguf") / "refs" / kCommit));
}

TEST_F(Hub, NamesWhatIsNotFound) {
  server_.add("owner/gguf", kCommit, {{"m-Q8_0.gguf", "GGUF"}}, {"m-Q8_0.gguf"});
  std::string e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/nothing"), settings_); });
  EXPECT_NE(e.find("repository owner/nothing not found"), std::string::npos) << e;
  e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/gguf@v9"), settings_); });
  EXPECT_NE(e.find("revision 'v9' not found in owner/gguf"), std::string::npos) << e;
  e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/gguf:Q2_K"), settings_); });
  EXPECT_NE(e.find("hf://owner/gguf:Q2_K"), std::string::npos) << e;
  EXPECT_NE(e.find("(the repository has: Q8_0)"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(repo_dir("owner/gguf") / "snapshots"));
}

TEST_F(Hub, GatedRepositoryNeedsTheToken) {
  server_.add("owner/gated", kCommit, {{"m-Q8_0.gguf", "GGUF-gated"}}, {"m-Q8_0.gguf"});
  server_.gate("owner/gated", "hf_secret");
  std::string e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/gated"), settings_); });
  EXPECT_NE(e.find("hf://owner/gated file m-Q8_0.gguf"), std::string::npos) << e;
  EXPECT_NE(e.find("HTTP 401"), std::string::npos) << e;
  EXPECT_NE(e.find("set HF_TOKEN"), std::string::npos) << e;
  settings_.token = "hf_other";
  e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/gated"), settings_); });
  EXPECT_NE(e.find("HTTP 403"), std::string::npos) << e;
  EXPECT_NE(e.find("the token in HF_TOKEN has no access to owner/gated"), std::string::npos) << e;
  settings_.token = "hf_secret";
  const hub::Resolved r = hub::resolve(hub::parse_ref("hf://owner/gated"), settings_);
  EXPECT_EQ(read_file(r.path), "GGUF-gated");
  for (const auto& req : server_.requests())
    if (req.path.rfind("/owner/gated/resolve/", 0) == 0 && req.authorization == "Bearer hf_secret") return;
  ADD_FAILURE() << "no request carried the token";
}

TEST_F(Hub, ResumesADroppedTransferWithARangeRequest) {
  const std::string weights = random_bytes(600000, 7);
  server_.add("owner/big", kCommit, {{"big-Q8_0.gguf", weights}}, {"big-Q8_0.gguf"});
  server_.drop_once(hub_test::sha256(weights));
  const hub::Resolved r = hub::resolve(hub::parse_ref("hf://owner/big"), settings_);
  EXPECT_EQ(read_file(r.path), weights);
  std::vector<std::string> ranges;
  for (const auto& req : server_.requests())
    if (req.path.rfind("/lfs/", 0) == 0) ranges.push_back(req.range);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0], "");
  EXPECT_EQ(ranges[1], "bytes=300000-");  // from where the first transfer stopped
}

TEST_F(Hub, ResumesTheIncompleteFileOfAnEarlierRun) {
  const std::string weights = random_bytes(400000, 8);
  const std::string sha = hub_test::sha256(weights);
  server_.add("owner/big", kCommit, {{"big-Q8_0.gguf", weights}}, {"big-Q8_0.gguf"});
  write_file(repo_dir("owner/big") / "blobs" / (sha + ".incomplete"), weights.substr(0, 123456));
  const hub::Resolved r = hub::resolve(hub::parse_ref("hf://owner/big"), settings_);
  EXPECT_EQ(read_file(r.path), weights);
  ASSERT_EQ(server_.count("GET", "/lfs/"), 1u);
  for (const auto& req : server_.requests())
    if (req.path.rfind("/lfs/", 0) == 0) {
      EXPECT_EQ(req.range, "bytes=123456-");
    }
  EXPECT_FALSE(fs::exists(repo_dir("owner/big") / "blobs" / (sha + ".incomplete")));
}

TEST_F(Hub, ACorruptedDownloadIsNeverUsed) {
  const std::string weights = random_bytes(300000, 9);
  const std::string sha = hub_test::sha256(weights);
  server_.add("owner/bad", kCommit, {{"bad-Q8_0.gguf", weights}}, {"bad-Q8_0.gguf"});
  server_.corrupt(sha);
  const std::string e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/bad"), settings_); });
  EXPECT_NE(e.find("hf://owner/bad file bad-Q8_0.gguf: checksum mismatch"), std::string::npos) << e;
  EXPECT_NE(e.find(sha), std::string::npos) << e;
  const fs::path repo = repo_dir("owner/bad");
  EXPECT_FALSE(fs::exists(repo / "snapshots" / kCommit / "bad-Q8_0.gguf"));
  EXPECT_FALSE(fs::exists(repo / "blobs" / sha));
  EXPECT_FALSE(fs::exists(repo / "blobs" / (sha + ".incomplete")));
  // Offline, the failed file is missing rather than half there.
  settings_.offline = true;
  EXPECT_NE(error_of([&] { hub::resolve(hub::parse_ref("hf://owner/bad"), settings_); }).find("offline"), std::string::npos);
}

TEST_F(Hub, DownloadsShardsConcurrently) {
  std::map<std::string, std::string> files;
  std::set<std::string> lfs;
  for (int i = 1; i <= 3; ++i) {
    const std::string name = fmt::format("split-Q4_K_M-{:05}-of-00003.gguf", i);
    files[name] = random_bytes(50000, 20 + i);
    lfs.insert(name);
  }
  server_.add("owner/split", kCommit, files, lfs);
  server_.expect_concurrency(3);
  settings_.progress = true;  // draws the bar (on stderr) while three transfers run
  const hub::Resolved r = hub::resolve(hub::parse_ref("hf://owner/split:Q4_K_M"), settings_);
  EXPECT_EQ(r.path.filename(), "split-Q4_K_M-00001-of-00003.gguf");
  EXPECT_EQ(r.files.size(), 3u);
  for (const auto& [name, content] : files) EXPECT_EQ(read_file(r.snapshot / name), content);
  EXPECT_EQ(server_.max_parallel(), 3);
}

// A cache written the way huggingface_hub writes it, read with HF_HUB_OFFLINE=1: no request at all.
TEST_F(Hub, OfflineUsesACacheLaidOutByHuggingFaceHub) {
  const fs::path repo = repo_dir("owner/cached");
  const std::string a = "GGUF shard 1", b = "GGUF shard 2";
  write_file(repo / "blobs" / hub_test::sha256(a), a);
  write_file(repo / "blobs" / hub_test::sha256(b), b);
  write_file(repo / "refs" / "main", kCommit);
  fs::create_directories(repo / "snapshots" / kCommit / "Q8_0");
  fs::create_symlink(fs::path("../../../blobs") / hub_test::sha256(a), repo / "snapshots" / kCommit / "Q8_0/m-Q8_0-00001-of-00002.gguf");
  fs::create_symlink(fs::path("../../../blobs") / hub_test::sha256(b), repo / "snapshots" / kCommit / "Q8_0/m-Q8_0-00002-of-00002.gguf");
  settings_.offline = true;
  const hub::Resolved r = hub::resolve(hub::parse_ref("hf://owner/cached"), settings_);
  EXPECT_EQ(r.path, repo / "snapshots" / kCommit / "Q8_0/m-Q8_0-00001-of-00002.gguf");
  EXPECT_EQ(read_file(r.path), a);
  EXPECT_EQ(r.files.size(), 2u);
  EXPECT_TRUE(server_.requests().empty());

  // What is missing, exactly.
  fs::remove(repo / "blobs" / hub_test::sha256(b));  // a dangling link counts as missing
  std::string e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/cached"), settings_); });
  EXPECT_NE(e.find("m-Q8_0-00002-of-00002.gguf"), std::string::npos) << e;
  EXPECT_NE(e.find("specula pull hf://owner/cached"), std::string::npos) << e;
  e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/cached@v2"), settings_); });
  EXPECT_NE(e.find("no revision 'v2' of owner/cached"), std::string::npos) << e;
  e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/other"), settings_); });
  EXPECT_NE(e.find("holds no owner/other (models--owner--other)"), std::string::npos) << e;
  e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/cached:Q8_0/m-Q8_0-00003-of-00003.gguf"), settings_); });
  EXPECT_NE(e.find("file Q8_0/m-Q8_0-00003-of-00003.gguf is missing"), std::string::npos) << e;
  EXPECT_TRUE(server_.requests().empty());
}

TEST_F(Hub, OfflineNamesTheMissingShardOfACheckpoint) {
  add_checkpoint("owner/ckpt");
  hub::resolve(hub::parse_ref("hf://owner/ckpt"), settings_);
  fs::remove(repo_dir("owner/ckpt") / "snapshots" / kCommit / "model-00002-of-00002.safetensors");
  settings_.offline = true;
  const std::string e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/ckpt"), settings_); });
  EXPECT_NE(e.find("file model-00002-of-00002.safetensors is missing"), std::string::npos) << e;
}

TEST_F(Hub, AnUnreachableServerFallsBackToTheCache) {
  settings_.endpoint = "http://127.0.0.1:1";  // nothing listens on port 1
  std::string e = error_of([&] { hub::resolve(hub::parse_ref("hf://owner/gguf"), settings_); });
  EXPECT_NE(e.find("hf://owner/gguf: cannot reach http://127.0.0.1:1/api/models/owner/gguf"), std::string::npos) << e;
  EXPECT_NE(e.find("HF_HUB_OFFLINE=1"), std::string::npos) << e;
  const fs::path repo = repo_dir("owner/gguf");
  write_file(repo / "blobs" / "abc", "GGUF");
  write_file(repo / "refs" / "main", kCommit);
  fs::create_directories(repo / "snapshots" / kCommit);
  fs::create_symlink("../../blobs/abc", repo / "snapshots" / kCommit / "m-Q8_0.gguf");
  EXPECT_EQ(read_file(hub::resolve(hub::parse_ref("hf://owner/gguf"), settings_).path), "GGUF");
}

TEST_F(Hub, ListsAndRemovesCachedRepositories) {
  add_checkpoint("owner/ckpt");
  server_.add("other/gguf", kCommit2, {{"m-Q8_0.gguf", std::string(1000, 'g')}}, {"m-Q8_0.gguf"});
  hub::resolve(hub::parse_ref("hf://owner/ckpt"), settings_);
  hub::resolve(hub::parse_ref("hf://other/gguf"), settings_);
  write_file(repo_dir("other/gguf") / "blobs" / "f00.incomplete", std::string(10, 'x'));
  auto repos = hub::list_cache(settings_.cache_dir);
  ASSERT_EQ(repos.size(), 2u);
  EXPECT_EQ(repos[0].repo, "other/gguf");
  EXPECT_EQ(repos[0].bytes, 1000u);
  EXPECT_EQ(repos[0].incomplete_bytes, 10u);
  ASSERT_EQ(repos[0].snapshots.size(), 1u);
  EXPECT_EQ(repos[0].snapshots[0].commit, kCommit2);
  EXPECT_EQ(repos[0].snapshots[0].refs, std::vector<std::string>{"main"});
  EXPECT_EQ(repos[1].repo, "owner/ckpt");
  EXPECT_EQ(repos[1].snapshots[0].files, 6u);
  EXPECT_GT(repos[1].bytes, 300000u);

  EXPECT_EQ(hub::remove_repo(settings_.cache_dir, "hf://other/gguf"), 1000u + 10u + kCommit2.size());  // + refs/main
  EXPECT_FALSE(fs::exists(repo_dir("other/gguf")));
  repos = hub::list_cache(settings_.cache_dir);
  ASSERT_EQ(repos.size(), 1u);
  EXPECT_NE(error_of([&] { hub::remove_repo(settings_.cache_dir, "other/gguf"); }).find("other/gguf is not in the cache"),
            std::string::npos);
}

TEST_F(Hub, AssistantCandidatesFollowTheRepositoryName) {
  auto c = hub::assistant_candidates(hub::parse_ref("hf://google/gemma-4-E2B-it"));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].repo, "google/gemma-4-E2B-it-assistant");
  c = hub::assistant_candidates(hub::parse_ref("hf://ggml-org/gemma-4-E2B-it-GGUF:Q8_0"));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].repo, "ggml-org/gemma-4-E2B-it-assistant-GGUF");
  EXPECT_EQ(c[0].selector, "Q8_0");
  EXPECT_EQ(c[1].repo, "ggml-org/gemma-4-E2B-it-GGUF-assistant");
  // The drafter repository's own choice when the target's quantization is not there.
  server_.add("o/m-GGUF-assistant", kCommit, {{"a-F16.gguf", "drafter"}}, {"a-F16.gguf"});
  const hub::Resolved r = hub::resolve_assistant(hub::parse_ref("hf://o/m-GGUF:Q8_0"), settings_);
  EXPECT_EQ(r.path.filename(), "a-F16.gguf");
  const std::string e = error_of([&] { hub::resolve_assistant(hub::parse_ref("hf://o/none"), settings_); });
  EXPECT_NE(e.find("tried o/none-assistant"), std::string::npos) << e;
}

// The environment, read as huggingface_hub reads it.
TEST_F(Hub, SettingsComeFromTheEnvironment) {
  const std::vector<std::string> names = {"HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ENDPOINT", "HF_TOKEN",
                                          "HF_TOKEN_PATH", "HF_HUB_OFFLINE", "HF_HUB_DOWNLOAD_TIMEOUT", "XDG_CACHE_HOME"};
  std::map<std::string, std::optional<std::string>> saved;
  for (const auto& n : names) {
    const char* v = std::getenv(n.c_str());
    saved[n] = v ? std::optional<std::string>(v) : std::nullopt;
    unsetenv(n.c_str());
  }
  setenv("HF_HOME", (root_ / "home").c_str(), 1);
  write_file(root_ / "home" / "token", "hf_from_file\n");
  setenv("HF_ENDPOINT", "http://mirror.example/", 1);
  setenv("HF_HUB_OFFLINE", "true", 1);
  setenv("HF_HUB_DOWNLOAD_TIMEOUT", "2.5", 1);
  hub::Settings s = hub::Settings::from_env();
  EXPECT_EQ(s.cache_dir, root_ / "home" / "hub");
  EXPECT_EQ(s.endpoint, "http://mirror.example");
  EXPECT_EQ(s.token, "hf_from_file");  // what `hf auth login` wrote
  EXPECT_TRUE(s.offline);
  EXPECT_EQ(s.download_timeout_s, 3);
  setenv("HF_HUB_CACHE", (root_ / "cache").c_str(), 1);
  setenv("HF_TOKEN", "hf_env", 1);
  setenv("HF_HUB_OFFLINE", "0", 1);
  s = hub::Settings::from_env();
  EXPECT_EQ(s.cache_dir, root_ / "cache");
  EXPECT_EQ(s.token, "hf_env");
  EXPECT_FALSE(s.offline);
  setenv("HF_HUB_DOWNLOAD_TIMEOUT", "soon", 1);
  EXPECT_NE(error_of([] { hub::Settings::from_env(); }).find("HF_HUB_DOWNLOAD_TIMEOUT=soon"), std::string::npos);
  for (const auto& [n, v] : saved) {
    if (v) setenv(n.c_str(), v->c_str(), 1);
    else unsetenv(n.c_str());
  }
}

// ---------------------------------------------------------------------------------------------------
// The pipeline keeps ids as written (resolved when opened), and checks them while parsing.

TEST(HubPipeline, AcceptsIdsWhereAModelPathGoes) {
  const auto p = specula::core::parse_pipeline(
      "backend: {plugin: cpu}\ntarget: {model: 'hf://o/m-GGUF:Q8_0'}\ndrafter: {model: auto}\n", "p.yaml", "/base");
  EXPECT_EQ(p.target.model.string(), "hf://o/m-GGUF:Q8_0");
  EXPECT_EQ(p.drafter->model.string(), "auto");
  std::string e = error_of([] {
    specula::core::parse_pipeline("backend: {plugin: cpu}\ntarget: {model: 'hf://o'}\n", "p.yaml", "/base");
  });
  EXPECT_NE(e.find("p.yaml:2:17: key 'target.model': model id 'hf://o'"), std::string::npos) << e;
  e = error_of([] {
    specula::core::parse_pipeline("backend: {plugin: cpu}\ntarget: {model: m.gguf}\ndrafter: {model: auto}\n", "p.yaml", "/base");
  });
  EXPECT_NE(e.find("p.yaml:3:18: drafter.model auto pairs an hf:// target"), std::string::npos) << e;
  const auto cli = specula::core::default_pipeline({{"target.model", "hf://o/m", "command line (--model)"},
                                                     {"drafter.model", "hf://o/m-assistant@v1", "command line (--drafter)"}});
  EXPECT_EQ(cli.drafter->model.string(), "hf://o/m-assistant@v1");
}

// ---------------------------------------------------------------------------------------------------
// End to end: the CLI runs the tiny KJV model (models/, 13.5 MB) and its drafter from the test Hub.

struct Cli {
  int status = -1;
  std::string output;
};

// The JSON object a command printed (its last line starting with '{'; logs go to the same pipe).
nlohmann::json last_json(const std::string& output) {
  const size_t at = output.rfind("\n{");
  return nlohmann::json::parse(at == std::string::npos ? output.substr(output.find('{')) : output.substr(at + 1));
}

Cli run_cli(const std::string& env, const std::string& args) {
  const std::string cmd = "SPECULA_PLUGIN_PATH= HF_TOKEN= no_proxy=127.0.0.1 NO_PROXY=127.0.0.1 HF_HUB_DISABLE_PROGRESS_BARS=1 HF_HUB_ETAG_TIMEOUT=10 "
                          "HF_HUB_DOWNLOAD_TIMEOUT=10 " + env + " '" + SPECULA_CLI + "' " + args + " 2>&1";
  Cli r;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  for (size_t n; (n = fread(buf.data(), 1, buf.size(), pipe)) > 0;) r.output.append(buf.data(), n);
  const int rc = pclose(pipe);
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return r;
}

TEST_F(Hub, RunsAModelAndItsDrafterByIdThenOffline) {
  const std::string models = std::string(SPECULA_SOURCE_DIR) + "/models/";
  server_.add("specula/tiny-kjv-GGUF", kCommit,
              {{"specula-tiny-kjv-Q8_0.gguf", read_file(models + "specula-tiny-kjv-q8_0.gguf")}, {"README.md", "card"}},
              {"specula-tiny-kjv-Q8_0.gguf"});
  server_.add("specula/tiny-kjv-assistant-GGUF", kCommit2,
              {{"specula-tiny-kjv-assistant-Q8_0.gguf", read_file(models + "specula-tiny-kjv-assistant-q8_0.gguf")}},
              {"specula-tiny-kjv-assistant-Q8_0.gguf"});
  const std::string env = fmt::format("HF_HOME='{}' HF_ENDPOINT={}", root_.string(), server_.endpoint());
  const std::string run = "run --model hf://specula/tiny-kjv-GGUF:q8_0 --drafter auto -p 'And God said' -n 8 --json";
  Cli c = run_cli(env, run);
  ASSERT_EQ(c.status, 0) << c.output;
  const auto j = last_json(c.output);
  EXPECT_FALSE(j["text"].get<std::string>().empty()) << c.output;
  EXPECT_GT(j["stats"]["drafted_tokens"].get<int64_t>(), 0) << c.output;  // the drafter was paired and ran
  const fs::path cache = root_ / "hub";  // HF_HOME/hub
  EXPECT_TRUE(fs::is_symlink(hub::repo_dir(cache, "specula/tiny-kjv-GGUF") / "snapshots" / kCommit / "specula-tiny-kjv-Q8_0.gguf"));
  EXPECT_TRUE(fs::exists(hub::repo_dir(cache, "specula/tiny-kjv-assistant-GGUF") / "refs" / "main"));

  // Offline: the same command from the cache, without one request.
  server_.clear_log();
  c = run_cli(env + " HF_HUB_OFFLINE=1", run);
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_TRUE(server_.requests().empty());
  c = run_cli(env + " HF_HUB_OFFLINE=1", "run --model hf://specula/missing -p x -n 1");
  EXPECT_EQ(c.status, 1);
  EXPECT_NE(c.output.find("hf://specula/missing: offline, and the cache"), std::string::npos) << c.output;

  // pull (cached: nothing to fetch), list, rm.
  c = run_cli(env, "pull specula/tiny-kjv-GGUF:Q8_0 --json");
  ASSERT_EQ(c.status, 0) << c.output;
  const auto pulled = last_json(c.output);
  EXPECT_EQ(pulled["commit"], kCommit);
  EXPECT_EQ(pulled["downloaded"], 0);
  c = run_cli(env, "list");
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output.find("specula/tiny-kjv-GGUF"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find("13.5 MB"), std::string::npos) << c.output;
  EXPECT_NE(c.output.find(kCommit.substr(0, 12)), std::string::npos) << c.output;
  c = run_cli(env, "rm specula/tiny-kjv-GGUF specula/tiny-kjv-assistant-GGUF");
  ASSERT_EQ(c.status, 0) << c.output;
  EXPECT_NE(c.output.find("removed specula/tiny-kjv-GGUF (13.5 MB)"), std::string::npos) << c.output;
  EXPECT_TRUE(hub::list_cache(cache).empty());
}

// What the issue asks for: `HF_HUB_OFFLINE=1 specula run --model hf://OWNER/REPO` on a cache huggingface_hub wrote.
TEST_F(Hub, RunsOfflineFromACacheWrittenByHuggingFaceHub) {
  const fs::path repo = hub::repo_dir(root_ / "hub", "google/tiny-kjv");
  const std::string model = read_file(std::string(SPECULA_SOURCE_DIR) + "/models/specula-tiny-kjv-q8_0.gguf");
  const std::string sha = hub_test::sha256(model);
  write_file(repo / "blobs" / sha, model);
  write_file(repo / "refs" / "main", kCommit);
  fs::create_directories(repo / "snapshots" / kCommit);
  fs::create_symlink(fs::path("../../blobs") / sha, repo / "snapshots" / kCommit / "tiny-kjv-Q8_0.gguf");
  const Cli c = run_cli(fmt::format("HF_HOME='{}' HF_HUB_OFFLINE=1 HF_ENDPOINT=http://127.0.0.1:1", root_.string()),
                        "run --model hf://google/tiny-kjv -p 'In the beginning' -n 4 --json");
  ASSERT_EQ(c.status, 0) << c.output;
  const auto tokens = last_json(c.output)["tokens"];
  EXPECT_GE(tokens.size(), 1u) << c.output;  // generated (at most 4; an end-of-turn may come first)
  EXPECT_LE(tokens.size(), 4u) << c.output;
}

// The application API (apps/api) takes an id where it takes a path; the environment says where the Hub is.
TEST_F(Hub, TheApplicationApiOpensAnId) {
  server_.add("specula/tiny-kjv-GGUF", kCommit,
              {{"specula-tiny-kjv-Q8_0.gguf", read_file(std::string(SPECULA_SOURCE_DIR) + "/models/specula-tiny-kjv-q8_0.gguf")}},
              {"specula-tiny-kjv-Q8_0.gguf"});
  setenv("HF_HUB_CACHE", settings_.cache_dir.c_str(), 1);
  setenv("HF_ENDPOINT", server_.endpoint().c_str(), 1);
  unsetenv("HF_HUB_OFFLINE");
  std::shared_ptr<specula::api::Model> model;
  try {
    specula::api::OpenOptions options;
    options.plugin_paths = {SPECULA_PLUGIN_DIR};
    model = specula::api::Model::open("hf://specula/tiny-kjv-GGUF", options);
  } catch (const specula::Error& e) {
    FAIL() << e.what();
  }
  unsetenv("HF_HUB_CACHE");
  unsetenv("HF_ENDPOINT");
  EXPECT_EQ(model->pipeline().target.model.string(), "hf://specula/tiny-kjv-GGUF");
  EXPECT_GT(model->info().vocab_size, 0);
  EXPECT_EQ(server_.count("GET", "/lfs/"), 1u);
}

}  // namespace

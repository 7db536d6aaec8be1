// The plugin host: discovery order and shadowing, refusal of mis-built libraries with messages naming
// the file and both versions, factories, pinning.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/expect_contains.hpp"
#include "specula/core/plugin_host.hpp"
#include "specula/error.hpp"
#include "test_util.hpp"

using specula::core::PluginHost;

namespace {


const specula::core::Rejection* rejection_for(const PluginHost& host, const std::string& file_name) {
  for (const auto& r : host.rejected()) {
    if (r.file.filename() == file_name) return &r;
  }
  return nullptr;
}

TEST(PluginHost, FirstDirectoryInTheOrderWinsAndTheShadowedCopyIsReported) {
  PluginHost host;
  host.discover({test::plugin_dir("first"), test::plugin_dir("second")});
  const auto* dup = host.find("dup");
  ASSERT_NE(dup, nullptr);
  EXPECT_EQ(dup->version, "1.0.0");
  EXPECT_EQ(dup->file.parent_path().filename(), "first");
  EXPECT_EQ(dup->kinds, std::vector<std::string>{"sampler"});
  ASSERT_EQ(host.rejected().size(), 1u);
  const auto& r = host.rejected()[0];
  EXPECT_EQ(r.file.parent_path().filename(), "second");
  EXPECT_CONTAINS(r.reason, "shadowed");
  EXPECT_CONTAINS(r.reason, "2.0.0");
  EXPECT_CONTAINS(r.reason, dup->file.string());

  PluginHost reversed;
  reversed.discover({test::plugin_dir("second"), test::plugin_dir("first")});
  EXPECT_EQ(reversed.find("dup")->version, "2.0.0");
}

TEST(PluginHost, SearchPathOrderIsFlagsThenEnvironmentThenBuildAndInstallDirs) {
  setenv("SPECULA_PLUGIN_PATH", "/env/a:/env/b", 1);
  auto dirs = specula::core::plugin_search_path({"/yaml/x"});
  unsetenv("SPECULA_PLUGIN_PATH");
  ASSERT_EQ(dirs.size(), 5u);
  EXPECT_EQ(dirs[0], "/yaml/x");
  EXPECT_EQ(dirs[1], "/env/a");
  EXPECT_EQ(dirs[2], "/env/b");
  EXPECT_EQ(dirs[3], SPECULA_PLUGIN_DIR);
  EXPECT_NE(dirs[4].string().find("specula/plugins"), std::string::npos);

  // The environment is searched before the build directory: a plugin found there shadows later ones.
  setenv("SPECULA_PLUGIN_PATH", test::plugin_dir("second").c_str(), 1);
  PluginHost host;
  host.discover(specula::core::plugin_search_path({test::plugin_dir("first")}));
  unsetenv("SPECULA_PLUGIN_PATH");
  EXPECT_EQ(host.find("dup")->version, "1.0.0");
  ASSERT_NE(rejection_for(host, "libspecula-dup.so"), nullptr);
}

TEST(PluginHost, RefusesAWrongAbiVersionNamingTheFileAndBothVersions) {
  PluginHost host;
  // The plugin's attach and factories abort: the host must refuse before calling either.
  EXPECT_FALSE(host.add_library(test::plugin_dir("bad") + "/libspecula-wrongabi.so"));
  ASSERT_EQ(host.rejected().size(), 1u);
  const std::string& reason = host.rejected()[0].reason;
  EXPECT_CONTAINS(reason, test::plugin_dir("bad") + "/libspecula-wrongabi.so");
  EXPECT_CONTAINS(reason, "plugin ABI version 999");
  EXPECT_CONTAINS(reason, "uses plugin ABI version " + std::to_string(SPECULA_PLUGIN_ABI_VERSION));
  EXPECT_TRUE(host.plugins().empty());
}

TEST(PluginHost, RefusesAForeignFingerprintNamingTheFileAndBothFingerprints) {
  PluginHost host;
  EXPECT_FALSE(host.add_library(test::plugin_dir("bad") + "/libspecula-wrongfp.so"));
  ASSERT_EQ(host.rejected().size(), 1u);
  const std::string& reason = host.rejected()[0].reason;
  EXPECT_CONTAINS(reason, "libspecula-wrongfp.so");
  EXPECT_CONTAINS(reason, "'msvc-19/msvcprt-143/c++201703L'");
  EXPECT_CONTAINS(reason, std::string("'") + SPECULA_ABI_FINGERPRINT + "'");
}

TEST(PluginHost, RefusesALibraryWithoutTheEntrySymbol) {
  PluginHost host;
  EXPECT_FALSE(host.add_library(test::plugin_dir("bad") + "/libspecula-noentry.so"));
  ASSERT_EQ(host.rejected().size(), 1u);
  EXPECT_CONTAINS(host.rejected()[0].reason, test::plugin_dir("bad") + "/libspecula-noentry.so");
  EXPECT_CONTAINS(host.rejected()[0].reason, "does not export the entry symbol 'specula_plugin_entry'");
}

TEST(PluginHost, RefusesACorruptLibrary) {
  test::TempDir dir;
  auto bad = test::write_file(dir / "libspecula-bad.so", std::string(200, '#') + "\nthis is a text file, not an ELF shared object\n");
  test::write_file(dir / "libspecula-empty.so", "");
  PluginHost host;
  host.discover({dir.path()});
  EXPECT_TRUE(host.plugins().empty());
  ASSERT_EQ(host.rejected().size(), 2u);
  const auto* r = rejection_for(host, "libspecula-bad.so");
  ASSERT_NE(r, nullptr);
  EXPECT_CONTAINS(r->reason, bad.string());
  EXPECT_CONTAINS(r->reason, "cannot be loaded as a shared library");
  EXPECT_CONTAINS(r->reason, "invalid ELF header");  // the loader's own reason is kept
  EXPECT_CONTAINS(rejection_for(host, "libspecula-empty.so")->reason, "file too short");
}

TEST(PluginHost, RefusesALibraryThatNeedsAMissingSymbol) {
  PluginHost host;
  EXPECT_FALSE(host.add_library(test::plugin_dir("undef") + "/libspecula-undef.so"));
  ASSERT_EQ(host.rejected().size(), 1u);
  EXPECT_CONTAINS(host.rejected()[0].reason, test::plugin_dir("undef") + "/libspecula-undef.so");
  EXPECT_CONTAINS(host.rejected()[0].reason, "undefined symbol: specula_test_function_that_does_not_exist");
}

TEST(PluginHost, ScanningADirectoryOfBadLibrariesRejectsEachWithItsReason) {
  PluginHost host;
  host.discover({test::plugin_dir("bad"), "/nonexistent/specula/plugins"});
  EXPECT_TRUE(host.plugins().empty());
  EXPECT_EQ(host.rejected().size(), 3u);
}

TEST(PluginHost, MakesObjectsOfEveryKindAndExplainsUnknownNames) {
  PluginHost host;
  host.discover({test::plugin_dir("toy"), test::plugin_dir("first")});
  ASSERT_NE(host.find("toy"), nullptr);
  EXPECT_EQ(host.of_kind("sampler").size(), 2u);
  EXPECT_NE(host.make_backend("toy"), nullptr);
  EXPECT_NE(host.make_format("toy"), nullptr);
  EXPECT_NE(host.make_model_loader("toy"), nullptr);
  EXPECT_NE(host.make_drafter_loader("toy"), nullptr);
  specula::SamplingParams sp;
  auto sampler = host.make_sampler("dup", sp);
  std::vector<float> logits = {0.1f, 3.0f, -1.0f};
  EXPECT_EQ(sampler->sample(logits, {}, 0.5f), 1);

  try {
    host.make_backend("cpuu");
    FAIL();
  } catch (const specula::Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "no backend plugin named 'cpuu'");
    EXPECT_CONTAINS(std::string(e.what()), "found: toy");
  }
  try {
    host.make_backend("dup");
    FAIL();
  } catch (const specula::Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "'dup'");
    EXPECT_CONTAINS(std::string(e.what()), "is not a backend plugin (it provides: sampler)");
  }
}

TEST(PluginHost, ObjectsOutliveTheHostThatMadeThem) {
  std::shared_ptr<specula::Sampler> sampler;
  {
    PluginHost host;
    host.discover({test::plugin_dir("first")});
    sampler = host.make_sampler("dup", {});
  }
  std::vector<float> logits = {0.1f, -3.0f, 2.0f};
  EXPECT_EQ(sampler->sample(logits, {}, 0.5f), 2);
  sampler.reset();
}

TEST(PluginHost, OpensModelsWithTheFormatThatAcceptsThem) {
  test::TempDir dir;
  auto file = test::write_file(dir / "m.toy", R"({"architecture": "toy", "vocab": 32})");
  auto other = test::write_file(dir / "m.bin", "junk");
  PluginHost host;
  host.discover({test::plugin_dir("toy")});
  auto f = host.open_model(file);
  EXPECT_EQ(f->format(), "toy");
  EXPECT_EQ(f->metadata().at("vocab"), 32);
  auto loader = host.find_model_loader(*f);
  EXPECT_EQ(loader->architecture(), "toy");
  auto model = loader->load(f, nullptr, {});
  EXPECT_EQ(model->info().vocab_size, 32);
  try {
    host.open_model(other);
    FAIL();
  } catch (const specula::Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "no format plugin can open " + other.string());
    // Each format plugin's own reason (what its open() says), not just its name.
    EXPECT_CONTAINS(std::string(e.what()), "(toy: " + other.string() + ": not a toy checkpoint");
  }
  EXPECT_THROW(host.open_model(dir / "missing.toy"), specula::Error);
  try {
    host.find_drafter_loader(*f);
    FAIL();
  } catch (const specula::Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "no drafter plugin accepts");
    EXPECT_CONTAINS(std::string(e.what()), "architecture: 'toy'");
  }
}

}  // namespace

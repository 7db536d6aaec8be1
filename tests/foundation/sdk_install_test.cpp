// The SDK as a plugin author uses it: `cmake --install` the sdk component into a temporary prefix,
// build sdk/template out of tree with find_package(Specula), then load the result with the CLI, from
// --plugin-path and from a pipeline YAML.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/expect_contains.hpp"
#include "test_util.hpp"
#include "toy.hpp"

namespace {


TEST(Sdk, TemplatePluginBuildsOutOfTreeAgainstTheInstalledSdkAndLoads) {
  test::TempDir dir;
  const auto prefix = dir / "prefix";
  const auto build = dir / "build";
  const std::string cmake = test::quote(SPECULA_CMAKE_COMMAND);

  auto r = test::run_command(cmake + " --install " + test::quote(SPECULA_BINARY_DIR) + " --prefix " +
                             test::quote(prefix.string()) + " --component sdk");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(prefix / "include/specula/plugin.hpp"));
  EXPECT_TRUE(std::filesystem::exists(prefix / "share/specula/template/CMakeLists.txt"));

  std::string flags;
  if (SPECULA_TEST_SANITIZE) {
    // The installed SDK of a sanitizer build is instrumented; the plugin must be too.
    flags = " -DCMAKE_CXX_FLAGS='-fsanitize=address,undefined' -DCMAKE_MODULE_LINKER_FLAGS='-fsanitize=address,undefined'";
  }
  // Build the installed copy of the template: exactly what a plugin author starts from.
  r = test::run_command(cmake + " -S " + test::quote((prefix / "share/specula/template").string()) + " -B " +
                        test::quote(build.string()) + " -DCMAKE_PREFIX_PATH=" + test::quote(prefix.string()) +
                        " -DCMAKE_CXX_COMPILER=" + test::quote(SPECULA_CXX_COMPILER) + flags);
  ASSERT_EQ(r.status, 0) << r.output;
  r = test::run_command(cmake + " --build " + test::quote(build.string()));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto so = build / "libspecula-template-greedy.so";
  ASSERT_TRUE(std::filesystem::exists(so)) << r.output;

  // The only dynamic export is the entry symbol.
  r = test::run_command("nm -D --defined-only " + test::quote(so.string()), false);
  ASSERT_EQ(r.status, 0);
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(" T ") == std::string::npos && line.find(" W ") == std::string::npos) continue;
    if (line.find("_init") != std::string::npos || line.find("_fini") != std::string::npos) continue;
    EXPECT_CONTAINS(line, "specula_plugin_entry");
  }

  r = test::run_command(test::cli() + " plugins --json --plugin-path " + test::quote(build.string()), false);
  ASSERT_EQ(r.status, 0) << r.output;
  auto j = nlohmann::json::parse(r.output);
  bool found = false;
  for (const auto& p : j["plugins"]) {
    if (p["name"] == "template-greedy") {
      found = true;
      EXPECT_EQ(p["kinds"], nlohmann::json::parse(R"(["sampler"])"));
      EXPECT_EQ(p["file"], std::filesystem::canonical(so).string());
    }
  }
  EXPECT_TRUE(found) << r.output;

  // From a pipeline: the template sampler drives a toy target; greedy output is the reference.
  test::write_file(dir / "t.toy", R"({"architecture": "toy", "vocab": 64, "end_tokens": []})");
  auto yaml = test::write_file(dir / "p.yaml", "plugin_paths: [build, " + test::plugin_dir("toy") + R"(]
backend: {plugin: toy}
target: {model: t.toy}
sampler: {plugin: template-greedy, max_tokens: 10}
)");
  r = test::run_command(test::cli() + " run " + test::quote(yaml.string()) + " --tokens 4,5,6 --json", false);
  ASSERT_EQ(r.status, 0) << r.output;
  toy::Config c;
  std::vector<int32_t> prefix_ids = {4, 5, 6}, expect;
  for (int i = 0; i < 10; ++i) {
    expect.push_back(toy::argmax(toy::logits_after(prefix_ids, 64, c.seed, c.sharpness)));
    prefix_ids.push_back(expect.back());
  }
  EXPECT_EQ(nlohmann::json::parse(r.output)["tokens"].get<std::vector<int32_t>>(), expect);

  // The host checks the template's declared options: a typo is refused with its line and the closest name.
  auto typo = test::write_file(dir / "typo.yaml", "plugin_paths: [build, " + test::plugin_dir("toy") + R"(]
backend: {plugin: toy}
target: {model: t.toy}
sampler: {plugin: template-greedy, options: {warn_on_temprature: false}}
)");
  r = test::run_command(test::cli() + " run " + test::quote(typo.string()) + " --tokens 4,5,6");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.output.find("typo.yaml:4:46: unknown option 'warn_on_temprature' of sampler plugin 'template-greedy'; did "
                          "you mean 'warn_on_temperature'?"), std::string::npos) << r.output;
}

}  // namespace

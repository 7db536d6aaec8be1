// apps/example as an application developer builds it: `cmake --install` the sdk and api components into
// a temporary prefix, build the installed copy of the example out of tree with find_package(Specula),
// run it on the default pipeline and compare its answer with `specula run`.
#include <gtest/gtest.h>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "../foundation/test_util.hpp"

namespace {

TEST(ApiExample, BuildsOutOfTreeAgainstTheInstalledPackageAndAnswersAsSpeculaRun) {
  test::TempDir dir;
  const auto prefix = dir / "prefix";
  const auto build = dir / "build";
  const std::string cmake = test::quote(SPECULA_CMAKE_COMMAND);
  for (const char* component : {"sdk", "api"}) {
    auto r = test::run_command(cmake + " --install " + test::quote(SPECULA_BINARY_DIR) + " --prefix " +
                               test::quote(prefix.string()) + " --component " + component);
    ASSERT_EQ(r.status, 0) << r.output;
  }
  EXPECT_TRUE(std::filesystem::exists(prefix / "include/specula/api.hpp"));
  EXPECT_TRUE(std::filesystem::exists(prefix / "include/specula/core/generator.hpp"));
  ASSERT_TRUE(std::filesystem::exists(prefix / "share/specula/example/main.cpp"));

  std::string flags;
  if (SPECULA_TEST_SANITIZE) {  // the installed libraries of a sanitizer build are instrumented
    flags = " -DCMAKE_CXX_FLAGS='-fsanitize=address,undefined' -DCMAKE_EXE_LINKER_FLAGS='-fsanitize=address,undefined'";
  }
  auto r = test::run_command(cmake + " -S " + test::quote((prefix / "share/specula/example").string()) + " -B " +
                             test::quote(build.string()) + " -DCMAKE_PREFIX_PATH=" + test::quote(prefix.string()) +
                             " -DCMAKE_CXX_COMPILER=" + test::quote(SPECULA_CXX_COMPILER) + flags);
  ASSERT_EQ(r.status, 0) << r.output;
  r = test::run_command(cmake + " --build " + test::quote(build.string()));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto exe = build / "specula-example";
  ASSERT_TRUE(std::filesystem::exists(exe)) << r.output;

  const std::string pipeline = test::quote(std::string(SPECULA_SOURCE_DIR) + "/configs/default.yaml");
  r = test::run_command(test::quote(exe.string()) + " " + pipeline + " 'And God said' 12", false);
  ASSERT_EQ(r.status, 0) << r.output;
  auto run = test::run_command(test::cli() + " run " + pipeline + " -p 'And God said' -n 12 --json", false);
  ASSERT_EQ(run.status, 0) << run.output;
  const std::string expected = nlohmann::json::parse(run.output)["text"].get<std::string>();
  EXPECT_FALSE(expected.empty());
  EXPECT_EQ(r.output, expected + "\n");
}

}  // namespace

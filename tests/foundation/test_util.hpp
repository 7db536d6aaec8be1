// Small helpers of the foundation tests: temporary directories, files, running the CLI.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace test {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "specula-test-XXXXXX").string();
    if (!mkdtemp(pattern.data())) std::abort();
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

inline fs::path write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
  return p;
}

inline std::string plugin_dir(const std::string& name) { return std::string(TEST_PLUGIN_ROOT) + "/" + name; }

struct CommandResult {
  int status = -1;
  std::string output;  // stdout, then stderr when `merge_stderr`
};

// Runs a shell command and captures its output.
inline CommandResult run_command(const std::string& command, bool merge_stderr = true) {
  CommandResult r;
  std::string full = command + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  int rc = pclose(pipe);
  r.status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return r;
}

inline std::string quote(const std::string& s) { return "'" + s + "'"; }

// Shell text that waits (up to 10 s) until process $pid catches SIGINT (bit 2 of SigCgt in
// /proc/PID/status), so a Ctrl+C test does not race the program's start, even under sanitizers.
inline std::string wait_for_sigint_handler() {
  return "for i in $(seq 200); do m=$(awk '/SigCgt/ {print $2}' /proc/$pid/status 2>/dev/null); "
         "[ -n \"$m\" ] && [ $((0x$m & 2)) -ne 0 ] && break; sleep 0.05; done; ";
}

inline std::string cli() { return quote(SPECULA_CLI); }

}  // namespace test

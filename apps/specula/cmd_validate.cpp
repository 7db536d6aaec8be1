// `specula validate`: checks a pipeline without running it: plugins found and ABI-compatible, model
// files open and are accepted by a model plugin, the backend supports what the weights need.
#include <set>

#include <fmt/format.h>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/error.hpp"

namespace {

namespace cli = specula::cli;
using specula::core::PluginHost;

struct Report {
  int failures = 0;
  void ok(const std::string& what) { fmt::print("  ok    {}\n", what); }
  void bad(const std::string& what) {
    fmt::print("  FAIL  {}\n", what);
    ++failures;
  }
  // Runs one check; a specula::Error becomes a failure line.
  template <typename F>
  bool check(const std::string& what, F&& fn) {
    try {
      std::string detail = fn();
      ok(detail.empty() ? what : what + ": " + detail);
      return true;
    } catch (const std::exception& e) {
      bad(what + ": " + e.what());
      return false;
    }
  }
};

// MatMul and GetRows on every storage type of the file's weights (matrices and up).
void check_weights(Report& report, const std::string& label, const specula::ModelFile& file,
                   const specula::ComputeBackend& backend) {
  std::set<specula::DType> types;
  for (const auto& t : file.tensors()) {
    if (t.shape.size() >= 2) types.insert(t.type);
  }
  if (types.empty()) {
    report.ok(fmt::format("{}: no weight matrices to check", label));
    return;
  }
  for (auto type : types) {
    for (auto op : {specula::Op::MatMul, specula::Op::GetRows}) {
      auto s = backend.supports(op, type);
      std::string what = fmt::format("{}: backend '{}' runs {} on {} weights", label, backend.name(),
                                     op == specula::Op::MatMul ? "MatMul" : "GetRows", specula::dtype_name(type));
      if (s.ok) {
        report.ok(what);
      } else {
        report.bad(what + ": " + s.reason);
      }
    }
  }
}

int run_validate(const std::vector<std::string>& args) {
  cli::ModelArgs model;
  cli::po::options_description desc(
      "usage: specula validate PIPELINE.yaml [options]\n\n"
      "Checks everything a pipeline needs without running it: plugins found and ABI-compatible, model\n"
      "files open and accepted by a model plugin, the backend supports the weights' storage types.\n"
      "Exits 0 when every check passes, 1 otherwise.\n\noptions");
  desc.add_options()("help,h", "show this help");
  cli::add_model_options(desc, model);
  cli::add_log_options(desc);
  cli::po::positional_options_description pos;
  pos.add("pipeline", 1);
  cli::po::variables_map vm;
  if (!cli::parse_args(args, desc, pos, vm)) return 0;

  Report report;
  specula::core::Pipeline p;
  fmt::print("pipeline {}\n", model.pipeline.empty() ? std::string("(command line)") : model.pipeline);
  if (!report.check("pipeline parses", [&] {
        p = cli::resolve_pipeline(model);
        return std::string();
      })) {
    return 1;
  }
  auto host = cli::make_host(p, model.plugin_paths);
  fmt::print("plugins: {} found, {} rejected\n", host->plugins().size(), host->rejected().size());
  for (const auto& r : host->rejected()) fmt::print("  note  rejected {}\n", r.reason);

  auto require_plugin = [&](const std::string& section, const std::string& name, const std::string& kind) {
    return report.check(fmt::format("{}: {} plugin '{}'", section, kind, name), [&] {
      const auto* info = host->find(name);
      if (!info) specula::fail("not found (run `specula plugins` to see the search path and rejections)");
      if (!info->has_kind(kind)) specula::fail("'{}' is not a {} plugin", name, kind);
      return fmt::format("{} {}", info->version, info->file.string());
    });
  };

  std::shared_ptr<specula::ComputeBackend> backend;
  if (require_plugin("backend", p.backend.plugin, "backend")) {
    report.check("backend: created", [&] {
      backend = host->make_backend(p.backend.plugin, p.backend.options);
      return backend->device().name;
    });
  }
  std::shared_ptr<const specula::ModelFile> target_file;
  if (report.check("target: " + p.target.model.string() + " opens", [&] {
        target_file = host->open_model(p.target.model, p.target.format);
        return fmt::format("{}, {} tensors", target_file->format(), target_file->tensors().size());
      })) {
    report.check("target: a model plugin accepts it", [&] {
      auto loader = p.target.plugin.empty() ? host->find_model_loader(*target_file, p.target.options)
                                            : host->make_model_loader(p.target.plugin, p.target.options);
      if (!loader->accepts(*target_file)) {
        specula::fail("model plugin '{}' does not accept it (its architecture: '{}')", p.target.plugin,
                      specula::core::declared_architecture(*target_file));
      }
      return loader->architecture();
    });
    if (backend) check_weights(report, "target", *target_file, *backend);
  }
  if (p.drafter) {
    std::shared_ptr<const specula::ModelFile> drafter_file;
    if (report.check("drafter: " + p.drafter->model.string() + " opens", [&] {
          drafter_file = host->open_model(p.drafter->model, p.drafter->format);
          return fmt::format("{}, {} tensors", drafter_file->format(), drafter_file->tensors().size());
        })) {
      report.check("drafter: a drafter plugin accepts it", [&] {
        auto loader = p.drafter->plugin.empty() ? host->find_drafter_loader(*drafter_file, p.drafter->options)
                                                : host->make_drafter_loader(p.drafter->plugin, p.drafter->options);
        if (!loader->accepts(*drafter_file)) specula::fail("drafter plugin '{}' does not accept it", p.drafter->plugin);
        return loader->architecture();
      });
      if (backend) check_weights(report, "drafter", *drafter_file, *backend);
    }
  }
  if (require_plugin("sampler", p.sampler.plugin, "sampler")) {
    report.check("sampler: created", [&] {
      host->make_sampler(p.sampler.plugin, p.sampler.params, p.sampler.options);
      return std::string();
    });
  }
  if (report.failures) {
    fmt::print("{} check(s) failed\n", report.failures);
    return 1;
  }
  fmt::print("pipeline is valid\n");
  return 0;
}

}  // namespace

SPECULA_COMMAND("validate", "check a pipeline (plugins, model files, backend support) without running it", run_validate);

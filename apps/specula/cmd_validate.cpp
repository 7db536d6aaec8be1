// `specula validate`: the checks `specula run` makes before generating (core::build_pipeline's steps),
// one line each, without loading weights; plus the backend's support for the weights' storage types.
#include <set>

#include <fmt/format.h>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/error.hpp"
#include "specula/hub.hpp"

namespace {

namespace cli = specula::cli;

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
  bool no_drafter = false;
  cli::po::options_description desc(
      "usage: specula validate PIPELINE.yaml [options]\n"
      "       specula validate MODEL.gguf|MODEL_DIR [options]\n\n"
      "Makes every check `specula run` and `specula chat` make before generating, without loading the\n"
      "weights: the pipeline and the flags (the same flags as run), the plugins and their options, the\n"
      "model files, the model's configuration and context length, the KV cache dtype and the weights'\n"
      "storage types against the backend, the drafter against the target, the sampler.\n"
      "Exits 0 when every check passes, 1 otherwise.\n\noptions");
  desc.add_options()("help,h", "show this help")(
      "system,s", cli::po::value<std::string>(), "system message (as run and chat take it)")(
      "no-drafter", cli::po::bool_switch(&no_drafter), "skip the drafter (as run --no-drafter)");
  cli::po::variables_map vm;
  if (!cli::parse_model_command(args, desc, model, vm)) return 0;

  namespace core = specula::core;
  Report report;
  core::Pipeline p;
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
  auto plugin_file = [&](const std::string& name) {
    const auto* info = host->find(name);
    return info ? fmt::format("{} {}", info->version, info->file.string()) : std::string();
  };

  // The steps of core::build_pipeline, one line each, with the messages `run` gives.
  std::shared_ptr<specula::ComputeBackend> backend;
  report.check(fmt::format("backend: plugin '{}'", p.backend.plugin), [&] {
    backend = core::make_backend(p, *host);
    return backend->device().name;
  });
  // The LM head and attention a section names (the standard ones need no check).
  auto check_parts = [&](const char* section, const std::string& lm_head, const std::string& attention) {
    if (!lm_head.empty())
      report.check(fmt::format("{}: lm_head plugin '{}'", section, lm_head), [&] {
        host->make_lm_head(lm_head);
        return plugin_file(lm_head);
      });
    if (!attention.empty())
      report.check(fmt::format("{}: attention plugin '{}'", section, attention), [&] {
        host->make_attention(attention);
        return plugin_file(attention);
      });
  };
  std::shared_ptr<const specula::ModelFile> target_file;
  std::shared_ptr<specula::ModelLoader> target_loader;
  specula::ModelInfo target_info;
  bool target_checked = false;
  if (report.check("target: " + p.target.model.string() + " opens", [&] {
        target_file = core::open_target(p, *host, core::hub::model_locator());
        return fmt::format("{}, {} tensors", target_file->format(), target_file->tensors().size());
      })) {
    if (report.check("target: a model plugin accepts it, with its options", [&] {
          target_loader = core::target_loader(p, *host, *target_file);
          return target_loader->architecture();
        }) && backend) {
      target_checked = report.check("target: options, configuration and context length", [&] {
        target_info = core::check_target(p, *target_loader, *target_file, *backend);
        const int64_t ctx = p.target.context_length > 0 ? p.target.context_length : target_info.context_length;
        return ctx > 0 ? fmt::format("context {} tokens", ctx) : std::string();
      });
    }
    if (backend) check_weights(report, "target", *target_file, *backend);
  }
  check_parts("target", p.target.lm_head, p.target.attention);
  if (p.drafter && !no_drafter) {
    std::shared_ptr<const specula::ModelFile> drafter_file;
    if (report.check("drafter: " + p.drafter->model.string() + " opens", [&] {
          drafter_file = core::open_drafter(p, *host, core::hub::model_locator());
          return fmt::format("{}, {} tensors", drafter_file->format(), drafter_file->tensors().size());
        })) {
      std::shared_ptr<specula::DrafterLoader> loader;
      if (report.check("drafter: a drafter plugin accepts it, with its options", [&] {
            loader = core::drafter_loader(p, *host, *drafter_file);
            return loader->architecture();
          }) && backend && target_checked) {
        report.check("drafter: options and pairing with the target", [&] {
          core::check_drafter(p, *loader, *drafter_file, *backend, target_info);
          return std::string();
        });
      }
      if (backend) check_weights(report, "drafter", *drafter_file, *backend);
    }
    check_parts("drafter", p.drafter->lm_head, p.drafter->attention);
  }
  report.check(fmt::format("sampler: plugin '{}'", p.sampler.plugin), [&] {
    core::make_sampler(p, *host);
    return plugin_file(p.sampler.plugin);
  });
  if (report.failures) {
    fmt::print("{} check(s) failed\n", report.failures);
    return 1;
  }
  fmt::print("pipeline is valid\n");
  return 0;
}

}  // namespace

SPECULA_COMMAND("validate", "make every check `run` makes (plugins, options, files, pairing, context) without loading weights", run_validate);

// A small sampler plugin whose identity is set by compile definitions, built several times by
// tests/foundation/CMakeLists.txt: two same-named copies in two directories (discovery order), and
// copies with a wrong ABI version or fingerprint (refusal). PROBE_BAD_DESCRIPTOR builds a descriptor by
// hand whose attach/factories abort, proving the host refuses before touching them.
#include <cstdlib>

#include "specula/plugin.hpp"
#include "toy.hpp"

namespace {
std::unique_ptr<specula::Sampler> make_sampler(const specula::SamplingParams& p, const nlohmann::json&) {
  return std::make_unique<toy::Sampler>(p);
}
const specula::PluginFactories* factories() {
  static specula::PluginFactories f = [] {
    specula::PluginFactories x;
    x.sampler = &make_sampler;
    return x;
  }();
  return &f;
}
}  // namespace

#ifndef PROBE_BAD_DESCRIPTOR
SPECULA_PLUGIN(PROBE_NAME, "sampler", PROBE_VERSION, "foundation test plugin", factories)
#else
namespace {
void attach_must_not_run(const specula::HostServices*) { std::abort(); }
const specula::PluginFactories* factories_must_not_run() { std::abort(); }
}  // namespace
extern "C" __attribute__((visibility("default"))) const SpeculaPluginDescriptor* specula_plugin_entry() {
  static const SpeculaPluginDescriptor d{PROBE_ABI, PROBE_FINGERPRINT, PROBE_NAME, "sampler", PROBE_VERSION,
                                         "mis-built foundation test plugin", &attach_must_not_run,
                                         &factories_must_not_run};
  (void)&factories;
  return &d;
}
#endif

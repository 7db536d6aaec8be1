// A plugin linked without --no-undefined that needs a function nobody defines: dlopen (RTLD_NOW) fails
// with "undefined symbol", which the host must report as a rejection, not a crash.
#include "specula/plugin.hpp"

extern "C" int specula_test_function_that_does_not_exist(int);

namespace {
const specula::PluginFactories* factories() {
  static specula::PluginFactories f;
  static int keep = specula_test_function_that_does_not_exist(1);
  (void)keep;
  return &f;
}
}  // namespace

SPECULA_PLUGIN("undefined", "sampler", "1.0.0", "needs a missing symbol", factories)

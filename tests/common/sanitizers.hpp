// The sanitizer build's test run is the longest part of CI. Long numerical parity runs whose time goes
// into a driver rather than Specula's code (the Vulkan suites on lavapipe), and whose code paths shorter
// tests exercise under ASan and UBSan anyway, run in the plain build only.
#pragma once

#include <gtest/gtest.h>

#define SKIP_UNDER_SANITIZERS()                                                                            \
  if (SPECULA_TEST_SANITIZE)                                                                               \
  GTEST_SKIP() << "a long parity run: the plain build runs it, shorter tests cover its code under the sanitizers"

// The sanitizer build's test run is the longest part of CI. Long numerical parity runs whose time goes
// into a driver rather than Specula's code (the Vulkan suites on lavapipe) or into repeating a code path
// that another test already runs under ASan and UBSan (the converter's value-equality checks, each of
// which parses a 262,144-token tokenizer.json several times), run in the plain build only.
#pragma once

#include <gtest/gtest.h>

#define SKIP_UNDER_SANITIZERS()                                                                            \
  if (SPECULA_TEST_SANITIZE)                                                                               \
  GTEST_SKIP() << "a long parity run: the plain build runs it, shorter tests cover its code under the sanitizers"

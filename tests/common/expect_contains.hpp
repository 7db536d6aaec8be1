// EXPECT_CONTAINS(text, part): `part` occurs in `text`; a failure shows what was missing and the text.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace specula::test {
inline std::string missing_from(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos ? std::string() : "'" + part + "' not found in: " + text;
}
}  // namespace specula::test

#define EXPECT_CONTAINS(text, part) EXPECT_EQ(::specula::test::missing_from(text, part), "")

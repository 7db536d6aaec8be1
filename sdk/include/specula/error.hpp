// The one exception type Specula throws for bad input and failed operations. Messages are for people:
// what failed, where (file, key, value) and what was expected or what to do.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace specula {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace specula

// The limits `specula serve` holds every connection to (docs/serving.md, "Security and limits").
#pragma once

#include <chrono>
#include <cstddef>

namespace specula::serve {

struct HttpLimits {
  size_t max_header_bytes = 16 << 10;              // request line and fields (431 beyond)
  size_t max_body_bytes = 4 << 20;                 // Content-Length, or the chunks as they arrive (413 beyond)
  std::chrono::milliseconds read_timeout{30000};   // a request's header and body, from its first byte (408)
  std::chrono::milliseconds idle_timeout{60000};   // a kept-alive connection between requests (closed)
  std::chrono::milliseconds write_timeout{30000};  // each write to a client that does not read (closed)
  int max_connections = 1024;                      // open at once; beyond it the oldest idle one is closed
};

}  // namespace specula::serve

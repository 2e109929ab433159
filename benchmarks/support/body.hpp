#pragma once

// The JSON body every amp benchmark sends (the peer benchmarks send 128-byte bodies too):
// 128 bytes, with a time inside (ns since the benchmark's origin) so that a task's result or
// a message carries it back for a latency. Padded to the size whatever the time's digits.

#include <cstddef>
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace amp::bench {

constexpr std::size_t k_body_bytes = 128;

inline std::string body_at(std::int64_t t0) {
  auto head = fmt::format(R"({{"t0":{},"image":"s3://bench/images/0000000000.png","w":640,"h":480,)"
                          R"("pad":")",
                          t0);
  auto pad = head.size() + 2 < k_body_bytes ? k_body_bytes - head.size() - 2 : 0;
  return head + std::string(pad, 'x') + "\"}";
}

}  // namespace amp::bench

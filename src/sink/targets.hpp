#pragma once

// The built-in targets (make_target in target.cpp builds them) and what they share.

#include <memory>
#include <string>

#include "amp/sink/target.hpp"

namespace amp::sink::detail {

std::unique_ptr<target> make_file_target(const target_config& config);
std::unique_ptr<target> make_sqlite_target(const target_config& config);
std::unique_ptr<target> make_postgres_target(const target_config& config);

/// Now, as `committed_at` is written: RFC 3339, milliseconds, UTC (the system clock).
std::string committed_now();

/// `unavailable` with `message`: the target cannot be used now.
inline unexpected away(std::string message) {
  return unexpected(errc::unavailable, std::move(message));
}

}  // namespace amp::sink::detail

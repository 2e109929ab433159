#pragma once

// Configuration rules that every transport enforces alike.

#include <fmt/format.h>

#include "amp/subjects.hpp"
#include "amp/transport/transport.hpp"

namespace amp::detail {

// JetStream refuses a stream whose own subjects overlap (one message, two filters).
inline result<void> check_own_overlap(const stream_config& c) {
  for (std::size_t i = 0; i < c.subjects.size(); ++i) {
    for (std::size_t j = i + 1; j < c.subjects.size(); ++j) {
      if (subjects::filters_overlap(c.subjects[i], c.subjects[j])) {
        return unexpected(errc::bad_request,
                          fmt::format("stream \"{}\": subjects \"{}\" and \"{}\" overlap", c.name,
                                      c.subjects[i], c.subjects[j]));
      }
    }
  }
  return {};
}

}  // namespace amp::detail

#pragma once

// What a sink makes of one consumed message: a row for its targets, nothing (a message
// that is not the sink's to write, acknowledged without a row), or the reason it can never
// be written (dead-lettered after its tries). Pure functions; thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "amp/names.hpp"
#include "amp/sink/config.hpp"
#include "amp/sink/target.hpp"
#include "amp/transport/transport.hpp"

namespace amp::sink::detail {

/// What the sink reads and how it keys it: the parts of `sink_config` that map messages.
struct source_rules {
  namespace_name ns;
  source_kind kind = source_kind::topics;
  std::vector<topic_pattern> patterns;  ///< with topics
  key_strategy strategy = key_strategy::stream_sequence;
  std::string field;  ///< JSON Pointer, with payload_field

  /// From a configuration that passed `check_sink_config`.
  static source_rules of(const sink_config& c);
};

struct mapped {
  enum class kind { row, pass_over, unwritable };
  kind what = kind::pass_over;
  amp::sink::row r{};
  std::string reason{};  ///< with unwritable
};

/// The row of `m`, consumed from the source's stream.
mapped map_message(const source_rules& rules, const message& m);

/// The stream and the consumer filter of the source: one pattern is the filter; several
/// share the narrowest filter that covers them all.
std::string source_stream(const source_rules& rules);
std::string source_filter(const source_rules& rules);

}  // namespace amp::sink::detail

#pragma once

/// \file
/// Timestamps on the wire: RFC 3339, UTC, with milliseconds (spec §1).

#include <array>
#include <string>
#include <string_view>

#include "amp/clock.hpp"
#include "amp/result.hpp"

namespace amp {

/// `t` as `2026-11-30T12:00:00.123Z`: UTC, always three fractional digits, truncated
/// (rounded down, also before 1970) to the millisecond. Thread-safe.
std::string format_timestamp(time_point t);

/// The 24 characters of `format_timestamp(t)`, held in place rather than in a string.
struct timestamp_chars {
  std::array<char, 24> chars{};
  std::string_view view() const noexcept { return {chars.data(), chars.size()}; }
};

/// `format_timestamp(t)` without allocating, for writers that copy the text at once
/// (`json_writer::string(format_timestamp_chars(t).view())`). Thread-safe.
timestamp_chars format_timestamp_chars(time_point t);

/// Parses an RFC 3339 date-time: `YYYY-MM-DDTHH:MM:SS`, an optional `.` followed by 1 to 9
/// fractional digits, then `Z` or an offset `+hh:mm` / `-hh:mm` (the result is UTC).
/// `t` and `z` are accepted in lower case, as RFC 3339 allows. Leap seconds (`:60`) are
/// not accepted: `time_point` cannot represent them. Digits beyond the clock's resolution
/// are truncated.
/// Errors: `bad_request` naming what is wrong and where, e.g. "invalid timestamp: day 30
/// is out of range for 2028-02 (01..29)" or "invalid timestamp: expected 'T' at
/// position 10"; also for an instant outside what `time_point` can hold (about the years
/// 1678 to 2261). Thread-safe; no locale is involved.
result<time_point> parse_timestamp(std::string_view text);

}  // namespace amp

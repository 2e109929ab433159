#include "amp/timestamp.hpp"

#include <chrono>
#include <cstdint>
#include <optional>

namespace amp {
namespace {

using std::chrono::days;
using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::nanoseconds;
using std::chrono::seconds;

// Writes `value` as exactly `width` decimal digits at `p`.
char* put_digits(char* p, unsigned value, int width) {
  for (int i = width - 1; i >= 0; --i) {
    p[i] = static_cast<char>('0' + value % 10);
    value /= 10;
  }
  return p + width;
}

std::string two_digits(unsigned value) {
  std::string s(2, '0');
  put_digits(s.data(), value, 2);
  return s;
}

unexpected invalid(std::string what) {
  return unexpected(errc::bad_request, "invalid timestamp: " + std::move(what));
}

// Reads an RFC 3339 date-time left to right; the first problem found is the answer.
class reader {
 public:
  explicit reader(std::string_view text) : text_(text) {}

  std::size_t position() const { return pos_; }
  bool at_end() const { return pos_ == text_.size(); }
  char peek() const { return at_end() ? '\0' : text_[pos_]; }

  std::string where() const {
    return "at position " + std::to_string(pos_) + (at_end() ? " (end of text)" : "");
  }

  // Exactly `width` digits naming `what`; on failure the position is the field's start.
  std::optional<unsigned> digits(int width, std::string_view what, std::string& problem) {
    const auto n = static_cast<std::size_t>(width);
    unsigned value = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const char c = pos_ + i < text_.size() ? text_[pos_ + i] : '\0';
      if (!is_digit(c)) {
        problem =
            "expected a " + std::to_string(width) + "-digit " + std::string(what) + " " + where();
        return std::nullopt;
      }
      value = value * 10 + static_cast<unsigned>(c - '0');
    }
    pos_ += n;
    return value;
  }

  // The next character is one of `accepted`; the first of them names it in the message.
  bool expect(std::string_view accepted, std::string& problem) {
    if (!at_end() && accepted.find(peek()) != std::string_view::npos) {
      ++pos_;
      return true;
    }
    problem = "expected '" + std::string(1, accepted.front()) + "' " + where();
    return false;
  }

  void skip() { ++pos_; }

  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

timestamp_chars format_timestamp_chars(time_point t) {
  const auto ms = std::chrono::floor<milliseconds>(t);
  const auto day = std::chrono::floor<days>(ms);
  const std::chrono::year_month_day ymd{day};
  const std::chrono::hh_mm_ss hms{ms - day};

  timestamp_chars out;  // YYYY-MM-DDTHH:MM:SS.mmmZ
  char* p = out.chars.data();
  p = put_digits(p, static_cast<unsigned>(static_cast<int>(ymd.year())), 4);
  *p++ = '-';
  p = put_digits(p, static_cast<unsigned>(ymd.month()), 2);
  *p++ = '-';
  p = put_digits(p, static_cast<unsigned>(ymd.day()), 2);
  *p++ = 'T';
  p = put_digits(p, static_cast<unsigned>(hms.hours().count()), 2);
  *p++ = ':';
  p = put_digits(p, static_cast<unsigned>(hms.minutes().count()), 2);
  *p++ = ':';
  p = put_digits(p, static_cast<unsigned>(hms.seconds().count()), 2);
  *p++ = '.';
  p = put_digits(p, static_cast<unsigned>(hms.subseconds().count()), 3);
  *p = 'Z';
  return out;
}

std::string format_timestamp(time_point t) {
  return std::string(format_timestamp_chars(t).view());
}

result<time_point> parse_timestamp(std::string_view text) {
  if (text.empty()) {
    return invalid("empty text");
  }
  reader in(text);
  std::string problem;

  const auto year = in.digits(4, "year", problem);
  if (!year || !in.expect("-", problem)) {
    return invalid(problem);
  }
  const auto month = in.digits(2, "month", problem);
  if (!month) {
    return invalid(problem);
  }
  if (*month < 1 || *month > 12) {
    return invalid("month " + two_digits(*month) + " is out of range (01..12)");
  }
  if (!in.expect("-", problem)) {
    return invalid(problem);
  }
  const auto day = in.digits(2, "day", problem);
  if (!day) {
    return invalid(problem);
  }
  const std::chrono::year_month ym{std::chrono::year(static_cast<int>(*year)),
                                   std::chrono::month(*month)};
  const auto last = static_cast<unsigned>((ym / std::chrono::last).day());
  if (*day < 1 || *day > last) {
    return invalid("day " + two_digits(*day) + " is out of range for " + std::to_string(*year) +
                   "-" + two_digits(*month) + " (01.." + two_digits(last) + ")");
  }
  if (!in.expect("Tt", problem)) {
    return invalid(problem);
  }

  const auto hour = in.digits(2, "hour", problem);
  if (!hour) {
    return invalid(problem);
  }
  if (*hour > 23) {
    return invalid("hour " + two_digits(*hour) + " is out of range (00..23)");
  }
  if (!in.expect(":", problem)) {
    return invalid(problem);
  }
  const auto minute = in.digits(2, "minute", problem);
  if (!minute) {
    return invalid(problem);
  }
  if (*minute > 59) {
    return invalid("minute " + two_digits(*minute) + " is out of range (00..59)");
  }
  if (!in.expect(":", problem)) {
    return invalid(problem);
  }
  const auto second = in.digits(2, "second", problem);
  if (!second) {
    return invalid(problem);
  }
  if (*second == 60) {
    return invalid("second 60 (a leap second) is not supported");
  }
  if (*second > 59) {
    return invalid("second " + two_digits(*second) + " is out of range (00..59)");
  }

  std::int64_t fraction_ns = 0;
  if (in.peek() == '.') {
    in.skip();
    int count = 0;
    while (reader::is_digit(in.peek())) {
      if (++count > 9) {
        return invalid("more than 9 fractional digits " + in.where());
      }
      fraction_ns = fraction_ns * 10 + (in.peek() - '0');
      in.skip();
    }
    if (count == 0) {
      return invalid("expected a digit after '.' " + in.where());
    }
    for (; count < 9; ++count) {
      fraction_ns *= 10;
    }
  }

  minutes offset{0};
  const char zone = in.peek();
  if (!in.at_end() && (zone == 'Z' || zone == 'z')) {
    in.skip();
  } else if (!in.at_end() && (zone == '+' || zone == '-')) {
    in.skip();
    const auto offset_hour = in.digits(2, "offset hour", problem);
    if (!offset_hour) {
      return invalid(problem);
    }
    if (*offset_hour > 23) {
      return invalid("offset hour " + two_digits(*offset_hour) + " is out of range (00..23)");
    }
    if (!in.expect(":", problem)) {
      return invalid(problem);
    }
    const auto offset_minute = in.digits(2, "offset minute", problem);
    if (!offset_minute) {
      return invalid(problem);
    }
    if (*offset_minute > 59) {
      return invalid("offset minute " + two_digits(*offset_minute) + " is out of range (00..59)");
    }
    offset = hours(*offset_hour) + minutes(*offset_minute);
    if (zone == '-') {
      offset = -offset;
    }
  } else {
    return invalid("expected 'Z' or an offset +hh:mm or -hh:mm " + in.where());
  }
  if (!in.at_end()) {
    return invalid("unexpected text after the time zone " + in.where());
  }

  // The local time minus its offset is UTC.
  const std::chrono::sys_seconds utc = std::chrono::sys_days{ym / std::chrono::day(*day)} +
                                       hours(*hour) + minutes(*minute) + seconds(*second) - offset;
  const auto lowest = std::chrono::ceil<seconds>(time_point::min().time_since_epoch());
  const auto highest = std::chrono::floor<seconds>(time_point::max().time_since_epoch());
  if (utc.time_since_epoch() < lowest || utc.time_since_epoch() >= highest) {
    return invalid("the instant is outside the range this clock can hold (" +
                   format_timestamp(time_point(lowest)) + " to " +
                   format_timestamp(time_point(highest)) + ")");
  }
  return time_point(std::chrono::duration_cast<duration>(utc.time_since_epoch()) +
                    std::chrono::duration_cast<duration>(nanoseconds(fraction_ns)));
}

}  // namespace amp

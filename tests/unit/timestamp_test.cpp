#include <catch2/catch.hpp>

#include <chrono>
#include <string>

#include "amp/timestamp.hpp"

using namespace std::chrono;

namespace {

amp::time_point utc(int y, unsigned mo, unsigned d, int h = 0, int mi = 0, int s = 0,
                    milliseconds ms = milliseconds(0)) {
  return amp::time_point(sys_days{year(y) / month(mo) / day(d)} + hours(h) + minutes(mi) +
                         seconds(s) + ms);
}

}  // namespace

TEST_CASE("format_timestamp writes RFC 3339 UTC with milliseconds", "[timestamp]") {
  REQUIRE(amp::format_timestamp(utc(2026, 11, 30, 12, 0, 0, milliseconds(123))) ==
          "2026-11-30T12:00:00.123Z");
  REQUIRE(amp::format_timestamp(amp::time_point{}) == "1970-01-01T00:00:00.000Z");
  REQUIRE(amp::format_timestamp(utc(2028, 2, 29, 23, 59, 59, milliseconds(999))) ==
          "2028-02-29T23:59:59.999Z");
  // Sub-millisecond parts are cut off, not rounded.
  REQUIRE(amp::format_timestamp(utc(2026, 1, 1) + microseconds(1999)) ==
          "2026-01-01T00:00:00.001Z");
  // Before 1970 the instant is rounded down, like any other.
  REQUIRE(amp::format_timestamp(amp::time_point{} - microseconds(1)) == "1969-12-31T23:59:59.999Z");
}

TEST_CASE("format_timestamp_chars holds the text format_timestamp writes", "[timestamp]") {
  for (auto t : {utc(2026, 11, 30, 12, 0, 0, milliseconds(123)), amp::time_point{},
                 utc(2028, 2, 29, 23, 59, 59, milliseconds(999)),
                 amp::time_point{} - microseconds(1), utc(1700, 3, 1, 4, 5, 6)}) {
    const auto chars = amp::format_timestamp_chars(t);
    CHECK(chars.view() == amp::format_timestamp(t));
    CHECK(chars.view().size() == 24);
  }
  CHECK(amp::format_timestamp_chars(utc(2026, 11, 30, 12, 0, 0, milliseconds(5))).view() ==
        "2026-11-30T12:00:00.005Z");
}

TEST_CASE("parse_timestamp reads what format_timestamp writes", "[timestamp]") {
  for (auto t : {utc(2026, 11, 30, 12, 0, 0, milliseconds(123)), utc(2028, 2, 29, 12),
                 utc(2000, 2, 29, 0, 0, 0, milliseconds(1)), utc(1970, 1, 1),
                 utc(1969, 12, 31, 23, 59, 59, milliseconds(999)), utc(2099, 12, 31, 23, 59, 59),
                 utc(1700, 3, 1, 4, 5, 6, milliseconds(7)), utc(2261, 12, 31, 23, 59, 59)}) {
    const std::string text = amp::format_timestamp(t);
    CAPTURE(text);
    auto parsed = amp::parse_timestamp(text);
    REQUIRE(parsed.has_value());
    REQUIRE(*parsed == t);
  }
}

TEST_CASE("parse_timestamp applies offsets and reads 0 to 9 fractional digits", "[timestamp]") {
  const auto noon = utc(2026, 11, 30, 12);
  REQUIRE(amp::parse_timestamp("2026-11-30T12:00:00Z").value() == noon);
  REQUIRE(amp::parse_timestamp("2026-11-30t12:00:00z").value() == noon);
  REQUIRE(amp::parse_timestamp("2026-11-30T13:30:00+01:30").value() == noon);
  REQUIRE(amp::parse_timestamp("2026-11-30T07:00:00-05:00").value() == noon);
  REQUIRE(amp::parse_timestamp("2026-11-30T12:00:00+00:00").value() == noon);
  REQUIRE(amp::parse_timestamp("2026-11-30T12:00:00-00:00").value() == noon);
  // An offset can move the date across a day, a month and a year.
  REQUIRE(amp::parse_timestamp("2027-01-01T01:00:00+02:00").value() == utc(2026, 12, 31, 23));
  REQUIRE(amp::parse_timestamp("2028-02-28T23:00:00-01:00").value() == utc(2028, 2, 29));

  REQUIRE(amp::parse_timestamp("2026-11-30T12:00:00.5Z").value() == noon + milliseconds(500));
  REQUIRE(amp::parse_timestamp("2026-11-30T12:00:00.123Z").value() == noon + milliseconds(123));
  REQUIRE(amp::parse_timestamp("2026-11-30T12:00:00.000001Z").value() == noon + microseconds(1));
  REQUIRE(amp::parse_timestamp("2026-11-30T12:00:00.123456789Z").value() ==
          noon + duration_cast<amp::duration>(nanoseconds(123456789)));
}

TEST_CASE("parse_timestamp accepts leap days only in leap years", "[timestamp]") {
  REQUIRE(amp::parse_timestamp("2028-02-29T00:00:00Z").value() == utc(2028, 2, 29));
  REQUIRE(amp::parse_timestamp("2000-02-29T00:00:00Z").has_value());
  auto r = amp::parse_timestamp("2026-02-29T00:00:00Z");
  REQUIRE_FALSE(r.has_value());
  REQUIRE(r.error().code() == amp::errc::bad_request);
  REQUIRE(r.error().message() == "invalid timestamp: day 29 is out of range for 2026-02 (01..28)");
  REQUIRE_FALSE(amp::parse_timestamp("2100-02-29T00:00:00Z").has_value());
}

TEST_CASE("parse_timestamp refuses malformed text with a message that says what is wrong",
          "[timestamp]") {
  struct bad_case {
    const char* text;
    const char* message;
  };
  const bad_case cases[] = {
      {"", "empty text"},
      {"2026", "expected '-' at position 4 (end of text)"},
      {"26-11-30T12:00:00Z", "expected a 4-digit year at position 0"},
      {"2026/11/30T12:00:00Z", "expected '-' at position 4"},
      {"2026-1-30T12:00:00Z", "expected a 2-digit month at position 5"},
      {"2026-13-01T00:00:00Z", "month 13 is out of range (01..12)"},
      {"2026-00-01T00:00:00Z", "month 00 is out of range (01..12)"},
      {"2026-11-00T00:00:00Z", "day 00 is out of range for 2026-11 (01..30)"},
      {"2026-11-31T00:00:00Z", "day 31 is out of range for 2026-11 (01..30)"},
      {"2026-02-30T00:00:00Z", "day 30 is out of range for 2026-02 (01..28)"},
      {"2028-02-30T00:00:00Z", "day 30 is out of range for 2028-02 (01..29)"},
      {"2026-11-30 12:00:00Z", "expected 'T' at position 10"},
      {"2026-11-30T24:00:00Z", "hour 24 is out of range (00..23)"},
      {"2026-11-30T12:60:00Z", "minute 60 is out of range (00..59)"},
      {"2026-11-30T23:59:60Z", "second 60 (a leap second) is not supported"},
      {"2026-11-30T12:00:61Z", "second 61 is out of range (00..59)"},
      {"2026-11-30T12:00Z", "expected ':' at position 16"},
      {"2026-11-30T12:00:00",
       "expected 'Z' or an offset +hh:mm or -hh:mm at position 19 (end of text)"},
      {"2026-11-30T12:00:00.Z", "expected a digit after '.' at position 20"},
      {"2026-11-30T12:00:00.1234567890Z", "more than 9 fractional digits at position 29"},
      {"2026-11-30T12:00:00UTC", "expected 'Z' or an offset +hh:mm or -hh:mm at position 19"},
      {"2026-11-30T12:00:00+0100", "expected ':' at position 22"},
      {"2026-11-30T12:00:00+1", "expected a 2-digit offset hour at position 20"},
      {"2026-11-30T12:00:00+24:00", "offset hour 24 is out of range (00..23)"},
      {"2026-11-30T12:00:00+01:60", "offset minute 60 is out of range (00..59)"},
      {"2026-11-30T12:00:00Z ", "unexpected text after the time zone at position 20"},
      {"2026-11-30T12:00:00ZZ", "unexpected text after the time zone at position 20"},
      {" 2026-11-30T12:00:00Z", "expected a 4-digit year at position 0"},
      {"２０２６-11-30T12:00:00Z", "expected a 4-digit year at position 0"},
      {"1600-01-01T00:00:00Z", "the instant is outside the range this clock can hold"},
      {"9999-12-31T23:59:59Z", "the instant is outside the range this clock can hold"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    auto r = amp::parse_timestamp(c.text);
    REQUIRE_FALSE(r.has_value());
    REQUIRE(r.error().code() == amp::errc::bad_request);
    REQUIRE_THAT(r.error().message(),
                 Catch::StartsWith(std::string("invalid timestamp: ") + c.message));
  }
}

#include <catch2/catch.hpp>

#include "amp/error.hpp"
#include "amp/result.hpp"

TEST_CASE("every errc has its wire spelling and parses back", "[error]") {
  for (int i = 1; i <= static_cast<int>(amp::errc::internal); ++i) {
    auto e = static_cast<amp::errc>(i);
    auto name = amp::to_string(e);
    REQUIRE_FALSE(name.empty());
    REQUIRE(amp::errc_from_string(name) == e);
    std::error_code ec = e;
    REQUIRE(ec.category().name() == std::string("amp"));
    REQUIRE(ec.message() == std::string(name));
  }
  REQUIRE(amp::to_string(amp::errc::lease_lost) == "lease_lost");
  REQUIRE_FALSE(amp::errc_from_string("no_such_code").has_value());
  REQUIRE_FALSE(amp::errc_from_string("").has_value());
}

TEST_CASE("result holds a value or an error and refuses to hand out the wrong one", "[error]") {
  amp::result<int> ok = 42;
  REQUIRE(ok.has_value());
  REQUIRE(ok.value() == 42);
  REQUIRE(ok.value_or(7) == 42);

  amp::result<int> bad = amp::unexpected(amp::errc::conflict, "wrong last sequence");
  REQUIRE_FALSE(bad.has_value());
  REQUIRE(bad.error() == amp::errc::conflict);
  REQUIRE(bad.error().message() == "wrong last sequence");
  REQUIRE(bad.value_or(7) == 7);
  REQUIRE_THROWS_AS(bad.value(), amp::bad_result_access);

  amp::result<void> done;
  REQUIRE(done.has_value());
  amp::result<void> failed = amp::error(amp::errc::invalid_envelope, "bad", "/body/x");
  REQUIRE(failed.error().path() == "/body/x");
  REQUIRE(failed.error().to_string() == "invalid_envelope: bad");
}

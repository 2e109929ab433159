#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <type_traits>

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

TEST_CASE("result's and_then, transform, or_else and transform_error follow std::expected",
          "[error]") {
  using amp::errc;
  using amp::result;
  using amp::unexpected;
  auto half = [](int v) -> result<int> {
    if (v % 2) return unexpected(errc::bad_request, "odd");
    return v / 2;
  };

  SECTION("and_then chains on a value and passes an error through without calling") {
    REQUIRE(result<int>(8).and_then(half).and_then(half).value() == 2);
    auto odd = result<int>(6).and_then(half).and_then(half);
    REQUIRE(odd.error() == errc::bad_request);
    REQUIRE(odd.error().message() == "odd");
    int calls = 0;
    result<int> bad = unexpected(errc::conflict, "taken", "/task");
    auto after = bad.and_then([&](int) -> result<std::string> {
      ++calls;
      return std::string("never");
    });
    REQUIRE(calls == 0);
    REQUIRE(after.error() == errc::conflict);
    REQUIRE(after.error().path() == "/task");
  }

  SECTION("transform wraps what the function returns; void gives result<void>") {
    auto text = result<int>(7).transform([](int v) { return std::to_string(v); });
    static_assert(std::is_same_v<decltype(text), result<std::string>>);
    REQUIRE(text.value() == "7");
    int seen = 0;
    auto done = result<int>(3).transform([&](int v) { seen = v; });
    static_assert(std::is_same_v<decltype(done), result<void>>);
    REQUIRE(done.has_value());
    REQUIRE(seen == 3);
    result<int> bad = unexpected(errc::not_found, "no task");
    REQUIRE(bad.transform([](int v) { return v + 1; }).error() == errc::not_found);
  }

  SECTION("a moved result moves its value into the function") {
    auto owned = std::make_unique<int>(5);
    result<std::unique_ptr<int>> r = std::move(owned);
    auto v = std::move(r).transform([](std::unique_ptr<int> p) { return *p * 2; });
    REQUIRE(v.value() == 10);
    result<std::unique_ptr<int>> r2 = std::make_unique<int>(1);
    auto chained = std::move(r2).and_then(
        [](std::unique_ptr<int> p) -> result<std::unique_ptr<int>> { return p; });
    REQUIRE(*chained.value() == 1);
    REQUIRE(result<std::string>(std::string("kept")).value_or("other") == "kept");
  }

  SECTION("or_else recovers from an error and leaves a value alone") {
    result<int> missing = unexpected(errc::not_found, "no record");
    auto recovered = missing.or_else([](const amp::error& e) -> result<int> {
      if (e == errc::not_found) return 0;
      return e;
    });
    REQUIRE(recovered.value() == 0);
    int calls = 0;
    auto kept = result<int>(4).or_else([&](const amp::error&) -> result<int> {
      ++calls;
      return 0;
    });
    REQUIRE(kept.value() == 4);
    REQUIRE(calls == 0);
    result<int> other = unexpected(errc::unavailable, "away");
    REQUIRE(other.or_else([](const amp::error& e) -> result<int> { return e; }).error() ==
            errc::unavailable);
  }

  SECTION("transform_error rewrites the error only") {
    result<int> bad = unexpected(errc::conflict, "wrong last sequence");
    auto worded = bad.transform_error(
        [](const amp::error& e) { return amp::error(e.code(), "task t_1 " + e.message()); });
    REQUIRE(worded.error() == errc::conflict);
    REQUIRE(worded.error().message() == "task t_1 wrong last sequence");
    REQUIRE(
        result<int>(1)
            .transform_error([](const amp::error&) { return amp::error(errc::internal, "never"); })
            .value() == 1);
  }

  SECTION("result<void> chains the same way") {
    result<void> ok;
    REQUIRE(ok.and_then([] { return result<int>(9); }).value() == 9);
    REQUIRE(ok.transform([] { return 2; }).value() == 2);
    result<void> failed = amp::error(errc::forbidden, "not yours");
    int calls = 0;
    auto r = failed.and_then([&] {
      ++calls;
      return result<int>(1);
    });
    REQUIRE(calls == 0);
    REQUIRE(r.error() == errc::forbidden);
    REQUIRE(failed.transform([] { return 1; }).error() == errc::forbidden);
    REQUIRE(failed.or_else([](const amp::error&) { return result<void>(); }).has_value());
    REQUIRE(
        failed.transform_error([](const amp::error& e) { return amp::error(e.code(), "changed"); })
            .error()
            .message() == "changed");
  }
}

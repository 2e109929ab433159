#pragma once

// JSON objects written member by member, and their variants, for the differential tests
// of the hand-written schema fast paths (envelope_check_test, frame_check_test).

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amp/json.hpp"

namespace amp::testing {

/// Members of a JSON object in order: name, raw JSON value. A name may repeat.
using json_members = std::vector<std::pair<std::string, std::string>>;

/// `s` as a JSON string.
inline std::string q(std::string_view s) {
  return amp::json_quote(s);
}

/// `unit` `n` times.
inline std::string repeat(std::string_view unit, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out += unit;
  return out;
}

/// The JSON object of `members`, in their order, repeated names included.
inline std::string object_of(const json_members& members) {
  std::string out = "{";
  for (const auto& [k, v] : members) out += (out.size() > 1 ? "," : "") + q(k) + ":" + v;
  return out + "}";
}

/// Calls `check(json, doubled)` for each variant of `valid`: each member's value replaced
/// by each of `values`; that value added as a second member of the same name, after and
/// before the first (`doubled` true); and each member removed.
template <class Check>
void for_each_variant(const json_members& valid, const std::vector<std::string>& values,
                      Check check) {
  for (std::size_t m = 0; m < valid.size(); ++m) {
    for (const auto& v : values) {
      auto changed = valid;
      changed[m].second = v;
      check(object_of(changed), false);
      changed.push_back({valid[m].first, v});
      check(object_of(changed), true);
      changed = valid;
      changed.insert(changed.begin(), {valid[m].first, v});
      check(object_of(changed), true);
    }
    auto fewer = valid;
    fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(m));
    check(object_of(fewer), false);
  }
}

}  // namespace amp::testing

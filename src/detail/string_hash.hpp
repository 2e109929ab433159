#pragma once

// A hash for unordered containers keyed by std::string that look up by std::string_view
// without making a string (with std::equal_to<> as the key equality).

#include <cstddef>
#include <functional>
#include <string_view>

namespace amp::detail {

struct string_hash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};

}  // namespace amp::detail

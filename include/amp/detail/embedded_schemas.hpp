#pragma once

#include <string_view>
#include <vector>

namespace amp::detail {

/// A JSON Schema compiled into the library from the repository's `schemas/` folder.
struct embedded_schema {
  std::string_view name;  ///< path under `schemas/` without `.json`: `envelope`, `frames/send`
  std::string_view text;  ///< the schema document
};

/// Every schema in `schemas/`, in file-name order. Thread-safe.
const std::vector<embedded_schema>& embedded_schemas();

}  // namespace amp::detail

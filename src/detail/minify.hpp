#pragma once

// simdjson's minified text of a DOM value, without growing a new buffer for every value.

#include <simdjson.h>

#include <cstddef>
#include <string>

namespace amp::detail {

/// The same text as `simdjson::minify(value)`. `simdjson::minify` builds each value in a new
/// buffer grown a character at a time (about ten allocations for a 128-byte body); this
/// writes through a builder the calling thread keeps, so only the returned string is
/// allocated. The builder is dropped after a value over 256 KiB, so that a thread does not
/// keep the largest value it ever wrote. Thread-safe (one builder per thread).
/// `Value` is a `dom::element`, `dom::object` or `dom::array`.
template <class Value>
std::string minify(Value value) {
  constexpr std::size_t k_keep_bytes = 256 * 1024;
  thread_local simdjson::internal::string_builder<> builder;
  builder.clear();
  builder.append(value);
  std::string text(builder.str());
  if (text.size() > k_keep_bytes) builder = simdjson::internal::string_builder<>();
  return text;
}

}  // namespace amp::detail

#pragma once

/// \file
/// JSON Schema (draft 7) validation: the envelope schema compiled into the library, and
/// the per-type body schemas of the server's configuration (spec §8).

#include <memory>
#include <string_view>

#include "amp/result.hpp"

namespace amp {

namespace detail {
struct schema_access;
}

/// A parsed JSON Schema, draft 7.
///
/// Supported: what valijson supports of draft 7 (no remote `$ref`), with three keywords
/// checked by amp instead, so that validation costs time and stack bounded by the document
/// whatever the schema: `pattern` (ECMAScript grammar, searched with libstdc++'s
/// non-recursive automaton: linear in the string, no back-references), `format` (`date`,
/// `time` and `date-time` as RFC 3339 grammar, by hand; other formats are not checked) and
/// `uniqueItems` (by sorting the items, not comparing every pair). `patternProperties` is
/// refused: valijson would match it with a recursive, backtracking engine. Patterns see
/// bytes, not characters: a UTF-8 character is several. A pattern of the simplest shape
/// (`^`, ASCII characters and classes, a quantifier on the last only, `$`, such as
/// `^[a-z][a-z0-9_-]{0,63}$`) is matched by hand in one pass, with the same result. (The
/// schemas compiled into the library, `embedded`, are amp's own, whose patterns are
/// anchored and use bounded repetitions only: their other patterns keep the backtracking
/// matcher, which is faster on them.)
///
/// A document that fails is examined a second time, only to find the error to report; that
/// search stops at 8 errors or 65,536 visited values, so a large document with many errors
/// costs no more than a bounded walk.
///
/// Threads: a schema is immutable once parsed; `validate` may be called on one schema
/// from any number of threads at once. Copies are cheap and share the parsed schema.
/// A moved-from schema may only be assigned to or destroyed.
class json_schema {
 public:
  /// Parses a schema document.
  /// Errors: `bad_request` when `schema_json` is not JSON ("not valid JSON: …"), or when it
  /// is not a schema valijson accepts, holds a `pattern` that is not a valid regular
  /// expression (or uses a back-reference), or uses `patternProperties` ("invalid JSON
  /// Schema: …" with the reason and the JSON Pointer of the keyword).
  static result<json_schema> parse(std::string_view schema_json);

  /// One of the schemas compiled into the library from `schemas/` (e.g. `"envelope"`),
  /// parsed on first use and shared afterwards.
  /// Errors: `not_found` for an unknown name. Thread-safe.
  static result<json_schema> embedded(std::string_view name);

  /// Validates one JSON document.
  /// Errors: `bad_request` when `document_json` is not JSON; `invalid_envelope` when it
  /// does not match, with `error().path()` the JSON Pointer of the most specific failing
  /// value (e.g. `/items/2/name`; `""` for the document itself; for a missing required
  /// member, the pointer the member would have) and a message of the form
  /// `"at /items/2/name: <reason>"` (`"at the root: <reason>"` for `""`). Of the errors the
  /// bounded search found, the deepest is reported; when it found none (errors under
  /// `anyOf`/`oneOf` are only known once every branch was tried), the root, saying so.
  result<void> validate(std::string_view document_json) const;

 private:
  friend struct detail::schema_access;
  struct impl;
  explicit json_schema(std::shared_ptr<const impl> p) : impl_(std::move(p)) {}
  std::shared_ptr<const impl> impl_;
};

}  // namespace amp

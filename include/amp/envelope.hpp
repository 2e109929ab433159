#pragma once

/// \file
/// The envelope: what a message, an event or a task carries (spec §5, §6, §7), and its
/// JSON form.

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "amp/clock.hpp"
#include "amp/result.hpp"

namespace amp {

/// The branch of an operation that a message carries (spec §12): the envelope's
/// `operation` member, `{"id","branch","attempt","reply_by"}`.
struct operation_ref {
  std::string id;         ///< the operation, `o_…`
  std::string branch;     ///< the member whose branch it is
  int attempt = 1;        ///< the branch's attempt, which a reply must carry
  time_point reply_by{};  ///< the operation's deadline; the epoch: none (`null`)
  friend bool operator==(const operation_ref&, const operation_ref&) = default;
};

/// A message as stored and delivered. For the optional text fields (`type`, `reply_to`,
/// `correlation`) the empty string means absent; `headers` may be empty.
struct envelope {
  std::string id;    ///< the message id (`msg_id`), 1..128 printable characters
  std::string from;  ///< sender: a participant name, or `$broker`
  std::string to;    ///< recipient: a participant or job name, or a topic
  std::string ns;    ///< namespace
  std::string type;  ///< optional message type, e.g. `review.request`
  time_point ts;     ///< when the broker accepted it; written with millisecond precision
  std::string body;  ///< the body: one serialized JSON value (see `parse_envelope`)
  std::vector<std::pair<std::string, std::string>> headers;  ///< in document order
  std::string reply_to;                      ///< optional participant name to answer to
  std::string correlation;                   ///< optional, 1..256 characters
  std::optional<operation_ref> operation{};  ///< a branch of an operation (spec §12)

  friend bool operator==(const envelope&, const envelope&) = default;
};

/// Reads an envelope from its JSON form.
///
/// The text is first validated against the embedded `envelope` schema
/// (`schemas/envelope.json`), so every failure names its place: `invalid_envelope` with
/// `error().path()` the JSON Pointer of the failing member (`/from`, `/headers`, `/ts`…,
/// or `""` when the text is not an object) and a message that includes it. `ts` must
/// also be a real instant (`invalid_envelope` at `/ts` for e.g. February 30). Members
/// the schema does not know are ignored. `ts` is kept to the millisecond, the precision
/// the wire carries (further digits are dropped). A header name appearing twice is
/// `invalid_envelope` at `/headers/<name>`.
///
/// `body` keeps the value minified: the same JSON value, whitespace removed, strings
/// with only the escapes JSON requires (`"\u00e9"` becomes `"é"`), numbers re-printed by
/// simdjson (`1.10` becomes `1.1`, `1e2` becomes `100.0`). Re-parsing a minified body
/// gives it back unchanged.
///
/// Errors: `bad_request` when the text is not JSON (invalid UTF-8, truncated, numbers that
/// fit neither a 64-bit integer nor a double …), with the parser's description;
/// `invalid_envelope` as above. Thread-safe.
result<envelope> parse_envelope(std::string_view json);

/// Writes `e` as a JSON object with the members in the order id, from, to, ns, type, ts,
/// body, headers, reply_to, correlation, operation; empty optional members are left out. `body` is
/// spliced as it is (it must be one JSON value; an empty `body` is written as `null`);
/// `ts` is written by `format_timestamp`. Nothing is validated.
/// For an envelope that `parse_envelope` accepts, or one built with valid fields and a
/// whole-millisecond `ts`, `parse_envelope(to_json(e)) == e`. Thread-safe.
std::string to_json(const envelope& e);

/// What a sender supplies of an envelope; `sealed_envelope::seal` stamps the rest. The optional
/// text fields are absent when empty.
struct envelope_parts {
  std::string from;  ///< a participant name, or `$broker`
  std::string
      to;  ///< a participant or job name, or a topic (the primitive that stores it checks which)
  std::string body;  ///< one serialized JSON value
  std::string type{};
  std::vector<std::pair<std::string, std::string>> headers{};
  std::string msg_id{};  ///< empty: a new unique one
  std::string reply_to{};
  std::string correlation{};
  std::optional<operation_ref> operation{};  ///< set by the broker for an operation's branch
};

/// An envelope as the broker stores it: stamped, checked in the spec's order, and written
/// as JSON, once. Only `seal` makes one, so the primitives that take one
/// (`inbox::async_send`, `topics::async_publish`, `job_queue::async_submit`) store it
/// without checking or writing it again: a gateway that must check an envelope before it spends
/// anything (rate, budget) seals it, then hands the sealed envelope on.
class sealed_envelope {
 public:
  /// Stamps `id` (`parts.msg_id`, or a new unique one), `ns` and `ts` (`now`, to the
  /// millisecond), then checks in the spec's order: `bad_request` when `body` is missing or
  /// not exactly one JSON value; `invalid_name` ("from: …", "reply_to: …") when `from` is
  /// neither a participant name nor `$broker`, or `reply_to` is not a participant name; then
  /// the envelope schema (`invalid_envelope` naming the failing member, as
  /// `parse_envelope`). The body is kept minified. `ts` is `now` as given: the moment the
  /// sealer (the gateway, for a frame) accepted the message. Thread-safe.
  static result<sealed_envelope> seal(envelope_parts parts, std::string_view ns, time_point now);

  /// The envelope; `parse_envelope(json()) == get()`.
  const envelope& get() const noexcept { return env_; }
  /// `to_json(get())`.
  const std::string& json() const& noexcept { return json_; }
  /// Takes the text, and leaves this sealed envelope empty: a primitive refuses it then.
  std::string json() && {
    env_ = {};
    return std::move(json_);
  }

 private:
  sealed_envelope(envelope env, std::string json) : env_(std::move(env)), json_(std::move(json)) {}

  envelope env_;
  std::string json_;
};

}  // namespace amp

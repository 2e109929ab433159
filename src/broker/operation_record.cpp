#include "amp/broker/operation_record.hpp"

#include <simdjson.h>

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "amp/json.hpp"
#include "amp/names.hpp"
#include "amp/timestamp.hpp"
#include "broker/common.hpp"
#include "detail/minify.hpp"
#include "detail/simdjson_adapter.hpp"

namespace amp {

std::string_view to_string(operation_state s) noexcept {
  switch (s) {
    case operation_state::open: return "open";
    case operation_state::completed: return "completed";
    case operation_state::partial: return "partial";
    case operation_state::failed: return "failed";
    case operation_state::cancelled: return "cancelled";
  }
  return "open";
}

std::string_view to_string(branch_state s) noexcept {
  switch (s) {
    case branch_state::pending: return "pending";
    case branch_state::delivered: return "delivered";
    case branch_state::replied: return "replied";
    case branch_state::stopped: return "stopped";
  }
  return "pending";
}

std::string_view to_string(timeout_rule r) noexcept {
  return r == timeout_rule::partial ? "partial" : "failed";
}

std::string_view to_string(cancel_outcome c) noexcept {
  switch (c) {
    case cancel_outcome::already_completed: return "already_completed";
    case cancel_outcome::stopped: return "stopped";
    case cancel_outcome::unknown: return "unknown";
  }
  return "unknown";
}

bool is_closed(operation_state s) noexcept {
  return s != operation_state::open;
}

namespace {

int count_replies(const operation_record& r, bool accept) {
  int n = 0;
  for (const auto& [member, b] : r.branches) {
    if (b.reply && b.reply->accept == accept) ++n;
  }
  return n;
}

error not_open(const operation_record& r) {
  return error(errc::conflict,
               fmt::format("operation {} is {}", amp::quoted(r.operation), to_string(r.state)));
}

bool past_deadline(const operation_record& r, time_point now) {
  return r.quorum > 0 && r.timeout_at != time_point{} && now >= r.timeout_at;
}

// An open operation past its deadline is the deadline's to decide: what comes after it
// (a reply, a retry, a cancel) is refused as if the decision were taken.
std::optional<error> closed_or_due(const operation_record& r, time_point now) {
  if (is_closed(r.state)) return not_open(r);
  if (past_deadline(r, now)) {
    return error(errc::conflict,
                 fmt::format("operation {} reached its deadline at {}", amp::quoted(r.operation),
                             format_timestamp(r.timeout_at)));
  }
  return std::nullopt;
}

void close(operation_record& r, operation_state to, time_point now) {
  r.state = to;
  r.updated_at = now;
}

}  // namespace

int accepted(const operation_record& r) noexcept {
  return count_replies(r, true);
}

int rejected(const operation_record& r) noexcept {
  return count_replies(r, false);
}

std::vector<std::string> missing(const operation_record& r) {
  std::vector<std::string> out;
  for (const auto& [member, b] : r.branches) {
    if (!b.reply) out.push_back(member);
  }
  return out;
}

bool decide(operation_record& r, time_point now) {
  if (is_closed(r.state)) return false;
  if (r.quorum <= 0) {
    if (!r.sent) return false;
    close(r, operation_state::completed, now);
    return true;
  }
  const int yes = accepted(r);
  if (yes >= r.quorum) {
    close(r, operation_state::completed, now);
    return true;
  }
  const int members = static_cast<int>(r.branches.size());
  if (rejected(r) > members - r.quorum) {
    close(r, operation_state::failed, now);
    return true;
  }
  if (!past_deadline(r, now)) return false;
  if (r.on_timeout == timeout_rule::partial && yes > 0) {
    close(r, operation_state::partial, now);
    return true;
  }
  close(r, operation_state::failed, now);
  r.error = task_error{"timeout", fmt::format("{} of {} members accepted by the deadline; the "
                                              "quorum is {}",
                                              yes, members, r.quorum)};
  return true;
}

result<void> check_member(const operation_record& r, std::string_view member) {
  if (r.branches.count(member)) return {};
  return unexpected(errc::forbidden, fmt::format("{} is not a member of operation {}",
                                                 amp::quoted(member), amp::quoted(r.operation)));
}

result<void> refuse_member(const operation_record& r, std::string_view by, std::string_view what) {
  if (by == r.initiator || !r.branches.count(by)) return {};
  return unexpected(errc::forbidden, fmt::format("only the initiator may {} operation {}", what,
                                                 amp::quoted(r.operation)));
}

result<reply_effect> apply_reply(operation_record& r, std::string_view member, int attempt,
                                 bool accept, std::string body, time_point now) {
  if (auto m = check_member(r, member); !m) return m.error();
  auto it = r.branches.find(member);
  if (auto e = closed_or_due(r, now)) return std::move(*e);
  auto& b = it->second;
  if (attempt != b.attempt) {
    return unexpected(errc::conflict,
                      fmt::format("attempt {} is not the current attempt ({}) of branch {}",
                                  attempt, b.attempt, amp::quoted(member)));
  }
  if (b.reply) return reply_effect{.duplicate = true};
  b.reply =
      branch_reply{.accept = accept, .body = body.empty() ? "null" : std::move(body), .at = now};
  b.state = branch_state::replied;
  r.updated_at = now;
  return reply_effect{.decided = decide(r, now)};
}

result<int> retry_branch(operation_record& r, std::string_view member, time_point now) {
  if (auto e = closed_or_due(r, now)) return std::move(*e);
  auto it = r.branches.find(member);
  if (it == r.branches.end()) {
    return unexpected(errc::not_found, fmt::format("operation {} has no branch {}",
                                                   amp::quoted(r.operation), amp::quoted(member)));
  }
  auto& b = it->second;
  if (b.reply) {
    return unexpected(errc::conflict,
                      fmt::format("branch {} replied already", amp::quoted(member)));
  }
  ++b.attempt;
  b.state = branch_state::pending;
  b.seq = 0;
  r.updated_at = now;
  return b.attempt;
}

bool mark_delivered(operation_record& r, std::string_view member, int attempt, time_point now) {
  auto it = r.branches.find(member);
  if (it == r.branches.end() || it->second.attempt != attempt ||
      it->second.state != branch_state::pending) {
    return false;
  }
  it->second.state = branch_state::delivered;
  r.updated_at = now;
  return true;
}

result<std::map<std::string, cancel_outcome, std::less<>>> cancel_operation(operation_record& r,
                                                                            time_point now) {
  if (auto e = closed_or_due(r, now)) return std::move(*e);
  std::map<std::string, cancel_outcome, std::less<>> out;
  for (auto& [member, b] : r.branches) {
    switch (b.state) {
      case branch_state::replied: out.emplace(member, cancel_outcome::already_completed); break;
      case branch_state::delivered: out.emplace(member, cancel_outcome::unknown); break;
      case branch_state::pending:
      case branch_state::stopped:
        b.state = branch_state::stopped;
        out.emplace(member, cancel_outcome::stopped);
        break;
    }
  }
  close(r, operation_state::cancelled, now);
  return out;
}

namespace {

void write_reply(json_writer& w, const branch_reply& reply) {
  w.begin_object().key("accept").boolean(reply.accept).key("body").raw(reply.body);
  w.key("at").string(format_timestamp_chars(reply.at).view()).end_object();
}

void write_branch(json_writer& w, const operation_branch& b, bool stored) {
  w.begin_object().key("attempt").integer(b.attempt).key("state").string(to_string(b.state));
  w.key("reply");
  if (b.reply) {
    write_reply(w, *b.reply);
  } else {
    w.null();
  }
  if (stored && b.seq != 0) w.key("seq").integer(b.seq);
  w.end_object();
}

void write_members(json_writer& w, const operation_record& r) {
  w.key("members").begin_array();
  for (const auto& [member, b] : r.branches) w.string(member);
  w.end_array();
}

void write_quorum(json_writer& w, const operation_record& r) {
  w.key("quorum");
  if (r.quorum > 0) {
    w.integer(r.quorum);
  } else {
    w.null();
  }
}

std::size_t bodies_size(const operation_record& r) {
  std::size_t n = 0;
  for (const auto& [member, b] : r.branches)
    n += member.size() + (b.reply ? b.reply->body.size() : 0);
  return n;
}

// The spec's members, then either the revision (wire form) or the broker's own members.
std::string write_record(const operation_record& r, bool stored,
                         std::optional<std::string_view> only) {
  json_writer w(512 + 96 * r.branches.size() + bodies_size(r));
  w.begin_object();
  w.key("operation").string(r.operation);
  w.key("ns").string(r.ns);
  w.key("initiator").string(r.initiator);
  write_members(w, r);
  write_quorum(w, r);
  w.key("state").string(to_string(r.state));
  detail::write_time_or_null(w, "created_at", r.created_at);
  detail::write_time_or_null(w, "updated_at", r.updated_at);
  detail::write_time_or_null(w, "timeout_at", r.timeout_at);
  w.key("branches").begin_object();
  for (const auto& [member, b] : r.branches) {
    if (only && member != *only) continue;
    w.key(member);
    write_branch(w, b, stored);
  }
  w.end_object();
  if (r.error) {
    w.key("error");
    detail::write_task_error(w, r.error);
  }
  if (stored) {
    w.key("on_timeout").string(to_string(r.on_timeout));
    if (r.sent) w.key("sent").boolean(true);
    if (r.notified) w.key("notified").boolean(true);
    if (!r.idem_key.empty()) w.key("idem").string(r.idem_key);
    if (r.due_seq != 0) w.key("due").integer(r.due_seq);
  } else {
    w.key("revision").integer(r.revision);
  }
  w.end_object();
  return w.take();
}

}  // namespace

std::string to_json(const operation_record& r, std::optional<std::string_view> only) {
  return write_record(r, false, only);
}

std::string to_stored_json(const operation_record& r) {
  return write_record(r, true, std::nullopt);
}

std::string notice_body(const operation_record& r) {
  json_writer w(256 + 64 * r.branches.size() + bodies_size(r));
  w.begin_object();
  w.key("operation").string(r.operation);
  w.key("state").string(to_string(r.state));
  write_quorum(w, r);
  write_members(w, r);
  w.key("replies").begin_object();
  for (const auto& [member, b] : r.branches) {
    if (!b.reply) continue;
    w.key(member);
    write_reply(w, *b.reply);
  }
  w.end_object();
  w.key("missing").begin_array();
  for (const auto& m : missing(r)) w.string(m);
  w.end_array();
  if (r.error) {
    w.key("error");
    detail::write_task_error(w, r.error);
  }
  w.end_object();
  return w.take();
}

namespace {

namespace dom = simdjson::dom;

result<operation_record> bad(std::string_view what) {
  return unexpected(errc::internal, fmt::format("operation record: {}", what));
}

template <typename Enum, std::size_t N>
std::optional<Enum> enum_from(std::string_view s, const Enum (&all)[N]) {
  for (auto e : all) {
    if (to_string(e) == s) return e;
  }
  return std::nullopt;
}

constexpr operation_state k_operation_states[] = {operation_state::open, operation_state::completed,
                                                  operation_state::partial, operation_state::failed,
                                                  operation_state::cancelled};
constexpr branch_state k_branch_states[] = {branch_state::pending, branch_state::delivered,
                                            branch_state::replied, branch_state::stopped};
constexpr timeout_rule k_timeout_rules[] = {timeout_rule::failed, timeout_rule::partial};

std::optional<operation_branch> read_branch(dom::object o) {
  operation_branch b;
  std::int64_t attempt = 0;
  if (o["attempt"].get(attempt) != simdjson::SUCCESS || attempt < 1) return std::nullopt;
  b.attempt = static_cast<int>(attempt);
  auto st = enum_from(detail::string_member(o, "state"), k_branch_states);
  if (!st) return std::nullopt;
  b.state = *st;
  dom::object reply;
  if (o["reply"].get(reply) == simdjson::SUCCESS) {
    branch_reply out;
    dom::element body;
    if (reply["accept"].get(out.accept) != simdjson::SUCCESS ||
        reply["body"].get(body) != simdjson::SUCCESS) {
      return std::nullopt;
    }
    out.body = detail::minify(body);
    auto at = detail::time_member(reply, "at");
    if (!at) return std::nullopt;
    out.at = *at;
    b.reply = std::move(out);
  }
  std::uint64_t seq = 0;
  if (o["seq"].get(seq) == simdjson::SUCCESS) b.seq = seq;
  return b;
}

}  // namespace

result<operation_record> parse_operation_record(std::string_view json) {
  thread_local dom::parser parser;  // reused for its buffers
  detail::parser_release release(parser);
  dom::object o;
  if (parser.parse(json.data(), json.size()).get(o) != simdjson::SUCCESS) {
    return bad("not a JSON object");
  }
  operation_record r;
  r.operation = detail::string_member(o, "operation");
  r.ns = detail::string_member(o, "ns");
  r.initiator = detail::string_member(o, "initiator");
  auto st = enum_from(detail::string_member(o, "state"), k_operation_states);
  if (r.operation.empty() || !st) return bad("no operation or state");
  r.state = *st;
  std::int64_t quorum = 0;
  if (o["quorum"].get(quorum) == simdjson::SUCCESS) r.quorum = static_cast<int>(quorum);
  auto rule = enum_from(detail::string_member(o, "on_timeout"), k_timeout_rules);
  r.on_timeout = rule.value_or(timeout_rule::failed);
  for (auto [key, field] :
       {std::pair{"created_at", &r.created_at}, std::pair{"updated_at", &r.updated_at},
        std::pair{"timeout_at", &r.timeout_at}}) {
    auto t = detail::time_member(o, key);
    if (!t) return bad(t.error().message());
    *field = *t;
  }
  dom::object branches;
  if (o["branches"].get(branches) != simdjson::SUCCESS) return bad("no branches");
  for (auto [member, value] : branches) {
    dom::object b;
    if (value.get(b) != simdjson::SUCCESS) return bad("a branch is not an object");
    auto branch = read_branch(b);
    if (!branch) return bad(fmt::format("branch {} is malformed", amp::quoted(member)));
    r.branches.emplace(std::string(member), std::move(*branch));
  }
  dom::object err;
  if (o["error"].get(err) == simdjson::SUCCESS) {
    r.error = task_error{detail::string_member(err, "code"), detail::string_member(err, "message")};
  }
  bool flag = false;
  if (o["sent"].get(flag) == simdjson::SUCCESS) r.sent = flag;
  if (o["notified"].get(flag) == simdjson::SUCCESS) r.notified = flag;
  r.idem_key = detail::string_member(o, "idem");
  std::uint64_t due = 0;
  if (o["due"].get(due) == simdjson::SUCCESS) r.due_seq = due;
  return r;
}

}  // namespace amp

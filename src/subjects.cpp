#include "amp/subjects.hpp"

#include <fmt/format.h>

#include <utility>

namespace amp::subjects {
namespace {

unexpected invalid(std::string message) {
  return unexpected(errc::invalid_name, std::move(message));
}

bool is_printable_ascii(char c) noexcept {
  const auto u = static_cast<unsigned char>(c);
  return u > 0x20 && u < 0x7f;  // space excluded
}

bool is_alnum(char c) noexcept {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

// Subjects and filters: non-empty tokens of printable ASCII separated by '.'; in a
// filter, '*' as a whole token and '>' as a whole last token.
result<void> check_dotted(std::string_view kind, std::string_view value, bool filter) {
  if (value.empty()) return invalid(fmt::format("{} is empty", kind));
  std::size_t start = 0;
  for (;;) {
    auto end = value.find('.', start);
    if (end == std::string_view::npos) end = value.size();
    const auto token = value.substr(start, end - start);
    if (token.empty()) {
      const char* where = start == 0              ? " (a leading '.')"
                          : start == value.size() ? " (a trailing '.')"
                                                  : "";
      return invalid(
          fmt::format("{} {}: empty token at position {}{}", kind, quoted(value), start, where));
    }
    for (std::size_t j = 0; j < token.size(); ++j) {
      const char c = token[j];
      const auto pos = start + j;
      if (c == '*' || c == '>') {
        if (!filter) {
          return invalid(fmt::format(
              "{} {}: wildcard '{}' at position {} not allowed in a {} (a concrete subject is "
              "needed)",
              kind, quoted(value), c, pos, kind));
        }
        if (token.size() != 1) {
          return invalid(fmt::format("{} {}: '{}' at position {} must be a whole token", kind,
                                     quoted(value), c, pos));
        }
        if (c == '>' && end != value.size()) {
          return invalid(fmt::format("{} {}: '>' at position {} must be the last token", kind,
                                     quoted(value), pos));
        }
      } else if (!is_printable_ascii(c)) {
        return invalid(fmt::format("{} {}: {} at position {} not allowed in a {}", kind,
                                   quoted(value), describe_byte(c), pos, kind));
      }
    }
    if (end == value.size()) return {};
    start = end + 1;
  }
}

result<void> check_stream_like(std::string_view kind, std::string_view name) {
  if (name.empty()) return invalid(fmt::format("{} is empty", kind));
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (is_printable_ascii(c) && c != '.' && c != '*' && c != '>' && c != '/' && c != '\\') {
      continue;
    }
    return invalid(fmt::format("{} {}: {} at position {} not allowed in a {}", kind, quoted(name),
                               describe_byte(c), i, kind));
  }
  if (name.size() > max_stream_name_length) {
    return invalid(fmt::format("{} {}: is {} bytes (at most {})", kind, quoted(name), name.size(),
                               max_stream_name_length));
  }
  return {};
}

// Splits a dotted string without allocating; "" has no tokens.
class token_reader {
 public:
  explicit token_reader(std::string_view s) noexcept : rest_(s), done_(s.empty()) {}
  bool done() const noexcept { return done_; }
  std::string_view next() noexcept {
    const auto dot = rest_.find('.');
    if (dot == std::string_view::npos) {
      done_ = true;
      return std::exchange(rest_, std::string_view{});
    }
    auto token = rest_.substr(0, dot);
    rest_.remove_prefix(dot + 1);
    return token;
  }

 private:
  std::string_view rest_;
  bool done_;
};

std::string prefixed(std::string_view prefix, std::string_view name) {
  std::string out;
  out.reserve(prefix.size() + name.size());
  out += prefix;
  out += name;
  return out;
}

std::string ns_subject(const namespace_name& ns, std::string_view kind, std::string_view rest) {
  return fmt::format("amp.{}.{}.{}", ns.view(), kind, rest);
}

}  // namespace

std::string inbox_stream(const namespace_name& ns) {
  return prefixed("AMP_INBOX_", ns.view());
}
std::string inbox_subjects(const namespace_name& ns) {
  return ns_subject(ns, "inbox", "*");
}
std::string inbox_subject(const namespace_name& ns, const participant_name& participant) {
  return ns_subject(ns, "inbox", participant.view());
}
std::string inbox_consumer(const participant_name& participant) {
  return prefixed("inbox_", participant.view());
}

std::string tasks_stream(const namespace_name& ns) {
  return prefixed("AMP_TASKS_", ns.view());
}
std::string job_subjects(const namespace_name& ns) {
  return ns_subject(ns, "job", "*");
}
std::string job_subject(const namespace_name& ns, const job_name& job) {
  return ns_subject(ns, "job", job.view());
}
std::string job_consumer(const job_name& job) {
  return prefixed("job_", job.view());
}

std::string ended_stream(const namespace_name& ns) {
  return prefixed("AMP_ENDED_", ns.view());
}
std::string ended_subject(const namespace_name& ns) {
  return ns_subject(ns, "task", "ended");
}
std::string sweeper_consumer() {
  return "sweeper";
}

std::string operations_stream(const namespace_name& ns) {
  return prefixed("AMP_OPS_", ns.view());
}
std::string operation_due_subject(const namespace_name& ns) {
  return ns_subject(ns, "operation", "due");
}
std::string deadlines_consumer() {
  return "deadlines";
}
std::string operation_control_subject(const namespace_name& ns) {
  return ns_subject(ns, "ctl", "operations");
}

std::string task_control_subject(const namespace_name& ns) {
  return ns_subject(ns, "ctl", "tasks");
}
std::string inbox_control_subjects(const namespace_name& ns) {
  return ns_subject(ns, "ctl", "inbox.*");
}
std::string inbox_control_subject(const namespace_name& ns, const participant_name& participant) {
  return ns_subject(ns, "ctl", "inbox." + participant.str());
}
std::string work_control_subject(const namespace_name& ns) {
  return ns_subject(ns, "ctl", "work");
}
std::string work_offer_subject(const namespace_name& ns, std::string_view gateway) {
  return ns_subject(ns, "ctl", fmt::format("work.{}", gateway));
}

std::string topics_stream(const namespace_name& ns) {
  return prefixed("AMP_TOPICS_", ns.view());
}
std::string topic_subjects(const namespace_name& ns) {
  return ns_subject(ns, "topic", ">");
}
std::string topic_subject(const namespace_name& ns, const topic& t) {
  return ns_subject(ns, "topic", t.view());
}
std::string topic_filter(const namespace_name& ns, const topic_pattern& pattern) {
  return ns_subject(ns, "topic", pattern.view());
}

result<topic> topic_from_subject(const namespace_name& ns, std::string_view subject) {
  const auto prefix = fmt::format("amp.{}.topic.", ns.view());
  if (!subject.starts_with(prefix)) {
    return invalid(fmt::format("subject {}: not under \"{}\"", quoted(subject), prefix));
  }
  auto t = topic::make(subject.substr(prefix.size()));
  if (!t) {
    return invalid(fmt::format("subject {}: {}", quoted(subject), std::move(t).error().message()));
  }
  return t;
}

std::string dlq_stream(const namespace_name& ns) {
  return prefixed("AMP_DLQ_", ns.view());
}
std::string dlq_subjects(const namespace_name& ns) {
  return ns_subject(ns, "dlq", "*");
}
std::string dlq_subject(const namespace_name& ns, const sink_name& sink) {
  return ns_subject(ns, "dlq", sink.view());
}

std::string registry_bucket(const namespace_name& ns) {
  return prefixed("AMP_REGISTRY_", ns.view());
}
std::string registry_key(const participant_name& participant) {
  return participant.str();
}
std::string task_state_bucket() {
  return "AMP_TASK_STATE";
}
std::string task_key(const namespace_name& ns, const task_id& task) {
  return fmt::format("{}.{}", ns.view(), task.view());
}
std::string operation_key(const namespace_name& ns, const operation_id& operation) {
  return fmt::format("{}.{}", ns.view(), operation.view());
}
std::string idempotency_key(const namespace_name& ns, std::string_view digest) {
  return fmt::format("{}.idem.{}", ns.view(), digest);
}
std::string budget_bucket() {
  return "AMP_BUDGETS";
}
std::string budget_key(const namespace_name& ns, const participant_name& participant,
                       std::string_view day) {
  return fmt::format("{}.{}.{}", ns.view(), participant.view(), day);
}

result<void> check_subject(std::string_view subject) {
  return check_dotted("subject", subject, false);
}

result<void> check_filter(std::string_view filter) {
  return check_dotted("filter", filter, true);
}

result<void> check_stream_name(std::string_view name) {
  return check_stream_like("stream name", name);
}

result<void> check_consumer_name(std::string_view name) {
  return check_stream_like("consumer name", name);
}

result<void> check_bucket_name(std::string_view name) {
  constexpr std::string_view kind = "bucket name";
  if (name.empty()) return invalid(fmt::format("{} is empty", kind));
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (is_alnum(c) || c == '_' || c == '-') continue;
    return invalid(fmt::format("{} {}: {} at position {} (allowed: A-Z, a-z, 0-9, '_', '-')", kind,
                               quoted(name), describe_byte(c), i));
  }
  if (name.size() > max_bucket_name_length) {
    return invalid(fmt::format("{} {}: is {} bytes (at most {})", kind, quoted(name), name.size(),
                               max_bucket_name_length));
  }
  return {};
}

result<void> check_kv_key(std::string_view key) {
  constexpr std::string_view kind = "key";
  if (key.empty()) return invalid(fmt::format("{} is empty", kind));
  for (std::size_t i = 0; i < key.size(); ++i) {
    const char c = key[i];
    if (c == '.') {
      const bool leading = i == 0;
      const bool trailing = i + 1 == key.size();
      if (leading || trailing || key[i + 1] == '.') {
        const auto pos = leading ? i : i + 1;
        return invalid(fmt::format("{} {}: empty token at position {}{}", kind, quoted(key), pos,
                                   leading    ? " (a leading '.')"
                                   : trailing ? " (a trailing '.')"
                                              : ""));
      }
      continue;
    }
    if (is_alnum(c) || c == '-' || c == '/' || c == '_' || c == '=') continue;
    return invalid(
        fmt::format("{} {}: {} at position {} (allowed: A-Z, a-z, 0-9, '-', '/', '_', '=', '.')",
                    kind, quoted(key), describe_byte(c), i));
  }
  return {};
}

bool subject_matches(std::string_view filter, std::string_view subject) noexcept {
  token_reader f(filter);
  token_reader s(subject);
  while (!f.done()) {
    const auto want = f.next();
    if (want == ">" && f.done()) return !s.done();
    if (s.done()) return false;
    const auto got = s.next();
    if (want != "*" && want != got) return false;
  }
  return s.done();
}

bool filters_overlap(std::string_view a, std::string_view b) noexcept {
  token_reader x(a);
  token_reader y(b);
  while (!x.done() && !y.done()) {
    const auto p = x.next();
    const auto q = y.next();
    // A last '>' absorbs whatever the other filter has left, which is at least the token
    // just read.
    if ((p == ">" && x.done()) || (q == ">" && y.done())) return true;
    if (p != "*" && q != "*" && p != q) return false;
  }
  return x.done() && y.done();
}

}  // namespace amp::subjects

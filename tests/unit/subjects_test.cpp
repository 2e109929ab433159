#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <random>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "amp/names.hpp"
#include "amp/subjects.hpp"

namespace subjects = amp::subjects;

namespace {

template <class T>
T must(std::string_view value) {
  auto r = T::make(value);
  INFO("value: " << amp::quoted(value));
  REQUIRE(r.has_value());
  return std::move(r).value();
}

bool printable_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u < 0x7f;
  });
}

// Runs a check, and when it fails, requires invalid_name and a printable message.
bool passes(const amp::result<void>& r) {
  if (r.has_value()) return true;
  INFO("message: " << r.error().message());
  REQUIRE(r.error().code() == amp::errc::invalid_name);
  REQUIRE(printable_ascii(r.error().message()));
  return false;
}

std::string message_of(const amp::result<void>& r) {
  REQUIRE_FALSE(r.has_value());
  REQUIRE(r.error().code() == amp::errc::invalid_name);
  REQUIRE(printable_ascii(r.error().message()));
  return r.error().message();
}

// What JetStream refuses in stream, consumer and bucket names.
bool clean_jetstream_name(std::string_view s) {
  return !s.empty() && std::none_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return c == '.' || c == '*' || c == '>' || c == '/' || c == '\\' || u <= 0x20 || u >= 0x7f;
  });
}

constexpr std::string_view lower = "abcdefghijklmnopqrstuvwxyz";
constexpr std::string_view body = "abcdefghijklmnopqrstuvwxyz0123456789_-";
constexpr std::string_view lower_digit = "abcdefghijklmnopqrstuvwxyz0123456789";

std::string random_from(std::mt19937& rng, std::string_view first, std::string_view rest,
                        std::size_t length) {
  std::string s;
  s += first[std::uniform_int_distribution<std::size_t>(0, first.size() - 1)(rng)];
  while (s.size() < length) {
    s += rest[std::uniform_int_distribution<std::size_t>(0, rest.size() - 1)(rng)];
  }
  return s;
}

}  // namespace

TEST_CASE("the NATS mapping spells streams, subjects, consumers and keys as documented",
          "[subjects]") {
  const auto ns = must<amp::namespace_name>("demo");
  const auto bob = must<amp::participant_name>("bob");
  const auto resize = must<amp::job_name>("resize");
  const auto news = must<amp::topic>("news.eu");
  const auto all_news = must<amp::topic_pattern>("news.>");
  const auto task = must<amp::task_id>("t_01abc");

  REQUIRE(subjects::inbox_stream(ns) == "AMP_INBOX_demo");
  REQUIRE(subjects::inbox_subjects(ns) == "amp.demo.inbox.*");
  REQUIRE(subjects::inbox_subject(ns, bob) == "amp.demo.inbox.bob");
  REQUIRE(subjects::inbox_consumer(bob) == "inbox_bob");

  REQUIRE(subjects::tasks_stream(ns) == "AMP_TASKS_demo");
  REQUIRE(subjects::job_subjects(ns) == "amp.demo.job.*");
  REQUIRE(subjects::job_subject(ns, resize) == "amp.demo.job.resize");
  REQUIRE(subjects::job_consumer(resize) == "job_resize");

  REQUIRE(subjects::ended_stream(ns) == "AMP_ENDED_demo");
  REQUIRE(subjects::ended_subject(ns) == "amp.demo.task.ended");
  REQUIRE(subjects::sweeper_consumer() == "sweeper");

  REQUIRE(subjects::operations_stream(ns) == "AMP_OPS_demo");
  REQUIRE(subjects::operation_due_subject(ns) == "amp.demo.operation.due");
  REQUIRE(subjects::deadlines_consumer() == "deadlines");
  REQUIRE(subjects::operation_key(ns, must<amp::operation_id>("o_01abc")) == "demo.o_01abc");

  const auto archive = must<amp::sink_name>("archive");
  REQUIRE(subjects::dlq_stream(ns) == "AMP_DLQ_demo");
  REQUIRE(subjects::dlq_subjects(ns) == "amp.demo.dlq.*");
  REQUIRE(subjects::dlq_subject(ns, archive) == "amp.demo.dlq.archive");
  CHECK(subjects::subject_matches(subjects::dlq_subjects(ns), subjects::dlq_subject(ns, archive)));

  // Core messages between gateways: no stream of the namespace may capture them.
  REQUIRE(subjects::task_control_subject(ns) == "amp.demo.ctl.tasks");
  REQUIRE(subjects::inbox_control_subjects(ns) == "amp.demo.ctl.inbox.*");
  REQUIRE(subjects::inbox_control_subject(ns, bob) == "amp.demo.ctl.inbox.bob");
  CHECK(subjects::subject_matches(subjects::inbox_control_subjects(ns),
                                  subjects::inbox_control_subject(ns, bob)));
  REQUIRE(subjects::work_control_subject(ns) == "amp.demo.ctl.work");
  REQUIRE(subjects::work_offer_subject(ns, "0a1b") == "amp.demo.ctl.work.0a1b");
  REQUIRE(subjects::operation_control_subject(ns) == "amp.demo.ctl.operations");
  for (const auto& control :
       {subjects::task_control_subject(ns), subjects::inbox_control_subjects(ns),
        subjects::work_control_subject(ns), subjects::work_offer_subject(ns, "0a1b"),
        subjects::operation_control_subject(ns)}) {
    for (const auto& captured : {subjects::inbox_subjects(ns), subjects::job_subjects(ns),
                                 subjects::ended_subject(ns), subjects::topic_subjects(ns),
                                 subjects::operation_due_subject(ns), subjects::dlq_subjects(ns)}) {
      CHECK_FALSE(subjects::filters_overlap(captured, control));
    }
  }
  CHECK_FALSE(subjects::filters_overlap(subjects::task_control_subject(ns),
                                        subjects::inbox_control_subjects(ns)));
  CHECK_FALSE(subjects::filters_overlap(subjects::work_control_subject(ns),
                                        subjects::work_offer_subject(ns, "0a1b")));
  CHECK_FALSE(subjects::filters_overlap(subjects::inbox_control_subjects(ns),
                                        subjects::work_offer_subject(ns, "0a1b")));

  REQUIRE(subjects::topics_stream(ns) == "AMP_TOPICS_demo");
  REQUIRE(subjects::topic_subjects(ns) == "amp.demo.topic.>");
  REQUIRE(subjects::topic_subject(ns, news) == "amp.demo.topic.news.eu");
  REQUIRE(subjects::topic_filter(ns, all_news) == "amp.demo.topic.news.>");
  REQUIRE(subjects::topic_filter(ns, must<amp::topic_pattern>(">")) ==
          subjects::topic_subjects(ns));

  REQUIRE(subjects::registry_bucket(ns) == "AMP_REGISTRY_demo");
  REQUIRE(subjects::registry_key(bob) == "bob");
  REQUIRE(subjects::task_state_bucket() == "AMP_TASK_STATE");
  REQUIRE(subjects::task_key(ns, task) == "demo.t_01abc");
}

TEST_CASE("every name the mapping builds passes the NATS syntax checks", "[subjects]") {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<std::size_t> length(1, 64);
  std::uniform_int_distribution<std::size_t> tokens(1, 8);
  std::uniform_int_distribution<int> percent(0, 99);
  for (int i = 0; i < 300; ++i) {
    // Names at the edges of the grammar: 1 or 64 characters, full of '-' and '_'.
    const std::size_t len = i % 3 == 0   ? std::size_t{64}
                            : i % 3 == 1 ? std::size_t{1}
                                         : length(rng);
    const auto ns = must<amp::namespace_name>(random_from(rng, lower, body, len));
    const auto p = must<amp::participant_name>(random_from(rng, lower, body, length(rng)));
    const auto j = must<amp::job_name>(random_from(rng, lower, "_-", length(rng)));
    const auto task =
        must<amp::task_id>("t_" + random_from(rng, lower_digit, lower_digit, length(rng) % 62 + 1));
    std::string t_text, p_text;
    const auto n = tokens(rng);
    for (std::size_t k = 0; k < n; ++k) {
      const auto token = random_from(rng, lower_digit, body, length(rng));
      t_text += (k ? "." : "") + token;
      const int roll = percent(rng);
      p_text += (k ? "." : "") + (roll < 25                 ? std::string("*")
                                  : k + 1 == n && roll < 50 ? std::string(">")
                                                            : token);
    }
    const auto t = must<amp::topic>(t_text);
    const auto pattern = must<amp::topic_pattern>(p_text);
    INFO("ns " << ns.str() << ", participant " << p.str() << ", job " << j.str() << ", topic "
               << t.str() << ", pattern " << pattern.str());

    for (const auto& stream : {subjects::inbox_stream(ns), subjects::tasks_stream(ns),
                               subjects::topics_stream(ns), subjects::ended_stream(ns)}) {
      REQUIRE(passes(subjects::check_stream_name(stream)));
      REQUIRE(clean_jetstream_name(stream));
    }
    for (const auto& consumer : {subjects::inbox_consumer(p), subjects::job_consumer(j)}) {
      REQUIRE(passes(subjects::check_consumer_name(consumer)));
      REQUIRE(clean_jetstream_name(consumer));
    }
    for (const auto& bucket : {subjects::registry_bucket(ns), subjects::task_state_bucket()}) {
      REQUIRE(passes(subjects::check_bucket_name(bucket)));
      REQUIRE(passes(subjects::check_stream_name("KV_" + bucket)));
    }
    REQUIRE(passes(subjects::check_kv_key(subjects::registry_key(p))));
    REQUIRE(passes(subjects::check_kv_key(subjects::task_key(ns, task))));

    const auto inbox = subjects::inbox_subject(ns, p);
    const auto job = subjects::job_subject(ns, j);
    const auto event = subjects::topic_subject(ns, t);
    const auto filter = subjects::topic_filter(ns, pattern);
    for (const auto& s : {inbox, job, event}) REQUIRE(passes(subjects::check_subject(s)));
    for (const auto& f : {subjects::inbox_subjects(ns), subjects::job_subjects(ns),
                          subjects::topic_subjects(ns), inbox, job, event, filter}) {
      REQUIRE(passes(subjects::check_filter(f)));
    }

    // Each subject lands in its own stream and nowhere else.
    REQUIRE(subjects::subject_matches(subjects::inbox_subjects(ns), inbox));
    REQUIRE(subjects::subject_matches(subjects::job_subjects(ns), job));
    REQUIRE(subjects::subject_matches(subjects::topic_subjects(ns), event));
    REQUIRE_FALSE(subjects::subject_matches(subjects::job_subjects(ns), inbox));
    REQUIRE_FALSE(subjects::subject_matches(subjects::topic_subjects(ns), job));
    REQUIRE_FALSE(subjects::subject_matches(subjects::inbox_subjects(ns), event));

    // A subscription filter selects exactly the topics its pattern matches.
    REQUIRE(subjects::subject_matches(filter, event) == pattern.matches(t));
    REQUIRE(subjects::subject_matches(subjects::topic_filter(ns, pattern),
                                      subjects::topic_subject(ns, t)) == pattern.matches(t));

    // Topics come back from their subjects.
    auto back = subjects::topic_from_subject(ns, event);
    REQUIRE(back.has_value());
    REQUIRE(back.value() == t);
  }
}

TEST_CASE("streams of different namespaces and kinds never share a subject", "[subjects]") {
  const std::vector<std::string> names{
      "a", "a-b", "a_b", "ab", "inbox", "job", "topic", "amp", std::string(64, 'z')};
  std::vector<std::string> filters;
  for (const auto& n : names) {
    const auto ns = must<amp::namespace_name>(n);
    filters.push_back(subjects::inbox_subjects(ns));
    filters.push_back(subjects::job_subjects(ns));
    filters.push_back(subjects::topic_subjects(ns));
  }
  for (std::size_t i = 0; i < filters.size(); ++i) {
    for (std::size_t k = 0; k < filters.size(); ++k) {
      INFO(filters[i] << " vs " << filters[k]);
      REQUIRE(subjects::filters_overlap(filters[i], filters[k]) == (i == k));
    }
  }
  // Inbox consumers of different participants never overlap, so a work queue can hold both.
  const auto ns = must<amp::namespace_name>("demo");
  const auto a = subjects::inbox_subject(ns, must<amp::participant_name>("a"));
  const auto ab = subjects::inbox_subject(ns, must<amp::participant_name>("a-b"));
  REQUIRE_FALSE(subjects::filters_overlap(a, ab));
  REQUIRE(subjects::inbox_consumer(must<amp::participant_name>("a-b")) !=
          subjects::inbox_consumer(must<amp::participant_name>("a_b")));
}

TEST_CASE("topic_from_subject refuses subjects outside the namespace's topics", "[subjects]") {
  const auto ns = must<amp::namespace_name>("demo");
  for (const char* bad :
       {"amp.other.topic.news", "amp.demo.inbox.bob", "amp.demo.topic.", "amp.demo.topic",
        "amp.demo.topic.News", "amp.demo.topic.a..b", "amp.demo.topic.a.*", "amp.demo.topic.>", "",
        "amp.demox.topic.a", "amp.demo.topic.1.2.3.4.5.6.7.8.9"}) {
    INFO(bad);
    auto r = subjects::topic_from_subject(ns, bad);
    REQUIRE_FALSE(r.has_value());
    REQUIRE(r.error().code() == amp::errc::invalid_name);
    REQUIRE_THAT(r.error().message(), Catch::StartsWith("subject " + amp::quoted(bad) + ": "));
    REQUIRE(printable_ascii(r.error().message()));
  }
  REQUIRE_THAT(subjects::topic_from_subject(ns, "amp.other.topic.news").error().message(),
               Catch::Contains("not under \"amp.demo.topic.\""));
  REQUIRE_THAT(subjects::topic_from_subject(ns, "amp.demo.topic.News").error().message(),
               Catch::Contains("upper case 'N'"));
  REQUIRE(subjects::topic_from_subject(ns, "amp.demo.topic.a.b.c.d.e.f.g.h").value().str() ==
          "a.b.c.d.e.f.g.h");
}

TEST_CASE("check_subject and check_filter accept NATS syntax and say what is wrong", "[subjects]") {
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    const auto u = static_cast<unsigned char>(c);
    const bool printable = u > 0x20 && u < 0x7f;
    const std::string mid = std::string("a") + c + "b";
    INFO("byte " << b);
    REQUIRE(passes(subjects::check_subject(mid)) == (printable && c != '*' && c != '>'));
    REQUIRE(passes(subjects::check_filter(mid)) == (printable && c != '*' && c != '>'));
    const std::string whole = std::string("a.") + c + ".b";
    REQUIRE(passes(subjects::check_subject(whole)) ==
            (printable && c != '*' && c != '>' && c != '.'));
    REQUIRE(passes(subjects::check_filter(whole)) == (printable && c != '>' && c != '.'));
    const std::string last = std::string("a.") + c;
    REQUIRE(passes(subjects::check_filter(last)) == (printable && c != '.'));
  }
  REQUIRE(message_of(subjects::check_subject("")) == "subject is empty");
  REQUIRE(message_of(subjects::check_subject("a..b")) ==
          "subject \"a..b\": empty token at position 2");
  REQUIRE(message_of(subjects::check_subject(".a")) ==
          "subject \".a\": empty token at position 0 (a leading '.')");
  REQUIRE(message_of(subjects::check_subject("a.")) ==
          "subject \"a.\": empty token at position 2 (a trailing '.')");
  REQUIRE(message_of(subjects::check_subject("amp.demo.*")) ==
          "subject \"amp.demo.*\": wildcard '*' at position 9 not allowed in a subject (a "
          "concrete subject is needed)");
  REQUIRE_THAT(message_of(subjects::check_subject("a b")),
               Catch::Contains("whitespace ' ' at position 1 not allowed in a subject"));
  REQUIRE_THAT(message_of(subjects::check_subject("a\tb")), Catch::Contains("\"a\\tb\""));
  REQUIRE_THAT(message_of(subjects::check_subject("a\xc3\xa9")),
               Catch::Contains("non-ASCII byte '\\xc3' at position 1"));
  REQUIRE(passes(subjects::check_subject("AMP.Demo-1.$x_y")));
  REQUIRE(message_of(subjects::check_filter("")) == "filter is empty");
  REQUIRE(message_of(subjects::check_filter("a.>.b")) ==
          "filter \"a.>.b\": '>' at position 2 must be the last token");
  REQUIRE(message_of(subjects::check_filter("a.b*")) ==
          "filter \"a.b*\": '*' at position 3 must be a whole token");
  REQUIRE_THAT(message_of(subjects::check_filter("a.>>")), Catch::Contains("whole token"));
  REQUIRE(passes(subjects::check_filter(">")));
  REQUIRE(passes(subjects::check_filter("*")));
  REQUIRE(passes(subjects::check_filter("*.*.>")));
}

TEST_CASE("stream, consumer, bucket and key checks follow JetStream's rules", "[subjects]") {
  static const std::regex bucket_re("[a-zA-Z0-9_-]+");
  static const std::regex key_re("[-/_=.a-zA-Z0-9]+");
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    const auto u = static_cast<unsigned char>(c);
    for (const auto& s : {std::string(1, c), std::string("A") + c, std::string("A") + c + "z"}) {
      INFO("value " << amp::quoted(s));
      const bool stream_ok =
          u > 0x20 && u < 0x7f && std::string_view(".*>/\\").find(c) == std::string_view::npos;
      REQUIRE(passes(subjects::check_stream_name(s)) == stream_ok);
      REQUIRE(passes(subjects::check_consumer_name(s)) == stream_ok);
      REQUIRE(passes(subjects::check_bucket_name(s)) ==
              std::regex_match(s.begin(), s.end(), bucket_re));
      const bool key_ok = std::regex_match(s.begin(), s.end(), key_re) && s.front() != '.' &&
                          s.back() != '.' && s.find("..") == std::string::npos;
      REQUIRE(passes(subjects::check_kv_key(s)) == key_ok);
    }
  }
  REQUIRE(passes(subjects::check_stream_name(std::string(255, 'S'))));
  REQUIRE(message_of(subjects::check_stream_name(std::string(256, 'S'))) ==
          "stream name " + amp::quoted(std::string(256, 'S')) + ": is 256 bytes (at most 255)");
  REQUIRE(message_of(subjects::check_stream_name("")) == "stream name is empty");
  REQUIRE(message_of(subjects::check_stream_name("AMP.X")) ==
          "stream name \"AMP.X\": '.' at position 3 not allowed in a stream name");
  REQUIRE(message_of(subjects::check_consumer_name("a/b")) ==
          "consumer name \"a/b\": '/' at position 1 not allowed in a consumer name");
  REQUIRE_THAT(message_of(subjects::check_stream_name("a\\b")),
               Catch::Contains("'\\\\' at position 1"));
  REQUIRE_THAT(message_of(subjects::check_stream_name("a b")),
               Catch::Contains("whitespace ' ' at position 1"));

  REQUIRE(passes(subjects::check_bucket_name(std::string(252, 'B'))));
  REQUIRE_THAT(message_of(subjects::check_bucket_name(std::string(253, 'B'))),
               Catch::Contains("is 253 bytes (at most 252)"));
  REQUIRE(message_of(subjects::check_bucket_name("")) == "bucket name is empty");
  REQUIRE(message_of(subjects::check_bucket_name("KV.x")) ==
          "bucket name \"KV.x\": '.' at position 2 (allowed: A-Z, a-z, 0-9, '_', '-')");

  REQUIRE(message_of(subjects::check_kv_key("")) == "key is empty");
  REQUIRE(message_of(subjects::check_kv_key(".a")) ==
          "key \".a\": empty token at position 0 (a leading '.')");
  REQUIRE(message_of(subjects::check_kv_key("a.")) ==
          "key \"a.\": empty token at position 2 (a trailing '.')");
  REQUIRE(message_of(subjects::check_kv_key("a..b")) == "key \"a..b\": empty token at position 2");
  REQUIRE_THAT(message_of(subjects::check_kv_key("a*")), Catch::Contains("'*' at position 1"));
  REQUIRE(passes(subjects::check_kv_key("demo.t_1/x=y-Z")));
}

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == '.') {
      out.emplace_back();
    } else {
      out.back() += c;
    }
  }
  return out;
}

bool ref_match(const std::vector<std::string>& f, std::size_t i, const std::vector<std::string>& s,
               std::size_t j) {
  if (i == f.size()) return j == s.size();
  if (f[i] == ">" && i + 1 == f.size()) return j < s.size();
  if (j == s.size()) return false;
  return (f[i] == "*" || f[i] == s[j]) && ref_match(f, i + 1, s, j + 1);
}

// Every dotted string of 1..max_len tokens; `last` is the alphabet of the last token.
std::vector<std::string> all_dotted(const std::vector<std::string>& alphabet,
                                    const std::vector<std::string>& last, std::size_t max_len) {
  std::vector<std::string> out;
  std::vector<std::string> prefixes{""};
  for (std::size_t len = 1; len <= max_len; ++len) {
    std::vector<std::string> next;
    for (const auto& p : prefixes) {
      for (const auto& t : last) out.push_back(p + t);
      for (const auto& t : alphabet) next.push_back(p + t + ".");
    }
    prefixes = std::move(next);
  }
  return out;
}

}  // namespace

TEST_CASE("subject_matches and filters_overlap agree with brute force", "[subjects]") {
  // Filters of up to 3 tokens over {a, b, *, >}. Two filters that share a subject share
  // one of at most 3 tokens (a '>' needs one token, and a token outside {a, b} is as good
  // as "c"), so subjects of up to 4 tokens over {a, b, c} decide overlap exactly.
  const auto filters = all_dotted({"a", "b", "*"}, {"a", "b", "*", ">"}, 3);
  const auto subjects_list = all_dotted({"a", "b", "c"}, {"a", "b", "c"}, 4);
  REQUIRE(filters.size() == 52);
  std::vector<std::vector<bool>> match(filters.size(),
                                       std::vector<bool>(subjects_list.size(), false));
  std::size_t mismatches = 0;
  std::string first;
  for (std::size_t i = 0; i < filters.size(); ++i) {
    REQUIRE(passes(subjects::check_filter(filters[i])));
    const auto f = split(filters[i]);
    for (std::size_t j = 0; j < subjects_list.size(); ++j) {
      match[i][j] = ref_match(f, 0, split(subjects_list[j]), 0);
      if (subjects::subject_matches(filters[i], subjects_list[j]) != match[i][j] &&
          mismatches++ == 0) {
        first = filters[i] + " matches " + subjects_list[j];
      }
    }
  }
  for (std::size_t i = 0; i < filters.size(); ++i) {
    for (std::size_t k = 0; k < filters.size(); ++k) {
      bool expect = false;
      for (std::size_t j = 0; j < subjects_list.size() && !expect; ++j) {
        expect = match[i][j] && match[k][j];
      }
      if (subjects::filters_overlap(filters[i], filters[k]) != expect && mismatches++ == 0) {
        first = filters[i] + " overlaps " + filters[k];
      }
    }
  }
  INFO("first mismatch: " << first);
  REQUIRE(mismatches == 0);

  REQUIRE(subjects::filters_overlap("amp.demo.inbox.*", "amp.demo.inbox.bob"));
  REQUIRE(subjects::filters_overlap("amp.demo.>", "amp.*.inbox.bob"));
  REQUIRE_FALSE(subjects::filters_overlap("amp.demo.inbox.*", "amp.demo.inbox.bob.x"));
  REQUIRE_FALSE(subjects::filters_overlap("a.>", "a"));
  REQUIRE(subjects::subject_matches(">", "a.b.c.d.e.f.g.h.i.j.k"));
  REQUIRE_FALSE(subjects::subject_matches("a.>", "a"));
}

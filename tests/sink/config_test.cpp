#include <catch2/catch.hpp>

#include <fmt/format.h>

#include "amp/sink/config.hpp"
#include "amp/sink/target.hpp"
#include "amp/timestamp.hpp"

using namespace amp::sink;

namespace {

constexpr const char* k_minimal = R"({"name":"archive","source":{"ns":"demo","kind":"topics",
  "topics":["news.>"]},"targets":[{"kind":"sqlite","path":"a.db","table":"events"}]})";

std::string error_of(std::string_view json) {
  auto c = parse_sink_config(json);
  REQUIRE_FALSE(c);
  CHECK(c.error().code() == amp::errc::bad_request);
  return c.error().message();
}

}  // namespace

TEST_CASE("the spec's example configuration reads with every key as written", "[sink][config]") {
  auto c = parse_sink_config(R"({
    "nats": {"url": "nats://127.0.0.1:4222"},
    "http": "127.0.0.1:9090",
    "name": "archive",
    "source": {"ns": "demo", "kind": "topics", "topics": ["news.>"], "from": "all"},
    "batch": {"max_messages": 256, "max_wait_ms": 50},
    "idempotency": {"strategy": "stream_sequence", "field": null},
    "on_duplicate": "skip",
    "targets": [
      {"kind": "sqlite", "path": "archive.db", "table": "events", "required": true},
      {"kind": "postgres", "dsn": "host=127.0.0.1 port=5432 dbname=amp", "table": "events", "required": true},
      {"kind": "file", "dir": "archive/", "required": false}
    ],
    "dlq": {"max_failures": 5}
  })");
  REQUIRE(c);
  CHECK(c->name == "archive");
  CHECK(c->ns == "demo");
  CHECK(c->http == "127.0.0.1:9090");
  CHECK(c->topics == std::vector<std::string>{"news.>"});
  CHECK(c->from.from == start_position::kind::all);
  CHECK(c->max_messages == 256);
  CHECK(c->max_wait == std::chrono::milliseconds(50));
  CHECK(c->strategy == key_strategy::stream_sequence);
  CHECK(c->on_duplicate == duplicate_mode::skip);
  REQUIRE(c->targets.size() == 3);
  CHECK(c->targets[1].kind == target_kind::postgres);
  CHECK(c->targets[1].dsn == "host=127.0.0.1 port=5432 dbname=amp");
  CHECK_FALSE(c->targets[2].required);
  CHECK(c->max_failures == 5);
}

TEST_CASE("a minimal configuration takes the defaults", "[sink][config]") {
  auto c = parse_sink_config(k_minimal);
  REQUIRE(c);
  CHECK(c->nats.url == "nats://127.0.0.1:4222");
  CHECK_FALSE(c->http);
  CHECK(c->from.from == start_position::kind::all);
  CHECK(c->max_messages == 256);
  CHECK(c->strategy == key_strategy::stream_sequence);
  CHECK(c->on_duplicate == duplicate_mode::skip);
  CHECK(c->max_failures == 5);
  CHECK(c->targets.front().required);
}

TEST_CASE("from reads new, all, a sequence and a time", "[sink][config]") {
  sink_config c = parse_sink_config(k_minimal).value();
  REQUIRE(set_sink_config_value(c, "source.from", R"("new")"));
  CHECK(c.from.from == start_position::kind::new_messages);
  REQUIRE(set_sink_config_value(c, "source.from", R"({"seq":42})"));
  CHECK(c.from.from == start_position::kind::sequence);
  CHECK(c.from.seq == 42);
  REQUIRE(set_sink_config_value(c, "source.from", R"({"time":"2026-01-02T03:04:05Z"})"));
  CHECK(c.from.from == start_position::kind::time);
  CHECK(amp::format_timestamp(c.from.time) == "2026-01-02T03:04:05.000Z");
  auto bad = set_sink_config_value(c, "source.from", R"({"seq":0})");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message().find("source.from.seq") != std::string::npos);
  bad = set_sink_config_value(c, "source.from", R"("last")");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message().find("source.from: must be") != std::string::npos);
}

TEST_CASE("a bad configuration is refused with a message naming the key", "[sink][config]") {
  CHECK(error_of("{").find("not valid JSON") != std::string::npos);
  CHECK(error_of("[]").find("must be a JSON object") != std::string::npos);
  CHECK(error_of(R"({"nmae":"x"})").find("unknown key \"nmae\" (did you mean \"name\"?)") !=
        std::string::npos);
  CHECK(error_of(R"({"name":"archive","name":"b"})").find("duplicate key \"name\"") !=
        std::string::npos);
  CHECK(error_of(R"({"source":{"ns":"demo","kind":"topics","topics":["news.>"]},
    "targets":[{"kind":"sqlite","path":"a","table":"t"}]})")
            .find("name: is required") != std::string::npos);
  CHECK(error_of(R"({"name":"Archive","source":{"ns":"demo","kind":"topics","topics":[">"]},
    "targets":[{"kind":"sqlite","path":"a","table":"t"}]})")
            .find("name: ") == 0);
  CHECK(error_of(R"({"name":"a","batch":{"max_messages":0}})")
            .find("batch.max_messages: must be an integer from 1 to 10000, not 0") !=
        std::string::npos);
  CHECK(error_of(R"({"name":"a","dlq":{"max_failures":"5"}})")
            .find("dlq.max_failures: must be an integer from 1 to 1000, not \"5\"") !=
        std::string::npos);
  CHECK(error_of(R"({"name":"a","on_duplicate":"ignore"})")
            .find(R"(on_duplicate: must be "skip", "replace" or "fail", not "ignore")") !=
        std::string::npos);
  CHECK(error_of(R"({"name":"a","source":{"ns":"demo","kind":"topics","topics":["News"]},
    "targets":[{"kind":"sqlite","path":"a","table":"t"}]})")
            .find("source.topics/0: ") == 0);
  CHECK(error_of(R"({"name":"a","source":{"ns":"demo","kind":"topics"},
    "targets":[{"kind":"sqlite","path":"a","table":"t"}]})")
            .find("source.topics: is required") == 0);
  CHECK(error_of(R"({"name":"a","source":{"ns":"demo","kind":"tasks","topics":[">"]},
    "targets":[{"kind":"sqlite","path":"a","table":"t"}]})")
            .find("source.topics: must be null or absent") == 0);
  CHECK(error_of(R"({"name":"a","source":{"ns":"demo","kind":"topics","topics":[">"]},
    "idempotency":{"strategy":"payload_field"},
    "targets":[{"kind":"sqlite","path":"a","table":"t"}]})")
            .find("idempotency.field: is required") == 0);
  CHECK(error_of(R"({"name":"a","source":{"ns":"demo","kind":"topics","topics":[">"]},
    "targets":[{"kind":"sqlite","path":"a"}]})")
            .find("targets/0.table: is required for a sqlite target") == 0);
  CHECK(error_of(R"({"name":"a","source":{"ns":"demo","kind":"topics","topics":[">"]},
    "targets":[{"kind":"sqlite","path":"a","table":"events; DROP TABLE x"}]})")
            .find("targets/0.table: must match") == 0);
  CHECK(error_of(R"({"name":"a","source":{"ns":"demo","kind":"topics","topics":[">"]},
    "targets":[{"kind":"file","dir":"d","dsn":"x"}]})")
            .find("targets/0.dsn: is not a key of a file target") == 0);
  CHECK(error_of(R"({"name":"a","source":{"ns":"demo","kind":"topics","topics":[">"]},
    "targets":[{"kind":"file","dir":"d","required":false}]})")
            .find("targets: at least one target must be required") == 0);
  CHECK(error_of(R"({"name":"a","http":"9090","source":{"ns":"demo","kind":"topics","topics":[">"]},
    "targets":[{"kind":"file","dir":"d"}]})")
            .find("http: must be \"host:port\"") == 0);
  CHECK(error_of(R"({"name":"a","http":"127.0.0.1:99999","source":{"ns":"demo","kind":"topics",
    "topics":[">"]},"targets":[{"kind":"file","dir":"d"}]})")
            .find("http: must be") == 0);
  CHECK(error_of(R"({"name":"a","targets":[{"kind":"kafka"}]})")
            .find(R"(targets/0.kind: must be "sqlite", "postgres" or "file", not "kafka")") !=
        std::string::npos);
}

TEST_CASE("an override sets one key and leaves the configuration as it was on error",
          "[sink][config]") {
  sink_config c = parse_sink_config(k_minimal).value();
  REQUIRE(set_sink_config_value(c, "batch.max_messages", "16"));
  CHECK(c.max_messages == 16);
  REQUIRE(set_sink_config_value(c, "nats.url", R"("nats://10.0.0.1:4222")"));
  CHECK(c.nats.url == "nats://10.0.0.1:4222");
  const auto before = c;
  auto bad = set_sink_config_value(c, "batch.max_messages", "many");
  REQUIRE_FALSE(bad);
  CHECK(bad.error().message().find("write a string in double quotes") != std::string::npos);
  CHECK(c == before);
  bad = set_sink_config_value(c, "batch..max", "1");
  REQUIRE_FALSE(bad);
  CHECK(c == before);
}

TEST_CASE("a key becomes a safe file name, deterministically and without collisions",
          "[sink][files]") {
  CHECK(safe_file_name("AMP_TOPICS_demo:42") == "AMP_TOPICS_demo%3A42");
  CHECK(safe_file_name("order-17.v2") == "order-17.v2");
  CHECK(safe_file_name(".hidden") == "%2Ehidden");
  CHECK(safe_file_name("..") == "%2E.");
  CHECK(safe_file_name("a/b") == "a%2Fb");
  CHECK(safe_file_name("%2F") == "%252F");
  CHECK(safe_file_name("a/b") != safe_file_name("a%2Fb"));
  const std::string long_key(300, 'x');
  const auto name = safe_file_name(long_key);
  CHECK(name.size() == 120 + 1 + 64);
  CHECK(name == safe_file_name(long_key));
  CHECK(name != safe_file_name(long_key + "y"));
  CHECK(name.substr(0, 121) == std::string(120, 'x') + "~");
}

TEST_CASE("idempotency.field is checked as a JSON Pointer when the configuration is read",
          "[sink][config]") {
  auto with_field = [](std::string_view field) {
    return fmt::format(R"({{"name":"a","source":{{"ns":"demo","kind":"topics","topics":[">"]}},
      "idempotency":{{"strategy":"payload_field","field":{}}},
      "targets":[{{"kind":"sqlite","path":"a.db","table":"t"}}]}})",
                       field);
  };
  for (const auto* ok : {R"("")", R"("/order")", R"("/a~1b/c~0d")", R"("/items/0")", R"("/")"}) {
    INFO(ok);
    CHECK(parse_sink_config(with_field(ok)));
  }
  for (const auto* bad : {R"("/a~2b")", R"("/a~")", R"("order")", R"(7)"}) {
    INFO(bad);
    CHECK(error_of(with_field(bad)).find("idempotency.field: must be a JSON Pointer") == 0);
  }
}

TEST_CASE("a configuration file may start with a byte order mark, and bad JSON is said once",
          "[sink][config]") {
  CHECK(parse_sink_config(std::string("\xEF\xBB\xBF") + k_minimal));
  const auto e = error_of("{");
  CHECK(e.find("not valid JSON: ") == 0);
  CHECK(e.find("not valid JSON", 1) == std::string::npos);
}

// The JSON Schemas of the amp.v1 frames (schemas/frames/, spec amp-ws-v1.md): one shape
// schema per client op (`frames/<op>`, bad_request), the names pass (`frames/names`,
// invalid_name) and the server frames (`frames/server/<op>`).
//
// Valid frames are the spec's examples, copied literally where they are JSON; where the spec
// writes a placeholder that is not JSON (`"body":…`, `{…}`), a concrete value stands in.

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "amp/detail/embedded_schemas.hpp"
#include "amp/json.hpp"
#include "amp/names.hpp"
#include "amp/schema.hpp"
#include "amp/timestamp.hpp"

namespace {

const char* const client_ops[] = {
    "hello", "register", "heartbeat", "who",         "watch",  "bye",       "send",    "ack",
    "nack",  "publish",  "subscribe", "unsubscribe", "submit", "claim",     "decline", "complete",
    "fail",  "cancel",   "task",      "scatter",     "reply",  "operation", "retry",
};
const char* const server_ops[] = {
    "ok",       "error",      "message",   "event",       "offer",
    "presence", "lease_lost", "cancelled", "sub_dropped",
};

amp::json_schema schema(std::string_view name) {
  auto s = amp::json_schema::embedded(name);
  if (!s) {
    FAIL(std::string(name) + ": " + s.error().to_string());
  }
  return *s;
}

// What the gateway answers a frame with, as far as the schemas decide it: the shape
// pass first (bad_request), then the names pass (invalid_name), each with its pointer.
enum class verdict { ok, bad_request, invalid_name };

struct outcome {
  verdict v = verdict::ok;
  std::string path;
};

std::string to_string(const outcome& o) {
  switch (o.v) {
    case verdict::ok: return "ok";
    case verdict::bad_request: return "bad_request at '" + o.path + "'";
    case verdict::invalid_name: return "invalid_name at '" + o.path + "'";
  }
  return "?";
}

outcome two_passes(std::string_view op, std::string_view frame) {
  for (auto [name, v] : {std::pair{"frames/" + std::string(op), verdict::bad_request},
                         std::pair{std::string("frames/names"), verdict::invalid_name}}) {
    auto r = schema(name).validate(frame);
    if (!r) {
      const amp::error& e = r.error();
      INFO(name << ": " << e.to_string());
      REQUIRE(e.code() == amp::errc::invalid_envelope);  // what a schema mismatch is
      REQUIRE_THAT(e.message(), Catch::StartsWith("at "));
      return {v, e.path()};
    }
  }
  return {};
}

struct frame_case {
  std::string frame;
  verdict expect = verdict::ok;
  std::string path = "";
};

void check_frames(std::string_view op, std::initializer_list<frame_case> cases) {
  for (const auto& c : cases) {
    INFO("op " << op << ": " << c.frame);
    const outcome got = two_passes(op, c.frame);
    CHECK(to_string(got) == to_string(outcome{c.expect, c.path}));
  }
}

constexpr verdict bad = verdict::bad_request;       // the shape pass refuses it
constexpr verdict badname = verdict::invalid_name;  // the names pass refuses it

std::string repeat(std::string_view s, std::size_t n) {
  std::string out;
  out.reserve(s.size() * n);
  for (std::size_t i = 0; i < n; ++i) {
    out += s;
  }
  return out;
}

// `frame` with `"<key>":<value>` added as its last member (value is JSON text).
std::string with(std::string frame, std::string_view key, std::string_view value) {
  frame.pop_back();  // the closing brace
  frame += ",";
  frame += amp::json_quote(key);
  frame += ":";
  frame += value;
  frame += "}";
  return frame;
}

std::filesystem::path schemas_dir() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "schemas";
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

// ---- the embedded set -------------------------------------------------------------------

TEST_CASE("the frame schemas are embedded, named by their path under schemas/", "[frames]") {
  std::set<std::string> expected = {"envelope", "frames/names"};
  for (const char* op : client_ops) {
    expected.insert(std::string("frames/") + op);
  }
  for (const char* op : server_ops) {
    expected.insert(std::string("frames/server/") + op);
  }
  std::set<std::string> embedded;
  for (const auto& s : amp::detail::embedded_schemas()) {
    embedded.emplace(s.name);
  }
  CHECK(embedded == expected);

  REQUIRE(amp::json_schema::embedded("frames/send").has_value());
  REQUIRE(amp::json_schema::embedded("frames/server/offer").has_value());
  REQUIRE(amp::json_schema::embedded("envelope").has_value());
  for (const char* missing : {"send", "frames/send.json", "server/offer", "frames/server"}) {
    auto r = amp::json_schema::embedded(missing);
    REQUIRE_FALSE(r.has_value());
    REQUIRE(r.error().code() == amp::errc::not_found);
  }
}

TEST_CASE("every schema file under schemas/ parses and is embedded as it is", "[frames]") {
  const auto root = schemas_dir();
  REQUIRE(std::filesystem::is_directory(root));
  std::size_t files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (!entry.is_regular_file() || entry.path().extension() != ".json") {
      continue;
    }
    ++files;
    const std::string text = read_file(entry.path());
    auto name = std::filesystem::relative(entry.path(), root).replace_extension().generic_string();
    INFO(name);
    auto parsed = amp::json_schema::parse(text);
    if (!parsed) {
      FAIL(parsed.error().to_string());
    }
    bool found = false;
    for (const auto& s : amp::detail::embedded_schemas()) {
      if (s.name == name) {
        found = true;
        CHECK(s.text == text);
      }
    }
    CHECK(found);
  }
  CHECK(files == amp::detail::embedded_schemas().size());
}

// ---- client frames: shape (bad_request), then names (invalid_name) ----------------------

TEST_CASE("frame schemas: the request id is a string of at most 64 characters or an integer",
          "[frames]") {
  for (const char* op : client_ops) {
    CAPTURE(op);
    // `bye` and `watch` take nothing else; a minimal valid frame of each op:
    std::string base = std::string(R"({"op":")") + op + "\"}";
    const std::string_view o = op;
    if (o == "hello") base = R"({"op":"hello","token":"x"})";
    if (o == "register") base = R"({"op":"register","jobs":[]})";
    if (o == "send") base = R"({"op":"send","to":"bob","body":1})";
    if (o == "ack" || o == "nack") base = with(base, "seq", "1");
    if (o == "publish") base = R"({"op":"publish","topic":"a","body":1})";
    if (o == "subscribe") base = R"({"op":"subscribe","topic":"a"})";
    if (o == "unsubscribe") base = R"({"op":"unsubscribe","sub":"s1"})";
    if (o == "submit") base = R"({"op":"submit","job":"j","body":1})";
    if (o == "claim" || o == "decline" || o == "complete" || o == "cancel" || o == "task") {
      base = with(base, "task", R"("t_1")");
    }
    if (o == "fail") base = R"({"op":"fail","task":"t_1","error":{"code":"x","message":""}})";
    if (o == "scatter") base = R"({"op":"scatter","to":["bob"]})";
    if (o == "reply") base = R"({"op":"reply","operation":"o_1","attempt":1})";
    if (o == "operation") base = R"({"op":"operation","operation":"o_1"})";
    if (o == "retry") base = R"({"op":"retry","operation":"o_1","member":"bob"})";

    check_frames(op, {
                         {base},
                         {with(base, "id", "1")},
                         {with(base, "id", "0")},
                         {with(base, "id", "-7")},
                         {with(base, "id", "9007199254740991")},
                         {with(base, "id", R"("")")},
                         {with(base, "id", R"("req-1")")},
                         {with(base, "id", amp::json_quote(std::string(64, 'x')))},
                         {with(base, "id", amp::json_quote(repeat("\xc3\xa9", 64)))},  // é
                         {with(base, "id", amp::json_quote(std::string(65, 'x'))), bad, "/id"},
                         {with(base, "id", "1.5"), bad, "/id"},
                         {with(base, "id", "9007199254740992"), bad, "/id"},
                         {with(base, "id", "null"), bad, "/id"},
                         {with(base, "id", "true"), bad, "/id"},
                         {with(base, "id", "[1]"), bad, "/id"},
                         {with(base, "id", R"({"n":1})"), bad, "/id"},
                         {with(base, "unknown", R"({"x":[1,2]})")},
                     });
    // The op is a constant of its schema; not an object at all is refused at the root.
    CHECK(to_string(two_passes(op, R"({"op":"nope"})")).starts_with("bad_request at '"));
    CHECK(to_string(two_passes(op, "[]")) == "bad_request at ''");
  }
}

TEST_CASE("frame schemas: hello", "[frames]") {
  check_frames("hello", {
                            {R"({"op":"hello","id":1,"token":"<JWT>"})"},
                            {R"({"op":"hello","token":""})"},  // unauthenticated, later
                            {R"({"op":"hello","id":1})", bad, "/token"},
                            {R"({"op":"hello","id":1,"token":42})", bad, "/token"},
                            {R"({"op":"hello","id":1,"token":null})", bad, "/token"},
                            {R"({"op":"hello","id":1,"token":["a"]})", bad, "/token"},
                            {R"({"id":1,"token":"x"})", bad, "/op"},
                        });
}

TEST_CASE("frame schemas: register", "[frames]") {
  check_frames("register", {
                               {R"({"op":"register","id":2,"jobs":["resize"],"slots":4,)"
                                R"("meta":{"gpu":"a100","zone":["eu"]}})"},
                               {R"({"op":"register","jobs":[]})"},
                               {R"({"op":"register","jobs":["a","b"],"slots":0})"},
                               {R"({"op":"register","jobs":["a"],"slots":1024,"meta":{}})"},
                               {R"({"op":"register","id":2})", bad, "/jobs"},
                               {R"({"op":"register","jobs":"resize"})", bad, "/jobs"},
                               {R"({"op":"register","jobs":[1]})", bad, "/jobs/0"},
                               {R"({"op":"register","jobs":["a",null]})", bad, "/jobs/1"},
                               {R"({"op":"register","jobs":["a"],"slots":1025})", bad, "/slots"},
                               {R"({"op":"register","jobs":["a"],"slots":-1})", bad, "/slots"},
                               {R"({"op":"register","jobs":["a"],"slots":1.5})", bad, "/slots"},
                               {R"({"op":"register","jobs":["a"],"slots":"4"})", bad, "/slots"},
                               {R"({"op":"register","jobs":["a"],"meta":[]})", bad, "/meta"},
                               {R"({"op":"register","jobs":["a"],"meta":"x"})", bad, "/meta"},
                               {R"({"op":"register","jobs":["a","Resize"]})", badname, "/jobs/1"},
                               {R"({"op":"register","jobs":["*"]})", badname, "/jobs/0"},
                               {R"({"op":"register","jobs":[""]})", badname, "/jobs/0"},
                           });
}

TEST_CASE("frame schemas: heartbeat, who, watch, bye", "[frames]") {
  check_frames("heartbeat", {
                                {R"({"op":"heartbeat","id":3})"},
                                {R"({"op":"heartbeat","id":4,"task":"t_…"})", badname, "/task"},
                                {R"({"op":"heartbeat","id":4,"task":"t_0k3v9z"})"},
                                {R"({"op":"heartbeat","id":4,"task":7})", bad, "/task"},
                                {R"({"op":"heartbeat","id":4,"task":"T_abc"})", badname, "/task"},
                                {R"({"op":"heartbeat","id":4,"task":"t_"})", badname, "/task"},
                            });
  check_frames("who", {
                          {R"({"op":"who","id":5,"job":"resize"})"},
                          {R"({"op":"who","id":5})"},
                          {R"({"op":"who","id":5,"job":["resize"]})", bad, "/job"},
                          {R"({"op":"who","id":5,"job":"re size"})", badname, "/job"},
                      });
  check_frames("watch", {
                            {R"({"op":"watch","id":6})"},
                            {R"({"op":"watch"})"},
                        });
  check_frames("bye", {
                          {R"({"op":"bye"})"},
                          {R"({"op":"bye","id":"last","reason":"done"})"},
                      });
}

TEST_CASE("frame schemas: send", "[frames]") {
  check_frames(
      "send",
      {
          {R"({"op":"send","id":7,"to":"bob","body":{"pr":42},"type":"review.request",)"
           R"("headers":{"k":"v"},"msg_id":"…","reply_to":"alice","correlation":"c-1"})"},
          {R"({"op":"send","to":"bob","body":null})"},
          {R"({"op":"send","to":"bob","body":[1,"two",{"three":3}]})"},
          {R"({"op":"send","to":"bob","body":"text","from":"mallory"})"},  // ignored
          {R"({"op":"send","to":"bob","body":1,"from":42})"},
          {R"({"op":"send","to":"bob","body":1,"headers":{}})"},
          {R"({"op":"send","id":7,"body":1})", bad, "/to"},
          {R"({"op":"send","id":7,"to":"bob"})", bad, "/body"},
          {R"({"op":"send","id":7,"to":42,"body":1})", bad, "/to"},
          {R"({"op":"send","id":7,"to":null,"body":1})", bad, "/to"},
          {R"({"op":"send","id":7,"to":["bob"],"body":1})", bad, "/to"},
          {R"({"op":"send","to":"bob","body":1,"type":5})", bad, "/type"},
          {R"({"op":"send","to":"bob","body":1,"headers":[]})", bad, "/headers"},
          {R"({"op":"send","to":"bob","body":1,"headers":{"k":1}})", bad, "/headers/k"},
          {R"({"op":"send","to":"bob","body":1,"headers":{"a/b":null}})", bad, "/headers/a~1b"},
          {R"({"op":"send","to":"bob","body":1,"msg_id":1})", bad, "/msg_id"},
          {R"({"op":"send","to":"bob","body":1,"reply_to":false})", bad, "/reply_to"},
          {R"({"op":"send","to":"bob","body":1,"correlation":{}})", bad, "/correlation"},
          // A string is the right type: the name is wrong, which is decided later.
          {R"({"op":"send","id":7,"to":"Bob","body":1})", badname, "/to"},
          {R"({"op":"send","id":7,"to":"$broker","body":1})", badname, "/to"},
          {R"({"op":"send","id":7,"to":"","body":1})", badname, "/to"},
          {R"({"op":"send","id":7,"to":"bob.smith","body":1})", badname, "/to"},
          {R"({"op":"send","id":7,"to":"*","body":1})", badname, "/to"},
          {R"({"op":"send","id":7,"to":" bob","body":1})", badname, "/to"},
          {R"({"op":"send","to":"bob","body":1,"reply_to":"Alice"})", badname, "/reply_to"},
          // Shape first: a mistyped field wins over a bad name.
          {R"({"op":"send","to":"Bob","body":1,"type":5})", bad, "/type"},
          // Envelope rules (type grammar, header limits) are neither pass's business.
          {R"({"op":"send","to":"bob","body":1,"type":"no spaces allowed","msg_id":""})"},
      });
}

TEST_CASE("frame schemas: ack and nack", "[frames]") {
  check_frames("ack", {
                          {R"({"op":"ack","seq":17})"},
                          {R"({"op":"ack","id":"a","seq":9007199254740991})"},
                          {R"({"op":"ack"})", bad, "/seq"},
                          {R"({"op":"ack","seq":0})", bad, "/seq"},
                          {R"({"op":"ack","seq":-1})", bad, "/seq"},
                          {R"({"op":"ack","seq":1.5})", bad, "/seq"},
                          {R"({"op":"ack","seq":"17"})", bad, "/seq"},
                          {R"({"op":"ack","seq":9007199254740992})", bad, "/seq"},
                      });
  check_frames("nack", {
                           {R"({"op":"nack","seq":17,"delay_ms":1000})"},
                           {R"({"op":"nack","seq":17})"},
                           {R"({"op":"nack","seq":17,"delay_ms":0})"},
                           {R"({"op":"nack","delay_ms":1000})", bad, "/seq"},
                           {R"({"op":"nack","seq":17,"delay_ms":-1})", bad, "/delay_ms"},
                           {R"({"op":"nack","seq":17,"delay_ms":"1000"})", bad, "/delay_ms"},
                           {R"({"op":"nack","seq":17,"delay_ms":0.5})", bad, "/delay_ms"},
                       });
}

TEST_CASE("frame schemas: publish", "[frames]") {
  check_frames(
      "publish",
      {
          {R"({"op":"publish","id":8,"topic":"news.eu","body":{"headline":"…"},)"
           R"("type":"news.item","headers":{"lang":"en"},"msg_id":"m-1"})"},
          {R"({"op":"publish","topic":"a.b.c.d.e.f.g.h","body":0})"},
          {R"({"op":"publish","topic":"0.news_x.eu-1","body":0})"},
          {R"({"op":"publish","id":8,"body":{}})", bad, "/topic"},
          {R"({"op":"publish","id":8,"topic":"news.eu"})", bad, "/body"},
          {R"({"op":"publish","id":8,"topic":["news"],"body":{}})", bad, "/topic"},
          {R"({"op":"publish","id":8,"topic":"news.eu","body":{},"headers":{"k":[]}})", bad,
           "/headers/k"},
          {R"({"op":"publish","id":8,"topic":"news.*","body":{}})", badname, "/topic"},
          {R"({"op":"publish","id":8,"topic":"news.>","body":{}})", badname, "/topic"},
          {R"({"op":"publish","id":8,"topic":"News.eu","body":{}})", badname, "/topic"},
          {R"({"op":"publish","id":8,"topic":"news..eu","body":{}})", badname, "/topic"},
          {R"({"op":"publish","id":8,"topic":"news.","body":{}})", badname, "/topic"},
          {R"({"op":"publish","id":8,"topic":"a.b.c.d.e.f.g.h.i","body":{}})", badname, "/topic"},
      });
}

TEST_CASE("frame schemas: subscribe and unsubscribe", "[frames]") {
  check_frames(
      "subscribe",
      {
          {R"({"op":"subscribe","id":9,"topic":"news.>","sub":"s1","from":"new"})"},
          {R"({"op":"subscribe","id":9,"topic":"news.>","from":"all"})"},
          {R"({"op":"subscribe","id":9,"topic":"news.*","from":"last"})"},
          {R"({"op":"subscribe","id":9,"topic":">","from":{"seq":1}})"},
          {R"({"op":"subscribe","topic":"news.eu","from":{"seq":9007199254740991}})"},
          {R"({"op":"subscribe","topic":"*.eu","from":{"time":"2026-11-30T12:00:00.123Z"}})"},
          {R"({"op":"subscribe","topic":"a","from":{"time":"2026-11-30t12:00:00z"}})"},
          {R"({"op":"subscribe","topic":"a","from":{"time":"2026-11-30T12:00:00.123456789+02:00"}})"},
          {R"({"op":"subscribe","topic":"a.b.c.d.e.f.g.>"})"},
          {R"({"op":"subscribe","id":9,"sub":"s1"})", bad, "/topic"},
          {R"({"op":"subscribe","topic":1})", bad, "/topic"},
          {R"({"op":"subscribe","topic":"a","sub":1})", bad, "/sub"},
          {R"({"op":"subscribe","topic":"a","from":"old"})", bad, "/from"},
          {R"({"op":"subscribe","topic":"a","from":"NEW"})", bad, "/from"},
          {R"({"op":"subscribe","topic":"a","from":5})", bad, "/from"},
          {R"({"op":"subscribe","topic":"a","from":null})", bad, "/from"},
          {R"({"op":"subscribe","topic":"a","from":["new"]})", bad, "/from"},
          {R"({"op":"subscribe","topic":"a","from":{}})", bad, "/from"},
          {R"({"op":"subscribe","topic":"a","from":{"seq":0}})", bad, "/from/seq"},
          {R"({"op":"subscribe","topic":"a","from":{"seq":"1"}})", bad, "/from/seq"},
          {R"({"op":"subscribe","topic":"a","from":{"seq":1.5}})", bad, "/from/seq"},
          {R"({"op":"subscribe","topic":"a","from":{"sq":1}})", bad, "/from/sq"},
          {R"({"op":"subscribe","topic":"a","from":{"seq":1,"time":"2026-11-30T12:00:00Z"}})", bad,
           "/from"},
          {R"({"op":"subscribe","topic":"a","from":{"time":"yesterday"}})", bad, "/from/time"},
          {R"({"op":"subscribe","topic":"a","from":{"time":"2026-11-30 12:00:00Z"}})", bad,
           "/from/time"},
          {R"({"op":"subscribe","topic":"a","from":{"time":"2026-13-01T12:00:00Z"}})", bad,
           "/from/time"},
          {R"({"op":"subscribe","topic":"a","from":{"time":"2026-11-30T12:00:00"}})", bad,
           "/from/time"},
          {R"({"op":"subscribe","topic":"a","from":{"time":1700000000}})", bad, "/from/time"},
          {R"({"op":"subscribe","topic":"news.>.eu"})", badname, "/topic"},
          {R"({"op":"subscribe","topic":"news.e*"})", badname, "/topic"},
          {R"({"op":"subscribe","topic":"news.>>"})", badname, "/topic"},
          {R"({"op":"subscribe","topic":""})", badname, "/topic"},
          {R"({"op":"subscribe","topic":"a.b.c.d.e.f.g.h.>"})", badname, "/topic"},
          {R"({"op":"subscribe","topic":"a","sub":"S1"})", badname, "/sub"},
          {R"({"op":"subscribe","topic":"a","sub":""})", badname, "/sub"},
      });
  check_frames("unsubscribe", {
                                  {R"({"op":"unsubscribe","id":10,"sub":"s1"})"},
                                  {R"({"op":"unsubscribe","id":10})", bad, "/sub"},
                                  {R"({"op":"unsubscribe","id":10,"sub":1})", bad, "/sub"},
                                  {R"({"op":"unsubscribe","id":10,"sub":"s 1"})", badname, "/sub"},
                              });
}

TEST_CASE("frame schemas: submit", "[frames]") {
  const std::string key256 = amp::json_quote(std::string(256, 'k'));
  const std::string key257 = amp::json_quote(std::string(257, 'k'));
  const std::string key_bytes = amp::json_quote(repeat("\xc3\xa9", 129));  // 129 chars, 258 bytes
  const std::string base = R"({"op":"submit","job":"resize","body":{}})";
  check_frames("submit",
               {
                   {R"({"op":"submit","id":11,"job":"resize","body":{"image":"a.png","width":640},)"
                    R"("type":"resize.request","headers":{"k":"v"},"max_attempts":3,)"
                    R"("idempotency_key":"order-42"})"},
                   {R"({"op":"submit","job":"resize","body":null,"max_attempts":1})"},
                   {R"({"op":"submit","job":"resize","body":null,"max_attempts":100})"},
                   {with(base, "idempotency_key", key256)},
                   {with(base, "idempotency_key", amp::json_quote(repeat("\xc3\xa9", 128)))},
                   {R"({"op":"submit","id":11,"body":{}})", bad, "/job"},
                   {R"({"op":"submit","id":11,"job":"resize"})", bad, "/body"},
                   {R"({"op":"submit","id":11,"job":7,"body":{}})", bad, "/job"},
                   {with(base, "max_attempts", "0"), bad, "/max_attempts"},
                   {with(base, "max_attempts", "101"), bad, "/max_attempts"},
                   {with(base, "max_attempts", R"("3")"), bad, "/max_attempts"},
                   {with(base, "max_attempts", "2.5"), bad, "/max_attempts"},
                   {with(base, "idempotency_key", R"("")"), bad, "/idempotency_key"},
                   {with(base, "idempotency_key", key257), bad, "/idempotency_key"},
                   {with(base, "idempotency_key", key_bytes), bad, "/idempotency_key"},
                   {with(base, "idempotency_key", "42"), bad, "/idempotency_key"},
                   {with(base, "type", "[]"), bad, "/type"},
                   {R"({"op":"submit","id":11,"job":"Resize","body":{}})", badname, "/job"},
                   {R"({"op":"submit","id":11,"job":"*","body":{}})", badname, "/job"},
               });
}

TEST_CASE("frame schemas: claim, decline, complete, fail, cancel, task", "[frames]") {
  for (const char* op : {"claim", "decline", "cancel", "complete", "task"}) {
    const std::string o = op;
    check_frames(op, {
                         {R"({"op":")" + o + R"(","id":12,"task":"t_…"})", badname, "/task"},
                         {R"({"op":")" + o + R"(","id":12,"task":"t_0k3v9z1a"})"},
                         {R"({"op":")" + o + R"(","task":"t_)" + std::string(62, 'z') + "\"}"},
                         {R"({"op":")" + o + R"(","id":12})", bad, "/task"},
                         {R"({"op":")" + o + R"(","id":12,"task":12})", bad, "/task"},
                         {R"({"op":")" + o + R"(","id":12,"task":null})", bad, "/task"},
                         {R"({"op":")" + o + R"(","id":12,"task":"t_ABC"})", badname, "/task"},
                         {R"({"op":")" + o + R"(","id":12,"task":"x_abc"})", badname, "/task"},
                         {R"({"op":")" + o + R"(","task":"t_)" + std::string(63, 'z') + "\"}",
                          badname, "/task"},
                     });
  }
  check_frames("complete", {
                               {R"({"op":"complete","id":14,"task":"t_1","result":{"url":"…"}})"},
                               {R"({"op":"complete","id":14,"task":"t_1","result":null})"},
                               {R"({"op":"complete","id":14,"task":"t_1","result":[1]})"},
                           });
  check_frames(
      "fail",
      {
          {R"({"op":"fail","id":15,"task":"t_…","error":{"code":"…","message":"…"},"retry":true,)"
           R"("retry_delay_ms":1000})",
           badname, "/task"},
          {R"({"op":"fail","id":15,"task":"t_1","error":{"code":"oom","message":"out of memory"},)"
           R"("retry":true,"retry_delay_ms":1000})"},
          {R"({"op":"fail","task":"t_1","error":{"code":"x","message":"","detail":[1]}})"},
          {R"({"op":"fail","task":"t_1","error":{"code":"x","message":""},"retry":false})"},
          {R"({"op":"fail","task":"t_1"})", bad, "/error"},
          {R"({"op":"fail","task":"t_1","error":"boom"})", bad, "/error"},
          {R"({"op":"fail","task":"t_1","error":null})", bad, "/error"},
          {R"({"op":"fail","task":"t_1","error":{"message":"x"}})", bad, "/error/code"},
          {R"({"op":"fail","task":"t_1","error":{"code":"x"}})", bad, "/error/message"},
          {R"({"op":"fail","task":"t_1","error":{"code":1,"message":"x"}})", bad, "/error/code"},
          {R"({"op":"fail","task":"t_1","error":{"code":"","message":"x"}})", bad, "/error/code"},
          {R"({"op":"fail","task":"t_1","error":{"code":"x","message":2}})", bad, "/error/message"},
          {R"({"op":"fail","task":"t_1","error":{"code":"x","message":""},"retry":"yes"})", bad,
           "/retry"},
          {R"({"op":"fail","task":"t_1","error":{"code":"x","message":""},"retry_delay_ms":-1})",
           bad, "/retry_delay_ms"},
          {R"({"op":"fail","error":{"code":"x","message":""}})", bad, "/task"},
      });
  check_frames("task",
               {
                   {R"({"op":"task","id":17,"task":"t_…","history":true})", badname, "/task"},
                   {R"({"op":"task","id":17,"task":"t_1","history":true})"},
                   {R"({"op":"task","id":17,"task":"t_1","history":false})"},
                   {R"({"op":"task","id":17,"task":"t_1","history":"true"})", bad, "/history"},
                   {R"({"op":"task","id":17,"task":"t_1","history":1})", bad, "/history"},
               });
}

TEST_CASE("subscribe's from.time takes what parse_timestamp takes, calendar aside", "[frames]") {
  const auto subscribe = schema("frames/subscribe");
  auto shape_ok = [&](std::string_view t) {
    return subscribe
        .validate(R"({"op":"subscribe","topic":"a","from":{"time":)" + amp::json_quote(t) + "}}")
        .has_value();
  };
  for (const char* t : {
           "2026-11-30T12:00:00.123Z",
           "2026-11-30T12:00:00Z",
           "2026-11-30t12:00:00z",
           "2026-11-30T12:00:00.1+01:00",
           "2026-11-30T12:00:00.123456789-23:59",
           "2026-11-30T23:59:59Z",
           "2028-02-29T00:00:00Z",
           "1970-01-01T00:00:00Z",
           "2026-11-30T12:00:00.Z",
           "2026-11-30T12:00:00.1234567890Z",
           "2026-11-30T12:00:00",
           "2026-11-30 12:00:00Z",
           "2026-11-30T24:00:00Z",
           "2026-11-30T12:60:00Z",
           "2026-11-30T12:00:60Z",
           "2026-13-30T12:00:00Z",
           "2026-00-30T12:00:00Z",
           "2026-11-00T12:00:00Z",
           "2026-11-32T12:00:00Z",
           "2026-11-30T12:00:00+24:00",
           "2026-11-30T12:00:00+01",
           "2026-11-30T12:00:00+0100",
           "26-11-30T12:00:00Z",
           "2026-11-30T12:00:00Z ",
           " 2026-11-30T12:00:00Z",
           "",
           "now",
       }) {
    CAPTURE(t);
    CHECK(shape_ok(t) == amp::parse_timestamp(t).has_value());
  }
  // The calendar is the parser's: the schema lets these through, the gateway refuses them
  // (bad_request too).
  for (const char* t : {"2026-02-29T12:00:00Z", "2026-04-31T12:00:00Z"}) {
    CAPTURE(t);
    CHECK(shape_ok(t));
    CHECK_FALSE(amp::parse_timestamp(t).has_value());
  }
}

TEST_CASE("the names pass agrees with the name types of amp/names.hpp", "[frames]") {
  const std::vector<std::string> candidates = {
      "",
      "a",
      "z",
      "A",
      "bob",
      "b0b",
      "0bob",
      "bob-1",
      "bob_1",
      "-bob",
      "_bob",
      "bob-",
      std::string(64, 'a'),
      std::string(65, 'a'),
      "a" + std::string(63, '9'),
      "bob smith",
      "bob\t",
      "bob\n",
      "bob.x",
      "$broker",
      "broker",
      "*",
      ">",
      "news.eu",
      "news.>",
      "news.*",
      "news.*.x",
      "*.*",
      ">.x",
      "news.>.x",
      "a.b.c.d.e.f.g.h",
      "a.b.c.d.e.f.g.h.i",
      "a.b.c.d.e.f.g.>",
      "a.b.c.d.e.f.g.h.>",
      "*.b.c.d.e.f.g.h",
      "news..eu",
      ".news",
      "news.",
      ".",
      "..",
      "news.e*",
      "news.>>",
      "news.**",
      "0.1",
      "news.EU",
      "news.eu-west_1",
      std::string(64, 'x') + "." + std::string(64, 'y'),
      std::string(65, 'x') + ".y",
      "t_abc",
      "t_",
      "t_ABC",
      "t_a-b",
      "t_" + std::string(62, '0'),
      "t_" + std::string(63, '0'),
      "T_abc",
      "t__a",
      "\xc3\xa9t\xc3\xa9",
      "bob\xc2\xa0",
      "na\xc3\xafve",
  };
  const auto names = schema("frames/names");
  for (const auto& s : candidates) {
    CAPTURE(s);
    const std::string q = amp::json_quote(s);
    auto passes = [&](const std::string& frame) { return names.validate(frame).has_value(); };
    CHECK(passes(R"({"op":"send","body":0,"to":)" + q + "}") ==
          amp::participant_name::make(s).has_value());
    CHECK(passes(R"({"op":"send","to":"bob","body":0,"reply_to":)" + q + "}") ==
          amp::participant_name::make(s).has_value());
    CHECK(passes(R"({"op":"submit","body":0,"job":)" + q + "}") ==
          amp::job_name::make(s).has_value());
    CHECK(passes(R"({"op":"who","job":)" + q + "}") == amp::job_name::make(s).has_value());
    CHECK(passes(R"({"op":"register","jobs":["ok",)" + q + "]}") ==
          amp::job_name::make(s).has_value());
    CHECK(passes(R"({"op":"publish","body":0,"topic":)" + q + "}") ==
          amp::topic::make(s).has_value());
    CHECK(passes(R"({"op":"subscribe","topic":)" + q + "}") ==
          amp::topic_pattern::make(s).has_value());
    for (const char* op : {"heartbeat", "claim", "decline", "complete", "fail", "cancel", "task"}) {
      CHECK(passes(std::string(R"({"op":")") + op + R"(","task":)" + q + "}") ==
            amp::task_id::make(s).has_value());
    }
  }
  // Ops without names, and members that are no names, are left alone.
  for (const char* frame : {
           R"({"op":"hello","token":"Not A Name"})",
           R"({"op":"ack","seq":1})",
           R"({"op":"send","to":"bob","body":0,"type":"X Y","msg_id":"$$","correlation":"."})",
           R"({"op":"who","task":"NOT.A.TASK","jobs":["*"]})",
           R"({"op":"watch","to":"Bob"})",
       }) {
    CAPTURE(frame);
    CHECK(names.validate(frame).has_value());
  }
}

TEST_CASE("frame schemas validate 100 KB strings without crashing", "[frames]") {
  const std::size_t n = 100 * 1024;
  const std::vector<std::string> longs = {
      std::string(n, 'a'),       std::string(n, '0'),
      repeat("\xc3\xa9", n / 2), "t_" + std::string(n, 'z'),
      repeat("news.", n / 5),    repeat("*.", n / 2) + ">",
      repeat("a", n) + ".>",     "2026-11-30T12:00:00." + std::string(n, '1') + "Z",
      std::string(n, ' '),
  };
  const char* const members[] = {
      "id",
      "token",
      "jobs",
      "task",
      "job",
      "to",
      "reply_to",
      "type",
      "msg_id",
      "correlation",
      "topic",
      "sub",
      "idempotency_key",
      "from",
      "error",
      "headers",
      "meta",
      "session",
      "participant",
      "ns",
      "server",
      "code",
      "message",
      "path",
      "reason",
      "state",
      "envelope",
      "entry",
      "participants",
      "leases",
      "expires_at",
      "lease_expires_at",
      "history",
  };
  // Every schema with the op its name ends with; the names pass with every client op.
  std::vector<std::pair<std::string, std::string>> targets;
  for (const auto& s : amp::detail::embedded_schemas()) {
    const std::string schema_name(s.name);
    if (schema_name == "frames/names") {
      for (const char* op : client_ops) {
        targets.emplace_back(schema_name, op);
      }
    } else {
      targets.emplace_back(schema_name, schema_name.substr(schema_name.find_last_of('/') + 1));
    }
  }
  std::size_t refused = 0;
  for (const auto& value : longs) {
    const std::string v = amp::json_quote(value);
    std::string envelope = "{";
    for (const char* m : {"id", "from", "to", "ns", "ts", "type", "reply_to", "correlation"}) {
      envelope += amp::json_quote(m) + ":" + v + ",";
    }
    envelope += R"("headers":{)" + v + ":" + v + R"(},"body":)" + v + "}";
    std::string record = "{";
    for (const char* m : {"task", "ns", "job", "state", "submitted_by", "owner", "participant",
                          "lease_expires_at", "created_at", "updated_at", "expires_at"}) {
      record += amp::json_quote(m) + ":" + v + ",";
    }
    record += R"("jobs":[)" + v + R"(],"error":{"code":)" + v + R"(,"message":)" + v + "}}";
    for (const auto& [schema_name, op] : targets) {
      CAPTURE(schema_name, op);
      const auto s = schema(schema_name);
      std::string flat = R"({"op":")" + op + "\"";
      std::string in_arrays = flat;
      for (const char* m : members) {
        flat += "," + amp::json_quote(m) + ":" + v;
        in_arrays += "," + amp::json_quote(m) + ":[" + v + "]";
      }
      flat += "}";
      in_arrays += "}";
      const std::string nested =
          R"({"op":")" + op + R"(","from":{"time":)" + v + R"(},"headers":{)" + v + ":" + v +
          R"(},"error":{"code":)" + v + R"(,"message":)" + v + R"(},"envelope":)" + envelope +
          R"(,"task":)" + record + R"(,"entry":)" + record + R"(,"participants":[)" + record +
          R"(],"history":[)" + record + R"(],"leases":[)" + record + "]}";
      for (const std::string* doc :
           std::initializer_list<const std::string*>{&flat, &in_arrays, &nested, &envelope}) {
        auto r = s.validate(*doc);
        if (!r) {
          ++refused;
          if (r.error().code() != amp::errc::invalid_envelope) {
            FAIL(r.error().to_string());
          }
        }
      }
    }
  }
  CHECK(refused > 0);

  // The names pass refuses every overlong name, and the shape pass lets them through.
  const std::string a = amp::json_quote(std::string(n, 'a'));
  const std::string t = amp::json_quote("t_" + std::string(n, 'z'));
  const std::string topic = amp::json_quote(repeat("news.", n / 5) + "eu");
  const std::string pattern = amp::json_quote(repeat("*.", n / 2) + ">");
  check_frames("send", {{R"({"op":"send","body":0,"to":)" + a + "}", badname, "/to"}});
  check_frames("claim", {{R"({"op":"claim","task":)" + t + "}", badname, "/task"}});
  check_frames("publish",
               {{R"({"op":"publish","body":0,"topic":)" + topic + "}", badname, "/topic"}});
  check_frames("subscribe", {{R"({"op":"subscribe","topic":)" + pattern + "}", badname, "/topic"}});
  check_frames("subscribe",
               {{R"({"op":"subscribe","topic":"a","sub":)" + a + "}", badname, "/sub"}});
  check_frames("hello", {{R"({"op":"hello","token":)" + a + "}"}});
  check_frames("hello", {{R"({"op":"hello","token":"x","id":)" + a + "}", bad, "/id"}});
}

// ---- server frames ----------------------------------------------------------------------

namespace {

const char* const entry_w1 =
    R"({"participant":"w1","jobs":["resize"],"slots":4,"load":1,"meta":{"gpu":"a100"},)"
    R"("updated_at":"2026-11-30T12:00:00.123Z","expires_at":"2026-11-30T12:00:30.123Z"})";

const char* const record_running =
    R"({"task":"t_0k3v9z1a","ns":"demo","job":"resize","state":"running","attempt":1,)"
    R"("max_attempts":3,"submitted_by":"alice","owner":"w1",)"
    R"("lease_expires_at":"2026-11-30T12:00:30.000Z","created_at":"2026-11-30T12:00:00.000Z",)"
    R"("updated_at":"2026-11-30T12:00:00.500Z","result":null,"error":null,"revision":2})";

const char* const record_queued =
    R"({"task":"t_0k3v9z1a","ns":"demo","job":"resize","state":"queued","attempt":0,)"
    R"("max_attempts":3,"submitted_by":"alice","owner":null,"lease_expires_at":null,)"
    R"("created_at":"2026-11-30T12:00:00.000Z","updated_at":"2026-11-30T12:00:00.000Z",)"
    R"("result":null,"error":null,"revision":1})";

const char* const inbox_envelope =
    R"({"id":"m-1","from":"alice","to":"bob","ns":"demo","type":"review.request",)"
    R"("ts":"2026-11-30T12:00:00.123Z","body":{"pr":42},"headers":{"k":"v"},)"
    R"("reply_to":"alice","correlation":"c-1"})";

const char* const topic_envelope =
    R"({"id":"e-9","from":"alice","to":"news.eu","ns":"demo","type":"news.item",)"
    R"("ts":"2026-11-30T12:00:01.000Z","body":{"headline":"…"}})";

const char* const job_envelope =
    R"({"id":"t_0k3v9z1a","from":"alice","to":"resize","ns":"demo","type":"resize.request",)"
    R"("ts":"2026-11-30T12:00:00.000Z","body":{"image":"a.png","width":640}})";

void check_server(std::string_view op, std::initializer_list<frame_case> cases) {
  const auto s = schema("frames/server/" + std::string(op));
  for (const auto& c : cases) {
    INFO("server op " << op << ": " << c.frame);
    auto r = s.validate(c.frame);
    const outcome got = r ? outcome{} : outcome{verdict::bad_request, r.error().path()};
    CHECK(to_string(got) == to_string(outcome{c.expect, c.path}));
  }
}

std::string sub(std::string text, std::string_view from, std::string_view to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("server frame schemas: ok replies", "[frames]") {
  const std::string s = record_running;
  check_server(
      "ok",
      {
          {R"({"op":"ok","id":1,"session":"…","participant":"alice","ns":"demo","heartbeat_s":10,)"
           R"("registry_ttl_s":30,"max_frame_bytes":1048576,"server":"amp-server/X.Y.Z"})"},
          {R"({"op":"ok","id":2,"expires_in_s":30})"},
          {R"({"op":"ok","id":3,"leases":[{"task":"t_1","expires_at":"2026-11-30T12:00:30.000Z"}]})"},
          {R"({"op":"ok","id":3,"leases":[]})"},
          {R"({"op":"ok","id":4,"task":"t_1","expires_at":"2026-11-30T12:00:30.000Z"})"},
          {std::string(R"({"op":"ok","id":5,"participants":[)") + entry_w1 + "]}"},
          {std::string(R"({"op":"ok","id":6,"participants":[]})")},
          {R"({"op":"ok","id":7,"seq":17,"msg_id":"…","duplicate":false})"},
          {R"({"op":"ok","id":8,"seq":18,"duplicate":true})"},
          {R"({"op":"ok","id":9,"sub":"s1"})"},
          {R"({"op":"ok","id":10})"},
          {R"({"op":"ok","id":11,"task":"t_0k3v9z1a","created":true})"},
          {R"({"op":"ok","id":12,"task":"t_1","attempt":1,"lease_expires_at":"2026-11-30T12:00:30.000Z"})"},
          {R"({"op":"ok","id":13})"},
          {R"({"op":"ok","id":14,"task":"t_1","state":"completed"})"},
          {R"({"op":"ok","id":14,"task":"t_1","state":"completed","duplicate":true})"},
          {R"({"op":"ok","id":15,"task":"t_1","state":"queued","attempt":1})"},
          {R"({"op":"ok","id":15,"task":"t_1","state":"failed","attempt":3})"},
          {R"({"op":"ok","id":16,"state":"cancelled"})"},
          {std::string(R"({"op":"ok","id":17,"task":)") + record_running + R"(,"history":[)" +
           record_queued + "," + record_running + "]}"},
          {R"({"op":"ok","id":"req-1"})"},
          {R"({"op":"ok"})", bad, "/id"},
          {R"({"op":"ok","id":null})", bad, "/id"},
          {R"({"op":"ok","id":1,"task":"t_…"})", bad, "/task"},
          {R"({"op":"ok","id":1,"state":"done"})", bad, "/state"},
          {R"({"op":"ok","id":1,"seq":0})", bad, "/seq"},
          {R"({"op":"ok","id":1,"expires_at":"2026-11-30T12:00:30Z"})", bad, "/expires_at"},
          {std::string(R"({"op":"ok","id":17,"task":)") + sub(s, R"("revision":2)", R"("rev":2)") +
               "}",
           bad, "/task/revision"},
          {std::string(R"({"op":"ok","id":17,"task":)") +
               sub(s, R"("owner":"w1")", R"("owner":"W1")") + "}",
           bad, "/task/owner"},
          {std::string(R"({"op":"ok","id":17,"task":)") +
               sub(s, R"("error":null)", R"("error":{"code":"x"})") + "}",
           bad, "/task/error/message"},
          {std::string(R"({"op":"ok","id":5,"participants":[)") +
               sub(entry_w1, R"("slots":4)", R"("slots":2000)") + "]}",
           bad, "/participants/0/slots"},
      });
}

TEST_CASE("server frame schemas: error", "[frames]") {
  check_server(
      "error",
      {
          {R"({"op":"error","id":7,"code":"invalid_name","message":"\"Bob\" is not a participant name"})"},
          {R"({"op":"error","id":null,"code":"bad_request","message":"not a JSON object"})"},
          {R"({"op":"error","id":"req-1","code":"rate_limited","message":"…","retry_after_ms":250})"},
          {R"({"op":"error","id":8,"code":"invalid_envelope","message":"at /size: …","path":"/size"})"},
          {R"({"op":"error","id":1,"code":"unauthenticated","message":"token expired"})"},
          {R"({"op":"error","code":"internal","message":"…"})", bad, "/id"},
          {R"({"op":"error","id":1,"code":"oops","message":"…"})", bad, "/code"},
          {R"({"op":"error","id":1,"message":"…"})", bad, "/code"},
          {R"({"op":"error","id":1,"code":"conflict"})", bad, "/message"},
          {R"({"op":"error","id":1,"code":"rate_limited","message":"…"})", bad, "/retry_after_ms"},
          {R"({"op":"error","id":1.5,"code":"conflict","message":"…"})", bad, "/id"},
      });
  // Every code of spec §9 is a code the schema knows.
  for (const char* code :
       {"bad_request", "unauthenticated", "forbidden", "invalid_name", "invalid_envelope",
        "payload_too_large", "not_found", "conflict", "lease_lost", "budget_exhausted",
        "limit_exceeded", "unavailable", "internal"}) {
    check_server("error",
                 {{std::string(R"({"op":"error","id":1,"message":"m","code":")") + code + "\"}"}});
  }
}

TEST_CASE("server frame schemas: message, event, sub_dropped, offer", "[frames]") {
  check_server("message", {
                              {std::string(R"({"op":"message","seq":17,"delivery":1,"envelope":)") +
                               inbox_envelope + "}"},
                              {std::string(R"({"op":"message","seq":17,"delivery":0,"envelope":)") +
                                   inbox_envelope + "}",
                               bad, "/delivery"},
                              {R"({"op":"message","seq":17,"delivery":1})", bad, "/envelope"},
                              {std::string(R"({"op":"message","seq":17,"delivery":1,"envelope":)") +
                                   sub(inbox_envelope, R"("from":"alice",)", "") + "}",
                               bad, "/envelope/from"},
                          });
  check_server("event",
               {
                   {std::string(R"({"op":"event","sub":"s1","seq":18,"topic":"news.eu",)") +
                    R"("envelope":)" + topic_envelope + "}"},
                   {std::string(R"({"op":"event","sub":"s1","seq":18,"topic":"news.*",)") +
                        R"("envelope":)" + topic_envelope + "}",
                    bad, "/topic"},
                   {std::string(R"({"op":"event","seq":18,"topic":"news.eu","envelope":)") +
                        topic_envelope + "}",
                    bad, "/sub"},
               });
  check_server(
      "sub_dropped",
      {
          {R"({"op":"sub_dropped","sub":"s1","reason":"slow_consumer","last_seq":41})"},
          {R"({"op":"sub_dropped","sub":"s1","reason":"slow_consumer","last_seq":0})"},
          {R"({"op":"sub_dropped","sub":"s1","reason":"slow_consumer"})", bad, "/last_seq"},
          {R"({"op":"sub_dropped","sub":"s1","reason":"","last_seq":1})", bad, "/reason"},
      });
  check_server(
      "offer",
      {
          {std::string(R"({"op":"offer","task":"t_0k3v9z1a","job":"resize","attempt":1,)") +
           R"("max_attempts":3,"lease_s":30,"envelope":)" + job_envelope + "}"},
          {std::string(R"({"op":"offer","task":"t_0k3v9z1a","job":"resize","attempt":0,)") +
               R"("max_attempts":3,"lease_s":30,"envelope":)" + job_envelope + "}",
           bad, "/attempt"},
          {std::string(R"({"op":"offer","task":"t_…","job":"resize","attempt":1,)") +
               R"("max_attempts":3,"lease_s":30,"envelope":)" + job_envelope + "}",
           bad, "/task"},
          {std::string(
               R"({"op":"offer","task":"t_1","job":"resize","attempt":1,"max_attempts":3,)") +
               R"("envelope":)" + job_envelope + "}",
           bad, "/lease_s"},
      });
  // The envelopes in these frames are envelopes.
  const auto envelope = schema("envelope");
  for (const char* e : {inbox_envelope, topic_envelope, job_envelope}) {
    CAPTURE(e);
    CHECK(envelope.validate(e).has_value());
  }
}

TEST_CASE("frame schemas: scatter, reply, operation, retry, and cancel of an operation",
          "[frames]") {
  check_frames(
      "scatter",
      {
          {R"({"op":"scatter","id":20,"to":["alfa","bravo"],"body":{"x":1},)"
           R"("bodies":{"bravo":[2]},"type":"review.request","headers":{"h":"v"},)"
           R"("quorum":2,"timeout_ms":30000,"on_timeout":"partial",)"
           R"("idempotency_key":"review-42"})"},
          {R"({"op":"scatter","audience":"online","include_self":true})"},
          {R"({"op":"scatter","audience":"all","quorum":1,"timeout_ms":100})"},
          {R"({"op":"scatter","body":1})", bad, "/to"},
          {R"({"op":"scatter","to":["a"],"audience":"all"})", bad, ""},
          {R"({"op":"scatter","audience":"some"})", bad, "/audience"},
          {R"({"op":"scatter","to":"alfa"})", bad, "/to"},
          {R"({"op":"scatter","to":[]})", bad, "/to"},
          {R"({"op":"scatter","to":[1]})", bad, "/to/0"},
          {R"({"op":"scatter","to":["a"],"quorum":1})", bad, ""},
          {R"({"op":"scatter","to":["a"],"quorum":0,"timeout_ms":100})", bad, "/quorum"},
          {R"({"op":"scatter","to":["a"],"quorum":1,"timeout_ms":99})", bad, "/timeout_ms"},
          {R"({"op":"scatter","to":["a"],"quorum":1,"timeout_ms":86400001})", bad, "/timeout_ms"},
          {R"({"op":"scatter","to":["a"],"on_timeout":"later"})", bad, "/on_timeout"},
          {R"({"op":"scatter","to":["a"],"bodies":[1]})", bad, "/bodies"},
          {R"({"op":"scatter","to":["a"],"include_self":1})", bad, "/include_self"},
          {R"({"op":"scatter","to":["alfa","Bravo"]})", badname, "/to/1"},
          {R"({"op":"scatter","to":["a"],"bodies":{"a.b":1}})", badname, "/bodies"},
      });
  check_frames("reply",
               {
                   {R"({"op":"reply","id":21,"operation":"o_1","attempt":1,)"
                    R"("accept":false,"body":{"why":"no"}})"},
                   {R"({"op":"reply","operation":"o_1","attempt":0})"},
                   {R"({"op":"reply","operation":"o_1"})", bad, "/attempt"},
                   {R"({"op":"reply","operation":"o_1","attempt":"1"})", bad, "/attempt"},
                   {R"({"op":"reply","operation":"o_1","attempt":1,"accept":"y"})", bad, "/accept"},
                   {R"({"op":"reply","attempt":1})", bad, "/operation"},
                   {R"({"op":"reply","operation":"t_1","attempt":1})", badname, "/operation"},
               });
  check_frames("operation", {
                                {R"({"op":"operation","id":22,"operation":"o_0k3v9z1a"})"},
                                {R"({"op":"operation","id":22})", bad, "/operation"},
                                {R"({"op":"operation","operation":"o_"})", badname, "/operation"},
                            });
  check_frames("retry",
               {
                   {R"({"op":"retry","id":23,"operation":"o_1","member":"bravo"})"},
                   {R"({"op":"retry","operation":"o_1"})", bad, "/member"},
                   {R"({"op":"retry","operation":"o_1","member":"Bravo"})", badname, "/member"},
               });
  check_frames("cancel", {
                             {R"({"op":"cancel","id":24,"operation":"o_1"})"},
                             {R"({"op":"cancel","operation":"o_1","task":"t_1"})", bad, ""},
                             {R"({"op":"cancel","operation":"O_1"})", badname, "/operation"},
                         });
  check_server("cancelled", {
                                {R"({"op":"cancelled","operation":"o_0k3v9z1a"})"},
                                {R"({"op":"cancelled","operation":"o_1","task":"t_1"})", bad, ""},
                            });
}

TEST_CASE("server frame schemas: presence, lease_lost, cancelled", "[frames]") {
  const std::string up = std::string(R"({"op":"presence","participant":"w1","state":"up",)") +
                         R"("reason":"registered","entry":)" + entry_w1 + "}";
  check_server("presence",
               {
                   {up},
                   {sub(sub(up, "\"up\"", "\"down\""), "registered", "expired")},
                   {sub(sub(up, "\"up\"", "\"down\""), "registered", "left")},
                   {sub(up, "registered", "left"), bad, "/reason"},
                   {sub(sub(up, "\"up\"", "\"down\""), "registered", "registered"), bad, "/reason"},
                   {sub(sub(up, "\"up\"", "\"gone\""), "registered", "left"), bad, "/state"},
                   {sub(up, R"("load":1)", R"("load":-1)"), bad, "/entry/load"},
                   {R"({"op":"presence","participant":"w1","state":"up",)"
                    R"("reason":"registered"})",
                    bad, "/entry"},
               });
  for (const char* op : {"lease_lost", "cancelled"}) {
    const std::string o = op;
    check_server(op, {
                         {R"({"op":")" + o + R"(","task":"t_0k3v9z1a"})"},
                         {R"({"op":")" + o + R"("})", bad, "/task"},
                         {R"({"op":")" + o + R"(","task":"t_…"})", bad, "/task"},
                     });
  }
}

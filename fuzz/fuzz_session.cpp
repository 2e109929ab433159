// fuzz_session: one client session of the gateway (amp/gateway/session.hpp), frame by frame.
//
// Each input gets a gateway of its own on the memory transport, with a manual clock and the
// inline executor (every frame is handled, and everything it causes sent, before `receive`
// returns; no thread is started), and one session on a carrier that checks what it is given.
// Small limits (rate, budget, leases, registry TTL, subscriptions) make their errors and
// timers reachable.
//
// The input: the first byte, then frames separated by '\n'.
// - First byte: bit 0 set, the session first says a valid `hello` (participant "alice" in
//   namespace "demo", a token of the gateway's HS256 secret); bit 1 set, that token grants
//   nothing instead of everything; bits 2-4, the time the clock moves after each frame: 1,
//   2, 5, 10, 50, 100, 500 or 1000 ms. In a text seed: ' ' no hello, '!' hello, '#' hello
//   without grants, all 1 ms; ')' hello, 5 ms; '-' 10 ms; '5' 100 ms; '=' 1000 ms.
// - A frame is given to `session::receive`, with every "$task" replaced by the task id the
//   session last sent (so that claim, complete … can name a task); except the frames "~b"
//   (a binary frame: `receive_binary`) and "~w" (no frame: the clock moves 10 s).
// - Once the session asks its carrier to close, the carrier tells it `closed` and no more
//   frames are given. At the end the connection goes away (`closed`), the clock moves 12 s
//   so that waits in the backend end, and the gateway shuts down.
//
// Asserts: every frame the session sends is one JSON object that passes the schema of its
// op in `schemas/frames/server/`; nothing is sent after `close`, which comes at most once
// with a close code of the protocol; every log line is a JSON object; the valid `hello` is
// answered with `ok`; no session counts once the connection has gone.
// (ASan's leak check at the end of each input finds what the teardown leaves behind.)
//
// With AMP_FUZZ_VERBOSE set in the environment, every frame in and out and every close is
// printed to standard error: `AMP_FUZZ_VERBOSE=1 build-fuzz/fuzz/fuzz_session crash-…`.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "amp/broker/config.hpp"
#include "amp/clock.hpp"
#include "amp/gateway/auth.hpp"
#include "amp/gateway/config.hpp"
#include "amp/gateway/session.hpp"
#include "amp/json.hpp"
#include "amp/schema.hpp"
#include "amp/transport/memory.hpp"
#include "check.hpp"

namespace {

using namespace std::chrono_literals;

constexpr std::string_view k_secret = "amp-fuzz-hs256-secret-of-40-bytes-long!!";
constexpr std::string_view k_all_grants =
    R"({"send":["*"],"submit":["*"],"work":["*"],"publish":[">"],"subscribe":[">"],"admin":true})";

// The `hello` frame of alice, valid for an hour from the manual clock's start.
const std::string& hello(bool grants) {
  static const auto make = [](std::string_view amp_json) {
    auto token = amp::mint_token({.sub = "alice",
                                  .ns = "demo",
                                  .exp = amp::manual_clock::default_start() + 1h,
                                  .amp_json = std::string(amp_json)},
                                 amp::jwt_alg::hs256, k_secret);
    AMP_FUZZ_CHECK(token.has_value(), token.error().to_string());
    return R"({"op":"hello","id":"hello","token":")" + *token + "\"}";
  };
  static const std::string all = make(k_all_grants), none = make("{}");
  return grants ? all : none;
}

// The schema of each frame a server sends, by op.
const amp::json_schema* server_schema(std::string_view op) {
  static const auto schemas = [] {
    std::map<std::string, amp::json_schema, std::less<>> m;
    for (auto name : {"ok", "error", "message", "event", "offer", "presence", "lease_lost",
                      "cancelled", "sub_dropped"}) {
      auto s = amp::json_schema::embedded(std::string("frames/server/") + name);
      AMP_FUZZ_CHECK(s.has_value(), s.error().to_string());
      m.emplace(name, *s);
    }
    return m;
  }();
  auto it = schemas.find(op);
  return it == schemas.end() ? nullptr : &it->second;
}

bool verbose() {
  static const bool on = std::getenv("AMP_FUZZ_VERBOSE") != nullptr;
  return on;
}

void trace(std::string_view what, std::string_view text) {
  if (!verbose()) return;
  std::fprintf(stderr, "%.*s %.*s\n", static_cast<int>(what.size()), what.data(),
               static_cast<int>(text.size()), text.data());
}

class checking_carrier final : public amp::session_carrier {
 public:
  void send(std::string frame) override {
    trace("<-", frame);
    AMP_FUZZ_CHECK(!close_code, "sent after close: " + frame);
    auto json = amp::json_check(frame);
    AMP_FUZZ_CHECK(json.has_value(), frame + ": " + json.error().to_string());
    constexpr std::string_view start = R"({"op":")";
    AMP_FUZZ_CHECK(frame.starts_with(start), frame);
    auto op = std::string_view(frame).substr(start.size());
    op = op.substr(0, op.find('"'));
    const auto* schema = server_schema(op);
    AMP_FUZZ_CHECK(schema != nullptr, "a frame of unknown op: " + frame);
    auto valid = schema->validate(frame);
    AMP_FUZZ_CHECK(valid.has_value(), frame + ": " + valid.error().to_string());
    if (!first_) first_ = frame;
    constexpr std::string_view task = R"("task":"t_)";
    if (auto at = frame.find(task); at != std::string::npos) {
      auto id = frame.substr(at + task.size() - 2);
      last_task_ = id.substr(0, id.find('"'));
    }
  }

  std::size_t buffered_bytes() const override { return 0; }

  void close(int code, std::string reason) override {
    trace("close " + std::to_string(code), reason);
    AMP_FUZZ_CHECK(!close_code, "closed twice: " + reason);
    namespace cc = amp::close_code;
    AMP_FUZZ_CHECK(code == cc::normal || code == cc::going_away || code == cc::policy_violation ||
                       code == cc::too_big || code == cc::try_again_later ||
                       code == cc::unauthenticated,
                   std::to_string(code) + " " + reason);
    close_code = code;
  }

  const std::optional<std::string>& first() const { return first_; }
  /// The task id of the last frame that had one (an offer, a submit's ok …).
  const std::string& last_task() const { return last_task_; }

  std::optional<int> close_code;

 private:
  std::optional<std::string> first_;
  std::string last_task_;
};

// `frame` with every "$task" replaced by `task` (task ids are made up by the broker, with a
// random part, so the input cannot spell them).
std::string with_task(std::string_view frame, const std::string& task) {
  std::string out(frame);
  if (task.empty()) return out;
  constexpr std::string_view placeholder = "$task";
  for (auto at = out.find(placeholder); at != std::string::npos;
       at = out.find(placeholder, at + task.size())) {
    out.replace(at, placeholder.size(), task);
  }
  return out;
}

amp::server_config fuzz_config() {
  amp::server_config c;
  c.auth.secret = std::string(k_secret);
  c.heartbeat_s = 1;
  c.registry_ttl_s = 3;
  c.inbox_ack_s = 2;
  c.inbox_window = 4;
  c.default_job = {.lease_s = 2, .max_attempts = 2, .decline_delay_ms = 100};
  c.limits.max_subscriptions = 4;
  c.limits.max_body_bytes = 2048;
  c.default_policy.rate = {.per_s = 20, .burst = 10, .bytes_per_s = 4096};
  c.default_policy.budget.per_day = 40;
  auto checked = amp::check_server_config(c);
  AMP_FUZZ_CHECK(checked.has_value(), checked.error().to_string());
  return c;
}

void check_log(const amp::log_line& line) {
  AMP_FUZZ_CHECK(amp::json_check(line.json).has_value() && line.json.starts_with("{"),
                 std::string(line.json));
  AMP_FUZZ_CHECK(line.level == "info" || line.level == "warn" || line.level == "error",
                 std::string(line.json));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const bool say_hello = (data[0] & 1) != 0;
  const bool grants = (data[0] & 2) == 0;
  constexpr int steps_ms[] = {1, 2, 5, 10, 50, 100, 500, 1000};
  const auto step = std::chrono::milliseconds(steps_ms[(data[0] >> 2) & 7]);
  std::string_view frames(reinterpret_cast<const char*>(data) + 1, size - 1);

  static const auto config = fuzz_config();
  auto clock = std::make_shared<amp::manual_clock>();
  auto opened = amp::gateway::open({.config = config,
                                    .backend = amp::memory_transport::create({.clock = clock}),
                                    .server_name = "amp-fuzz/1",
                                    .run = amp::inline_executor(),
                                    .log = check_log});
  AMP_FUZZ_CHECK(opened.has_value(), opened.error().to_string());
  auto gw = std::move(*opened);
  auto carrier = std::make_shared<checking_carrier>();
  auto s = gw->open_session(carrier);

  bool told_closed = false;
  auto after_frame = [&](amp::duration d) {
    clock->advance(d);
    if (carrier->close_code && !told_closed) {
      told_closed = true;
      s->closed();
    }
  };

  if (say_hello) {
    s->receive(hello(grants));
    AMP_FUZZ_CHECK(carrier->first() && carrier->first()->starts_with(R"({"op":"ok","id":"hello")"),
                   carrier->first().value_or("no answer to hello"));
    after_frame(step);
  }
  while (!told_closed && !frames.empty()) {
    auto frame = frames.substr(0, frames.find('\n'));
    frames.remove_prefix(frame.size() == frames.size() ? frame.size() : frame.size() + 1);
    if (frame == "~b") {
      trace("->", "(binary)");
      s->receive_binary();
    } else if (frame == "~w") {
      trace("->", "(10 s pass)");
      after_frame(10s);
      continue;
    } else {
      auto text = with_task(frame, carrier->last_task());
      trace("->", text);
      s->receive(text);
    }
    after_frame(step);
  }

  if (!told_closed) s->closed();
  s->closed();  // idempotent
  clock->advance(6s);
  clock->advance(6s);
  AMP_FUZZ_CHECK(gw->sessions() == 0, std::to_string(gw->sessions()) + " sessions");
  gw->shutdown();
  return 0;
}

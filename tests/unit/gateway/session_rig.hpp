#pragma once

// A gateway on the memory transport with a manual clock and the inline executor, and
// sessions carried by a vector of strings: every frame is handled, and every frame it
// causes is sent, before `receive` returns.

#include <simdjson.h>

#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "amp/gateway/auth.hpp"
#include "amp/gateway/session.hpp"
#include "amp/transport/memory.hpp"
#include "support/checks.hpp"

namespace amp::testing {

/// One frame the gateway sent, with readers by JSON Pointer.
struct frame {
  std::string text;

  bool has(std::string_view pointer) const {
    simdjson::dom::element e;
    thread_local simdjson::dom::parser parser;
    return !parser.parse(text).at_pointer(pointer).get(e);
  }
  std::string str(std::string_view pointer) const {
    thread_local simdjson::dom::parser parser;
    std::string_view v;
    if (parser.parse(text).at_pointer(pointer).get_string().get(v)) return "<absent>";
    return std::string(v);
  }
  std::int64_t num(std::string_view pointer) const {
    thread_local simdjson::dom::parser parser;
    std::int64_t v = 0;
    if (parser.parse(text).at_pointer(pointer).get_int64().get(v)) return -999999;
    return v;
  }
  bool flag(std::string_view pointer) const {
    thread_local simdjson::dom::parser parser;
    bool v = false;
    if (parser.parse(text).at_pointer(pointer).get_bool().get(v)) return false;
    return v;
  }
  std::string raw(std::string_view pointer) const {
    thread_local simdjson::dom::parser parser;
    simdjson::dom::element e;
    if (parser.parse(text).at_pointer(pointer).get(e)) return "<absent>";
    return simdjson::minify(e);
  }
  std::string op() const { return str("/op"); }
  std::string code() const { return str("/code"); }
};

/// A carrier that keeps what it is given.
class test_carrier final : public session_carrier {
 public:
  void send(std::string f) override {
    std::lock_guard lock(mu_);
    frames_.push_back(frame{std::move(f)});
  }
  std::size_t buffered_bytes() const override { return buffered; }
  void close(int code, std::string reason) override {
    std::lock_guard lock(mu_);
    close_code = code;
    close_reason = std::move(reason);
  }
  std::vector<frame> take() {
    std::lock_guard lock(mu_);
    return std::exchange(frames_, {});
  }

  std::size_t buffered = 0;  // what the test says the client has not read
  std::optional<int> close_code;
  std::string close_reason;

 private:
  std::mutex mu_;
  std::vector<frame> frames_;
};

/// One client connection.
struct wire {
  std::shared_ptr<test_carrier> carrier = std::make_shared<test_carrier>();
  std::shared_ptr<session> s;
  std::vector<frame> seen;  // frames received and not yet taken by `next`

  void send(std::string_view text) { s->receive(text); }

  void collect() {
    for (auto& f : carrier->take()) seen.push_back(std::move(f));
  }
  /// Sends `text` (which must carry `"id":N` or `"id":"…"`) and returns the reply with `id`.
  frame request(std::string_view text, std::string_view id_json) {
    send(text);
    collect();
    for (auto it = seen.begin(); it != seen.end(); ++it) {
      if ((it->op() == "ok" || it->op() == "error") && it->raw("/id") == id_json) {
        auto f = *it;
        seen.erase(it);
        return f;
      }
    }
    FAIL("no reply with id " << id_json << " to " << text);
    return {};
  }
  /// The oldest pushed frame of `op` (removed), if any.
  std::optional<frame> next(std::string_view op) {
    collect();
    for (auto it = seen.begin(); it != seen.end(); ++it) {
      if (it->op() == op) {
        auto f = *it;
        seen.erase(it);
        return f;
      }
    }
    return std::nullopt;
  }
  std::size_t count(std::string_view op) {
    collect();
    std::size_t n = 0;
    for (auto& f : seen) n += f.op() == op ? 1 : 0;
    return n;
  }
};

inline constexpr std::string_view k_secret = "a-test-secret-of-at-least-32-bytes!!";
inline constexpr std::string_view k_all_grants =
    R"({"send":["*"],"submit":["*"],"work":["*"],"publish":[">"],"subscribe":[">"]})";

struct gateway_rig {
  std::shared_ptr<manual_clock> clock = std::make_shared<manual_clock>();
  std::shared_ptr<transport> backend = memory_transport::create({.clock = clock});
  server_config config;
  std::shared_ptr<gateway> gw;

  /// `wrap` may put a transport of the test's (one that injects faults, say) over the
  /// memory transport; `workers` is what the gateway is told `run` has.
  explicit gateway_rig(
      const std::function<void(server_config&)>& tweak = {}, std::size_t outbound_limit = 4u << 20,
      executor run = inline_executor(),
      const std::function<std::shared_ptr<transport>(std::shared_ptr<transport>)>& wrap = {},
      std::size_t workers = 16) {
    if (wrap) backend = wrap(backend);
    open_gateway(tweak, outbound_limit, std::move(run), workers);
  }
  /// Another gateway on `first`'s clock and transport: another server of the same broker.
  gateway_rig(const gateway_rig& first, const std::function<void(server_config&)>& tweak)
      : clock(first.clock), backend(first.backend) {
    open_gateway(tweak, 4u << 20, inline_executor(), 16);
  }
  // `shutdown` waits for the gateway's fetches, which wait a second of this clock: it runs
  // beside a thread that lets the clock go on.
  ~gateway_rig() {
    auto done = std::async(std::launch::async, [this] { gw->shutdown(); });
    while (done.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
      clock->advance(std::chrono::milliseconds(250));
    }
  }

  void open_gateway(const std::function<void(server_config&)>& tweak, std::size_t outbound_limit,
                    executor run, std::size_t workers) {
    config.auth.secret = std::string(k_secret);
    if (tweak) tweak(config);
    gw = must(gateway::open({.config = config,
                             .backend = backend,
                             .server_name = "amp-test/1",
                             .run = std::move(run),
                             .workers = workers,
                             .outbound_limit_bytes = outbound_limit}));
  }

  std::string token(std::string_view sub, std::string_view grants = k_all_grants,
                    std::string_view ns = "demo") {
    return must(mint_token({.sub = std::string(sub),
                            .ns = std::string(ns),
                            .exp = clock->now() + std::chrono::hours(1),
                            .amp_json = std::string(grants)},
                           jwt_alg::hs256, k_secret));
  }
  wire open() {
    wire w;
    w.s = gw->open_session(w.carrier);
    return w;
  }
  /// A session that said hello as `sub`.
  wire connect(std::string_view sub, std::string_view grants = k_all_grants,
               std::string_view ns = "demo") {
    auto w = open();
    auto ok =
        w.request(R"({"op":"hello","id":"h","token":")" + token(sub, grants, ns) + "\"}", "\"h\"");
    REQUIRE(ok.op() == "ok");
    return w;
  }
};

}  // namespace amp::testing

// One client session of `amp.v1`: frames in, checks in the spec's order, operations on the
// broker, frames out. See include/amp/gateway/session.hpp and docs/protocol.md.

#include <simdjson.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "amp/detail/embedded_schemas.hpp"
#include "amp/json.hpp"
#include "amp/timestamp.hpp"
#include "detail/lanes.hpp"
#include "detail/simdjson_adapter.hpp"
#include "gateway/gateway_state.hpp"

namespace amp {

namespace dom = simdjson::dom;

namespace {

// The ops a client may send, each with its shape schema `frames/<op>`.
constexpr std::array<std::string_view, 19> k_ops = {
    "hello",   "register", "heartbeat", "who",       "watch",       "bye",    "send",
    "ack",     "nack",     "publish",   "subscribe", "unsubscribe", "submit", "claim",
    "decline", "complete", "fail",      "cancel",    "task"};

constexpr std::int64_t k_max_safe_integer = 9007199254740991;  // 2^53 - 1
// A session may have this many frames (or 64 MiB, or 4 frames' worth of bytes if more)
// waiting for the executor; a client that pipelines more is closed rather than queued without
// bound.
constexpr std::size_t k_max_inbound_frames = 8192;
constexpr std::size_t k_min_inbound_bytes = 64u << 20;
// The most frames of one session that run at once (on different lanes), waiting for the
// backend included.
constexpr int k_max_running = 64;
// What an op takes from the participant's ops bucket: nothing for hello and bye, nor for
// the ops the spec's rate limits (admit), the most for those that touch the whole registry.
double ops_cost(std::string_view op) {
  if (op == "hello" || op == "bye" || op == "send" || op == "publish" || op == "submit") return 0;
  if (op == "register" || op == "who" || op == "watch") return registry_op_cost;
  return 1;
}

// The most bytes of a registry entry's `meta` (minified), which every watcher receives.
constexpr std::size_t k_max_meta_bytes = 4096;

// `frames/names` cut down to what applies to `op`: its `definitions` and the `then` of every
// `allOf` branch whose `if` names `op` (the other branches' `if` fails for such a frame, so
// they constrain nothing). The same verdicts as the whole schema, without evaluating every
// op's branch on every frame. Empty when no branch names `op`.
std::string names_schema_for(std::string_view op) {
  std::string_view text;
  for (const auto& e : detail::embedded_schemas()) {
    if (e.name == "frames/names") text = e.text;
  }
  dom::parser parser;
  dom::element root = parser.parse(text.data(), text.size()).value();
  std::string branches;
  dom::array all_of = root["allOf"].get_array().value();
  for (dom::element branch : all_of) {
    dom::element cond = branch["if"]["properties"]["op"].value();
    bool names_op = false;
    std::string_view one;
    dom::array many;
    if (!cond["const"].get(one)) names_op = one == op;
    if (!cond["enum"].get(many)) {
      for (dom::element e : many) names_op = names_op || e.get_string().value() == op;
    }
    if (!names_op) continue;
    if (!branches.empty()) branches += ',';
    branches += simdjson::minify(branch["then"].value());
  }
  if (branches.empty()) return {};
  return fmt::format(R"({{"$schema":"http://json-schema.org/draft-07/schema#","definitions":{},)"
                     R"("type":"object","allOf":[{}]}})",
                     simdjson::minify(root["definitions"].value()), branches);
}

// Per op: the shape schema `frames/<op>`, and the names pass for it (see above), if any.
struct frame_schema {
  json_schema shape;
  std::optional<json_schema> names;
};

const std::map<std::string, frame_schema, std::less<>>& frame_schemas() {
  static const auto schemas = [] {
    std::map<std::string, frame_schema, std::less<>> m;
    for (auto op : k_ops) {
      frame_schema f{json_schema::embedded(fmt::format("frames/{}", op)).value(), std::nullopt};
      if (auto names = names_schema_for(op); !names.empty()) {
        f.names = detail::schema_access::parse_own(names).value();
      }
      m.emplace(std::string(op), std::move(f));
    }
    return m;
  }();
  return schemas;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::size_t utf8_length(std::string_view s) {
  std::size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80 ? 1 : 0;
  return n;
}

std::optional<std::string_view> string_at(dom::element e, std::string_view key) {
  std::string_view v;
  if (e.at_key(key).get_string().get(v)) return std::nullopt;
  return v;
}

std::string string_or_empty(dom::element e, std::string_view key) {
  return std::string(string_at(e, key).value_or(std::string_view{}));
}

std::optional<std::int64_t> int_at(dom::element e, std::string_view key) {
  std::int64_t v = 0;
  if (e.at_key(key).get_int64().get(v)) return std::nullopt;
  return v;
}

// The fence a frame carries (spec §7): its `attempt`, with one no attempt can have (outside
// 0..INT_MAX) kept as -1, never current, rather than narrowed to one that might be.
std::optional<int> attempt_of(dom::element frame) {
  auto a = int_at(frame, "attempt");
  if (!a) return std::nullopt;
  if (*a < 0 || *a > std::numeric_limits<int>::max()) return -1;
  return static_cast<int>(*a);
}

bool bool_or(dom::element e, std::string_view key, bool fallback) {
  bool v = fallback;
  if (e.at_key(key).get_bool().get(v)) return fallback;
  return v;
}

// The member's JSON text, minified; empty when absent.
std::string raw_at(dom::element e, std::string_view key) {
  dom::element v;
  if (e.at_key(key).get(v)) return {};
  return simdjson::minify(v);
}

header_list headers_at(dom::element e) {
  header_list out;
  dom::object o;
  if (e.at_key("headers").get_object().get(o)) return out;
  for (auto member : o) {
    std::string_view v;
    if (!member.value.get_string().get(v))
      out.emplace_back(std::string(member.key), std::string(v));
  }
  return out;
}

// A more helpful message for a name the names pass refused: what `make` says of it.
std::string name_problem(std::string_view op, std::string_view pointer, dom::element frame) {
  dom::element value;
  std::string_view text;
  if (frame.at_pointer(pointer).get(value) || value.get_string().get(text)) {
    return fmt::format("{}: not a valid name", pointer);
  }
  auto member = pointer.substr(1);
  member = member.substr(0, member.find('/'));
  std::optional<error> e;
  if (member == "to" || member == "reply_to") {
    if (auto r = participant_name::make(text); !r) e = r.error();
  } else if (member == "job" || member == "jobs") {
    if (auto r = job_name::make(text); !r) e = r.error();
  } else if (member == "topic" && op == "publish") {
    if (auto r = topic::make(text); !r) e = r.error();
  } else if (member == "topic") {
    if (auto r = topic_pattern::make(text); !r) e = r.error();
  } else if (member == "task") {
    if (auto r = task_id::make(text); !r) e = r.error();
  }
  if (e) return fmt::format("{}: {}", pointer, e->message());
  if (member == "sub") {
    return fmt::format("{}: {} is not a subscription name (^[a-z0-9][a-z0-9_-]{{0,63}}$)", pointer,
                       amp::quoted(text));
  }
  return fmt::format("{}: {} is not a valid name", pointer, amp::quoted(text));
}

}  // namespace

// A topic subscription of a session. Events that arrive before the `ok` of `subscribe` has
// been sent wait in `pending` (bounded like the carrier), so the client sees the `ok` first.
struct sub_state {
  std::string name;
  std::mutex mu;
  bool started = false;
  bool over = false;
  std::optional<std::uint64_t> dropped_at;  // dropped before the ok was sent
  std::vector<std::string> pending;
  std::size_t pending_bytes = 0;
  std::unique_ptr<topic_subscription> s;
};

struct session::impl : std::enable_shared_from_this<session::impl> {
  std::shared_ptr<gateway::impl> gw;
  std::shared_ptr<session_carrier> carrier;
  std::string id;

  // Frames waiting for the executor and running on it, by lane (see `classify`): frames of
  // one lane run one at a time in the order they came; a frame without a lane (`barrier`)
  // runs alone; frames of different lanes run at once (up to k_max_running of a session).
  using frame_lanes = detail::lanes<std::string>;
  using inbound_frame = frame_lanes::entry;
  std::unique_ptr<frame_lanes> frames;  // set by new_session

  std::atomic<bool> ended{false};    // closed() ran, or a close was asked of the carrier
  std::atomic<bool> cleaned{false};  // closed() ran

  std::mutex mu;
  std::optional<identity> ident;
  std::shared_ptr<detail::ns_state> ns;
  std::unique_ptr<inbox_reader> reader;
  std::map<std::string, std::shared_ptr<sub_state>, std::less<>> subs;
  std::uint64_t next_sub = 1;
  timer_id hello_timer = 0;
  bool counted = false;  // counts in the gateway's sessions
  bool pending_counted = true;

  std::mutex out_mu;
  bool close_requested = false;

  // ---- output -------------------------------------------------------------------------

  enum class out_kind {
    reply,   // a reply or a push the client must get: over the hard limit, close
    event,   // a topic event: refused over the soft limit
    forced,  // sent whatever the buffer holds (sub_dropped, the last error before a close)
  };

  // Sends one frame; false when it was not sent (closing, or an event over the limit).
  bool emit(std::string frame, std::string_view op, out_kind kind = out_kind::reply) {
    std::lock_guard lock(out_mu);
    if (close_requested) return false;
    auto limit = gw->opts.outbound_limit_bytes;
    auto buffered = carrier->buffered_bytes();
    if (kind == out_kind::event && buffered + frame.size() > limit) return false;
    if (kind == out_kind::reply && buffered > 4 * limit) {
      close_locked(close_code::policy_violation, "slow consumer: the client does not read");
      gw->metrics.slow_consumer();
      gw->log("warn", "slow_consumer",
              fmt::format("\"session\":{},\"buffered\":{}", json_quote(id), buffered));
      return false;
    }
    carrier->send(std::move(frame));
    gw->metrics.frame_out(op);
    return true;
  }

  void close_locked(int code, std::string reason) {
    if (close_requested) return;
    close_requested = true;
    ended = true;
    frames->close();
    carrier->close(code, std::move(reason));
  }

  void request_close(int code, std::string reason) {
    std::lock_guard lock(out_mu);
    close_locked(code, std::move(reason));
  }

  // ---- requests -----------------------------------------------------------------------

  struct request {
    std::string_view op;
    std::string id_json;  // the id to echo, or "null"
    bool has_id = false;
    dom::element frame;          // valid only while `process` runs
    std::shared_ptr<void> hold;  // the frame's lane is busy until every copy is gone
  };

  // The request as an operation that answers later keeps it: without the frame.
  static request later(const request& rq) {
    return request{
        .op = rq.op, .id_json = rq.id_json, .has_id = rq.has_id, .frame = {}, .hold = rq.hold};
  }

  void reply_ok(const request& rq, std::string_view members = {}) {
    if (!rq.has_id) return;
    std::string out = fmt::format("{{\"op\":\"ok\",\"id\":{}", rq.id_json);
    if (!members.empty()) {
      out += ',';
      out += members;
    }
    out += '}';
    emit(std::move(out), "ok");
  }

  void reply_error(std::string_view id_json, const error& e,
                   std::optional<std::int64_t> retry_after_ms = {},
                   out_kind kind = out_kind::reply) {
    json_writer w;
    w.begin_object().key("op").string("error").key("id").raw(id_json);
    w.key("code").string(to_string(e.code())).key("message").string(e.message());
    if (!e.path().empty()) w.key("path").string(e.path());
    if (retry_after_ms) w.key("retry_after_ms").integer(*retry_after_ms);
    w.end_object();
    gw->metrics.error(to_string(e.code()));
    emit(w.take(), "error", kind);
  }

  void fail(const request& rq, const error& e, std::optional<std::int64_t> retry_after_ms = {}) {
    reply_error(rq.id_json, e, retry_after_ms);
  }

  void fail(const request& rq, errc code, std::string message) {
    fail(rq, error(code, std::move(message)));
  }

  // ---- inbound --------------------------------------------------------------------------

  // Which lane `text` goes to: ops on one task share the task's lane, sends to one
  // recipient and publishes on one topic keep their order, submits and acks keep none;
  // everything else (hello, register, heartbeat, bye, subscriptions, watch, who, bad frames)
  // is a barrier.
  static void classify(inbound_frame& f) {
    thread_local dom::parser parser;
    detail::parser_release release(parser);
    dom::element frame;
    if (parser.parse(f.item.data(), f.item.size()).get(frame) || !frame.is_object()) return;
    auto op = string_at(frame, "op");
    if (!op) return;
    auto lane_of = [&](std::string_view prefix, std::string_view member) {
      auto v = string_at(frame, member);
      if (!v) return;
      f.barrier = false;
      f.lane = fmt::format("{}:{}", prefix, *v);
    };
    if (*op == "claim" || *op == "decline" || *op == "complete" || *op == "fail" ||
        *op == "cancel" || *op == "task" ||
        (*op == "heartbeat" && frame.at_key("task").error() == simdjson::SUCCESS)) {
      lane_of("task", "task");
    } else if (*op == "send") {
      lane_of("to", "to");
    } else if (*op == "publish") {
      lane_of("topic", "topic");
    } else if (*op == "submit" || *op == "ack" || *op == "nack") {
      f.barrier = false;
    }
  }

  void receive(std::string_view text) {
    if (ended) return;
    inbound_frame f{.item = std::string(text), .barrier = true, .lane = {}, .bytes = text.size()};
    classify(f);
    auto start = frames->push(std::move(f));
    if (!start) {
      if (ended) return;  // closed meanwhile: nothing more runs
      request_close(close_code::policy_violation, "too many frames waiting to be processed");
      gw->log("warn", "inbound_overflow", fmt::format("\"session\":{}", json_quote(id)));
      return;
    }
    run(std::move(*start));
  }

  void run(std::vector<inbound_frame> start) {
    for (auto& f : start) {
      gw->post([self = shared_from_this(), f = std::move(f)]() mutable {
        // The frame is finished when its answer is: at the end of `process`, or later, when
        // an asynchronous operation lets go of its copy of `hold`.
        // Counted in `in_flight` like executor work, so that shutdown waits for the answer.
        self->gw->in_flight.fetch_add(1);
        std::shared_ptr<void> hold(nullptr,
                                   [self, barrier = f.barrier, lane = std::move(f.lane)](void*) {
                                     self->run(self->frames->finished(barrier, lane));
                                     self->gw->in_flight.fetch_sub(1);
                                   });
        self->process(f.item, std::move(hold));
        self->run(self->frames->left_thread());
      });
    }
  }

  void process(std::string_view text, std::shared_ptr<void> hold) {
    thread_local dom::parser parser;
    detail::parser_release release(parser);
    dom::element frame;
    if (auto err = parser.parse(text.data(), text.size()).get(frame)) {
      gw->metrics.frame_in("invalid");
      reply_error("null", error(errc::bad_request,
                                fmt::format("not valid JSON: {}", simdjson::error_message(err))));
      return;
    }
    if (!frame.is_object()) {
      gw->metrics.frame_in("invalid");
      reply_error("null", error(errc::bad_request, "a frame must be a JSON object"));
      return;
    }
    request rq;
    rq.frame = frame;
    rq.hold = std::move(hold);
    rq.id_json = "null";
    dom::element id_value;
    if (!frame.at_key("id").get(id_value)) {
      std::string_view s;
      std::int64_t i = 0;
      if (!id_value.get_string().get(s) && utf8_length(s) <= 64) {
        rq.id_json = json_quote(s);
        rq.has_id = true;
      } else if (id_value.is_int64() && !id_value.get_int64().get(i) && i >= -k_max_safe_integer &&
                 i <= k_max_safe_integer) {
        rq.id_json = std::to_string(i);
        rq.has_id = true;
      } else {
        gw->metrics.frame_in("invalid");
        reply_error("null", error(errc::bad_request,
                                  "id must be a string of at most 64 characters or an integer "
                                  "within ±(2^53-1)"));
        return;
      }
    }
    std::string_view op;
    dom::element op_value;
    if (frame.at_key("op").get(op_value)) {
      gw->metrics.frame_in("invalid");
      return fail(rq, errc::bad_request, "missing op");
    }
    if (op_value.get_string().get(op)) {
      gw->metrics.frame_in("invalid");
      return fail(rq, errc::bad_request, "op must be a string");
    }
    auto known = std::find(k_ops.begin(), k_ops.end(), op);
    if (known == k_ops.end()) {
      gw->metrics.frame_in("unknown");
      return fail(rq, errc::bad_request, fmt::format("unknown op {}", amp::quoted(op)));
    }
    rq.op = *known;  // static, unlike the parsed text: an answer may come after `process`
    gw->metrics.frame_in(op);
    bool authenticated = false;
    {
      std::lock_guard lock(mu);
      authenticated = ident.has_value();
    }
    if (!authenticated && op != "hello") {
      return fail(rq, errc::unauthenticated, "say hello with a token first");
    }
    if (authenticated && op == "hello")
      return fail(rq, errc::bad_request, "hello was already said");
    const auto& schemas = frame_schemas().find(op)->second;
    if (auto r = detail::schema_access::validate(schemas.shape, frame); !r) {
      return fail(rq, error(errc::bad_request, r.error().message(), r.error().path()));
    }
    if (schemas.names) {
      if (auto r = detail::schema_access::validate(*schemas.names, frame); !r) {
        return fail(rq, error(errc::invalid_name, name_problem(op, r.error().path(), frame),
                              r.error().path()));
      }
    }
    if (const double cost = ops_cost(op); cost > 0) {
      rate_verdict verdict;
      {
        std::lock_guard lock(mu);  // the names only: who() would copy the whole identity
        verdict = gw->pol->take_ops(ident->ns, ident->participant, cost);
      }
      if (!verdict.allowed) {
        return fail(rq, error(errc::rate_limited, verdict.message), verdict.retry_after.count());
      }
    }
    try {
      dispatch(rq);
    } catch (const std::exception& e) {
      gw->log("error", "internal",
              fmt::format("\"session\":{},\"op\":{},\"what\":{}", json_quote(id), json_quote(op),
                          json_quote(e.what())));
      fail(rq, errc::internal, "internal error");
    }
  }

  void dispatch(request& rq) {
    auto op = rq.op;
    if (op == "hello") return on_hello(rq);
    if (op == "register") return on_register(rq);
    if (op == "heartbeat") return on_heartbeat(rq);
    if (op == "who") return on_who(rq);
    if (op == "watch") return on_watch(rq);
    if (op == "bye") return on_bye(rq);
    if (op == "send") return on_send(rq);
    if (op == "ack" || op == "nack") return on_ack(rq);
    if (op == "publish") return on_publish(rq);
    if (op == "subscribe") return on_subscribe(rq);
    if (op == "unsubscribe") return on_unsubscribe(rq);
    if (op == "submit") return on_submit(rq);
    if (op == "claim") return on_claim(rq);
    if (op == "decline") return on_decline(rq);
    if (op == "complete") return on_complete(rq);
    if (op == "fail") return on_fail(rq);
    if (op == "cancel") return on_cancel(rq);
    if (op == "task") return on_task(rq);
  }

  // The identity and namespace of an authenticated session (every op but hello). Callers
  // name the two through references, not a structured binding: their lambdas capture them,
  // which clang before 16 refuses for bindings (the fuzz build is clang 14).
  std::pair<identity, std::shared_ptr<detail::ns_state>> who() {
    std::lock_guard lock(mu);
    return {*ident, ns};
  }

  // ---- hello ----------------------------------------------------------------------------

  void start_hello_deadline() {
    std::weak_ptr<impl> weak = shared_from_this();
    auto at = gw->clk->now() + gw->opts.hello_timeout;
    auto t = gw->clk->call_at(at, [weak] {
      auto self = weak.lock();
      if (!self) return;
      {
        std::lock_guard lock(self->mu);
        if (self->ident) return;
      }
      if (self->ended) return;
      self->reply_error("null", error(errc::unauthenticated, "no hello within the deadline"), {},
                        out_kind::forced);
      self->request_close(close_code::unauthenticated, "no hello");
      self->gw->log("info", "hello_timeout", fmt::format("\"session\":{}", json_quote(self->id)));
    });
    std::lock_guard lock(mu);
    hello_timer = t;
  }

  void on_hello(request& rq) {
    auto token = string_or_empty(rq.frame, "token");
    auto verified = gw->auth->verify(token, gw->clk->now());
    if (!verified) {
      reply_error(rq.id_json, verified.error(), {}, out_kind::forced);
      request_close(close_code::unauthenticated, "unauthenticated");
      gw->log("info", "hello_failed",
              fmt::format("\"session\":{},\"reason\":{}", json_quote(id),
                          json_quote(verified.error().message())));
      return;
    }
    if (gw->shutting_down) {
      reply_error(rq.id_json, error(errc::unavailable, "the server is shutting down"), {},
                  out_kind::forced);
      request_close(close_code::going_away, "shutting down");
      return;
    }
    auto max = gw->opts.config.limits.max_sessions;
    if (!gw->metrics.try_open(max)) {
      reply_error(rq.id_json,
                  error(errc::limit_exceeded,
                        fmt::format("the server has max_sessions ({}) sessions", max)),
                  {}, out_kind::forced);
      request_close(close_code::try_again_later, "too many sessions");
      gw->log("warn", "max_sessions", fmt::format("\"session\":{}", json_quote(id)));
      return;
    }
    auto& me = *verified;
    bool opened = false;  // the place in max_sessions reserved above
    auto release_place = [&] {
      if (!opened) gw->metrics.session_closed();
    };
    auto state = gw->ns_for(me.ns);
    if (!state) {
      release_place();
      return fail(rq, state.error());
    }
    auto self = shared_from_this();
    std::weak_ptr<impl> weak = self;
    auto attached = gw->timed([&] {
      return (*state)->b->inbox().attach(me.participant, [weak](const inbox_message& m) {
        if (auto s = weak.lock()) s->deliver(m);
      });
    });
    if (!attached) {
      release_place();
      return fail(rq, attached.error());
    }
    {
      std::lock_guard lock(mu);
      if (ended) {  // closed meanwhile: the reader stops as it goes out of scope
        release_place();
        return;
      }
      opened = true;
      ident = me;
      ns = *state;
      reader = std::move(*attached);
      counted = true;
      pending_counted = false;
      if (hello_timer) gw->clk->cancel(hello_timer);
    }
    gw->pending_connections.fetch_sub(1);
    {
      std::lock_guard lock((*state)->mu);
      auto& w = (*state)->workers[this];
      w.s = self;
      w.who = me.participant.str();
    }
    const auto& c = gw->opts.config;
    json_writer w;
    w.begin_object();
    w.key("session").string(id).key("participant").string(me.participant.view());
    w.key("ns").string(me.ns.view()).key("heartbeat_s").integer(c.heartbeat_s);
    w.key("registry_ttl_s").integer(c.registry_ttl_s);
    w.key("max_frame_bytes").integer(c.limits.max_frame_bytes);
    w.key("server").string(gw->opts.server_name).end_object();
    auto members = w.take();
    reply_ok(rq, std::string_view(members).substr(1, members.size() - 2));
    gw->log("info", "session_open",
            fmt::format("\"session\":{},\"participant\":{},\"ns\":{}", json_quote(id),
                        json_quote(me.participant.view()), json_quote(me.ns.view())));
  }

  // ---- inbox ----------------------------------------------------------------------------

  void deliver(const inbox_message& m) {
    json_writer w;
    w.begin_object().key("op").string("message").key("seq").integer(m.seq);
    w.key("delivery").integer(m.delivery).key("envelope").raw(to_json(m.env)).end_object();
    emit(w.take(), "message");
  }

  // The policy checks of send, publish and submit, in the spec's order after the
  // envelope: rate, then budget. Returns the spend to refund if the operation fails.
  // `count_budget` may decide after the rate passed whether the budget counts (false: a
  // resubmission), or fail the request itself (then it returns an error).
  std::optional<budget_spend> admit(const request& rq, const identity& me, std::size_t body_bytes,
                                    const std::function<result<bool>()>& count_budget = {}) {
    auto verdict = gw->pol->take_rate(me.ns, me.participant, body_bytes);
    if (!verdict.allowed) {
      fail(rq, error(errc::rate_limited, verdict.message), verdict.retry_after.count());
      return std::nullopt;
    }
    if (count_budget) {
      auto counts = count_budget();
      if (!counts) {
        fail(rq, counts.error());
        return std::nullopt;
      }
      if (!*counts) return budget_spend{.ns = me.ns, .participant = me.participant};
    }
    auto spend = gw->timed([&] { return gw->pol->spend_budget(me.ns, me.participant); });
    if (!spend) {
      fail(rq, spend.error());
      return std::nullopt;
    }
    return *spend;
  }

  void refund(const budget_spend& spend) {
    if (!spend.counted()) return;
    (void)gw->timed([&] { return gw->pol->refund_budget(spend); });
  }

  result<void> check_body(std::string_view body) {
    if (body.size() > gw->opts.config.limits.max_body_bytes) {
      return error(errc::payload_too_large,
                   fmt::format("body is {} bytes; max_body_bytes is {}", body.size(),
                               gw->opts.config.limits.max_body_bytes),
                   "/body");
    }
    return {};
  }

  // The envelope rules and the body schema of the message's type (`invalid_envelope`).
  result<envelope> check_envelope(const identity& me, std::string to, std::string body,
                                  std::string type, header_list headers, std::string msg_id,
                                  std::string reply_to = {}, std::string correlation = {}) {
    auto sealed = detail::seal_envelope({.from = std::string(me.participant.view()),
                                         .to = std::move(to),
                                         .body = std::move(body),
                                         .type = std::move(type),
                                         .headers = std::move(headers),
                                         .msg_id = std::move(msg_id),
                                         .reply_to = std::move(reply_to),
                                         .correlation = std::move(correlation)},
                                        me.ns.view(), gw->clk->now());
    if (!sealed) return sealed.error();
    if (!sealed->type.empty()) {
      auto it = gw->body_schemas.find(sealed->type);
      if (it != gw->body_schemas.end()) {
        if (auto r = it->second.validate(sealed->body); !r) {
          auto path = "/body" + r.error().path();
          return error(errc::invalid_envelope,
                       fmt::format("body does not match the schema of type {}: {}",
                                   amp::quoted(sealed->type), r.error().message()),
                       path);
        }
      }
    }
    return sealed;
  }

  void on_send(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    auto to = participant_name::make(string_or_empty(rq.frame, "to")).value();
    if (!me.grants.may_send(to)) {
      return fail(rq, errc::forbidden,
                  fmt::format("not granted to send to {}", amp::quoted(to.view())));
    }
    auto body = raw_at(rq.frame, "body");
    if (auto r = check_body(body); !r) return fail(rq, r.error());
    auto env = check_envelope(me, std::string(to.view()), body, string_or_empty(rq.frame, "type"),
                              headers_at(rq.frame), string_or_empty(rq.frame, "msg_id"),
                              string_or_empty(rq.frame, "reply_to"),
                              string_or_empty(rq.frame, "correlation"));
    if (!env) return fail(rq, env.error());
    auto spend = admit(rq, me, body.size());
    if (!spend) return;
    st->b->inbox().async_send({.to = to,
                               .from = env->from,
                               .body = std::move(env->body),
                               .type = env->type,
                               .headers = env->headers,
                               .msg_id = env->id,
                               .reply_to = env->reply_to,
                               .correlation = env->correlation},
                              answer_later<send_result>(rq, *spend));
  }

  // The completion that answers a send or publish (see `answer_stored`) when the backend has.
  template <class Stored>
  completion<Stored> answer_later(const request& rq, const budget_spend& spend) {
    return [self = shared_from_this(), rq = later(rq), spend,
            started = std::chrono::steady_clock::now()](result<Stored> stored) {
      self->gw->metrics.backend(seconds_since(started));
      if (!stored || stored->duplicate) {
        // The refund may block: not on the transport's thread.
        return self->gw->post(
            [self, rq, spend, stored] { self->answer_stored(rq, spend, stored); });
      }
      self->answer_stored(rq, spend, stored);
    };
  }

  // The answer to a send or publish (`send_result`, `publish_result`): a failure or a
  // duplicate gives the budget unit back (a duplicate costs rate, not budget).
  template <class Stored>
  void answer_stored(const request& rq, const budget_spend& spend, const result<Stored>& stored) {
    if (!stored || stored->duplicate) refund(spend);
    if (!stored) return fail(rq, stored.error());
    json_writer w;
    w.begin_object().key("seq").integer(stored->seq).key("msg_id").string(stored->msg_id);
    w.key("duplicate").boolean(stored->duplicate).end_object();
    reply_members(rq, w.take());
  }

  void reply_members(const request& rq, const std::string& object_json) {
    reply_ok(rq, std::string_view(object_json).substr(1, object_json.size() - 2));
  }

  void on_ack(request& rq) {
    auto seq = int_at(rq.frame, "seq").value_or(0);
    auto delay = std::chrono::milliseconds(int_at(rq.frame, "delay_ms").value_or(0));
    result<void> done = error(errc::not_found, "no reader");
    {
      // ack and nack never block; the reader may be stopped by closed() meanwhile.
      std::lock_guard lock(mu);
      if (reader && seq > 0) {
        done = rq.op == "ack" ? reader->ack(static_cast<std::uint64_t>(seq))
                              : reader->nack(static_cast<std::uint64_t>(seq), delay);
      }
    }
    if (!done) {
      if (done.error().code() == errc::not_found) {
        return fail(
            rq, errc::not_found,
            fmt::format("no message with seq {} is in flight to you (unknown or already settled)",
                        seq));
      }
      return fail(rq, done.error());
    }
    reply_ok(rq);
  }

  // ---- topics ---------------------------------------------------------------------------

  void on_publish(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    auto t = topic::make(string_or_empty(rq.frame, "topic")).value();
    if (!me.grants.may_publish(t)) {
      return fail(rq, errc::forbidden,
                  fmt::format("not granted to publish to {}", amp::quoted(t.view())));
    }
    auto body = raw_at(rq.frame, "body");
    if (auto r = check_body(body); !r) return fail(rq, r.error());
    auto env = check_envelope(me, std::string(t.view()), body, string_or_empty(rq.frame, "type"),
                              headers_at(rq.frame), string_or_empty(rq.frame, "msg_id"));
    if (!env) return fail(rq, env.error());
    auto spend = admit(rq, me, body.size());
    if (!spend) return;
    st->b->topics().async_publish({.to = t,
                                   .from = env->from,
                                   .body = std::move(env->body),
                                   .type = env->type,
                                   .headers = env->headers,
                                   .msg_id = env->id},
                                  answer_later<publish_result>(rq, *spend));
  }

  result<replay_from> replay_of(dom::element frame) {
    dom::element from;
    if (frame.at_key("from").get(from)) return replay_from::new_events();
    std::string_view s;
    if (!from.get_string().get(s)) {
      if (s == "all") return replay_from::all();
      if (s == "last") return replay_from::last();
      return replay_from::new_events();
    }
    std::int64_t seq = 0;
    if (!from.at_key("seq").get_int64().get(seq)) {
      return replay_from::sequence(static_cast<std::uint64_t>(seq));
    }
    std::string_view time;
    if (!from.at_key("time").get_string().get(time)) {
      auto t = parse_timestamp(time);
      if (!t)
        return error(errc::bad_request, fmt::format("/from/time: {}", t.error().message()),
                     "/from/time");
      return replay_from::at_time(*t);
    }
    return error(errc::bad_request,
                 "/from: must be \"new\", \"all\", \"last\", {\"seq\":N} or {\"time\":T}");
  }

  void on_subscribe(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    auto pattern = topic_pattern::make(string_or_empty(rq.frame, "topic")).value();
    auto from = replay_of(rq.frame);
    if (!from) return fail(rq, from.error());
    if (!me.grants.may_subscribe(pattern)) {
      return fail(
          rq, errc::forbidden,
          fmt::format("not granted to subscribe to {} (every topic it matches must be granted)",
                      amp::quoted(pattern.view())));
    }
    auto state = std::make_shared<sub_state>();
    {
      std::lock_guard lock(mu);
      auto name = string_or_empty(rq.frame, "sub");
      if (name.empty()) {
        do {
          name = fmt::format("s{}", next_sub++);
        } while (subs.contains(name));
      } else if (subs.contains(name)) {
        return fail(rq, errc::conflict,
                    fmt::format("subscription {} is already in use", amp::quoted(name)));
      }
      if (subs.size() >= gw->opts.config.limits.max_subscriptions) {
        return fail(rq, errc::limit_exceeded,
                    fmt::format("a session may have {} subscriptions (max_subscriptions)",
                                gw->opts.config.limits.max_subscriptions));
      }
      state->name = name;
      subs.emplace(name, state);
    }
    std::weak_ptr<impl> weak = shared_from_this();
    auto on_event = [weak, state](const topic_event& ev) {
      auto self = weak.lock();
      if (!self) return false;
      json_writer w;
      w.begin_object().key("op").string("event").key("sub").string(state->name);
      w.key("seq").integer(ev.seq).key("topic").string(ev.t.view());
      w.key("envelope").raw(to_json(ev.env)).end_object();
      auto frame = w.take();
      std::lock_guard lock(state->mu);
      if (state->over) return false;
      if (!state->started) {
        if (state->pending_bytes + frame.size() > self->gw->opts.outbound_limit_bytes) return false;
        state->pending_bytes += frame.size();
        state->pending.push_back(std::move(frame));
        return true;
      }
      return self->emit(std::move(frame), "event", out_kind::event);
    };
    auto on_dropped = [weak, state](std::uint64_t last_seq) {
      auto self = weak.lock();
      if (!self) return;
      std::unique_ptr<topic_subscription> done;
      {
        std::lock_guard lock(state->mu);
        state->over = true;
        if (!state->started) {
          // Dropped during the replay, before the ok: the events taken so far wait in
          // `pending`; on_subscribe sends them after the ok, then sub_dropped.
          state->dropped_at = last_seq;
          return;
        }
        done = std::move(state->s);
      }
      self->retire(std::move(done));
      self->announce_drop(state, last_seq);
    };
    auto s =
        gw->timed([&] { return st->b->topics().subscribe(pattern, *from, on_event, on_dropped); });
    if (!s) {
      std::lock_guard lock(mu);
      subs.erase(state->name);
      return fail(rq, s.error());
    }
    std::unique_ptr<topic_subscription> stale;
    {
      std::lock_guard lock(state->mu);
      state->s = std::move(*s);
      if (ended) stale = std::move(state->s);
    }
    if (stale) {
      stale->stop();
      return;
    }
    json_writer w;
    w.begin_object().key("sub").string(state->name).end_object();
    reply_members(rq, w.take());
    std::optional<std::uint64_t> dropped_at;
    {
      std::lock_guard lock(state->mu);
      for (auto& frame : state->pending) emit(std::move(frame), "event", out_kind::forced);
      state->pending.clear();
      state->pending_bytes = 0;
      state->started = true;
      dropped_at = state->dropped_at;
      if (dropped_at) stale = std::move(state->s);
    }
    if (dropped_at) {
      retire(std::move(stale));
      announce_drop(state, *dropped_at);
    }
  }

  // Tells the client its subscription was dropped, and forgets it.
  void announce_drop(const std::shared_ptr<sub_state>& state, std::uint64_t last_seq) {
    json_writer w;
    w.begin_object().key("op").string("sub_dropped").key("sub").string(state->name);
    w.key("reason").string("slow_consumer").key("last_seq").integer(last_seq).end_object();
    emit(w.take(), "sub_dropped", out_kind::forced);
    gw->metrics.slow_consumer();
    gw->log("warn", "sub_dropped",
            fmt::format("\"session\":{},\"sub\":{},\"last_seq\":{}", json_quote(id),
                        json_quote(state->name), last_seq));
    std::lock_guard lock(mu);
    auto it = subs.find(state->name);
    if (it != subs.end() && it->second == state) subs.erase(it);
  }

  void on_unsubscribe(request& rq) {
    auto name = string_or_empty(rq.frame, "sub");
    std::shared_ptr<sub_state> state;
    {
      std::lock_guard lock(mu);
      auto it = subs.find(name);
      if (it == subs.end())
        return fail(rq, errc::not_found, fmt::format("no subscription {}", amp::quoted(name)));
      state = it->second;
      subs.erase(it);
    }
    stop_sub(*state);
    reply_ok(rq);
  }

  // Stops a subscription whose callback may be running on this very thread, and destroys it
  // later on the executor (its callbacks hold its state: dropping it breaks that cycle).
  void retire(std::unique_ptr<topic_subscription> s) {
    if (!s) return;
    s->stop();
    auto holder = std::make_shared<std::unique_ptr<topic_subscription>>(std::move(s));
    gw->post([holder] { holder->reset(); });
  }

  ~impl() {
    for (auto& [name, state] : subs) {
      std::unique_ptr<topic_subscription> s;
      {
        std::lock_guard lock(state->mu);
        state->over = true;
        s = std::move(state->s);
      }
      retire(std::move(s));
    }
    if (reader) reader->stop();
  }

  static void stop_sub(sub_state& state) {
    std::unique_ptr<topic_subscription> s;
    {
      std::lock_guard lock(state.mu);
      state.over = true;
      s = std::move(state.s);
    }
    if (s) s->stop();
  }

  // ---- registry -------------------------------------------------------------------------

  int load_of(const identity& me, detail::ns_state& st) {
    return static_cast<int>(st.b->jobs().leases_of(me.participant).size());
  }

  void remember_entry(detail::ns_state& st, const registry_entry& e) {
    std::lock_guard lock(st.mu);
    st.live.insert_or_assign(std::string(e.participant.view()), e);
  }

  void on_register(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    std::vector<job_name> jobs;
    dom::array arr;
    if (!rq.frame.at_key("jobs").get_array().get(arr)) {
      for (auto j : arr) {
        std::string_view s;
        if (!j.get_string().get(s)) jobs.push_back(job_name::make(s).value());
      }
    }
    for (const auto& j : jobs) {
      if (!me.grants.may_work(j)) {
        return fail(rq, errc::forbidden,
                    fmt::format("not granted to work on job {}", amp::quoted(j.view())));
      }
    }
    auto slots = static_cast<int>(int_at(rq.frame, "slots").value_or(1));
    auto meta = raw_at(rq.frame, "meta");
    if (meta.empty()) meta = "{}";
    if (meta.size() > k_max_meta_bytes) {
      return fail(rq, error(errc::payload_too_large,
                            fmt::format("meta is {} bytes; at most {} are allowed", meta.size(),
                                        k_max_meta_bytes),
                            "/meta"));
    }
    auto entry = gw->timed([&] {
      return st->b->registry().register_participant(me.participant, jobs, slots, meta,
                                                    load_of(me, *st));
    });
    if (!entry) return fail(rq, entry.error());
    remember_entry(*st, *entry);
    {
      std::lock_guard lock(st->mu);
      // A session that closed meanwhile has had its entry removed: it must not come back.
      if (ended) return;
      auto& w = st->workers[this];
      w.registered = true;
      w.jobs = entry->jobs;
      w.slots = entry->slots;
      w.meta = entry->meta;
    }
    reply_members(rq, fmt::format("{{\"expires_in_s\":{}}}", gw->opts.config.registry_ttl_s));
    gw->log("info", "registered",
            fmt::format("\"session\":{},\"participant\":{},\"slots\":{}", json_quote(id),
                        json_quote(me.participant.view()), slots));
    gw->pump_all(st, entry->jobs);
  }

  // Refreshes the entry; one that expired while this session stayed registered comes back.
  void refresh_entry(const identity& me, const std::shared_ptr<detail::ns_state>& st) {
    auto load = load_of(me, *st);
    auto refreshed = gw->timed([&] { return st->b->registry().heartbeat(me.participant, load); });
    if (refreshed) {
      remember_entry(*st, *refreshed);
      return;
    }
    if (refreshed.error().code() != errc::not_found) return;
    std::vector<job_name> jobs;
    int slots = 0;
    std::string meta;
    {
      std::lock_guard lock(st->mu);
      auto it = st->workers.find(this);
      if (it == st->workers.end() || !it->second.registered) return;
      auto& w = it->second;
      jobs = w.jobs;
      slots = w.slots;
      meta = w.meta;
    }
    auto entry = gw->timed([&] {
      return st->b->registry().register_participant(me.participant, jobs, slots, meta, load);
    });
    if (entry) {
      remember_entry(*st, *entry);
      gw->pump_all(st, entry->jobs);
    }
  }

  void on_heartbeat(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    refresh_entry(me, st);
    if (auto task = string_at(rq.frame, "task")) {
      auto t = task_id::make(*task).value();
      auto l = gw->timed(
          [&] { return st->b->jobs().heartbeat(t, me.participant, attempt_of(rq.frame)); });
      if (!l) {
        if (l.error().code() == errc::lease_lost) lease_refused(st, me.participant, t);
        return fail(rq, l.error());
      }
      {
        std::lock_guard lock(st->mu);
        auto it = st->workers.find(this);
        if (it != st->workers.end()) it->second.leases.insert_or_assign(t.str(), l->job);
      }
      json_writer w;
      w.begin_object()
          .key("task")
          .string(t.view())
          .key("expires_at")
          .string(format_timestamp(l->expires_at));
      w.end_object();
      return reply_members(rq, w.take());
    }
    // Only the leases held through this session (spec §4): one claimed in a session that is
    // gone runs out unless a session adopts it.
    std::vector<std::string> held;
    {
      std::lock_guard lock(st->mu);
      auto it = st->workers.find(this);
      if (it != st->workers.end()) {
        for (const auto& [task, job] : it->second.leases) held.push_back(task);
      }
    }
    // Each lease on its own: one the backend could not extend does not keep the others from
    // being extended; the answer is then that error, naming the leases it concerns.
    std::optional<error> trouble;
    std::vector<std::string> not_extended;
    json_writer w;
    w.begin_object().key("leases").begin_array();
    for (const auto& task : held) {
      auto t = task_id::make(task).value();
      auto l = gw->timed([&] { return st->b->jobs().heartbeat(t, me.participant); });
      if (!l) {
        if (l.error().code() == errc::lease_lost) {
          lease_over(st, task, {});
        } else {
          if (!trouble) trouble = l.error();
          not_extended.push_back(task);
        }
        continue;
      }
      w.begin_object()
          .key("task")
          .string(l->task.view())
          .key("expires_at")
          .string(format_timestamp(l->expires_at));
      w.end_object();
    }
    w.end_array().end_object();
    if (trouble) {
      return fail(rq, error(trouble->code(),
                            fmt::format("not extended: {} ({}); the others were",
                                        fmt::join(not_extended, ", "), trouble->message())));
    }
    reply_members(rq, w.take());
  }

  void on_who(request& rq) {
    auto here = who();
    auto& st = here.second;
    std::optional<job_name> job;
    if (auto j = string_at(rq.frame, "job")) job = job_name::make(*j).value();
    auto entries = gw->timed([&] { return st->b->registry().live(job); });
    if (!entries) return fail(rq, entries.error());
    json_writer w;
    w.begin_object().key("participants").begin_array();
    for (const auto& e : *entries) w.raw(to_json(e));
    w.end_array().end_object();
    reply_members(rq, w.take());
  }

  void on_watch(request& rq) {
    auto here = who();
    auto& st = here.second;
    auto now = gw->clk->now();
    json_writer w;
    w.begin_object().key("participants").begin_array();
    std::lock_guard lock(st->mu);  // presence events are sent under it: none overtakes this ok
    for (const auto& [name, e] : st->live) {
      if (e.expires_at > now) w.raw(to_json(e));
    }
    w.end_array().end_object();
    st->watchers[this] = weak_from_this();
    reply_members(rq, w.take());
  }

  // ---- jobs -----------------------------------------------------------------------------

  void on_submit(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    auto job = job_name::make(string_or_empty(rq.frame, "job")).value();
    if (!me.grants.may_submit(job)) {
      return fail(rq, errc::forbidden,
                  fmt::format("not granted to submit to job {}", amp::quoted(job.view())));
    }
    auto body = raw_at(rq.frame, "body");
    if (auto r = check_body(body); !r) return fail(rq, r.error());
    auto type = string_or_empty(rq.frame, "type");
    auto headers = headers_at(rq.frame);
    auto env = check_envelope(me, std::string(job.view()), body, type, headers, {});
    if (!env) return fail(rq, env.error());
    // A resubmission (an idempotency key already bound) counts against the rate, not the
    // budget: it is answered with its task even when the budget is spent.
    auto key = string_or_empty(rq.frame, "idempotency_key");
    auto spend = admit(rq, me, body.size(), [&]() -> result<bool> {
      if (key.empty()) return true;
      auto bound = gw->timed(
          [&] { return st->b->tasks().find_idempotency_key(me.ns, me.participant, key); });
      if (!bound) return bound.error();
      return !bound->has_value();
    });
    if (!spend) return;
    std::optional<int> max_attempts;
    if (auto m = int_at(rq.frame, "max_attempts")) max_attempts = static_cast<int>(*m);
    auto started = std::chrono::steady_clock::now();
    st->b->jobs().async_submit({.job = job,
                                .from = me.participant,
                                .body = std::move(env->body),
                                .type = std::move(type),
                                .headers = std::move(headers),
                                .max_attempts = max_attempts,
                                .idempotency_key = std::string(key)},
                               [self = shared_from_this(), rq = later(rq), spend = *spend,
                                started](result<submit_result> submitted) {
                                 self->gw->metrics.backend(seconds_since(started));
                                 if (!submitted || !submitted->created) {
                                   // A failure, or a resubmission (which counts against the rate,
                                   // not the budget): the refund may block, so not on the
                                   // transport's thread.
                                   return self->gw->post([self, rq, spend, submitted] {
                                     self->refund(spend);
                                     if (!submitted) return self->fail(rq, submitted.error());
                                     self->answer_submitted(rq, *submitted);
                                   });
                                 }
                                 self->gw->metrics.transition("queued");
                                 self->answer_submitted(rq, *submitted);
                               });
  }

  void answer_submitted(const request& rq, const submit_result& submitted) {
    json_writer w;
    w.begin_object()
        .key("task")
        .string(submitted.task.view())
        .key("created")
        .boolean(submitted.created);
    w.end_object();
    reply_members(rq, w.take());
  }

  // Takes the open offer of `task` away from this session, cancelling its lapse timer.
  std::optional<offer> take_offer(detail::ns_state& st, std::string_view task) {
    std::lock_guard lock(st.mu);
    auto wit = st.workers.find(this);
    if (wit == st.workers.end()) return std::nullopt;
    auto it = wit->second.offers.find(task);
    if (it == wit->second.offers.end()) return std::nullopt;
    auto o = std::move(it->second);
    wit->second.offers.erase(it);
    gw->clk->cancel(o.lapse);
    return std::move(o.o);
  }

  void on_claim(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    auto task = string_or_empty(rq.frame, "task");
    auto o = take_offer(*st, task);
    if (!o)
      return fail(rq, errc::not_found,
                  fmt::format("no open offer of task {} for you", amp::quoted(task)));
    auto started = std::chrono::steady_clock::now();
    st->b->jobs().async_claim(
        *o, me.participant,
        [self = shared_from_this(), rq = later(rq), st, o = *o, started](result<lease> l) {
          self->gw->metrics.backend(seconds_since(started));
          if (!l) {
            // Handing the offer back may block: not on the transport's thread.
            return self->gw->post([self, rq, st, o, l] {
              self->fail(rq, l.error());
              auto code = l.error().code();  // conflict, not_found: the offer is over already
              self->gw->offer_done(st, o, code != errc::conflict && code != errc::not_found);
            });
          }
          {
            std::lock_guard lock(st->mu);
            // Not for a session that closed meanwhile: the lease runs out in the broker.
            auto it = st->workers.find(self.get());
            if (it != st->workers.end())
              it->second.leases.insert_or_assign(o.task.task, o.task.job);
          }
          self->gw->metrics.transition("running");
          json_writer w;
          w.begin_object().key("task").string(o.task.task).key("attempt").integer(l->attempt);
          w.key("lease_expires_at").string(format_timestamp(l->expires_at)).end_object();
          self->reply_members(rq, w.take());
        });
  }

  void on_decline(request& rq) {
    auto here = who();
    auto& st = here.second;
    auto task = string_or_empty(rq.frame, "task");
    auto o = take_offer(*st, task);
    if (!o)
      return fail(rq, errc::not_found,
                  fmt::format("no open offer of task {} for you", amp::quoted(task)));
    auto r = gw->timed([&] { return st->b->jobs().decline(*o); });
    if (!r) {
      fail(rq, r.error());
    } else {
      reply_ok(rq);
    }
    gw->pump(st, job_name::make(o->task.job).value());
  }

  // The lease of `task` is over for this session (completed, failed, lost, released): its
  // slot is free, so the job (`job`, or the one the session held it for) is offered again.
  void lease_over(const std::shared_ptr<detail::ns_state>& st, std::string_view task,
                  std::string_view job) {
    std::string of(job);
    {
      std::lock_guard lock(st->mu);
      auto it = st->workers.find(this);
      if (it != st->workers.end()) {
        auto l = it->second.leases.find(task);
        if (l != it->second.leases.end()) {
          if (of.empty()) of = l->second;
          it->second.leases.erase(l);
        }
      }
    }
    if (auto j = job_name::make(of)) gw->pump(st, *j);
  }

  // `lease_lost` for `task`: the session's lease is over, unless the participant still holds
  // it here (the frame named another attempt than the live one).
  void lease_refused(const std::shared_ptr<detail::ns_state>& st, const participant_name& who,
                     const task_id& task) {
    if (!st->b->jobs().holds(task, who)) lease_over(st, task.view(), {});
  }

  void on_complete(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    auto t = task_id::make(string_or_empty(rq.frame, "task")).value();
    auto result_json = raw_at(rq.frame, "result");
    if (result_json.empty()) result_json = "null";
    if (result_json.size() > gw->opts.config.limits.max_body_bytes) {
      return fail(rq, error(errc::payload_too_large,
                            fmt::format("result is {} bytes; max_body_bytes is {}",
                                        result_json.size(), gw->opts.config.limits.max_body_bytes),
                            "/result"));
    }
    auto started = std::chrono::steady_clock::now();
    st->b->jobs().async_complete(
        t, me.participant, std::string(result_json), attempt_of(rq.frame),
        [self = shared_from_this(), rq = later(rq), st, t, who = me.participant,
         started](result<completion_result> done) {
          self->gw->metrics.backend(seconds_since(started));
          if (!done) {
            self->fail(rq, done.error());
            if (done.error().code() != errc::lease_lost) return;
            // Freeing the slot offers more work, which may block: not on this thread.
            return self->gw->post([self, st, t, who] { self->lease_refused(st, who, t); });
          }
          if (!done->duplicate) self->gw->metrics.transition("completed");
          json_writer w;
          w.begin_object().key("task").string(t.view()).key("state").string("completed");
          if (done->duplicate) w.key("duplicate").boolean(true);
          w.end_object();
          self->reply_members(rq, w.take());
          self->gw->post(
              [self, st, t, job = done->task.job] { self->lease_over(st, t.view(), job); });
        });
  }

  void on_fail(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    auto t = task_id::make(string_or_empty(rq.frame, "task")).value();
    task_error err;
    dom::element e;
    if (!rq.frame.at_key("error").get(e)) {
      err.code = string_or_empty(e, "code");
      err.message = string_or_empty(e, "message");
    }
    auto retry = bool_or(rq.frame, "retry", false);
    auto delay = std::chrono::milliseconds(int_at(rq.frame, "retry_delay_ms").value_or(0));
    auto r = gw->timed([&] {
      return st->b->jobs().fail(t, me.participant, err, retry, delay, attempt_of(rq.frame));
    });
    if (!r) {
      if (r.error().code() == errc::lease_lost) lease_refused(st, me.participant, t);
      return fail(rq, r.error());
    }
    gw->metrics.transition(to_string(r->state));
    lease_over(st, t.view(), r->job);
    json_writer w;
    w.begin_object().key("task").string(t.view()).key("state").string(to_string(r->state));
    w.key("attempt").integer(r->attempt).end_object();
    reply_members(rq, w.take());
  }

  void on_cancel(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    auto t = task_id::make(string_or_empty(rq.frame, "task")).value();
    auto r = gw->timed(
        [&] { return st->b->jobs().cancel(t, {.who = me.participant, .admin = me.grants.admin}); });
    if (!r) return fail(rq, r.error());
    gw->metrics.transition("cancelled");
    json_writer w;
    w.begin_object().key("task").string(t.view()).key("state").string("cancelled").end_object();
    reply_members(rq, w.take());
  }

  void on_task(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    auto t = task_id::make(string_or_empty(rq.frame, "task")).value();
    viewer v{.who = me.participant, .admin = me.grants.admin};
    auto record = gw->timed([&] { return st->b->jobs().get(t, v); });
    if (!record) return fail(rq, record.error());
    json_writer w;
    w.begin_object().key("task").raw(to_json(*record));
    if (bool_or(rq.frame, "history", false)) {
      auto history = gw->timed([&] { return st->b->jobs().history(t, v); });
      if (!history) return fail(rq, history.error());
      w.key("history").begin_array();
      for (const auto& h : *history) w.raw(to_json(h));
      w.end_array();
    }
    w.end_object();
    reply_members(rq, w.take());
  }

  // ---- bye and close --------------------------------------------------------------------

  void on_bye(request& rq) {
    auto here = who();
    auto& me = here.first;
    auto& st = here.second;
    std::vector<std::string> leases;
    // The entry is the participant's: while another of its sessions here is registered it
    // stays (written from that session's registration when this one's was another).
    struct registration {
      std::vector<job_name> jobs;
      int slots = 0;
      std::string meta;
    };
    std::optional<registration> staying;
    bool rewrite = false;
    {
      std::lock_guard lock(st->mu);
      auto it = st->workers.find(this);
      detail::worker* mine = it == st->workers.end() ? nullptr : &it->second;
      if (mine) {
        for (const auto& [task, job] : mine->leases) leases.push_back(task);
      }
      for (const auto& [key, w] : st->workers) {
        if (key == this || !w.registered || w.who != me.participant.view()) continue;
        staying = registration{w.jobs, w.slots, w.meta};
        rewrite = mine && mine->registered &&
                  (mine->jobs != w.jobs || mine->slots != w.slots || mine->meta != w.meta);
        break;
      }
      if (mine) mine->registered = false;
    }
    if (!staying) {
      auto left = gw->timed([&] { return st->b->registry().leave(me.participant); });
      if (!left) return fail(rq, left.error());
    } else if (rewrite) {
      auto entry = gw->timed([&] {
        return st->b->registry().register_participant(me.participant, staying->jobs, staying->slots,
                                                      staying->meta, load_of(me, *st));
      });
      if (!entry) return fail(rq, entry.error());
      remember_entry(*st, *entry);
    }
    for (const auto& task : leases) {
      auto released = gw->timed(
          [&] { return st->b->jobs().release_lease(task_id::make(task).value(), me.participant); });
      if (released) lease_over(st, task, released->job);
    }
    reply_ok(rq);
    request_close(close_code::normal, "bye");
    gw->log("info", "bye",
            fmt::format("\"session\":{},\"participant\":{}", json_quote(id),
                        json_quote(me.participant.view())));
  }

  // The connection is gone: hand back open offers, stop the reader and subscriptions.
  void on_closed() {
    {
      std::lock_guard lock(out_mu);
      close_requested = true;
    }
    ended = true;
    frames->close();
    std::unique_ptr<inbox_reader> r;
    std::map<std::string, std::shared_ptr<sub_state>, std::less<>> s;
    std::shared_ptr<detail::ns_state> st;
    bool was_counted = false;
    bool was_pending = false;
    {
      std::lock_guard lock(mu);
      r = std::move(reader);
      s = std::move(subs);
      subs.clear();
      st = ns;
      was_counted = std::exchange(counted, false);
      was_pending = std::exchange(pending_counted, false);
      if (hello_timer) gw->clk->cancel(hello_timer);
    }
    if (r) r->stop();
    for (auto& [name, state] : s) stop_sub(*state);
    if (was_pending) gw->pending_connections.fetch_sub(1);
    if (was_counted) gw->metrics.session_closed();
    {
      std::lock_guard lock(gw->mu);
      gw->all_sessions.erase(this);
    }
    if (!st) return;
    std::vector<offer> offers;
    {
      std::lock_guard lock(st->mu);
      st->watchers.erase(this);
      auto it = st->workers.find(this);
      if (it != st->workers.end()) {
        for (auto& [task, o] : it->second.offers) {
          gw->clk->cancel(o.lapse);
          offers.push_back(std::move(o.o));
        }
        st->workers.erase(it);
      }
    }
    auto g = gw;
    for (auto& o : offers) {
      g->post([g, st, o = std::move(o)] { g->offer_done(st, o, true); });
    }
    if (was_counted)
      g->log("info", "session_closed", fmt::format("\"session\":{}", json_quote(id)));
  }
};

namespace detail {

std::shared_ptr<session::impl> new_session(std::shared_ptr<gateway::impl> gw,
                                           std::shared_ptr<session_carrier> carrier,
                                           std::string id) {
  auto s = std::make_shared<session::impl>();
  s->frames = std::make_unique<session::impl::frame_lanes>(detail::lane_limits{
      .max_waiting = k_max_inbound_frames,
      .max_waiting_bytes =
          std::max<std::size_t>(k_min_inbound_bytes, 4 * gw->opts.config.limits.max_frame_bytes),
      .max_running = k_max_running,
      .max_on_threads = gw->session_threads});
  s->gw = std::move(gw);
  s->carrier = std::move(carrier);
  s->id = std::move(id);
  s->start_hello_deadline();
  return s;
}

bool push(session::impl& s, std::string frame, std::string_view op) {
  return s.emit(std::move(frame), op);
}

void close(session::impl& s, int code, std::string reason) {
  s.request_close(code, std::move(reason));
}

const std::string& id_of(const session::impl& s) {
  return s.id;
}

}  // namespace detail

session::session(std::shared_ptr<impl> p) : impl_(std::move(p)) {}

session::~session() = default;

void session::receive(std::string_view text) {
  impl_->receive(text);
}

void session::receive_binary() {
  if (impl_->ended) return;
  impl_->gw->metrics.frame_in("binary");
  impl_->reply_error(
      "null",
      error(errc::bad_request, "binary frames are not accepted: send text frames (UTF-8 JSON)"));
}

void session::closed() {
  if (impl_->cleaned.exchange(true)) return;
  impl_->on_closed();
}

const std::string& session::id() const noexcept {
  return impl_->id;
}

}  // namespace amp

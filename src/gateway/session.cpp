// One client session of `amp.v1`: frames in, the op table, checks in the spec's order,
// frames out, and the policy steps several op groups share. The ops themselves are in
// session_lifecycle.cpp, session_messaging.cpp, session_registry.cpp and session_jobs.cpp.

#include "gateway/session_impl.hpp"

#include <thread>

#include <fmt/format.h>

#include "amp/detail/embedded_schemas.hpp"
#include "detail/frame_check.hpp"
#include "detail/minify.hpp"
#include "detail/run_in_turn.hpp"
#include "detail/write_batch.hpp"

namespace amp {

namespace detail::session_util {

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

std::string raw_at(dom::element e, std::string_view key) {
  dom::element v;
  if (e.at_key(key).get(v)) return {};
  return detail::minify(v);
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

}  // namespace detail::session_util

using namespace detail::session_util;

namespace {

constexpr std::int64_t k_max_safe_integer = 9007199254740991;  // 2^53 - 1
// A session may have this many frames (or 64 MiB, or 4 frames' worth of bytes if more)
// waiting for the executor; a client that pipelines more is closed rather than queued without
// bound.
constexpr std::size_t k_max_inbound_frames = 8192;
constexpr std::size_t k_min_inbound_bytes = 64u << 20;
// The most frames of one session that run at once (on different lanes), waiting for the
// backend included.
constexpr int k_max_running = 64;
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
    for (const auto& op : session::impl::ops()) {
      frame_schema f{json_schema::embedded(fmt::format("frames/{}", op.name)).value(),
                     std::nullopt};
      if (auto names = names_schema_for(op.name); !names.empty()) {
        f.names = detail::schema_access::parse_own(names).value();
      }
      m.emplace(std::string(op.name), std::move(f));
    }
    return m;
  }();
  return schemas;
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
    return fmt::format(
        "{}: {} is not a subscription name (^[a-z0-9][a-z0-9_-]{{0,63}}$, or _s1, _s2, ... as "
        "the server names them)",
        pointer, amp::quoted(text));
  }
  return fmt::format("{}: {} is not a valid name", pointer, amp::quoted(text));
}

}  // namespace

bool session::impl::emit(std::string frame, std::string_view op, out_kind kind) {
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

void session::impl::close_locked(int code, std::string reason) {
  if (close_requested) return;
  close_requested = true;
  ended = true;
  frames->close();
  carrier->close(code, std::move(reason));
}

void session::impl::request_close(int code, std::string reason) {
  std::lock_guard lock(out_mu);
  close_locked(code, std::move(reason));
}

session::impl::request session::impl::later(const request& rq) {
  return request{.op = rq.op,
                 .id_json = rq.id_json,
                 .has_id = rq.has_id,
                 .frame = {},
                 .hold = rq.hold,
                 .lane = rq.lane};
}

session::impl::request session::impl::pipelined(const request& rq) {
  auto out = later(rq);
  out.lane.reset();
  return out;
}

void session::impl::reply_ok(const request& rq, std::string_view members) {
  if (!rq.has_id) return;
  constexpr std::string_view head = R"({"op":"ok","id":)";
  std::string out;
  out.reserve(head.size() + rq.id_json.size() + members.size() + 2);
  out.append(head).append(rq.id_json);
  if (!members.empty()) {
    out += ',';
    out += members;
  }
  out += '}';
  emit(std::move(out), "ok");
}

void session::impl::reply_error(std::string_view id_json, const error& e,
                                std::optional<std::int64_t> retry_after_ms, out_kind kind) {
  json_writer w;
  w.begin_object().key("op").string("error").key("id").raw(id_json);
  w.key("code").string(to_string(e.code())).key("message").string(e.message());
  if (!e.path().empty()) w.key("path").string(e.path());
  if (retry_after_ms) w.key("retry_after_ms").integer(*retry_after_ms);
  w.end_object();
  gw->metrics.error(to_string(e.code()));
  emit(w.take(), "error", kind);
}

void session::impl::fail(const request& rq, const error& e,
                         std::optional<std::int64_t> retry_after_ms) {
  reply_error(rq.id_json, e, retry_after_ms);
}

void session::impl::fail(const request& rq, errc code, std::string message) {
  fail(rq, error(code, std::move(message)));
}

void session::impl::classify(inbound_frame& f) {
  thread_local dom::parser parser;
  detail::parser_release release(parser);
  dom::element frame;
  if (parser.parse(f.item.text.data(), f.item.text.size()).get(frame) || !frame.is_object()) {
    return;
  }
  auto name = string_at(frame, "op");
  if (!name) return;
  const op_spec* op = find_op(*name);
  if (!op) return;
  f.item.op = op->name;
  f.item.on_caller =
      op->on_caller &&
      !(op->name == "submit" && !string_or_empty(frame, "idempotency_key").empty()) &&
      !(op->name == "heartbeat" && string_at(frame, "task"));
  auto lane_of = [&](std::string_view member) {
    auto v = string_at(frame, member);
    if (!v) return;
    f.barrier = false;
    f.lane = fmt::format("{}:{}", member, *v);
  };
  switch (op->lane) {
    case lane_rule::barrier: break;
    case lane_rule::none: f.barrier = false; break;
    case lane_rule::task: lane_of("task"); break;
    case lane_rule::to: lane_of("to"); break;
    case lane_rule::topic: lane_of("topic"); break;
  }
}

void session::impl::receive(std::string_view text) {
  if (ended) return;
  inbound_frame f{
      .item = {.text = std::string(text)}, .barrier = true, .lane = {}, .bytes = text.size()};
  classify(f);
  auto start = frames->push(std::move(f));
  if (!start) {
    if (ended) return;  // closed meanwhile: nothing more runs
    request_close(close_code::policy_violation, "too many frames waiting to be processed");
    gw->log("warn", "inbound_overflow", fmt::format("\"session\":{}", json_quote(id)));
    return;
  }
  run(std::move(*start), true);
}

void session::impl::run(std::vector<inbound_frame> start, bool from_receive) {
  for (auto& f : start) {
    if (!f.item.on_caller || !runs_here(f.item)) {
      gw->post(
          [self = shared_from_this(), f = std::move(f)]() mutable { self->start(std::move(f)); });
    } else if (from_receive) {
      gw->run_here([&] { this->start(std::move(f)); });
    } else {
      // Let go by another frame's end, on that end's thread (a transport's, say): never waits.
      detail::run_in_turn([self = shared_from_this(), f = std::move(f)]() mutable {
        self->gw->run_here([&] { self->start(std::move(f)); });
      });
    }
  }
}

bool session::impl::runs_here(const queued_frame& f) {
  if (f.op == "heartbeat") {
    std::shared_ptr<detail::ns_state> st;
    {
      std::lock_guard lock(mu);
      if (!ns) return true;  // refused at once
      st = ns;
    }
    return !holds_leases(*st);
  }
  if (f.op != "complete") return true;
  thread_local dom::parser parser;
  detail::parser_release release(parser);
  dom::element frame;
  if (parser.parse(f.text.data(), f.text.size()).get(frame)) return true;  // refused at once
  std::shared_ptr<detail::ns_state> st;
  std::optional<participant_name> me;
  {
    std::lock_guard lock(mu);
    if (!ident || !ns) return true;  // refused at once
    st = ns;
    me = ident->participant;
  }
  auto t = task_id::make(string_or_empty(frame, "task"));
  if (!t) return true;  // refused at once
  return st->b->jobs().completes_from_written(*t, *me, attempt_of(frame));
}

void session::impl::start(inbound_frame f) {
  // The frame is finished when its answer is: at the end of `process`, or later, when an
  // asynchronous operation lets go of its copy of `hold`.
  // Counted in `in_flight` like executor work, so that shutdown waits for the answer.
  gw->in_flight.fetch_add(1);
  auto self = shared_from_this();
  std::shared_ptr<void> hold(nullptr, [self, barrier = f.barrier](void*) {
    self->run(self->frames->finished(barrier, {}));
    self->gw->in_flight.fetch_sub(1);
  });
  std::shared_ptr<void> lane;
  if (!f.lane.empty()) {
    lane = std::shared_ptr<void>(nullptr, [self, name = std::move(f.lane)](void*) {
      self->run(self->frames->release(name));
    });
  }
  process(f.item.text, std::move(hold), std::move(lane));
  run(frames->left_thread());
}

void session::impl::process(std::string_view text, std::shared_ptr<void> hold,
                            std::shared_ptr<void> lane) {
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
  rq.lane = std::move(lane);
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
  const op_spec* spec = find_op(op);
  if (!spec) {
    gw->metrics.frame_in("unknown");
    return fail(rq, errc::bad_request, fmt::format("unknown op {}", amp::quoted(op)));
  }
  rq.op = spec->name;  // static, unlike the parsed text: an answer may come after `process`
  gw->metrics.frame_in(op);
  bool authenticated = false;
  {
    std::lock_guard lock(mu);
    authenticated = ident != nullptr;
  }
  if (!authenticated && op != "hello") {
    return fail(rq, errc::unauthenticated, "say hello with a token first");
  }
  if (authenticated && op == "hello") return fail(rq, errc::bad_request, "hello was already said");
  if (!detail::surely_valid_frame(op, frame)) {
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
  }
  if (const double cost = spec->cost; cost > 0) {
    std::shared_ptr<const identity> me;
    {
      std::lock_guard lock(mu);
      me = ident;
    }
    auto verdict = gw->pol->take_ops(me->ns, me->participant, cost);
    if (!verdict.allowed) {
      return fail(rq, error(errc::rate_limited, verdict.message), verdict.retry_after.count());
    }
  }
  try {
    (this->*spec->handle)(rq);
  } catch (const std::exception& e) {
    gw->log("error", "internal",
            fmt::format("\"session\":{},\"op\":{},\"what\":{}", json_quote(id), json_quote(op),
                        json_quote(e.what())));
    fail(rq, errc::internal, "internal error");
  }
}

std::span<const session::impl::op_spec> session::impl::ops() {
  using L = lane_rule;
  static constexpr op_spec table[] = {
      {"hello", L::barrier, 0, &impl::on_hello},
      {"register", L::barrier, registry_op_cost, &impl::on_register},
      {"heartbeat", L::task, 1, &impl::on_heartbeat, true},
      {"who", L::barrier, registry_op_cost, &impl::on_who},
      {"watch", L::barrier, registry_op_cost, &impl::on_watch},
      {"bye", L::barrier, 0, &impl::on_bye},
      {"send", L::to, 0, &impl::on_send, true},
      {"ack", L::none, 1, &impl::on_ack, true},
      {"nack", L::none, 1, &impl::on_ack, true},
      {"publish", L::topic, 0, &impl::on_publish, true},
      {"subscribe", L::barrier, 1, &impl::on_subscribe},
      {"unsubscribe", L::barrier, 1, &impl::on_unsubscribe},
      {"submit", L::none, 0, &impl::on_submit, true},
      {"claim", L::task, 1, &impl::on_claim, true},
      {"decline", L::task, 1, &impl::on_decline},
      {"complete", L::task, 1, &impl::on_complete, true},
      {"fail", L::task, 1, &impl::on_fail},
      {"cancel", L::task, 1, &impl::on_cancel},
      {"task", L::task, 1, &impl::on_task},
      {"scatter", L::none, 1, &impl::on_scatter},
      {"reply", L::none, 1, &impl::on_reply},
      {"operation", L::none, 1, &impl::on_operation},
      {"retry", L::none, 1, &impl::on_retry},
  };
  return table;
}

const session::impl::op_spec* session::impl::find_op(std::string_view name) {
  for (const auto& op : ops()) {
    if (op.name == name) return &op;
  }
  return nullptr;
}

std::pair<std::shared_ptr<const identity>, std::shared_ptr<detail::ns_state>> session::impl::who() {
  std::lock_guard lock(mu);
  return {ident, ns};
}

bool session::impl::take_rate(const request& rq, const identity& me, std::size_t body_bytes) {
  auto verdict = gw->pol->take_rate(me.ns, me.participant, body_bytes);
  if (verdict.allowed) return true;
  fail(rq, error(errc::rate_limited, verdict.message), verdict.retry_after.count());
  return false;
}

std::optional<budget_spend> session::impl::admit(
    const request& rq, const identity& me, std::size_t body_bytes,
    const std::function<result<bool>()>& count_budget) {
  if (!take_rate(rq, me, body_bytes)) return std::nullopt;
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

void session::impl::admit_async(const request& rq, const identity& me, std::size_t body_bytes,
                                std::function<void(const request&, const budget_spend&)> then) {
  if (!take_rate(rq, me, body_bytes)) return;
  // Whether the budget answered inside `async_spend_budget` (no budget, or one that needs no
  // backend): then the operation goes on on this thread; else on the executor, not on the
  // thread of whichever spend drove the counter (a transport's), where the frames let go
  // of by this one would start too.
  auto answering = std::make_shared<std::atomic<bool>>(true);
  const auto caller = std::this_thread::get_id();
  auto go_on = [self = shared_from_this(), rq = later(rq),
                then = std::move(then)](const result<budget_spend>& spend) {
    self->gw->run_here([&] {
      if (!spend) return self->fail(rq, spend.error());
      try {
        then(rq, *spend);
      } catch (const std::exception& e) {
        self->gw->log("error", "internal",
                      fmt::format("\"session\":{},\"op\":{},\"what\":{}", json_quote(self->id),
                                  json_quote(rq.op), json_quote(e.what())));
        self->gw->pol->async_refund_budget(*spend, [](result<void>) {});
        self->fail(rq, errc::internal, "internal error");
      }
    });
  };
  gw->pol->async_spend_budget(
      me.ns, me.participant,
      [self = shared_from_this(), answering, caller,
       go_on = std::move(go_on)](result<budget_spend> spend) mutable {
        if (answering->load() && std::this_thread::get_id() == caller) return go_on(spend);
        self->gw->post([go_on = std::move(go_on), spend = std::move(spend)] { go_on(spend); });
      });
  answering->store(false);
}

void session::impl::refund(const budget_spend& spend) {
  if (!spend.counted()) return;
  (void)gw->timed([&] { return gw->pol->refund_budget(spend); });
}

result<void> session::impl::check_body(std::string_view body) {
  if (body.size() > gw->opts.config.limits.max_body_bytes) {
    return error(errc::payload_too_large,
                 fmt::format("body is {} bytes; max_body_bytes is {}", body.size(),
                             gw->opts.config.limits.max_body_bytes),
                 "/body");
  }
  return {};
}

result<sealed_envelope> session::impl::check_envelope(const identity& me, std::string to,
                                                      std::string body, std::string type,
                                                      header_list headers, std::string msg_id,
                                                      std::string reply_to,
                                                      std::string correlation) {
  auto sealed = sealed_envelope::seal({.from = std::string(me.participant.view()),
                                       .to = std::move(to),
                                       .body = std::move(body),
                                       .type = std::move(type),
                                       .headers = std::move(headers),
                                       .msg_id = std::move(msg_id),
                                       .reply_to = std::move(reply_to),
                                       .correlation = std::move(correlation)},
                                      me.ns.view(), gw->clk->now());
  if (!sealed) return sealed.error();
  if (const auto& env = sealed->get(); !env.type.empty()) {
    auto it = gw->body_schemas.find(env.type);
    if (it != gw->body_schemas.end()) {
      if (auto r = it->second.validate(env.body); !r) {
        auto path = "/body" + r.error().path();
        return error(errc::invalid_envelope,
                     fmt::format("body does not match the schema of type {}: {}",
                                 amp::quoted(env.type), r.error().message()),
                     path);
      }
    }
  }
  return sealed;
}

void session::impl::reply_members(const request& rq, const std::string& object_json) {
  reply_ok(rq, std::string_view(object_json).substr(1, object_json.size() - 2));
}

session::impl::~impl() {
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
  // What the frame publishes to the backend goes out in one write when it has been handled.
  detail::write_batch batch;
  impl_->receive(text);
}

std::function<void()> session::hold_writes_until_called() {
  return detail::write_batch::keep_until_later();
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

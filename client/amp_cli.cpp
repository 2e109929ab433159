// amp: the command-line client of AMP over WebSocket. One function per command; the command
// line itself is read by cli_args.cpp (`amp --help` lists the commands).

#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "amp/client.hpp"
#include "amp/json.hpp"
#include "cli_args.hpp"
#include "process.hpp"

namespace {

using namespace amp;
using namespace amp::cli;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------
// Output and errors

std::mutex output_mutex;

/// One line on stdout, flushed at once (the output is often piped line by line).
void print_line(std::string_view line) {
  std::lock_guard lock(output_mutex);
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

/// "amp: CODE: MESSAGE" on stderr.
void print_error(std::string_view code, std::string_view message) {
  std::lock_guard lock(output_mutex);
  std::fprintf(stderr, "amp: %.*s: %.*s\n", static_cast<int>(code.size()), code.data(),
               static_cast<int>(message.size()), message.data());
}

void print_error(const error& e) {
  print_error(to_string(e.code()), e.message());
}

/// Reports an error of the server or the connection: exit status 1.
int fail(const error& e) {
  print_error(e);
  return 1;
}

/// Reports a usage error: exit status 2.
int usage_error(const error& e) {
  print_error(e);
  return 2;
}

/// Reports an `error` push (a failure of a request sent without id).
void warn_about_push(const client_frame& f) {
  print_error(f.string_at("/code").value_or("error"), f.string_at("/message").value_or(""));
}

// ---------------------------------------------------------------------------------------
// Signals: the long-running commands stop cleanly on SIGINT and SIGTERM.

volatile std::sig_atomic_t interrupted = 0;

extern "C" void on_signal(int) {
  interrupted = 1;
}

void catch_interrupts() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

// ---------------------------------------------------------------------------------------
// Connecting, and the frames the I/O thread hands to the command's thread

result<std::unique_ptr<client>> open_session(const connection_args& args) {
  client_options options;
  options.url = args.url;
  options.token = args.token;
  options.ca_file = args.ca_file;
  options.verify_peer = args.verify_peer;
  return client::connect(std::move(options));
}

/// The body argument: JSON text, or "-" for stdin (checked to be JSON).
result<std::string> read_body(const std::string& body) {
  if (body != "-") return body;
  std::string text;
  char buffer[65536];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, stdin)) > 0;)
    text.append(buffer, n);
  if (auto ok = json_check(text); !ok) {
    return unexpected(errc::bad_request, "stdin: " + ok.error().message());
  }
  return text;
}

/// The pushes of one client, queued for the command's thread, and the close.
class frame_queue {
 public:
  enum class status { frame, timeout, closed };

  void attach(client& c) {
    c.on_push([this](const client_frame& f) {
      {
        std::lock_guard lock(mutex_);
        frames_.push_back(f);
      }
      cv_.notify_all();
    });
    c.on_close([this](int, const std::string&) {
      {
        std::lock_guard lock(mutex_);
        closed_ = true;
      }
      cv_.notify_all();
    });
  }

  /// The next frame within `timeout`; `closed` once the connection closed and every frame
  /// received before was taken.
  status pop(client_frame& out, steady::duration timeout) {
    std::unique_lock lock(mutex_);
    cv_.wait_for(lock, timeout, [&] { return !frames_.empty() || closed_; });
    if (!frames_.empty()) {
      out = std::move(frames_.front());
      frames_.pop_front();
      return status::frame;
    }
    return closed_ ? status::closed : status::timeout;
  }

  /// Takes every frame queued now.
  std::deque<client_frame> take_all() {
    std::lock_guard lock(mutex_);
    return std::exchange(frames_, {});
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<client_frame> frames_;
  bool closed_ = false;
};

/// The error of a connection the server closed under a running command.
int connection_lost(const client& c) {
  std::string message = "the server closed the connection";
  if (auto code = c.close_code()) {
    message += " (code " + std::to_string(*code);
    if (auto reason = c.close_reason(); !reason.empty()) message += ": " + reason;
    message += ")";
  }
  return fail(error(errc::unavailable, message));
}

/// A poll interval for the loops that also watch for SIGINT.
constexpr auto k_poll = 100ms;

// ---------------------------------------------------------------------------------------
// Commands

int run_help(const help_args& args) {
  std::fputs(help_text(args.command).c_str(), stdout);
  return 0;
}

int run_token(const token_args& args) {
  auto token = make_token(args, std::chrono::system_clock::now());
  if (!token) return usage_error(token.error());
  print_line(*token);
  return 0;
}

int run_send(const send_args& args) {
  auto body = read_body(args.body);
  if (!body) return usage_error(body.error());
  auto c = open_session(args.connection);
  if (!c) return fail(c.error());
  auto sent = (*c)->send(args.to, *body, args.options);
  if (!sent) return fail(sent.error());
  json_writer w;
  w.begin_object().key("seq").integer(sent->seq).key("msg_id").string(sent->msg_id);
  w.key("duplicate").boolean(sent->duplicate).end_object();
  print_line(w.str());
  return 0;
}

int run_listen(const listen_args& args) {
  frame_queue queue;  // before the client: its I/O thread feeds the queue until it ends
  auto c = open_session(args.connection);
  if (!c) return fail(c.error());
  client& session = **c;
  queue.attach(session);
  catch_interrupts();

  std::int64_t printed = 0;
  while (!interrupted && (args.count == 0 || printed < args.count)) {
    client_frame f;
    const auto status = queue.pop(f, k_poll);
    if (status == frame_queue::status::closed) return connection_lost(session);
    if (status == frame_queue::status::timeout) continue;
    if (f.op() == "error") {
      warn_about_push(f);
      continue;
    }
    if (f.op() != "message") continue;
    print_line(f.raw_at("/envelope").value_or("null"));
    ++printed;
    if (args.ack) {
      if (auto acked = session.ack(f.int_at("/seq").value_or(0)); !acked)
        print_error(acked.error());
    }
  }
  // Messages received beyond the count go back at once, not after the ack timeout.
  if (args.ack) {
    for (const auto& f : queue.take_all()) {
      if (f.op() != "message") continue;
      if (auto r = session.nack(f.int_at("/seq").value_or(0)); !r) print_error(r.error());
    }
  }
  return 0;
}

/// The outcome line of `submit --wait` for a task that had already ended, from its record:
/// the body of the broker's notice.
std::string outcome_from_record(const client_frame& record) {
  json_writer w;
  w.begin_object();
  for (const char* name : {"task", "job", "state", "attempt"}) {
    if (auto v = record.raw_at(std::string("/task/") + name)) w.key(name).raw(*v);
  }
  const bool completed = record.string_at("/task/state") == "completed";
  const char* detail = completed ? "result" : "error";
  w.key(detail).raw(record.raw_at(std::string("/task/") + detail).value_or("null"));
  w.end_object();
  return w.take();
}

/// True when `f` is the broker's notice of the end of `task`.
bool is_end_notice(const client_frame& f, const std::string& task) {
  if (f.op() != "message" || f.string_at("/envelope/from") != "$broker") return false;
  const auto type = f.string_at("/envelope/type").value_or("");
  if (type != "amp.task.completed" && type != "amp.task.failed" && type != "amp.task.cancelled") {
    return false;
  }
  return f.string_at("/envelope/body/task") == task;
}

int run_submit(const submit_args& args) {
  auto body = read_body(args.body);
  if (!body) return usage_error(body.error());
  frame_queue queue;  // before the client: its I/O thread feeds the queue until it ends
  auto c = open_session(args.connection);
  if (!c) return fail(c.error());
  client& session = **c;
  queue.attach(session);

  auto submitted = session.submit(args.job, *body, args.options);
  if (!submitted) return fail(submitted.error());
  json_writer w;
  w.begin_object().key("task").string(submitted->task).key("created").boolean(submitted->created);
  w.end_object();
  print_line(w.str());
  if (!args.wait) return 0;
  catch_interrupts();

  if (!submitted->created) {
    // An idempotency key named an existing task: it may have ended long ago.
    auto record = session.task(submitted->task);
    if (!record) return fail(record.error());
    const auto state = record->string_at("/task/state").value_or("");
    if (state == "completed" || state == "failed" || state == "cancelled") {
      print_line(outcome_from_record(*record));
      return state == "completed" ? 0 : 1;
    }
  }

  const auto deadline = args.timeout_s
                            ? steady::now() + std::chrono::duration_cast<steady::duration>(
                                                  std::chrono::duration<double>(*args.timeout_s))
                            : steady::time_point::max();
  while (!interrupted && steady::now() < deadline) {
    client_frame f;
    const auto status = queue.pop(f, k_poll);
    if (status == frame_queue::status::closed) return connection_lost(session);
    if (status == frame_queue::status::timeout) continue;
    if (f.op() == "error") warn_about_push(f);
    if (!is_end_notice(f, submitted->task)) continue;  // other messages stay in the inbox
    if (auto acked = session.ack(f.int_at("/seq").value_or(0)); !acked) print_error(acked.error());
    print_line(f.raw_at("/envelope/body").value_or("null"));
    return f.string_at("/envelope/body/state") == "completed" ? 0 : 1;
  }
  if (interrupted) return 1;
  print_error("timeout", "task " + submitted->task + " did not end within " +
                             std::to_string(*args.timeout_s) + " s");
  return 1;
}

/// Replaces bytes that are not UTF-8 with U+FFFD, so that any output can become a JSON
/// string.
std::string valid_utf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  std::size_t i = 0;
  while (i < in.size()) {
    const auto c = static_cast<unsigned char>(in[i]);
    std::size_t len = c < 0x80           ? 1
                      : (c >> 5) == 0x6  ? 2
                      : (c >> 4) == 0xE  ? 3
                      : (c >> 3) == 0x1E ? 4
                                         : 0;
    bool ok = len > 0 && i + len <= in.size();
    for (std::size_t k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(in[i + k]) & 0xC0) == 0x80;
    }
    if (ok && len > 1) {
      // Overlong forms, surrogates and code points above U+10FFFF are not UTF-8 either.
      std::uint32_t cp = c & (0xFF >> (len + 1));
      for (std::size_t k = 1; k < len; ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(in[i + k]) & 0x3F);
      static constexpr std::uint32_t min_for_len[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= min_for_len[len] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (ok) {
      out.append(in.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      ++i;
    }
  }
  return out;
}

std::string_view trim(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last - first + 1);
}

/// The result of a task from its command's stdout (see `amp work --help`).
std::string result_from_output(std::string_view out) {
  const auto trimmed = trim(out);
  if (trimmed.empty()) return "null";
  if (json_check(trimmed)) return std::string(trimmed);
  if (out.ends_with("\r\n")) {
    out.remove_suffix(2);
  } else if (out.ends_with('\n')) {
    out.remove_suffix(1);
  }
  return json_quote(valid_utf8(out));
}

/// What `amp work` shares between the I/O thread, the slot threads and the main thread.
struct work_state {
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<client_frame> offers;
  /// The tasks whose command runs, with their lease length and a way to stop them.
  struct running_task {
    std::shared_ptr<process_control> control;
    std::int64_t lease_s = 0;
  };
  std::map<std::string, running_task> running;
  std::int64_t claimed = 0;   // tasks claimed (or being claimed)
  std::int64_t finished = 0;  // claimed tasks whose command ended
  bool stop = false;
  bool closed = false;
};

/// A frame from the server, on the I/O thread: offers are queued for the slots; a task
/// cancelled or lost while it runs gets its command stopped.
void on_work_push(work_state& state, const client_frame& f) {
  const auto& op = f.op();
  if (op == "offer") {
    {
      std::lock_guard lock(state.mutex);
      state.offers.push_back(f);
    }
    state.cv.notify_all();
  } else if (op == "cancelled" || op == "lease_lost") {
    const auto task = f.string_at("/task").value_or("");
    std::lock_guard lock(state.mutex);
    if (auto it = state.running.find(task); it != state.running.end()) {
      it->second.control->kill();
      print_error(op, "task " + task + ": stopping its command, nothing is reported");
    }
  } else if (op == "error") {
    warn_about_push(f);
  }
}

/// Runs the command for one claimed task and reports its outcome; prints the task's line.
void run_task(client& session, const work_args& args, work_state& state, const client_frame& offer,
              const claim_receipt& claim) {
  const auto task = claim.task;
  const auto job = offer.string_at("/job").value_or("");
  auto control = std::make_shared<process_control>();
  {
    std::lock_guard lock(state.mutex);
    state.running[task] = {control, offer.int_at("/lease_s").value_or(0)};
  }
  process_spec spec{
      .argv = args.command,
      .env = {{"AMP_TASK", task}, {"AMP_JOB", job}, {"AMP_ATTEMPT", std::to_string(claim.attempt)}},
      .input = offer.raw_at("/envelope/body").value_or("null") + "\n",
      .error_tail = 2048};
  const auto outcome = run_process(spec, control.get());
  {
    std::lock_guard lock(state.mutex);
    state.running.erase(task);
  }
  // Cancelled, lease lost, or interrupted (the command may have died of the terminal's
  // SIGINT before we stopped it): nothing to report.
  if (outcome.killed || interrupted) return;

  int exit_status = outcome.exit_code;
  std::string state_after;
  if (outcome.succeeded()) {
    auto done = session.complete(task, result_from_output(outcome.output), claim.attempt);
    if (!done && done.error().code() == errc::payload_too_large) {
      // A result the server will never take: fail the task rather than let its lease run out.
      fail_options no_retry;
      no_retry.retry = false;
      no_retry.attempt = claim.attempt;
      auto failed = session.fail(task, "result_too_large", done.error().message(), no_retry);
      if (failed) state_after = failed->state;
    } else if (done) {
      state_after = "completed";
    }
    if (!done) print_error(done.error());
  } else {
    std::string code, message;
    if (!outcome.started) {
      code = "spawn_failed";
      message = "cannot run " + args.command.front() + ": " + outcome.start_error;
    } else if (outcome.signal != 0) {
      code = "signal_" + std::to_string(outcome.signal);
    } else {
      code = "exit_" + std::to_string(outcome.exit_code);
    }
    if (message.empty()) message = valid_utf8(trim(outcome.error_output));
    if (message.empty()) message = args.command.front() + " ended with " + code;
    fail_options fenced;
    fenced.attempt = claim.attempt;
    auto failed = session.fail(task, code, message, fenced);
    if (failed) {
      state_after = failed->state;
    } else {
      print_error(failed.error());
    }
    if (outcome.signal != 0) exit_status = 128 + outcome.signal;
  }
  if (state_after.empty()) return;
  json_writer w;
  w.begin_object().key("task").string(task).key("job").string(job);
  w.key("attempt").integer(claim.attempt).key("exit").integer(exit_status);
  w.key("state").string(state_after).end_object();
  print_line(w.str());
}

/// One slot: takes offers, claims them and runs their commands, until told to stop.
void work_slot(client& session, const work_args& args, work_state& state) {
  for (;;) {
    client_frame offer;
    bool decline = false;
    {
      std::unique_lock lock(state.mutex);
      state.cv.wait(lock, [&] { return state.stop || state.closed || !state.offers.empty(); });
      if (state.stop || state.closed) return;
      offer = std::move(state.offers.front());
      state.offers.pop_front();
      decline = args.count > 0 && state.claimed >= args.count;
      if (!decline) ++state.claimed;
    }
    const auto task = offer.string_at("/task").value_or("");
    if (decline) {  // enough tasks claimed: let another worker have it
      if (auto r = session.decline(task); !r) print_error(r.error());
      continue;
    }
    auto claim = session.claim(task);
    if (!claim) {
      print_error(to_string(claim.error().code()),
                  "claim " + task + ": " + claim.error().message());
      std::lock_guard lock(state.mutex);
      --state.claimed;
      continue;
    }
    run_task(session, args, state, offer, *claim);
    {
      std::lock_guard lock(state.mutex);
      ++state.finished;
      if (args.count > 0 && state.finished >= args.count) state.stop = true;
    }
    state.cv.notify_all();
  }
}

/// How long between heartbeats: the server's heartbeat_s, or half the shortest lease held.
steady::duration heartbeat_interval(const client& session, work_state& state) {
  steady::duration interval =
      std::chrono::seconds(session.heartbeat_s() > 0 ? session.heartbeat_s() : 10);
  std::lock_guard lock(state.mutex);
  for (const auto& [task, running] : state.running) {
    if (running.lease_s > 0) {
      interval =
          std::min<steady::duration>(interval, std::chrono::milliseconds(running.lease_s * 500));
    }
  }
  return std::max<steady::duration>(interval, 200ms);
}

int run_work(const work_args& args) {
  if (!find_program(args.command.front())) {
    return usage_error(error(errc::bad_request, "work: cannot find COMMAND \"" +
                                                    args.command.front() +
                                                    "\" (not in PATH, "
                                                    "or not an executable file)"));
  }
  work_state state;  // before the client: its I/O thread uses the state until it ends
  auto c = open_session(args.connection);
  if (!c) return fail(c.error());
  client& session = **c;
  session.on_push([&state](const client_frame& f) { on_work_push(state, f); });
  session.on_close([&state](int, const std::string&) {
    {
      std::lock_guard lock(state.mutex);
      state.closed = true;
    }
    state.cv.notify_all();
  });
  catch_interrupts();
  if (auto registered = session.register_worker(args.jobs, args.slots); !registered) {
    return fail(registered.error());
  }

  std::vector<std::thread> slots;
  for (int i = 0; i < args.slots; ++i) {
    slots.emplace_back([&] { work_slot(session, args, state); });
  }
  auto last_heartbeat = steady::now();
  bool lost = false;
  for (;;) {
    {
      std::unique_lock lock(state.mutex);
      state.cv.wait_for(lock, k_poll, [&] { return state.stop || state.closed; });
      if (interrupted) {
        state.stop = true;
        for (auto& [task, running] : state.running) running.control->kill();
      }
      if (state.stop || state.closed) {
        lost = state.closed && !state.stop;
        state.stop = true;
        break;
      }
    }
    if (steady::now() - last_heartbeat >= heartbeat_interval(session, state)) {
      last_heartbeat = steady::now();
      if (auto beat = session.heartbeat(); !beat) print_error(beat.error());
    }
  }
  state.cv.notify_all();
  for (auto& t : slots) t.join();
  if (lost) return connection_lost(session);
  // Leaves the registry and gives back what is still offered or held, at once.
  if (auto left = session.bye(); !left) print_error(left.error());
  return 0;
}

int run_pub(const pub_args& args) {
  auto body = read_body(args.body);
  if (!body) return usage_error(body.error());
  auto c = open_session(args.connection);
  if (!c) return fail(c.error());
  auto published = (*c)->publish(args.topic, *body, args.options);
  if (!published) return fail(published.error());
  json_writer w;
  w.begin_object()
      .key("seq")
      .integer(published->seq)
      .key("duplicate")
      .boolean(published->duplicate);
  w.end_object();
  print_line(w.str());
  return 0;
}

int run_sub(const sub_args& args) {
  frame_queue queue;  // before the client: its I/O thread feeds the queue until it ends
  auto c = open_session(args.connection);
  if (!c) return fail(c.error());
  client& session = **c;
  queue.attach(session);
  catch_interrupts();

  auto sub = session.subscribe(args.topic, args.from);
  if (!sub) return fail(sub.error());
  std::int64_t printed = 0;
  std::int64_t last_seq = 0;  // of the last event printed
  while (!interrupted && (args.count == 0 || printed < args.count)) {
    client_frame f;
    const auto status = queue.pop(f, k_poll);
    if (status == frame_queue::status::closed) return connection_lost(session);
    if (status == frame_queue::status::timeout) continue;
    if (f.op() == "error") {
      warn_about_push(f);
      continue;
    }
    if (f.string_at("/sub") != *sub) continue;
    if (f.op() == "event") {
      const auto seq = f.int_at("/seq").value_or(0);
      if (seq != 0 && seq <= last_seq) continue;  // already printed before a resubscription
      last_seq = seq;
      json_writer w;
      w.begin_object().key("seq").integer(seq);
      w.key("topic").string(f.string_at("/topic").value_or(""));
      w.key("envelope").raw(f.raw_at("/envelope").value_or("null")).end_object();
      print_line(w.str());
      ++printed;
    } else if (f.op() == "sub_dropped") {
      // Dropped for falling behind: continue right after the last event the server sent,
      // under a name the server makes up again (a client cannot take the server's names).
      const auto resume = std::max(last_seq, f.int_at("/last_seq").value_or(last_seq)) + 1;
      auto again = session.subscribe(args.topic, subscribe_from::at_seq(resume));
      if (!again) return fail(again.error());
      sub = std::move(again);
    }
  }
  return 0;
}

/// Connects, sends one request and prints the reply's fields.
int print_reply(const connection_args& connection, std::string_view op, const json_writer& fields) {
  auto c = open_session(connection);
  if (!c) return fail(c.error());
  auto reply = (*c)->request(op, fields.str());
  if (!reply) return fail(reply.error());
  print_line(reply->result_json());
  return 0;
}

int run_who(const who_args& args) {
  json_writer w;
  w.begin_object();
  if (!args.job.empty()) w.key("job").string(args.job);
  w.end_object();
  return print_reply(args.connection, "who", w);
}

int run_task(const task_args& args) {
  json_writer w;
  w.begin_object().key("task").string(args.task);
  if (args.history) w.key("history").boolean(true);
  w.end_object();
  return print_reply(args.connection, "task", w);
}

int run_cancel(const cancel_args& args) {
  json_writer w;
  const bool operation = args.task.rfind("o_", 0) == 0;
  w.begin_object().key(operation ? "operation" : "task").string(args.task).end_object();
  return print_reply(args.connection, "cancel", w);
}

/// True when `f` is the broker's notice of the end of `operation`.
bool is_operation_notice(const client_frame& f, const std::string& operation) {
  if (f.op() != "message" || f.string_at("/envelope/from") != "$broker") return false;
  const auto type = f.string_at("/envelope/type").value_or("");
  return type.rfind("amp.operation.", 0) == 0 &&
         f.string_at("/envelope/body/operation") == operation;
}

int run_scatter(const scatter_args& args) {
  auto body = read_body(args.body);
  if (!body) return usage_error(body.error());
  frame_queue queue;  // before the client: its I/O thread feeds the queue until it ends
  auto c = open_session(args.connection);
  if (!c) return fail(c.error());
  client& session = **c;
  queue.attach(session);

  auto started = args.audience.empty()
                     ? session.scatter(args.to, *body, args.options)
                     : session.scatter_to_audience(args.audience, *body, args.options);
  if (!started) return fail(started.error());
  json_writer w;
  w.begin_object().key("operation").string(started->operation);
  w.key("created").boolean(started->created).key("members").begin_array();
  for (const auto& m : started->members) w.string(m);
  w.end_array().end_object();
  print_line(w.str());
  if (!args.wait) return 0;
  catch_interrupts();

  if (!started->created) {
    // An idempotency key named an existing operation: it may have ended already.
    auto record = session.operation(started->operation);
    if (!record) return fail(record.error());
    const auto state = record->string_at("/operation/state").value_or("open");
    if (state != "open") {
      print_line(record->raw_at("/operation").value_or("null"));
      return state == "completed" ? 0 : 1;
    }
  }
  while (!interrupted) {
    client_frame f;
    const auto status = queue.pop(f, k_poll);
    if (status == frame_queue::status::closed) return connection_lost(session);
    if (status == frame_queue::status::timeout) continue;
    if (f.op() == "error") warn_about_push(f);
    if (!is_operation_notice(f, started->operation)) continue;  // other messages stay
    if (auto acked = session.ack(f.int_at("/seq").value_or(0)); !acked) print_error(acked.error());
    print_line(f.raw_at("/envelope/body").value_or("null"));
    return f.string_at("/envelope/body/state") == "completed" ? 0 : 1;
  }
  return 1;
}

int run_reply(const reply_args& args) {
  auto body = read_body(args.body);
  if (!body) return usage_error(body.error());
  auto c = open_session(args.connection);
  if (!c) return fail(c.error());
  auto replied = (*c)->reply(args.operation, args.attempt, args.accept, *body);
  if (!replied) return fail(replied.error());
  json_writer w;
  w.begin_object().key("operation").string(replied->operation).key("state").string(replied->state);
  if (replied->duplicate) w.key("duplicate").boolean(true);
  w.end_object();
  print_line(w.str());
  return 0;
}

int run_operation(const operation_args& args) {
  json_writer w;
  w.begin_object().key("operation").string(args.operation).end_object();
  return print_reply(args.connection, "operation", w);
}

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  auto command = parse_command_line(args, [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
  if (!command) return usage_error(command.error());
  return std::visit(overloaded{
                        [](const help_args& a) { return run_help(a); },
                        [](const token_args& a) { return run_token(a); },
                        [](const send_args& a) { return run_send(a); },
                        [](const listen_args& a) { return run_listen(a); },
                        [](const submit_args& a) { return run_submit(a); },
                        [](const work_args& a) { return run_work(a); },
                        [](const pub_args& a) { return run_pub(a); },
                        [](const sub_args& a) { return run_sub(a); },
                        [](const who_args& a) { return run_who(a); },
                        [](const task_args& a) { return run_task(a); },
                        [](const cancel_args& a) { return run_cancel(a); },
                        [](const scatter_args& a) { return run_scatter(a); },
                        [](const reply_args& a) { return run_reply(a); },
                        [](const operation_args& a) { return run_operation(a); },
                    },
                    *command);
}

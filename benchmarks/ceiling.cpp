// The ceiling (issue 6, item 1): the durable task throughput this machine allows for the
// naive design, measured with raw cnats and no amp code on the path.
//
// One task's life is the JetStream operations of the naive design, each one waited for
// (a task counts as done only when the server has confirmed all eight):
//
//   1 create    KV create of the task record (~300-byte JSON), bucket with history 64
//   2 publish   the job message (~300-byte envelope, 128-byte body) with Nats-Msg-Id to a
//               work-queue stream
//   3 fetch     from a durable pull consumer (explicit ack, AckWait 30 s)
//   4 claim     KV update of the record to "running", compare-and-set on step 1's revision
//   5 progress  in-progress ack (+WPI), confirmed by the server
//   6 complete  KV update to "completed" with a result, compare-and-set on step 4's revision
//   7 ack       +ACK, confirmed by the server (the double ack of natsMsg_AckSync)
//   8 notice    publish the notice with Nats-Msg-Id to the inbox work-queue stream
//
// The shapes are amp's (docs/broker.md), with file storage: the job stream is a work queue
// on amp.<ns>.job.<job> with a 2-minute duplicate window and the durable job_<job>; the
// inbox stream a work queue on amp.<ns>.inbox.>; the bucket keeps 64 revisions, keys
// <ns>.<task>. The job message carries the record's revision in a header, so the worker
// that fetches it (often not the thread that created it) does its compare-and-set on the
// revision its creator wrote; the naive life has no KV read.
//
// Modes, each on fresh streams, bucket and consumer (set up and checked outside the timing):
//   one at a time   one thread, one connection, the synchronous cnats calls
//   T threads       T threads, a connection each, each doing one task at a time
//   batched         W workers, a connection each; each creates a batch of B tasks (B creates
//                   sent, then all waited for; B publishes, then all waited for), fetches up
//                   to B, and runs each step for the whole batch before waiting for its
//                   replies. The requests are natsConnection_PublishMsg with a reply subject
//                   on the worker's inbox, the replies read from a synchronous subscription
//                   (what js_PublishAsync does, without its callback thread). At most W x B
//                   tasks are in flight.
// After each run: the job stream is empty, the consumer has nothing pending or redelivered,
// the inbox stream holds one notice per task, the bucket N keys with 3 revisions each, and
// every record (read key by key) says "completed".
//
// Usage: amp-bench-ceiling [--tasks N] [--runs R] [--quick] [--url nats://host:port]
//          [--out FILE] [--threads 8,32,64] [--workers W] [--batch B] [--only MODES]
//   Without --url it starts its own nats-server (amp-test-support) with a temporary store.
//   --only takes: serial, threads, batched.

#include <nats/nats.h>
#include <netdb.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "support/stats.hpp"

#ifdef AMP_BENCH_HAVE_TEST_SUPPORT
#include "support/nats_server.hpp"
#endif

namespace {

using amp::bench::cpu_model;
using amp::bench::json_number;
using amp::bench::json_string;
using amp::bench::max_of;
using amp::bench::median;
using amp::bench::min_of;
using amp::bench::now_utc;
using amp::bench::read_first_line;
using amp::bench::split_list;

using bench_clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "benchmark failed: %s\n", what.c_str());
  std::exit(1);
}

void check(bool ok, const std::string& what) {
  if (!ok) fail(what);
}

void must_nats(natsStatus s, const std::string& what, jsErrCode ec = static_cast<jsErrCode>(0)) {
  if (s != NATS_OK) {
    const char* last = nats_GetLastError(nullptr);
    fail(what + ": " + natsStatus_GetText(s) + " (jsErrCode " + std::to_string(ec) + ") " +
         (last ? last : ""));
  }
}

constexpr std::int64_t k_ns_per_s = 1000000000;
constexpr std::int64_t k_ack_wait_ns = 30 * k_ns_per_s;
constexpr std::int64_t k_duplicate_window_ns = 120 * k_ns_per_s;
constexpr std::int64_t k_unlimited_ack_pending = std::int64_t{1} << 30;  // as amp's transport
constexpr int k_history = 64;                                            // amp's task store
constexpr std::int64_t k_reply_timeout_ms = 30000;

// ----- CPU and context switches ---------------------------------------------------------

using amp::bench::context_switches_self;
using amp::bench::cpu_seconds_self;

// CPU seconds of nats-server, negative when unknown (the benchmark did not start it).
double cpu_seconds_of(pid_t pid) {
  return pid > 0 ? amp::bench::cpu_seconds(pid) : -1;
}

pid_t g_server_pid = -1;

struct sample {
  double tasks_per_s = 0;
  double seconds = 0;
  double client_us_per_task = 0;        // this process, all threads
  double server_us_per_task = -1;       // nats-server, when it is our child
  double client_switches_per_task = 0;  // voluntary context switches of this process
};

struct meter {
  double cpu = cpu_seconds_self();
  double switches = context_switches_self();
  double server = cpu_seconds_of(g_server_pid);
  bench_clock::time_point start = bench_clock::now();

  sample finish(std::size_t n, bench_clock::time_point end) const {
    double cpu1 = cpu_seconds_self();
    double sw1 = context_switches_self();
    double srv1 = cpu_seconds_of(g_server_pid);
    sample out;
    auto dn = static_cast<double>(n);
    out.seconds = std::chrono::duration<double>(end - start).count();
    out.tasks_per_s = dn / out.seconds;
    out.client_us_per_task = (cpu1 - cpu) * 1e6 / dn;
    out.client_switches_per_task = (sw1 - switches) / dn;
    if (server >= 0 && srv1 >= 0) out.server_us_per_task = (srv1 - server) * 1e6 / dn;
    return out;
  }
};

// ----- connections and names -------------------------------------------------------------

struct connection {
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;

  connection(const std::string& url, const std::string& name) {
    natsOptions* opts = nullptr;
    must_nats(natsOptions_Create(&opts), "natsOptions_Create");
    must_nats(natsOptions_SetURL(opts, url.c_str()), "natsOptions_SetURL");
    must_nats(natsOptions_SetSendAsap(opts, true), "natsOptions_SetSendAsap");
    must_nats(natsOptions_SetName(opts, name.c_str()), "natsOptions_SetName");
    must_nats(natsConnection_Connect(&nc, opts), "connect " + url);
    natsOptions_Destroy(opts);
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = k_reply_timeout_ms;
    must_nats(natsConnection_JetStream(&js, nc, &jo), "natsConnection_JetStream");
  }
  ~connection() {
    jsCtx_Destroy(js);
    natsConnection_Close(nc);
    natsConnection_Destroy(nc);
  }
  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;
};

int g_names = 0;

// One run's streams, bucket and consumer, named after a fresh namespace.
struct shapes {
  std::string ns;
  std::string bucket;          // TASKS_<ns> (amp: AMP_TASK_STATE), history 64
  std::string kv_prefix;       // $KV.<bucket>.
  std::string jobs_stream;     // AMP_TASKS_<ns>
  std::string job_subject;     // amp.<ns>.job.resize
  std::string durable;         // job_resize
  std::string inbox_stream;    // AMP_INBOX_<ns>
  std::string notice_subject;  // amp.<ns>.inbox.alice

  shapes() {
    ns = "c" + std::to_string(getpid()) + "x" + std::to_string(++g_names);
    bucket = "TASKS_" + ns;
    kv_prefix = "$KV." + bucket + ".";
    jobs_stream = "AMP_TASKS_" + ns;
    job_subject = "amp." + ns + ".job.resize";
    durable = "job_resize";
    inbox_stream = "AMP_INBOX_" + ns;
    notice_subject = "amp." + ns + ".inbox.alice";
  }

  std::string key(const std::string& task) const { return ns + "." + task; }
};

std::string task_id(std::size_t i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "t_%010zu", i);
  return buf;
}

// The index back from a task id; fails on anything else.
std::size_t task_index(const char* id) {
  check(id != nullptr && std::strncmp(id, "t_", 2) == 0, "job message without Amp-Task");
  return std::strtoull(id + 2, nullptr, 10);
}

void add_work_queue(connection& admin, const std::string& name, const std::string& subjects) {
  const char* subj = subjects.c_str();
  jsStreamConfig sc;
  jsStreamConfig_Init(&sc);
  sc.Name = name.c_str();
  sc.Subjects = &subj;
  sc.SubjectsLen = 1;
  sc.Retention = js_WorkQueuePolicy;
  sc.Storage = js_FileStorage;
  sc.Duplicates = k_duplicate_window_ns;
  jsStreamInfo* si = nullptr;
  jsErrCode ec = static_cast<jsErrCode>(0);
  must_nats(js_AddStream(&si, admin.js, &sc, nullptr, &ec), "create stream " + name, ec);
  jsStreamInfo_Destroy(si);
}

void create_shapes(connection& admin, const shapes& s) {
  add_work_queue(admin, s.jobs_stream, "amp." + s.ns + ".job.>");
  add_work_queue(admin, s.inbox_stream, "amp." + s.ns + ".inbox.>");
  jsConsumerConfig cc;
  jsConsumerConfig_Init(&cc);
  cc.Durable = s.durable.c_str();
  cc.AckPolicy = js_AckExplicit;
  cc.AckWait = k_ack_wait_ns;
  cc.MaxAckPending = k_unlimited_ack_pending;
  cc.MaxDeliver = -1;
  cc.FilterSubject = s.job_subject.c_str();
  jsConsumerInfo* ci = nullptr;
  jsErrCode ec = static_cast<jsErrCode>(0);
  must_nats(js_AddConsumer(&ci, admin.js, s.jobs_stream.c_str(), &cc, nullptr, &ec),
            "create consumer", ec);
  jsConsumerInfo_Destroy(ci);
  kvConfig kc;
  kvConfig_Init(&kc);
  kc.Bucket = s.bucket.c_str();
  kc.History = k_history;
  kc.StorageType = js_FileStorage;
  kvStore* kv = nullptr;
  must_nats(js_CreateKeyValue(&kv, admin.js, &kc), "create bucket " + s.bucket);
  kvStore_Destroy(kv);
}

void delete_shapes(connection& admin, const shapes& s) {
  (void)js_DeleteStream(admin.js, s.jobs_stream.c_str(), nullptr, nullptr);
  (void)js_DeleteStream(admin.js, s.inbox_stream.c_str(), nullptr, nullptr);
  (void)js_DeleteKeyValue(admin.js, s.bucket.c_str());
}

// ----- the payloads --------------------------------------------------------------------

std::string now_iso() {
  auto now = std::chrono::system_clock::now();
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count();
  std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<int>(ms % 1000));
  return buf;
}

// The job's body: 128 bytes of JSON.
const std::string g_body = [] {
  std::string b = R"({"w":640,"h":480,"src":"s3://photos/2026/11/30/IMG_0001.jpg","pad":")";
  b.append(128 - b.size() - 2, 'x');
  return b + "\"}";
}();

const std::string g_result =
    R"({"ok":true,"out":"s3://photos/2026/11/30/IMG_0001-640x480.jpg","bytes":48213})";

struct payloads {
  std::string buf;

  // The record as submitted: ~300 bytes.
  const std::string& queued(const shapes& s, const std::string& task) {
    auto t = now_iso();
    buf = R"({"task":")" + task + R"(","ns":")" + s.ns +
          R"(","job":"resize","state":"queued","attempt":0,"max_attempts":3,)"
          R"("submitted_by":"alice","owner":null,"lease_expires_at":null,"created_at":")" +
          t + R"(","updated_at":")" + t +
          R"(","result":null,"error":null,"holders":[],"ack":"","job_seq":0})";
    return buf;
  }
  const std::string& running(const shapes& s, const std::string& task, const std::string& worker,
                             const char* ack) {
    auto t = now_iso();
    buf = R"({"task":")" + task + R"(","ns":")" + s.ns +
          R"(","job":"resize","state":"running","attempt":1,"max_attempts":3,)"
          R"("submitted_by":"alice","owner":")" +
          worker + R"(","lease_expires_at":")" + t + R"(","created_at":")" + t +
          R"(","updated_at":")" + t + R"(","result":null,"error":null,"holders":[")" + worker +
          R"("],"ack":")" + ack + R"("})";
    return buf;
  }
  const std::string& completed(const shapes& s, const std::string& task,
                               const std::string& worker) {
    auto t = now_iso();
    buf = R"({"task":")" + task + R"(","ns":")" + s.ns +
          R"(","job":"resize","state":"completed","attempt":1,"max_attempts":3,)"
          R"("submitted_by":"alice","owner":")" +
          worker + R"(","lease_expires_at":null,"created_at":")" + t + R"(","updated_at":")" + t +
          R"(","result":)" + g_result + R"(,"error":null,"holders":[")" + worker + R"("]})";
    return buf;
  }
  // The job message: the envelope around the 128-byte body, ~300 bytes.
  const std::string& job(const std::string& task) {
    buf = R"({"v":"amp.v1","id":"m_)" + task +
          R"(","from":"alice","to":"job:resize",)"
          R"("type":"amp.job","ts":")" +
          now_iso() + R"(","task":")" + task + R"(","max_attempts":3,"body":)" + g_body + "}";
    return buf;
  }
  // The submitter's notice.
  const std::string& notice(const std::string& task) {
    buf = R"({"v":"amp.v1","id":")" + task +
          R"(.completed","from":"$broker","to":"alice",)"
          R"("type":"amp.task.completed","ts":")" +
          now_iso() + R"(","body":{"task":")" + task +
          R"(","job":"resize","state":"completed","attempt":1,"result":)" + g_result + "}}";
    return buf;
  }
};

constexpr const char* k_rev_header = "Ceiling-Record-Revision";

// Builds a message with headers; the caller destroys it.
natsMsg* make_msg(const std::string& subject, const char* reply, const std::string& data) {
  natsMsg* m = nullptr;
  must_nats(natsMsg_Create(&m, subject.c_str(), reply, data.data(), static_cast<int>(data.size())),
            "natsMsg_Create");
  return m;
}

void set_header(natsMsg* m, const char* key, const std::string& value) {
  must_nats(natsMsgHeader_Set(m, key, value.c_str()), std::string("header ") + key);
}

void set_job_headers(natsMsg* m, const std::string& task, std::uint64_t rev) {
  set_header(m, "Amp-Task", task);
  set_header(m, "Amp-Max-Attempts", "3");
  set_header(m, k_rev_header, std::to_string(rev));
}

// The task and the record revision a fetched job message carries.
std::pair<std::string, std::uint64_t> job_of(natsMsg* m) {
  const char* task = nullptr;
  const char* rev = nullptr;
  must_nats(natsMsgHeader_Get(m, "Amp-Task", &task), "job message: Amp-Task");
  must_nats(natsMsgHeader_Get(m, k_rev_header, &rev), "job message: revision");
  (void)task_index(task);
  return {task, std::strtoull(rev, nullptr, 10)};
}

// ----- one run ------------------------------------------------------------------------------

// Shared by the threads of one run: when the N-th task was done.
struct run_state {
  std::size_t n = 0;
  std::mutex mu;
  std::size_t produced = 0;
  std::size_t done = 0;
  bench_clock::time_point end{};
  bench_clock::time_point last_progress = bench_clock::now();

  // Counts `k` finished tasks; the N-th sets the end time.
  void finish(std::size_t k) {
    std::lock_guard lock(mu);
    done += k;
    last_progress = bench_clock::now();
    if (done == n) end = last_progress;
    check(done <= n, "more tasks finished than started");
  }
};

natsSubscription* bind_pull(connection& c, const shapes& s) {
  natsSubscription* sub = nullptr;
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = s.jobs_stream.c_str();
  so.Consumer = s.durable.c_str();
  jsErrCode ec = static_cast<jsErrCode>(0);
  must_nats(
      js_PullSubscribe(&sub, c.js, s.job_subject.c_str(), s.durable.c_str(), nullptr, &so, &ec),
      "js_PullSubscribe", ec);
  return sub;
}

// One at a time with the synchronous cnats calls: one such worker per thread.
struct serial_worker {
  const shapes& s;
  std::string name;
  connection c;
  kvStore* kv = nullptr;
  natsSubscription* pull = nullptr;
  payloads p;

  serial_worker(const std::string& url, const shapes& sh, int index)
      : s(sh), name("w" + std::to_string(index)), c(url, "amp-bench-ceiling-" + name) {
    must_nats(js_KeyValue(&kv, c.js, s.bucket.c_str()), "js_KeyValue");
    pull = bind_pull(c, s);
  }
  ~serial_worker() {
    natsSubscription_Unsubscribe(pull);
    natsSubscription_Destroy(pull);
    kvStore_Destroy(kv);
  }
  serial_worker(const serial_worker&) = delete;
  serial_worker& operator=(const serial_worker&) = delete;

  // Confirmed acknowledgement (as natsMsg_AckSync does for +ACK).
  void ack_confirmed(natsMsg* m, const char* what) {
    natsMsg* reply = nullptr;
    must_nats(natsConnection_Request(&reply, c.nc, natsMsg_GetReply(m), what,
                                     static_cast<int>(std::strlen(what)), k_reply_timeout_ms),
              std::string(what) + " confirmation");
    natsMsg_Destroy(reply);
  }

  void publish(natsMsg* m, const std::string& msg_id, const char* what) {
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = msg_id.c_str();
    jsPubAck* pa = nullptr;
    jsErrCode ec = static_cast<jsErrCode>(0);
    must_nats(js_PublishMsg(&pa, c.js, m, &po, &ec), what, ec);
    check(!pa->Duplicate, std::string(what) + ": duplicate");
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
  }

  // Submits task i (steps 1, 2), then takes one job and carries it through (steps 3-8).
  void one_task(std::size_t i) {
    auto task = task_id(i);
    auto key = s.key(task);
    const auto& rec = p.queued(s, task);
    std::uint64_t rev = 0;
    must_nats(kvStore_Create(&rev, kv, key.c_str(), rec.data(), static_cast<int>(rec.size())),
              "kvStore_Create");
    natsMsg* job = make_msg(s.job_subject, nullptr, p.job(task));
    set_job_headers(job, task, rev);
    publish(job, task, "publish job");

    natsMsgList list{};
    jsErrCode ec = static_cast<jsErrCode>(0);
    must_nats(natsSubscription_Fetch(&list, pull, 1, k_reply_timeout_ms, &ec), "fetch", ec);
    check(list.Count == 1, "fetch: no message");
    natsMsg* m = list.Msgs[0];
    auto [got, created] = job_of(m);
    auto got_key = s.key(got);
    const auto& running = p.running(s, got, name, natsMsg_GetReply(m));
    std::uint64_t claimed = 0;
    must_nats(kvStore_Update(&claimed, kv, got_key.c_str(), running.data(),
                             static_cast<int>(running.size()), created),
              "claim (kvStore_Update)");
    ack_confirmed(m, "+WPI");
    const auto& done = p.completed(s, got, name);
    std::uint64_t completed = 0;
    must_nats(kvStore_Update(&completed, kv, got_key.c_str(), done.data(),
                             static_cast<int>(done.size()), claimed),
              "complete (kvStore_Update)");
    jsErrCode aec = static_cast<jsErrCode>(0);
    must_nats(natsMsg_AckSync(m, nullptr, &aec), "natsMsg_AckSync", aec);
    natsMsg* notice = make_msg(s.notice_subject, nullptr, p.notice(got));
    publish(notice, got + ".completed", "publish notice");
    natsMsgList_Destroy(&list);
  }
};

// T threads (T = 1: one at a time), each with its connection, each doing one task at a time:
// thread k submits its share of the tasks, and after each submission takes one job.
sample run_threads(const std::string& url, const shapes& s, std::size_t n, int threads) {
  std::vector<std::unique_ptr<serial_worker>> workers;
  for (int k = 0; k < threads; ++k) workers.push_back(std::make_unique<serial_worker>(url, s, k));
  run_state state;
  state.n = n;
  std::latch ready(threads + 1);
  std::latch go(1);
  std::vector<std::thread> pool;
  for (int k = 0; k < threads; ++k) {
    pool.emplace_back([&, k] {
      auto tk = static_cast<std::size_t>(k);
      auto tn = static_cast<std::size_t>(threads);
      std::size_t first = n * tk / tn, last = n * (tk + 1) / tn;
      ready.count_down();
      go.wait();
      for (std::size_t i = first; i < last; ++i) {
        workers[tk]->one_task(i);
        state.finish(1);
      }
    });
  }
  ready.arrive_and_wait();
  meter m;
  go.count_down();
  for (auto& t : pool) t.join();
  return m.finish(n, state.end);
}

// Batched: requests sent for a whole batch, then the replies waited for.
struct pipelined_worker {
  const shapes& s;
  std::string name;
  connection c;
  natsSubscription* pull = nullptr;
  natsSubscription* replies = nullptr;  // synchronous, on <inbox>.*
  std::string inbox;
  std::vector<std::string> reply_subjects;  // <inbox>.<token>
  std::vector<char> expects_pub_ack;        // per token: a PubAck (else an ack's confirmation)
  std::vector<std::uint64_t> seq;           // per token: the PubAck's sequence
  std::vector<std::uint64_t> revs;
  std::vector<std::string> tasks;
  payloads p;

  pipelined_worker(const std::string& url, const shapes& sh, int index, std::size_t batch)
      : s(sh), name("w" + std::to_string(index)), c(url, "amp-bench-ceiling-" + name) {
    pull = bind_pull(c, s);
    natsInbox* ib = nullptr;
    must_nats(natsInbox_Create(&ib), "natsInbox_Create");
    inbox = ib;
    natsInbox_Destroy(ib);
    must_nats(natsConnection_SubscribeSync(&replies, c.nc, (inbox + ".*").c_str()),
              "subscribe replies");
    must_nats(natsSubscription_SetPendingLimits(replies, -1, -1), "pending limits");
    for (std::size_t t = 0; t < 2 * batch; ++t) {
      reply_subjects.push_back(inbox + "." + std::to_string(t));
    }
    expects_pub_ack.resize(2 * batch);
    seq.resize(2 * batch);
    revs.resize(batch);
    tasks.resize(batch);
    must_nats(natsConnection_Flush(c.nc), "flush");
  }
  ~pipelined_worker() {
    natsSubscription_Unsubscribe(replies);
    natsSubscription_Destroy(replies);
    natsSubscription_Unsubscribe(pull);
    natsSubscription_Destroy(pull);
  }
  pipelined_worker(const pipelined_worker&) = delete;
  pipelined_worker& operator=(const pipelined_worker&) = delete;

  // A JetStream publish whose PubAck comes back on token `t`; the caller set the headers.
  void send(natsMsg* m, std::size_t t) {
    expects_pub_ack[t] = 1;
    must_nats(natsConnection_PublishMsg(c.nc, m), "publish");
    natsMsg_Destroy(m);
  }
  // A KV write: create (expected 0) or compare-and-set on `expected`, exactly what
  // kvStore_Create / kvStore_Update send.
  void kv_write(const std::string& key, const std::string& value, std::uint64_t expected,
                std::size_t t) {
    natsMsg* m = make_msg(s.kv_prefix + key, reply_subjects[t].c_str(), value);
    set_header(m, "Nats-Expected-Last-Subject-Sequence", std::to_string(expected));
    send(m, t);
  }
  // An acknowledgement with a reply subject: the server confirms it.
  void ack(natsMsg* m, const char* what, std::size_t t) {
    expects_pub_ack[t] = 0;
    must_nats(natsConnection_PublishRequest(c.nc, natsMsg_GetReply(m), reply_subjects[t].c_str(),
                                            what, static_cast<int>(std::strlen(what))),
              std::string(what));
  }

  // Waits for `count` replies (tokens 0..count-1 in any order); a JetStream error fails.
  void wait(std::size_t count, const char* what) {
    for (std::size_t k = 0; k < count; ++k) {
      natsMsg* m = nullptr;
      must_nats(natsSubscription_NextMsg(&m, replies, k_reply_timeout_ms),
                std::string("reply to ") + what);
      const char* subject = natsMsg_GetSubject(m);
      std::size_t t = std::strtoull(std::strrchr(subject, '.') + 1, nullptr, 10);
      check(t < expects_pub_ack.size(), "reply to an unknown token");
      const char* status = nullptr;
      if (natsMsgHeader_Get(m, "Status", &status) == NATS_OK) {
        fail(std::string(what) + ": status " + (status ? status : "?"));
      }
      if (expects_pub_ack[t]) {
        std::string_view ack(natsMsg_GetData(m),
                             static_cast<std::size_t>(natsMsg_GetDataLength(m)));
        if (ack.find("\"error\"") != std::string_view::npos) {
          fail(std::string(what) + ": " + std::string(ack));
        }
        check(ack.find("\"duplicate\":true") == std::string_view::npos,
              std::string(what) + ": duplicate");
        auto at = ack.find("\"seq\":");
        check(at != std::string_view::npos,
              std::string(what) + ": no sequence in " + std::string(ack));
        seq[t] = std::strtoull(ack.data() + at + 6, nullptr, 10);
      }
      natsMsg_Destroy(m);
    }
  }

  // Steps 1 and 2 for tasks first..first+count-1.
  void submit(std::size_t first, std::size_t count) {
    for (std::size_t j = 0; j < count; ++j) {
      tasks[j] = task_id(first + j);
      kv_write(s.key(tasks[j]), p.queued(s, tasks[j]), 0, j);
    }
    wait(count, "create");
    for (std::size_t j = 0; j < count; ++j) {
      natsMsg* m = make_msg(s.job_subject, reply_subjects[j].c_str(), p.job(tasks[j]));
      set_header(m, "Nats-Msg-Id", tasks[j]);
      set_job_headers(m, tasks[j], seq[j]);
      send(m, j);
    }
    wait(count, "publish job");
  }

  // Steps 4 to 8 for a fetched batch.
  void work(natsMsgList& list) {
    auto count = static_cast<std::size_t>(list.Count);
    for (std::size_t j = 0; j < count; ++j) {
      natsMsg* m = list.Msgs[j];
      auto [task, rev] = job_of(m);
      tasks[j] = task;
      kv_write(s.key(task), p.running(s, task, name, natsMsg_GetReply(m)), rev, j);
    }
    wait(count, "claim");
    for (std::size_t j = 0; j < count; ++j) {
      revs[j] = seq[j];
      ack(list.Msgs[j], "+WPI", j);
    }
    wait(count, "+WPI");
    for (std::size_t j = 0; j < count; ++j) {
      kv_write(s.key(tasks[j]), p.completed(s, tasks[j], name), revs[j], j);
    }
    wait(count, "complete");
    for (std::size_t j = 0; j < count; ++j) {
      ack(list.Msgs[j], "+ACK", j);
      natsMsg* m =
          make_msg(s.notice_subject, reply_subjects[count + j].c_str(), p.notice(tasks[j]));
      set_header(m, "Nats-Msg-Id", tasks[j] + ".completed");
      send(m, count + j);
    }
    wait(2 * count, "+ACK and notice");
  }

  // Up to `batch` jobs: what is there now, or (`may_wait`) the next one within 100 ms.
  natsMsgList fetch(std::size_t batch, bool may_wait) {
    natsMsgList list{};
    jsFetchRequest req;
    jsFetchRequest_Init(&req);
    req.Batch = may_wait ? 1 : static_cast<int>(batch);
    req.NoWait = !may_wait;
    req.Expires = may_wait ? 100 * 1000000LL : k_reply_timeout_ms * 1000000LL;
    auto st = natsSubscription_FetchRequest(&list, pull, &req);
    if (st == NATS_NOT_FOUND || st == NATS_TIMEOUT) return natsMsgList{};
    must_nats(st, "fetch");
    return list;
  }
};

sample run_batched(const std::string& url, const shapes& s, std::size_t n, int workers,
                   std::size_t batch) {
  std::vector<std::unique_ptr<pipelined_worker>> pool_objects;
  for (int k = 0; k < workers; ++k) {
    pool_objects.push_back(std::make_unique<pipelined_worker>(url, s, k, batch));
  }
  const std::size_t max_in_flight = static_cast<std::size_t>(workers) * batch;
  run_state state;
  state.n = n;
  std::latch ready(workers + 1);
  std::latch go(1);
  std::vector<std::thread> pool;
  for (int k = 0; k < workers; ++k) {
    pool.emplace_back([&, k] {
      auto& w = *pool_objects[static_cast<std::size_t>(k)];
      ready.count_down();
      go.wait();
      for (;;) {
        std::size_t first = 0, take = 0;
        {
          std::lock_guard lock(state.mu);
          if (state.done == n) break;
          check(bench_clock::now() - state.last_progress < 60s, "no progress for 60 s");
          std::size_t in_flight = state.produced - state.done;
          if (in_flight < max_in_flight) {
            take = std::min({batch, n - state.produced, max_in_flight - in_flight});
          }
          first = state.produced;
          state.produced += take;
        }
        if (take > 0) w.submit(first, take);
        auto list = w.fetch(batch, take == 0);
        if (list.Count == 0) continue;
        w.work(list);
        auto got = static_cast<std::size_t>(list.Count);
        natsMsgList_Destroy(&list);
        state.finish(got);
      }
    });
  }
  ready.arrive_and_wait();
  meter m;
  go.count_down();
  for (auto& t : pool) t.join();
  return m.finish(n, state.end);
}

// ----- checking a run -------------------------------------------------------------------------

std::uint64_t stream_messages(connection& admin, const std::string& stream) {
  jsStreamInfo* si = nullptr;
  jsErrCode ec = static_cast<jsErrCode>(0);
  must_nats(js_GetStreamInfo(&si, admin.js, stream.c_str(), nullptr, &ec), "stream info", ec);
  auto msgs = si->State.Msgs;
  jsStreamInfo_Destroy(si);
  return msgs;
}

void verify(connection& admin, const shapes& s, std::size_t n) {
  auto left = stream_messages(admin, s.jobs_stream);
  check(left == 0, "job stream not empty after the run: " + std::to_string(left));
  jsConsumerInfo* ci = nullptr;
  jsErrCode ec = static_cast<jsErrCode>(0);
  must_nats(
      js_GetConsumerInfo(&ci, admin.js, s.jobs_stream.c_str(), s.durable.c_str(), nullptr, &ec),
      "consumer info", ec);
  auto pending = ci->NumAckPending;
  auto redelivered = ci->NumRedelivered;
  jsConsumerInfo_Destroy(ci);
  check(pending == 0, "consumer: " + std::to_string(pending) + " pending acks");
  check(redelivered == 0, "consumer: " + std::to_string(redelivered) + " redelivered");
  auto notices = stream_messages(admin, s.inbox_stream);
  check(notices == n, "inbox: " + std::to_string(notices) + " notices for " + std::to_string(n));
  auto writes = stream_messages(admin, "KV_" + s.bucket);
  check(writes == 3 * n, "bucket: " + std::to_string(writes) + " revisions for " +
                             std::to_string(n) + " tasks (3 each expected)");

  kvStore* kv = nullptr;
  must_nats(js_KeyValue(&kv, admin.js, s.bucket.c_str()), "js_KeyValue");
  kvKeysList keys{};
  must_nats(kvStore_Keys(&keys, kv, nullptr), "kvStore_Keys");
  check(static_cast<std::size_t>(keys.Count) == n,
        "bucket: " + std::to_string(keys.Count) + " keys for " + std::to_string(n) + " tasks");
  std::vector<char> seen(n, 0);
  std::size_t completed = 0;
  for (int i = 0; i < keys.Count; ++i) {
    kvEntry* e = nullptr;
    must_nats(kvStore_Get(&e, kv, keys.Keys[i]), std::string("kvStore_Get ") + keys.Keys[i]);
    std::string_view value(static_cast<const char*>(kvEntry_Value(e)),
                           static_cast<std::size_t>(kvEntry_ValueLen(e)));
    if (value.find(R"("state":"completed")") != std::string_view::npos) ++completed;
    const char* dot = std::strchr(keys.Keys[i], '.');
    auto idx = task_index(dot ? dot + 1 : nullptr);
    check(idx < n && !seen[idx], std::string("unexpected key ") + keys.Keys[i]);
    seen[idx] = 1;
    kvEntry_Destroy(e);
  }
  kvKeysList_Destroy(&keys);
  kvStore_Destroy(kv);
  check(completed == n,
        std::to_string(completed) + " of " + std::to_string(n) + " records say completed");
}

// ----- configuration --------------------------------------------------------------------

struct config {
  std::string url;
  std::size_t tasks = 20000;
  int runs = 3;
  std::vector<int> threads{8, 32, 64};
  int workers = 4;
  std::size_t batch = 64;
  std::string out;
  std::set<std::string> only;
  bool quick = false;
};

struct mode {
  std::string key;  // --only name
  std::string name;
  std::string how;
  int threads = 1;
  std::size_t in_flight = 1;
  std::vector<sample> runs;
};

template <class F>
std::vector<double> pluck(const std::vector<sample>& s, F f) {
  std::vector<double> out;
  for (const auto& x : s) out.push_back(f(x));
  return out;
}

// The server's version, from the INFO line it sends first (cnats does not expose it).
std::string server_version(const std::string& url) {
  std::string hostport = url;
  if (auto p = hostport.find("://"); p != std::string::npos) hostport = hostport.substr(p + 3);
  if (auto comma = hostport.find(','); comma != std::string::npos) hostport.resize(comma);
  if (auto at = hostport.rfind('@'); at != std::string::npos) hostport = hostport.substr(at + 1);
  auto colon = hostport.rfind(':');
  std::string host = colon == std::string::npos ? hostport : hostport.substr(0, colon);
  std::string port = colon == std::string::npos ? "4222" : hostport.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return "unknown";
  std::string line;
  int fd = socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    char buf[4096];
    ssize_t got = 0;
    while (line.find('\n') == std::string::npos && (got = read(fd, buf, sizeof buf)) > 0) {
      line.append(buf, static_cast<std::size_t>(got));
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  auto v = line.find("\"version\":\"");
  if (v == std::string::npos) return "unknown";
  v += 11;
  return line.substr(v, line.find('"', v) - v);
}

void write_json(const config& c, const std::vector<mode>& modes, const std::string& version,
                const std::string& load_before, const std::string& load_after,
                const std::string& started, double total_s) {
  std::filesystem::path out(c.out);
  if (out.has_parent_path()) std::filesystem::create_directories(out.parent_path());
  std::ofstream f(out);
  if (!f) fail("cannot write " + c.out);
  f << "{\n";
  f << "  \"benchmark\": \"amp-bench-ceiling\",\n";
  f << "  \"started\": " << json_string(started) << ",\n";
  f << "  \"seconds\": " << json_number(total_s, 1) << ",\n";
  f << "  \"quick\": " << (c.quick ? "true" : "false") << ",\n";
  f << "  \"tasks\": " << c.tasks << ",\n  \"runs\": " << c.runs << ",\n";
  f << "  \"batched\": {\"workers\": " << c.workers << ", \"batch\": " << c.batch
    << ", \"max_in_flight\": " << static_cast<std::size_t>(c.workers) * c.batch << "},\n";
  f << "  \"storage\": \"file\",\n";
  f << "  \"server\": " << json_string(c.url.empty() ? "own nats-server (amp-test-support)" : c.url)
    << ",\n";
  f << "  \"nats_server_version\": " << json_string(version) << ",\n";
  f << "  \"cnats\": " << json_string(nats_GetVersion()) << ",\n";
  f << "  \"machine\": {\"cpus\": " << std::thread::hardware_concurrency()
    << ", \"cpu\": " << json_string(cpu_model())
    << ", \"loadavg_before\": " << json_string(load_before)
    << ", \"loadavg_after\": " << json_string(load_after) << "},\n";
  f << "  \"life\": [\"kv create (record, history 64)\", \"publish job (Nats-Msg-Id)\", "
       "\"fetch (durable pull, explicit ack, AckWait 30 s)\", \"kv update CAS (claim)\", "
       "\"+WPI (confirmed)\", \"kv update CAS (complete)\", \"+ACK (confirmed, double ack)\", "
       "\"publish notice (Nats-Msg-Id)\"],\n";
  f << "  \"payload_bytes\": {\"body\": " << g_body.size() << "},\n";
  f << "  \"modes\": [\n";
  for (std::size_t i = 0; i < modes.size(); ++i) {
    const auto& m = modes[i];
    auto rate = pluck(m.runs, [](auto& s) { return s.tasks_per_s; });
    f << "    {\"key\": " << json_string(m.key) << ", \"name\": " << json_string(m.name)
      << ", \"how\": " << json_string(m.how) << ", \"threads\": " << m.threads
      << ", \"max_in_flight\": " << m.in_flight << ",\n";
    f << "     \"tasks_per_s\": {\"min\": " << json_number(min_of(rate), 1)
      << ", \"median\": " << json_number(median(rate), 1)
      << ", \"max\": " << json_number(max_of(rate), 1) << "},\n";
    f << "     \"runs\": [";
    for (std::size_t r = 0; r < m.runs.size(); ++r) {
      const auto& s = m.runs[r];
      f << (r ? ", " : "") << "{\"tasks_per_s\": " << json_number(s.tasks_per_s, 1)
        << ", \"seconds\": " << json_number(s.seconds, 3)
        << ", \"client_cpu_us_per_task\": " << json_number(s.client_us_per_task, 1)
        << ", \"server_cpu_us_per_task\": "
        << json_number(s.server_us_per_task >= 0 ? s.server_us_per_task : std::nan(""), 1)
        << ", \"client_context_switches_per_task\": " << json_number(s.client_switches_per_task, 2)
        << "}";
    }
    f << "]}" << (i + 1 < modes.size() ? "," : "") << "\n";
  }
  f << "  ],\n";
  const mode* ceiling = nullptr;
  for (const auto& m : modes) {
    if (m.key == "batched") ceiling = &m;
  }
  f << "  \"ceiling_tasks_per_s\": "
    << (ceiling
            ? json_number(median(pluck(ceiling->runs, [](auto& s) { return s.tasks_per_s; })), 1)
            : "null")
    << "\n}\n";
}

void print_table(const std::vector<mode>& modes) {
  std::printf("\n%-34s %9s %9s %9s %9s %9s %7s\n", "mode", "min/s", "median/s", "max/s", "cli us",
              "srv us", "cs");
  for (const auto& m : modes) {
    auto rate = pluck(m.runs, [](auto& s) { return s.tasks_per_s; });
    auto srv = pluck(m.runs, [](auto& s) { return s.server_us_per_task; });
    std::printf("%-34s %9.0f %9.0f %9.0f %9.1f %9.1f %7.2f\n", m.name.c_str(), min_of(rate),
                median(rate), max_of(rate),
                median(pluck(m.runs, [](auto& s) { return s.client_us_per_task; })),
                (srv.empty() || srv.front() < 0) ? std::nan("") : median(srv),
                median(pluck(m.runs, [](auto& s) { return s.client_switches_per_task; })));
  }
  std::printf(
      "(cli us, srv us: CPU per task of this process and of nats-server, medians; cs: voluntary "
      "context switches of this process per task)\n");
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: amp-bench-ceiling [--tasks N] [--runs R] [--quick] [--url URL] "
               "[--out FILE] [--threads 8,32,64] [--workers W] [--batch B] [--only MODES]\n"
               "  modes: serial threads batched\n");
  std::exit(2);
}

config parse_args(int argc, char** argv) {
  config c;
#ifdef AMP_BENCH_DEFAULT_OUT
  c.out = AMP_BENCH_DEFAULT_OUT;
#else
  c.out = "benchmarks/results/ceiling.json";
#endif
  bool n_set = false, runs_set = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--url") {
      c.url = next();
    } else if (a == "--tasks") {
      c.tasks = std::strtoull(next().c_str(), nullptr, 10);
      n_set = true;
    } else if (a == "--runs") {
      c.runs = std::atoi(next().c_str());
      runs_set = true;
    } else if (a == "--quick") {
      c.quick = true;
    } else if (a == "--out") {
      c.out = next();
    } else if (a == "--threads") {
      c.threads.clear();
      for (auto& t : split_list(next())) c.threads.push_back(std::atoi(t.c_str()));
    } else if (a == "--workers") {
      c.workers = std::atoi(next().c_str());
    } else if (a == "--batch") {
      c.batch = std::strtoull(next().c_str(), nullptr, 10);
    } else if (a == "--only") {
      for (auto& o : split_list(next())) c.only.insert(o);
    } else {
      usage();
    }
  }
  if (c.quick) {
    if (!n_set) c.tasks = 3000;
    if (!runs_set) c.runs = 1;
  }
  bool threads_ok = std::all_of(c.threads.begin(), c.threads.end(), [](int t) { return t > 0; });
  if (c.tasks == 0 || c.runs < 1 || c.workers < 1 || c.batch == 0 || !threads_ok) usage();
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  auto c = parse_args(argc, argv);
  auto started = now_utc();
  auto t_start = bench_clock::now();

#ifdef AMP_BENCH_HAVE_TEST_SUPPORT
  std::optional<amp::testing::nats_server> server;
  if (c.url.empty()) {
    server.emplace(amp::testing::nats_server::start());
    g_server_pid = server->pid();
  }
  std::string url = c.url.empty() ? server->url() : c.url;
#else
  if (c.url.empty()) {
    std::fprintf(stderr, "built without amp-test-support: pass --url\n");
    return 2;
  }
  std::string url = c.url;
#endif

  auto version = server_version(url);
  connection admin(url, "amp-bench-ceiling-admin");
  auto wanted = [&](const std::string& key) { return c.only.empty() || c.only.count(key) > 0; };

  std::vector<mode> modes;
  if (wanted("serial")) {
    modes.push_back({"serial", "one at a time", "1 thread, synchronous cnats calls", 1, 1, {}});
  }
  if (wanted("threads")) {
    for (int t : c.threads) {
      modes.push_back({"threads",
                       std::to_string(t) + " threads, one task each",
                       std::to_string(t) +
                           " threads, a connection each, synchronous cnats calls, one task at a "
                           "time",
                       t,
                       static_cast<std::size_t>(t),
                       {}});
    }
  }
  if (wanted("batched")) {
    auto in_flight = static_cast<std::size_t>(c.workers) * c.batch;
    modes.push_back(
        {"batched",
         "batched " + std::to_string(c.workers) + "x" + std::to_string(c.batch) + " (ceiling)",
         std::to_string(c.workers) +
             " workers, a connection each; every step sent for a batch of up to " +
             std::to_string(c.batch) +
             " tasks (natsConnection_PublishMsg with a reply subject), then the "
             "replies awaited",
         c.workers,
         in_flight,
         {}});
  }
  if (modes.empty()) usage();

  auto one = [&](const mode& m, std::size_t n) {
    shapes s;
    create_shapes(admin, s);
    auto out = m.key == "batched" ? run_batched(url, s, n, c.workers, c.batch)
                                  : run_threads(url, s, n, m.threads);
    verify(admin, s, n);
    delete_shapes(admin, s);
    return out;
  };

  auto load_before = read_first_line("/proc/loadavg");
  std::printf(
      "Ceiling: a durable task life with raw cnats %s on nats-server %s (%s), file storage, "
      "%zu tasks per measurement, %d run(s)\n",
      nats_GetVersion(), version.c_str(), c.url.empty() ? "own" : url.c_str(), c.tasks, c.runs);
  std::printf("load average before: %s\n", load_before.c_str());

  std::printf("warm-up...\n");
  std::fflush(stdout);
  for (const auto& m : modes) {
    (void)one(m, std::max<std::size_t>(static_cast<std::size_t>(m.threads) * 4, c.tasks / 20));
  }
  for (int run = 0; run < c.runs; ++run) {
    // The order rotates every run, so that drift does not always hit the same mode.
    for (std::size_t k = 0; k < modes.size(); ++k) {
      auto& m = modes[(k + static_cast<std::size_t>(run)) % modes.size()];
      std::printf("run %d/%d: %-34s", run + 1, c.runs, m.name.c_str());
      std::fflush(stdout);
      auto s = one(m, c.tasks);
      std::printf(" %8.0f tasks/s  (%.2f s)\n", s.tasks_per_s, s.seconds);
      std::fflush(stdout);
      m.runs.push_back(s);
    }
  }
  auto load_after = read_first_line("/proc/loadavg");
  double total_s = std::chrono::duration<double>(bench_clock::now() - t_start).count();

  print_table(modes);
  std::printf("load average after: %s\n", load_after.c_str());
  std::printf(
      "every run checked: job stream empty, nothing pending or redelivered, one notice "
      "per task, every record completed\n");
  write_json(c, modes, version, load_before, load_after, started, total_s);
  std::printf("results written to %s (%.0f s in all)\n", c.out.c_str(), total_s);
  return 0;
}

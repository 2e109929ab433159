#pragma once

// What the sink's tests share: events published through the broker's topics, a look into
// a SQLite table, a target that fails on demand, and a step that moves a manual clock.

#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "amp/broker/job_queue.hpp"
#include "amp/broker/topics.hpp"
#include "amp/sink/sink.hpp"
#include "amp/sink/target.hpp"

namespace amp::testing {

/// Publishes `body` on `topic` from `from`; returns the event's stream sequence.
inline std::uint64_t publish_event(topics& t, const std::string& topic_name,
                                   const std::string& body, const std::string& from = "alice",
                                   const std::string& msg_id = "") {
  auto r = t.publish({.to = topic::make(topic_name).value(),
                      .from = from,
                      .body = body,
                      .type = "note",
                      .headers = {},
                      .msg_id = msg_id});
  if (!r) throw std::runtime_error("publish: " + r.error().message());
  return r->seq;
}

/// Four tasks of job "review" submitted by alice: `done` completed and `failed` failed by
/// "worker", `cancelled` cancelled by alice, `running` claimed and left so. Fetches wait
/// `fetch_wait` (zero on a manual clock), for at most 10 s in all.
struct four_tasks {
  submit_result done, failed, cancelled, running;
};

inline four_tasks end_three_of_four_tasks(job_queue& jobs, duration fetch_wait) {
  const auto alice = participant_name::make("alice").value();
  const auto worker = participant_name::make("worker").value();
  const auto review = job_name::make("review").value();
  auto submit = [&](const char* body) {
    return jobs.submit({.job = review, .from = alice, .body = body}).value();
  };
  four_tasks t{.done = submit(R"({"doc":1})"),
               .failed = submit(R"({"doc":2})"),
               .cancelled = submit(R"({"doc":3})"),
               .running = submit(R"({"doc":4})")};
  REQUIRE(jobs.cancel(t.cancelled.task, {.who = alice}));
  std::set<std::string> claimed;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (claimed.size() < 3 && std::chrono::steady_clock::now() < deadline) {
    const auto offers = jobs.fetch(review, 4, fetch_wait).value();
    for (const auto& o : offers) {
      if (jobs.claim(o, worker)) claimed.insert(o.task.task);
    }
  }
  REQUIRE(claimed.size() == 3);
  REQUIRE(jobs.complete(t.done.task, worker, R"({"ok":true})"));
  REQUIRE(
      jobs.fail(t.failed.task, worker, {.code = "bad", .message = "no"}, false, duration::zero()));
  return t;
}

/// The rows of a SQLite table: each row's columns by name (NULL as "<null>"), by key.
inline std::map<std::string, std::map<std::string, std::string>> sqlite_rows(
    const std::string& path, const std::string& table) {
  std::map<std::string, std::map<std::string, std::string>> out;
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    sqlite3_close(db);
    return out;
  }
  sqlite3_stmt* s = nullptr;
  const std::string sql = "SELECT * FROM \"" + table + "\"";
  if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) == SQLITE_OK) {
    while (sqlite3_step(s) == SQLITE_ROW) {
      std::map<std::string, std::string> row;
      for (int i = 0; i < sqlite3_column_count(s); ++i) {
        const auto* v = reinterpret_cast<const char*>(sqlite3_column_text(s, i));
        row[sqlite3_column_name(s, i)] = v ? v : "<null>";
      }
      out[row["key"]] = row;
    }
  }
  sqlite3_finalize(s);
  sqlite3_close(db);
  return out;
}

/// A target that passes to another one, except while `away` is set (then `unavailable`,
/// nothing written), counting the writes that reached it.
class switchable_target final : public sink::target {
 public:
  explicit switchable_target(std::unique_ptr<sink::target> inner) : inner_(std::move(inner)) {}
  std::string describe() const override { return "switchable " + inner_->describe(); }
  result<void> open() override {
    if (away->load()) return unexpected(errc::unavailable, "switched off");
    return inner_->open();
  }
  result<sink::batch_result> write(std::span<const sink::row> rows,
                                   sink::duplicate_mode mode) override {
    if (away->load()) return unexpected(errc::unavailable, "switched off");
    ++*writes;
    return inner_->write(rows, mode);
  }
  result<void> probe() override {
    ++*probes;
    if (away->load()) return unexpected(errc::unavailable, "switched off");
    return inner_->probe();
  }
  std::shared_ptr<std::atomic<bool>> away = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<std::atomic<int>> writes = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> probes = std::make_shared<std::atomic<int>>(0);

 private:
  std::unique_ptr<sink::target> inner_;
};

/// A target that passes to another one the rows whose body does not contain `marker`, and
/// refuses those that do (as a database refuses a row it cannot hold).
class refusing_target final : public sink::target {
 public:
  refusing_target(std::unique_ptr<sink::target> inner, std::string marker)
      : inner_(std::move(inner)), marker_(std::move(marker)) {}
  std::string describe() const override { return "refusing " + inner_->describe(); }
  result<void> open() override { return inner_->open(); }
  result<sink::batch_result> write(std::span<const sink::row> rows,
                                   sink::duplicate_mode mode) override {
    std::vector<sink::row> taken;
    for (const auto& r : rows) {
      if (r.body.find(marker_) == std::string::npos) taken.push_back(r);
    }
    auto inner = inner_->write(taken, mode);
    if (!inner) return inner.error();
    sink::batch_result out;
    std::size_t next = 0;
    for (const auto& r : rows) {
      if (r.body.find(marker_) != std::string::npos) {
        out.outcomes.push_back(sink::row_outcome::refused);
        out.reasons.push_back("refused: " + marker_);
      } else {
        out.outcomes.push_back(inner->outcomes[next]);
        out.reasons.push_back(inner->reasons[next]);
        ++next;
      }
    }
    return out;
  }

 private:
  std::unique_ptr<sink::target> inner_;
  std::string marker_;
};

/// Runs `s.step()` on another thread while moving `clock` forward in small steps, so that
/// waits on the clock (a batch filling, an idle fetch) end; returns what the step did.
inline sink::step_result step_with(sink::sink& s, manual_clock& clock) {
  auto done = std::async(std::launch::async, [&] { return s.step(); });
  while (done.wait_for(std::chrono::milliseconds(1)) != std::future_status::ready) {
    clock.advance(std::chrono::milliseconds(10));
  }
  return done.get();
}

}  // namespace amp::testing

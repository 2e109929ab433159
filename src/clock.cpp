#include "amp/clock.hpp"

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace amp {
namespace {

// Timers ordered by (deadline, id) so that equal deadlines run in the order they were set.
class timer_queue {
 public:
  timer_id add(time_point at, std::function<void()> fn) {
    timer_id id = ++last_id_;
    auto it = by_time_.emplace(std::make_pair(at, id), std::move(fn)).first;
    by_id_.emplace(id, it);
    return id;
  }
  bool cancel(timer_id id) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return false;
    by_time_.erase(it->second);
    by_id_.erase(it);
    return true;
  }
  bool empty() const { return by_time_.empty(); }
  std::size_t size() const { return by_time_.size(); }
  time_point next() const { return by_time_.begin()->first.first; }
  // Removes and returns the earliest timer.
  std::function<void()> pop() {
    auto it = by_time_.begin();
    auto fn = std::move(it->second);
    by_id_.erase(it->first.second);
    by_time_.erase(it);
    return fn;
  }

 private:
  using key = std::pair<time_point, timer_id>;
  std::map<key, std::function<void()>> by_time_;
  std::unordered_map<timer_id, std::map<key, std::function<void()>>::iterator> by_id_;
  timer_id last_id_ = 0;
};

}  // namespace

struct system_clock_source::impl {
  // The idle thread wakes at least this often, so that a timer set far ahead does not
  // need to wake it (most timers are timeouts that are cancelled long before they fire).
  static constexpr auto idle_wait = std::chrono::seconds(1);

  std::mutex mu;
  std::condition_variable cv;
  timer_queue timers;
  bool stopping = false;
  std::thread thread;
  time_point sleeping_until = time_point::min();  // when the thread wakes on its own

  void run() {
    std::unique_lock lock(mu);
    while (!stopping) {
      auto now = std::chrono::system_clock::now();
      if (timers.empty() || now < timers.next()) {
        sleeping_until =
            timers.empty() ? now + idle_wait : std::min(timers.next(), now + idle_wait);
        cv.wait_until(lock, sleeping_until);
        sleeping_until = time_point::min();
        continue;
      }
      auto fn = timers.pop();
      lock.unlock();
      fn();
      lock.lock();
    }
  }
};

system_clock_source::system_clock_source() : impl_(std::make_unique<impl>()) {}

system_clock_source::~system_clock_source() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

time_point system_clock_source::now() const noexcept {
  return std::chrono::system_clock::now();
}

timer_id system_clock_source::call_at(time_point at, std::function<void()> fn) {
  std::lock_guard lock(impl_->mu);
  if (!impl_->thread.joinable()) impl_->thread = std::thread([i = impl_.get()] { i->run(); });
  auto id = impl_->timers.add(at, std::move(fn));
  if (at < impl_->sleeping_until) impl_->cv.notify_all();
  return id;
}

bool system_clock_source::cancel(timer_id id) noexcept {
  std::lock_guard lock(impl_->mu);
  return impl_->timers.cancel(id);
}

std::shared_ptr<clock> system_clock_source::shared() {
  static const std::shared_ptr<clock> instance = std::make_shared<system_clock_source>();
  return instance;
}

struct manual_clock::impl {
  mutable std::mutex mu;
  std::mutex advancing;  // one advance at a time, so timers run in deadline order
  time_point now;
  timer_queue timers;
};

manual_clock::manual_clock(time_point start) : impl_(std::make_unique<impl>()) {
  impl_->now = start;
}

manual_clock::~manual_clock() = default;

time_point manual_clock::default_start() {
  using namespace std::chrono;
  return sys_days{year{2026} / January / 1};
}

time_point manual_clock::now() const noexcept {
  std::lock_guard lock(impl_->mu);
  return impl_->now;
}

timer_id manual_clock::call_at(time_point at, std::function<void()> fn) {
  std::lock_guard lock(impl_->mu);
  return impl_->timers.add(at, std::move(fn));
}

bool manual_clock::cancel(timer_id id) noexcept {
  std::lock_guard lock(impl_->mu);
  return impl_->timers.cancel(id);
}

void manual_clock::advance(duration d) {
  if (d < duration::zero()) return;
  set(now() + d);
}

void manual_clock::set(time_point target) {
  std::lock_guard advancing(impl_->advancing);
  std::unique_lock lock(impl_->mu);
  if (target < impl_->now) return;
  while (!impl_->timers.empty() && impl_->timers.next() <= target) {
    if (impl_->timers.next() > impl_->now) impl_->now = impl_->timers.next();
    auto fn = impl_->timers.pop();
    lock.unlock();
    fn();
    lock.lock();
  }
  impl_->now = target;
}

std::size_t manual_clock::pending_timers() const {
  std::lock_guard lock(impl_->mu);
  return impl_->timers.size();
}

}  // namespace amp

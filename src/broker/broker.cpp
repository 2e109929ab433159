#include "amp/broker/broker.hpp"

#include <string>

namespace amp {

broker::broker(std::shared_ptr<transport> t, broker_config config)
    : transport_(std::move(t)), config_(std::move(config)) {}

result<std::shared_ptr<broker>> broker::open(std::shared_ptr<transport> t, broker_config config,
                                             job_events events, operation_events ops) {
  auto b = std::make_shared<broker>(t, config);
  auto tasks = task_store::open(t, config);
  if (!tasks) return tasks.error();
  b->tasks_ = *tasks;
  auto in = inbox::open(t, config);
  if (!in) return in.error();
  b->inbox_ = *in;
  auto tp = topics::open(t, config);
  if (!tp) return tp.error();
  b->topics_ = *tp;
  auto reg = registry::open(t, config);
  if (!reg) return reg.error();
  b->registry_ = *reg;
  if (!events.notify && !events.async_notify) {
    std::weak_ptr<amp::inbox> weak = b->inbox_;
    events.async_notify = [weak](const task_notice& n, std::function<void(result<void>)> done) {
      auto box = weak.lock();
      if (!box) return done(unexpected(errc::unavailable, "broker closed"));
      box->async_send({.to = n.to,
                       .from = std::string(broker_sender),
                       .body = n.body,
                       .type = n.type,
                       .msg_id = n.msg_id},
                      [done = std::move(done)](result<send_result> sent) {
                        if (!sent) return done(std::move(sent).error());
                        done(result<void>{});
                      });
    };
  }
  auto jobs = job_queue::open(t, config, b->tasks_, std::move(events));
  if (!jobs) return jobs.error();
  b->jobs_ = *jobs;
  auto operations = operations::open(t, config, b->tasks_, b->inbox_, std::move(ops));
  if (!operations) return operations.error();
  b->operations_ = *operations;
  return b;
}

}  // namespace amp

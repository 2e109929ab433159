#include "transport/nats_loop.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <stdexcept>
#include <utility>

namespace amp::detail {

namespace {

// The flush scopes of this thread: how deep, and the loop whose buffer this thread must send.
thread_local int scope_depth = 0;
thread_local std::shared_ptr<nats_loop> owed;
thread_local bool deferred = false;
// Set on a loop's own thread.
thread_local nats_loop* running_loop = nullptr;

}  // namespace

nats_loop::nats_loop() {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::runtime_error("eventfd failed");
  thread_ = std::thread([this] { run(); });
}

nats_loop::~nats_loop() {
  stop();
  ::close(wake_fd_);
}

natsStatus nats_loop::use_in(natsOptions* opts) {
  return natsOptions_SetEventLoop(opts, this, &nats_loop::on_attach, &nats_loop::on_read,
                                  &nats_loop::on_write, &nats_loop::on_detach);
}

void nats_loop::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake();
  if (thread_.joinable()) thread_.join();
  std::lock_guard flushing(flush_mu_);  // a caller writing now is done; later ones see stopping_
}

void nats_loop::wake() {
  if (running_loop == this) return;  // the loop looks at its state before it polls again
  if (wake_pending_.exchange(true)) return;
  std::uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof one);
}

natsStatus nats_loop::on_attach(void** user, void* loop, natsConnection* nc, natsSock sock) {
  auto* self = static_cast<nats_loop*>(loop);
  *user = self;
  {
    std::lock_guard lock(self->mu_);
    self->nc_ = nc;
    self->fd_ = sock;
    self->fd_gone_ = false;
    self->want_read_ = true;
  }
  self->wake();
  return NATS_OK;
}

natsStatus nats_loop::on_read(void* user, bool add) {
  auto* self = static_cast<nats_loop*>(user);
  {
    std::lock_guard lock(self->mu_);
    self->want_read_ = add;
  }
  self->wake();
  return NATS_OK;
}

// Called with the connection's lock held (cnats buffered a write, or finished one).
natsStatus nats_loop::on_write(void* user, bool add) {
  auto* self = static_cast<nats_loop*>(user);
  self->write_added_.store(add);
  if (!add) return NATS_OK;
  if (scope_depth > 0 && (owed == nullptr || owed.get() == self)) {
    if (!owed) owed = self->shared_from_this();  // this thread sends it when its scope ends
  } else {
    self->wake();
  }
  return NATS_OK;
}

natsStatus nats_loop::on_detach(void* user) {
  auto* self = static_cast<nats_loop*>(user);
  {
    std::lock_guard lock(self->mu_);
    self->fd_ = k_no_socket;
    self->want_read_ = false;
  }
  self->wake();
  return NATS_OK;
}

nats_loop::flush_scope::flush_scope() {
  ++scope_depth;
}

nats_loop::flush_scope::~flush_scope() {
  if (--scope_depth > 0) return;
  if (std::exchange(deferred, false)) return;
  if (auto loop = std::exchange(owed, nullptr)) loop->write_now();
}

void nats_loop::defer_flush() {
  if (scope_depth > 0) deferred = true;
}

// cnats takes a write of nothing for a closed connection: the buffer is written only by a
// holder of flush_mu_, and only while cnats has said it holds something (write_added_).
void nats_loop::write_now() {
  {
    std::lock_guard flushing(flush_mu_);
    natsConnection* nc = nullptr;
    {
      std::lock_guard lock(mu_);
      if (stopping_ || fd_ == k_no_socket || fd_gone_)
        nc = nullptr;
      else
        nc = nc_;
    }
    if (nc && write_added_.load()) natsConnection_ProcessWriteEvent(nc);
  }
  // A full socket took only part of it: the loop waits until it can take the rest.
  if (write_added_.load()) wake();
}

void nats_loop::run() {
  running_loop = this;
  while (true) {
    natsConnection* nc = nullptr;
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {k_no_socket, 0, 0}};
    {
      std::lock_guard lock(mu_);
      if (stopping_) break;
      nc = nc_;
      if (fd_ != k_no_socket && !fd_gone_) {
        fds[1].fd = fd_;
        fds[1].events =
            static_cast<short>((want_read_ ? POLLIN : 0) | (write_added_.load() ? POLLOUT : 0));
      }
    }
    int nfds = fds[1].fd != k_no_socket && fds[1].events != 0 ? 2 : 1;
    int n = ::poll(fds, static_cast<nfds_t>(nfds), -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents & POLLIN) {
      // Drained before the flag is cleared: a wake after this read writes the eventfd again.
      std::uint64_t count = 0;
      [[maybe_unused]] auto r = ::read(wake_fd_, &count, sizeof count);
      wake_pending_.store(false);
    }
    if (nfds < 2 || nc == nullptr) continue;
    auto ev = fds[1].revents;
    // A socket at its end (or closed by cnats before it told us) stays ready for ever: once
    // cnats has seen it go, it is not polled again until cnats attaches the next one.
    auto forget_socket = [&] {
      std::lock_guard lock(mu_);
      if (fd_ == fds[1].fd) fd_gone_ = true;
    };
    if (ev & POLLNVAL) {
      forget_socket();
      continue;
    }
    if (ev & (POLLIN | POLLERR | POLLHUP)) {
      natsConnection_ProcessReadEvent(nc);
      if ((ev & (POLLERR | POLLHUP)) && natsConnection_Status(nc) != NATS_CONN_STATUS_CONNECTED) {
        forget_socket();
        continue;
      }
    }
    if (ev & POLLOUT) {
      std::lock_guard flushing(flush_mu_);
      if (write_added_.load()) natsConnection_ProcessWriteEvent(nc);
    }
  }
  running_loop = nullptr;
}

}  // namespace amp::detail

#include "transport/jetstream/socket_loop.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <system_error>

namespace amp::jetstream_detail {

namespace {
thread_local bool t_publishing = false;
}

socket_loop::socket_loop() {
  event_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
  try {
    thread_ = std::thread([this] { run(); });
  } catch (...) {
    ::close(event_fd_);
    throw;
  }
}

socket_loop::~socket_loop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake();
  thread_.join();
  ::close(event_fd_);
}

natsStatus socket_loop::install(natsOptions* opts) {
  return natsOptions_SetEventLoop(opts, this, &socket_loop::on_attach, &socket_loop::on_read,
                                  &socket_loop::on_write, &socket_loop::on_detach);
}

void socket_loop::publishing(bool on) noexcept {
  t_publishing = on;
}

bool socket_loop::write_buffered(natsConnection* nc) {
  std::lock_guard lock(write_mu_);
  if (natsConnection_Buffered(nc) <= 0) return false;
  const auto before = writes_done_.load(std::memory_order_relaxed);
  natsConnection_ProcessWriteEvent(nc);
  return writes_done_.load(std::memory_order_relaxed) == before;
}

bool socket_loop::write_from_loop(natsConnection* nc, int fd) {
  write_buffered(nc);
  std::lock_guard lock(mu_);
  return must_write_ && want_write_ && fd_ == fd;
}

void socket_loop::write(natsConnection* nc) {
  if (!write_buffered(nc)) return;
  {
    std::lock_guard lock(mu_);
    if (!want_write_ || must_write_) return;
    must_write_ = true;
  }
  wake();
}

void socket_loop::wake() {
  if (on_loop_thread()) return;
  std::uint64_t one = 1;
  // Fails only when the counter is about to overflow: the loop is being woken anyway.
  [[maybe_unused]] auto n = ::write(event_fd_, &one, sizeof one);
}

natsStatus socket_loop::on_attach(void** user, void* loop, natsConnection* nc, natsSock fd) {
  auto* self = static_cast<socket_loop*>(loop);
  {
    std::lock_guard lock(self->mu_);
    self->nc_ = nc;
    self->fd_ = fd;
    self->want_read_ = true;
    self->want_write_ = self->must_write_ = false;
  }
  *user = self;
  self->wake();
  return NATS_OK;
}

natsStatus socket_loop::on_read(void* user, bool add) {
  auto* self = static_cast<socket_loop*>(user);
  {
    std::lock_guard lock(self->mu_);
    self->want_read_ = add;
  }
  self->wake();
  return NATS_OK;
}

natsStatus socket_loop::on_write(void* user, bool add) {
  auto* self = static_cast<socket_loop*>(user);
  bool wake = false;
  {
    std::lock_guard lock(self->mu_);
    self->want_write_ = add;
    if (!add) {
      self->writes_done_.fetch_add(1, std::memory_order_relaxed);
      self->must_write_ = false;
    } else if (!t_publishing) {
      self->must_write_ = wake = true;
    }
  }
  if (wake) self->wake();
  return NATS_OK;
}

natsStatus socket_loop::on_detach(void* user) {
  auto* self = static_cast<socket_loop*>(user);
  {
    std::lock_guard lock(self->mu_);
    self->nc_ = nullptr;
    self->fd_ = -1;
    self->want_read_ = self->want_write_ = self->must_write_ = false;
  }
  self->wake();
  return NATS_OK;
}

void socket_loop::run() {
  bool partial = false;  // the last write left bytes behind: wait until the socket takes more
  for (;;) {
    natsConnection* nc = nullptr;
    int fd = -1;
    bool read = false;
    bool write = false;
    {
      std::lock_guard lock(mu_);
      if (stop_) return;
      nc = nc_;
      fd = fd_;
      read = want_read_;
      write = must_write_ && want_write_;
    }
    if (nc == nullptr) fd = -1;
    if (!write) partial = false;
    if (write && fd >= 0 && !partial) partial = write_from_loop(nc, fd);
    pollfd fds[2] = {{event_fd_, POLLIN, 0}, {fd, 0, 0}};
    if (fd >= 0) fds[1].events = static_cast<short>((read ? POLLIN : 0) | (partial ? POLLOUT : 0));
    const nfds_t count = fd >= 0 && fds[1].events != 0 ? 2 : 1;
    if (::poll(fds, count, -1) < 0) continue;  // EINTR
    if (fds[0].revents & POLLIN) {
      std::uint64_t n = 0;
      [[maybe_unused]] auto r = ::read(event_fd_, &n, sizeof n);
    }
    if (count < 2) continue;
    const short ev = fds[1].revents;
    if (ev & POLLNVAL) {
      // Closed under us without a detach: wait for cnats to attach a new socket.
      std::lock_guard lock(mu_);
      if (fd_ == fd) want_read_ = want_write_ = must_write_ = false;
      continue;
    }
    // On an error or a hang-up the read finds out, and cnats reconnects or closes.
    if (ev & (POLLIN | POLLERR | POLLHUP)) natsConnection_ProcessReadEvent(nc);
    if (ev & POLLOUT) partial = write_from_loop(nc, fd);
  }
}

}  // namespace amp::jetstream_detail

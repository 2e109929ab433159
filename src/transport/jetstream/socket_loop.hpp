#pragma once

// The thread that reads one cnats connection's socket, through cnats's external event loop
// interface (natsOptions_SetEventLoop). Internal to the transport.
//
// Why: with cnats's own threads every publish is written with its own `sendto` on the
// publishing thread (SendAsap), or left to a flusher thread that waits a millisecond before
// each write. With an event loop a publish only appends to cnats's buffer and asks for a
// write; the connection writes on the publishing thread right after the publish, or, when
// that thread has a write batch open (detail::write_batch), when the batch ends: what one
// frame or a queue of answers publishes goes out in one write, and nats-server reads it in
// one read. This thread reads, writes what cnats itself asks to write (pongs, the
// protocol of subscriptions), and finishes writes the socket did not take at once.

#include <nats/nats.h>

#include <atomic>
#include <mutex>
#include <thread>

namespace amp::jetstream_detail {

class socket_loop {
 public:
  // Starts the thread. Throws std::system_error when no eventfd or thread can be made.
  socket_loop();
  // Stops and joins the thread. The connection must be closed first (detached), and this
  // must not run on the loop's own thread.
  ~socket_loop();
  socket_loop(const socket_loop&) = delete;
  socket_loop& operator=(const socket_loop&) = delete;

  // Makes connections created with `opts` use this loop (one connection per loop).
  natsStatus install(natsOptions* opts);

  // Around a publish whose caller writes (or defers) itself: cnats's request to write is
  // then not this thread's to serve.
  static void publishing(bool on) noexcept;

  // Writes what cnats has buffered for `nc` (this loop's connection), if anything; when the
  // socket does not take it all, this thread writes the rest when it can. Any thread.
  void write(natsConnection* nc);

 private:
  // cnats's callbacks: attach (connected or reconnected: poll `fd` for reading), read and
  // write (start or stop polling for that), detach (closed). They may come from any thread,
  // cnats's connection lock held; they only change what the loop polls and wake it.
  static natsStatus on_attach(void** user, void* loop, natsConnection* nc, natsSock fd);
  static natsStatus on_read(void* user, bool add);
  static natsStatus on_write(void* user, bool add);
  static natsStatus on_detach(void* user);

  bool on_loop_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  void wake();
  void run();
  // cnats takes a write of nothing for a closed connection: every write goes through here,
  // one at a time, and only when something is buffered. True when bytes are left that the
  // socket did not take (or the socket is not attached).
  bool write_buffered(natsConnection* nc);
  // The loop's own write: true when it must wait until the socket takes more.
  bool write_from_loop(natsConnection* nc, int fd);

  std::mutex write_mu_;  // taken before cnats's connection lock, never while holding it
  std::atomic<unsigned> writes_done_{0};  // cnats said all is written (its write "remove")
  std::mutex mu_;
  natsConnection* nc_ = nullptr;
  int fd_ = -1;
  bool want_read_ = false;
  bool want_write_ = false;  // cnats has bytes to write
  bool must_write_ = false;  // and nobody else writes them: this thread does
  bool stop_ = false;
  int event_fd_ = -1;
  std::thread thread_;
};

}  // namespace amp::jetstream_detail

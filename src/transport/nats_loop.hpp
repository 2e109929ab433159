#pragma once

// The socket of one cnats connection, driven through cnats's external event loop API
// instead of cnats's reader thread and SendAsap writes.
//
// Why: with SendAsap every publish is a send(2) of its own, so the requests that a burst of
// replies causes cost one system call each here and one read each in nats-server. Here a
// publish made inside a `flush_scope` only buffers, and the thread sends the buffer in one
// write when its outermost scope ends; on the thread that delivers replies, `defer_flush`
// holds that write until no more replies are queued, so a burst's requests go out together.
// A single request still goes out at once, from the thread that made it. Writes cnats makes
// outside any scope (PINGs, SUB and UNSUB, what it sends after a reconnect) and what a full
// socket left over are written by the loop thread, which also reads and parses, as cnats's
// reader did (cnats hands the messages to the subscriptions' threads).
//
// cnats takes a write of nothing for a closed connection and reconnects (the transport
// conformance suite lost requests that way): the buffer is written only under flush_mu_ and
// only while cnats has said it holds something.
//
// A scope must not contain a wait for an answer to what it published: the request would
// not go out before the scope ends.
//
// Threads. The event callbacks are called by cnats on any thread, `on_write` with the
// connection's lock held: they only record and wake. `stop` ends the loop thread and waits
// for a caller that is writing (call it after natsConnection_Close and before
// natsConnection_Destroy, never on the loop thread); nothing is written after it returns.

#include <nats/nats.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>

namespace amp::detail {

inline constexpr natsSock k_no_socket = -1;

class nats_loop : public std::enable_shared_from_this<nats_loop> {
 public:
  // Create it through std::make_shared.
  nats_loop();
  ~nats_loop();
  nats_loop(const nats_loop&) = delete;
  nats_loop& operator=(const nats_loop&) = delete;

  // Makes `opts` use this loop. The loop thread runs from construction.
  natsStatus use_in(natsOptions* opts);
  // Ends the loop thread; no ProcessRead/WriteEvent happens after it returns. Idempotent.
  void stop();

  // While one is alive on a thread, what that thread publishes is buffered; the outermost
  // scope sends it in one write when it ends.
  class flush_scope {
   public:
    flush_scope();
    ~flush_scope();
    flush_scope(const flush_scope&) = delete;
    flush_scope& operator=(const flush_scope&) = delete;
  };
  // Inside a scope: do not write when this scope ends; the next scope that ends on this
  // thread does. For a thread that knows more work follows at once (cnats's delivery thread
  // with more replies queued).
  static void defer_flush();

 private:
  static natsStatus on_attach(void** user, void* loop, natsConnection* nc, natsSock sock);
  static natsStatus on_read(void* user, bool add);
  static natsStatus on_write(void* user, bool add);
  static natsStatus on_detach(void* user);
  void run();
  void wake();
  void write_now();

  std::mutex mu_;
  std::mutex flush_mu_;  // held by whoever writes the buffer (ProcessWriteEvent)
  natsConnection* nc_ = nullptr;
  natsSock fd_ = k_no_socket;
  bool fd_gone_ = false;  // fd_ reported its end: not polled until the next attach
  bool want_read_ = false;
  bool stopping_ = false;
  std::atomic<bool> write_added_{false};
  std::atomic<bool> wake_pending_{false};
  int wake_fd_ = -1;
  std::thread thread_;
};

}  // namespace amp::detail

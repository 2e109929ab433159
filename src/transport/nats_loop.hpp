#pragma once

// The socket of one cnats connection, driven by a thread of ours through cnats's external
// event loop API instead of cnats's reader thread and SendAsap writes.
//
// Why: with SendAsap every publish is a send(2) of its own, made by the publishing thread
// under the connection's lock, so a burst of 100 requests costs 100 system calls here and
// 100 reads in nats-server. Here a publish only buffers, and the loop thread sends what is
// buffered in one write. The loop is woken when a write is first buffered, or, for a
// publish made inside a `flush_scope`, when the thread's outermost scope ends; on the thread
// that delivers replies, `defer_flush` holds the wake until no more replies are queued, so
// the requests a burst of replies causes go out together. Reading works as cnats's reader
// did: the loop thread reads and parses, and cnats hands the messages to the subscriptions'
// threads. (cnats's ProcessWriteEvent is called on the loop thread only: called from other
// threads beside the loop's reads it lost writes, in the transport conformance suite.)
//
// A scope must not contain a wait for an answer to what it published: the request would
// not go out before the scope ends.
//
// Threads. The event callbacks are called by cnats on any thread, `on_write` with the
// connection's lock held: they only record and wake. Only the loop thread calls
// natsConnection_ProcessReadEvent/ProcessWriteEvent; `stop` ends it (call it after
// natsConnection_Close and before natsConnection_Destroy, never on the loop thread).

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

  // While one is alive on a thread, the loop is not woken for what that thread publishes
  // until the outermost scope ends.
  class flush_scope {
   public:
    flush_scope();
    ~flush_scope();
    flush_scope(const flush_scope&) = delete;
    flush_scope& operator=(const flush_scope&) = delete;
  };
  // Inside a scope: do not wake the loop when this scope ends; the next scope that ends on
  // this thread does. For a thread that knows more work follows at once (cnats's delivery
  // thread with more replies queued).
  static void defer_flush();

 private:
  static natsStatus on_attach(void** user, void* loop, natsConnection* nc, natsSock sock);
  static natsStatus on_read(void* user, bool add);
  static natsStatus on_write(void* user, bool add);
  static natsStatus on_detach(void* user);
  void run();
  void wake();

  std::mutex mu_;
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

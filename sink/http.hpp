#pragma once

// The HTTP side of amp-sink: GET /healthz, /readyz and /metrics on one address, served by
// one thread of its own. Plain HTTP/1.1, one request per connection.

#include <functional>
#include <memory>
#include <string>

#include "amp/result.hpp"

namespace amp::sink_program {

/// What a request is answered with: the status and the body (text/plain).
struct http_answer {
  int status = 200;
  std::string body;
  std::string content_type = "text/plain; charset=utf-8";
};

class http_server {
 public:
  /// Listens on `address` ("host:port", IPv6 as "[::1]:9090") and answers each GET with
  /// `handle(path)` (called on the server's thread). Errors: `bad_request` for an address
  /// that is not host:port; `unavailable` when it cannot listen (taken, not local).
  static result<std::unique_ptr<http_server>> start(
      const std::string& address, std::function<http_answer(const std::string& path)> handle);
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  /// The port listened on (for port 0).
  unsigned short port() const;

 private:
  struct impl;
  explicit http_server(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace amp::sink_program

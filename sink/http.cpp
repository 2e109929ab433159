#include "http.hpp"

#include <fmt/format.h>
#include <asio.hpp>

#include <thread>
#include <utility>

namespace amp::sink_program {
namespace {

constexpr std::size_t k_max_request = 8192;

const char* reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 400: return "Bad Request";
    default: return "Service Unavailable";
  }
}

class connection : public std::enable_shared_from_this<connection> {
 public:
  connection(asio::ip::tcp::socket s, const std::function<http_answer(const std::string&)>& h)
      : socket_(std::move(s)), handle_(h) {}

  void start() {
    asio::async_read_until(
        socket_, asio::dynamic_buffer(request_, k_max_request), "\r\n\r\n",
        [self = shared_from_this()](std::error_code ec, std::size_t) { self->answer(ec); });
  }

 private:
  void answer(std::error_code ec) {
    http_answer a;
    if (ec) {
      if (ec != asio::error::not_found) return;  // gone before a whole request
      a = {.status = 400, .body = "request too large\n"};
    } else {
      const auto line_end = request_.find("\r\n");
      const std::string line = request_.substr(0, line_end);
      const auto sp1 = line.find(' ');
      const auto sp2 = line.find(' ', sp1 == std::string::npos ? 0 : sp1 + 1);
      if (sp1 == std::string::npos || sp2 == std::string::npos) {
        a = {.status = 400, .body = "bad request\n"};
      } else if (line.substr(0, sp1) != "GET" && line.substr(0, sp1) != "HEAD") {
        a = {.status = 405, .body = "only GET\n"};
      } else {
        auto path = line.substr(sp1 + 1, sp2 - sp1 - 1);
        if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
        a = handle_(path);
      }
    }
    response_ = fmt::format(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
        a.status, reason(a.status), a.content_type, a.body.size(), a.body);
    asio::async_write(socket_, asio::buffer(response_),
                      [self = shared_from_this()](std::error_code, std::size_t) {
                        std::error_code ignored;
                        self->socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
                      });
  }

  asio::ip::tcp::socket socket_;
  const std::function<http_answer(const std::string&)>& handle_;
  std::string request_;
  std::string response_;
};

}  // namespace

struct http_server::impl {
  asio::io_context io{1};
  asio::ip::tcp::acceptor acceptor{io};
  std::function<http_answer(const std::string&)> handle;
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](std::error_code ec, asio::ip::tcp::socket s) {
      if (!acceptor.is_open()) return;
      if (!ec) std::make_shared<connection>(std::move(s), handle)->start();
      accept();
    });
  }
};

result<std::unique_ptr<http_server>> http_server::start(
    const std::string& address, std::function<http_answer(const std::string&)> handle) {
  const auto colon = address.rfind(':');
  std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  const std::string port_text = colon == std::string::npos ? "" : address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  unsigned long port = 0;
  try {
    std::size_t used = 0;
    port = std::stoul(port_text, &used);
    if (used != port_text.size() || port > 65535) throw std::out_of_range("port");
  } catch (const std::exception&) {
    return unexpected(errc::bad_request,
                      fmt::format("http: must be \"host:port\", not \"{}\"", address));
  }
  std::error_code ec;
  const auto ip = asio::ip::make_address(host, ec);
  if (ec) {
    return unexpected(errc::bad_request,
                      fmt::format("http: \"{}\" is not an IP address (in \"{}\")", host, address));
  }
  auto p = std::make_unique<impl>();
  p->handle = std::move(handle);
  const asio::ip::tcp::endpoint endpoint(ip, static_cast<unsigned short>(port));
  p->acceptor.open(endpoint.protocol(), ec);
  if (!ec) p->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) p->acceptor.bind(endpoint, ec);
  if (!ec) p->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    return unexpected(errc::unavailable,
                      fmt::format("http: cannot listen on {}: {}", address, ec.message()));
  }
  p->accept();
  p->thread = std::thread([raw = p.get()] { raw->io.run(); });
  return std::unique_ptr<http_server>(new http_server(std::move(p)));
}

http_server::http_server(std::unique_ptr<impl> p) : impl_(std::move(p)) {}

http_server::~http_server() {
  asio::post(impl_->io, [p = impl_.get()] {
    std::error_code ignored;
    p->acceptor.close(ignored);
    p->io.stop();
  });
  impl_->thread.join();
}

unsigned short http_server::port() const {
  return impl_->acceptor.local_endpoint().port();
}

}  // namespace amp::sink_program

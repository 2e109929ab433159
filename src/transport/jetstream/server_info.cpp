#include "transport/jetstream/server_info.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <simdjson.h>

#include <charconv>
#include <chrono>
#include <vector>

namespace amp::jetstream_detail {

namespace {

// The numbers of a dotted version, up to a `-`; nothing when it is not one.
std::optional<std::vector<int>> version_numbers(std::string_view v) {
  if (auto dash = v.find('-'); dash != std::string_view::npos) v = v.substr(0, dash);
  std::vector<int> out;
  while (!v.empty()) {
    auto dot = v.find('.');
    auto part = v.substr(0, dot);
    int n = 0;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), n);
    if (ec != std::errc() || end != part.data() + part.size() || part.empty()) return std::nullopt;
    out.push_back(n);
    if (dot == std::string_view::npos) break;
    v.remove_prefix(dot + 1);
    if (v.empty()) return std::nullopt;
  }
  if (out.empty()) return std::nullopt;
  return out;
}

// "host" and "port" of a NATS URL; nothing when it has none.
std::optional<std::pair<std::string, std::string>> host_and_port(std::string_view url) {
  if (auto scheme = url.find("://"); scheme != std::string_view::npos)
    url.remove_prefix(scheme + 3);
  if (auto at = url.rfind('@'); at != std::string_view::npos) url.remove_prefix(at + 1);
  if (auto slash = url.find('/'); slash != std::string_view::npos) url = url.substr(0, slash);
  std::string_view host, port = "4222";
  if (!url.empty() && url.front() == '[') {
    auto close = url.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = url.substr(1, close - 1);
    if (close + 1 < url.size() && url[close + 1] == ':') port = url.substr(close + 2);
  } else {
    auto colon = url.rfind(':');
    host = url.substr(0, colon);
    if (colon != std::string_view::npos) port = url.substr(colon + 1);
  }
  if (host.empty() || port.empty()) return std::nullopt;
  return std::pair{std::string(host), std::string(port)};
}

}  // namespace

std::optional<server_info> parse_server_info(std::string_view line) {
  constexpr std::string_view k_info = "INFO ";
  if (!line.starts_with(k_info)) return std::nullopt;
  line.remove_prefix(k_info.size());
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  simdjson::dom::parser parser;
  simdjson::dom::object o;
  if (parser.parse(line.data(), line.size()).get(o) != simdjson::SUCCESS) return std::nullopt;
  server_info info;
  std::string_view s;
  if (o["version"].get(s) != simdjson::SUCCESS) return std::nullopt;
  info.version = std::string(s);
  simdjson::dom::array urls;
  info.clustered = (o["cluster"].get(s) == simdjson::SUCCESS && !s.empty()) ||
                   (o["connect_urls"].get(urls) == simdjson::SUCCESS && urls.size() > 0);
  return info;
}

std::optional<server_info> read_server_info(std::string_view url, duration timeout) {
  auto hp = host_and_port(url);
  if (!hp) return std::nullopt;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(hp->first.c_str(), hp->second.c_str(), &hints, &found) != 0 || !found) {
    return std::nullopt;
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(found, ::freeaddrinfo);
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* p) {
    ::close(*p);
    delete p;
  });
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto wait = [&](short events) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    pollfd p{.fd = fd, .events = events, .revents = 0};
    return left > 0 && ::poll(&p, 1, static_cast<int>(left)) == 1;
  };
  if (::connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
    if (errno != EINPROGRESS || !wait(POLLOUT)) return std::nullopt;
    int err = 0;
    socklen_t len = sizeof err;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) return std::nullopt;
  }
  std::string line;
  char buffer[4096];
  while (line.find('\n') == std::string::npos && line.size() < 65536) {
    if (!wait(POLLIN)) return std::nullopt;
    const auto n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      return std::nullopt;
    }
    line.append(buffer, static_cast<std::size_t>(n));
  }
  return parse_server_info(line.substr(0, line.find('\n')));
}

bool version_older_than(std::string_view version, std::string_view than) {
  auto a = version_numbers(version);
  auto b = version_numbers(than);
  if (!a || !b) return false;
  return *a < *b;
}

}  // namespace amp::jetstream_detail

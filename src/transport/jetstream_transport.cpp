#include "amp/transport/jetstream.hpp"

#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "transport/jetstream/backend.hpp"
#include "transport/jetstream/server_info.hpp"

namespace amp {

namespace {

// The first nats-server whose replicated KV compare-and-set is safe in a cluster.
constexpr std::string_view k_safe_cluster_version = "2.9.21";

}  // namespace

using jetstream_detail::callback_depth;
using jetstream_detail::connection;
using jetstream_detail::jetstream_backend;
using jetstream_detail::read_server_info;
using jetstream_detail::split;
using jetstream_detail::version_older_than;

bool valid_jetstream_domain(std::string_view domain) {
  return !domain.empty() && domain.size() <= 64 &&
         std::all_of(domain.begin(), domain.end(), [](char ch) {
           return std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_';
         });
}

std::string redact_nats_url(std::string_view url) {
  std::string out;
  bool first = true;
  for (auto u : split(url, ',')) {
    if (!std::exchange(first, false)) out += ',';
    const auto scheme = u.find("://");
    const auto start = scheme == std::string_view::npos ? 0 : scheme + 3;
    const auto end = u.find_first_of("/?#", start);
    const auto at = u.substr(0, end).rfind('@');
    if (at == std::string_view::npos || at < start) {
      out += u;
      continue;
    }
    const auto colon = u.substr(start, at - start).find(':');
    out += u.substr(0, colon == std::string_view::npos ? start : start + colon + 1);
    out += "***";
    out += u.substr(at);
  }
  return out;
}

result<std::shared_ptr<transport>> jetstream_transport::connect(jetstream_options options) {
  auto clock = options.clock ? options.clock : system_clock_source::shared();
  // The last reference may go away in a handler on a cnats thread, where closing the
  // connection would wait for that very thread: it is closed from another one then.
  auto sink = std::make_shared<const detail::handler_error_sink>(options.on_handler_error);
  auto conn = std::shared_ptr<connection>(new connection(clock, options.op_timeout, sink),
                                          [](connection* c) {
                                            if (callback_depth > 0) {
                                              std::thread([c] { delete c; }).detach();
                                            } else {
                                              delete c;
                                            }
                                          });
  if (auto r = conn->open(options); !r) return r.error();
  auto backend = std::make_shared<jetstream_backend>(conn);
  if (auto r = backend->ping(); !r) return r.error();
  if (auto r = backend->detect_capabilities(); !r) return r.error();
  if (options.on_notice) {
    auto info = read_server_info(conn->connected_url(), options.connect_timeout);
    if (info && info->clustered && version_older_than(info->version, k_safe_cluster_version)) {
      options.on_notice(fmt::format(
          "nats-server {} is in a cluster: before {}, compare-and-set on a replicated KV bucket "
          "(the task store and the registry) is not safe; run {} or later in production",
          info->version, k_safe_cluster_version, k_safe_cluster_version));
    }
  }
  return std::shared_ptr<transport>(backend);
}

}  // namespace amp

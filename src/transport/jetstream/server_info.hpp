#pragma once

// What a NATS server says of itself in the INFO line it sends first on every connection
// (in plain text, before any TLS): its version and whether it is part of a cluster.

#include <optional>
#include <string>
#include <string_view>

#include "amp/clock.hpp"

namespace amp::jetstream_detail {

struct server_info {
  std::string version;     // "2.9.10"
  bool clustered = false;  // it names a cluster, or other servers for clients to connect to
};

// Reads `INFO {…}` (one line, without its CRLF or with it). Nothing when it is not one.
std::optional<server_info> parse_server_info(std::string_view line);

// Connects to `url` (`nats://host:port`, `tls://…`; IPv6 in brackets), reads the INFO line
// and closes. Nothing when that cannot be done within `timeout`. Blocks.
std::optional<server_info> read_server_info(std::string_view url, duration timeout);

// Whether the dotted version `version` ("2.9.10", "2.10.0-beta.1") is older than `than`
// ("2.9.21"): compared number by number, what follows a `-` ignored. False when either is
// not a version.
bool version_older_than(std::string_view version, std::string_view than);

}  // namespace amp::jetstream_detail

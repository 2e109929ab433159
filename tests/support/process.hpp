#pragma once

// Child processes and files for tests that run programs (amp-server, amp-sink, postgres):
// temporary directories, fork+exec with the output in files, reaping with a limit, and a
// plain HTTP GET.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace amp::testing {

/// A temporary directory that goes away with the object.
class temp_dir {
 public:
  temp_dir();
  ~temp_dir();
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  /// Writes `text` to `name` in the directory and returns its path.
  std::filesystem::path write(const std::string& name, const std::string& text) const;

 private:
  std::filesystem::path path_;
};

/// The whole content of a file ("" when it cannot be read).
std::string read_file(const std::filesystem::path& path);

struct spawn_options {
  struct identity {
    uid_t uid;
    gid_t gid;
  };
  std::optional<identity> user{};  ///< run as this user (the test runs as root)
  std::filesystem::path cwd{};     ///< empty: the test's
};

/// fork + exec of `command` (the binary's path first) with stdin from /dev/null and stdout
/// and stderr into the files `out` and `err`; the child dies with the calling thread
/// (PR_SET_PDEATHSIG). Returns its pid. @throws std::runtime_error when fork fails.
pid_t spawn(const std::vector<std::string>& command, const std::filesystem::path& out,
            const std::filesystem::path& err, const spawn_options& options = {});

/// The exit status of `pid` once it exited (128 + signal for a signal), waiting at most
/// `limit`; nothing on timeout.
std::optional<int> reap(pid_t pid, std::chrono::milliseconds limit);

/// A plain HTTP/1.1 GET to 127.0.0.1:`port`, read until the server closes.
struct http_response {
  int status = 0;  ///< 0 when there was no answer
  std::string headers;
  std::string body;
};
http_response http_get(std::uint16_t port, const std::string& target);

}  // namespace amp::testing

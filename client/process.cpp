#include "process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

extern char** environ;

namespace amp::cli {
namespace {

/// A file descriptor closed on destruction.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) : fd_(fd) {}
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  unique_fd& operator=(unique_fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~unique_fd() { reset(); }
  int get() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// `fd` moved above the standard descriptors (when this process runs with one of them
/// closed, a pipe could land on 0..2 and the child's dup2 onto it would be a no-op that
/// keeps close-on-exec).
int above_stdio(int fd) {
  if (fd > STDERR_FILENO) return fd;
  const int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  ::close(fd);
  return moved;
}

/// A pipe whose ends are closed on exec, so that no other child inherits them.
bool make_pipe(unique_fd& read_end, unique_fd& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  read_end = unique_fd(above_stdio(fds[0]));
  write_end = unique_fd(above_stdio(fds[1]));
  return read_end.open() && write_end.open();
}

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void ignore_sigpipe() {
  static std::once_flag once;
  std::call_once(once, [] { ::signal(SIGPIPE, SIG_IGN); });
}

/// This process's environment with `extra` set over it, as NAME=VALUE strings.
std::vector<std::string> child_environment(
    const std::vector<std::pair<std::string, std::string>>& extra) {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    const auto name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [key, value] : extra) replaced = replaced || key == name;
    if (!replaced) out.emplace_back(entry);
  }
  for (const auto& [key, value] : extra) out.push_back(key + "=" + value);
  return out;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

struct spawn_setup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attributes;
  spawn_setup() {
    posix_spawn_file_actions_init(&actions);
    posix_spawnattr_init(&attributes);
  }
  ~spawn_setup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
  }
  spawn_setup(const spawn_setup&) = delete;
  spawn_setup& operator=(const spawn_setup&) = delete;
};

bool is_executable_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

void process_control::kill() {
  std::lock_guard lock(mutex_);
  killed_ = true;
  if (pid_ > 0) ::kill(pid_, SIGTERM);
}

bool process_control::killed() const {
  std::lock_guard lock(mutex_);
  return killed_;
}

process_outcome run_process(const process_spec& spec, process_control* control) {
  process_outcome outcome;
  if (spec.argv.empty()) {
    outcome.start_error = "no program";
    return outcome;
  }
  ignore_sigpipe();

  unique_fd in_read, in_write, out_read, out_write, err_read, err_write;
  if (!make_pipe(in_read, in_write) || !make_pipe(out_read, out_write) ||
      !make_pipe(err_read, err_write)) {
    outcome.start_error = std::string("cannot make pipes: ") + std::strerror(errno);
    return outcome;
  }

  spawn_setup setup;
  posix_spawn_file_actions_adddup2(&setup.actions, in_read.get(), STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&setup.actions, out_write.get(), STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&setup.actions, err_write.get(), STDERR_FILENO);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigset_t no_mask;
  sigemptyset(&no_mask);
  posix_spawnattr_setsigdefault(&setup.attributes, &defaults);
  posix_spawnattr_setsigmask(&setup.attributes, &no_mask);
  posix_spawnattr_setflags(&setup.attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);

  auto args = spec.argv;
  auto argv = c_strings(args);
  auto env = child_environment(spec.env);
  auto envp = c_strings(env);

  pid_t pid = 0;
  {
    std::unique_lock<std::mutex> lock;
    if (control != nullptr) {
      lock = std::unique_lock(control->mutex_);
      if (control->killed_) {
        outcome.killed = true;
        outcome.start_error = "stopped before it started";
        return outcome;
      }
    }
    const int rc =
        ::posix_spawnp(&pid, argv[0], &setup.actions, &setup.attributes, argv.data(), envp.data());
    if (rc != 0) {
      outcome.start_error = std::strerror(rc);
      return outcome;
    }
    if (control != nullptr) control->pid_ = pid;
  }
  outcome.started = true;
  in_read.reset();
  out_write.reset();
  err_write.reset();
  set_nonblocking(in_write.get());
  set_nonblocking(out_read.get());
  set_nonblocking(err_read.get());

  std::size_t written = 0;
  if (spec.input.empty()) in_write.reset();
  std::array<char, 65536> buffer;
  while (in_write.open() || out_read.open() || err_read.open()) {
    std::array<pollfd, 3> fds{};
    nfds_t n = 0;
    if (in_write.open()) fds[n++] = {in_write.get(), POLLOUT, 0};
    if (out_read.open()) fds[n++] = {out_read.get(), POLLIN, 0};
    if (err_read.open()) fds[n++] = {err_read.get(), POLLIN, 0};
    if (::poll(fds.data(), n, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (nfds_t i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == in_write.get()) {
        const auto chunk = std::min<std::size_t>(spec.input.size() - written, buffer.size());
        const auto w = ::write(in_write.get(), spec.input.data() + written, chunk);
        if (w > 0) written += static_cast<std::size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == spec.input.size()) {
          in_write.reset();  // done, or the child closed its stdin (EPIPE)
        }
        continue;
      }
      const bool is_out = fds[i].fd == out_read.get();
      const auto r = ::read(fds[i].fd, buffer.data(), buffer.size());
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (r <= 0) {
        (is_out ? out_read : err_read).reset();
        continue;
      }
      const std::string_view got(buffer.data(), static_cast<std::size_t>(r));
      if (is_out) {
        const auto room = spec.max_output - std::min(spec.max_output, outcome.output.size());
        outcome.output.append(got.substr(0, room));
        if (got.size() > room) outcome.output_truncated = true;
      } else {
        outcome.error_output.append(got);
        if (outcome.error_output.size() > 2 * spec.error_tail + buffer.size()) {
          outcome.error_output.erase(0, outcome.error_output.size() - spec.error_tail);
        }
      }
    }
  }
  if (outcome.error_output.size() > spec.error_tail) {
    outcome.error_output.erase(0, outcome.error_output.size() - spec.error_tail);
  }

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (control != nullptr) {
    std::lock_guard lock(control->mutex_);
    control->pid_ = 0;
    outcome.killed = control->killed_;
  }
  if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  return outcome;
}

std::optional<std::string> find_program(const std::string& program) {
  if (program.empty()) return std::nullopt;
  if (program.find('/') != std::string::npos) {
    if (is_executable_file(program)) return program;
    return std::nullopt;
  }
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const auto colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    if (colon == std::string_view::npos) break;
    dirs.remove_prefix(colon + 1);
  }
  return std::nullopt;
}

}  // namespace amp::cli

#pragma once

// Running a child process with its stdin, stdout and stderr on pipes: the commands of
// `amp work`, and the `amp` binary in the CLI tests. POSIX only.

#include <sys/types.h>

#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace amp::cli {

/// What to run.
struct process_spec {
  std::vector<std::string> argv;  ///< the program (looked up in PATH) and its arguments
  /// Variables set in the child's environment on top of this process's own.
  std::vector<std::pair<std::string, std::string>> env;
  std::string input;                               ///< written to the child's stdin, then closed
  std::size_t max_output = std::size_t{64} << 20;  ///< stdout beyond this is discarded
  std::size_t error_tail = 4096;                   ///< the last bytes of stderr kept
};

/// How it ended.
struct process_outcome {
  bool started = false;
  std::string start_error;  ///< why it did not start (e.g. "No such file or directory")
  int exit_code = -1;       ///< when it exited
  int signal = 0;           ///< when a signal ended it
  std::string output;       ///< stdout (up to max_output)
  bool output_truncated = false;
  std::string error_output;  ///< the end of stderr (up to error_tail bytes)
  bool killed = false;       ///< `process_control::kill` was called while it ran

  bool succeeded() const { return started && exit_code == 0; }
};

/// Lets another thread stop a running child: `kill` sends SIGTERM to it, now if it runs,
/// or as soon as it has started.
class process_control {
 public:
  void kill();
  bool killed() const;

 private:
  friend process_outcome run_process(const process_spec&, process_control*);
  mutable std::mutex mutex_;
  pid_t pid_ = 0;
  bool killed_ = false;
};

/// Runs `spec` to its end: writes the input, collects stdout and stderr, waits for it.
/// SIGPIPE is ignored in this process from the first call on (a child that does not read
/// all its input must not kill us); the child gets the default dispositions back.
/// Thread-safe: several may run at once, each child inheriting none of the others' pipes.
process_outcome run_process(const process_spec& spec, process_control* control = nullptr);

/// The path of `program` as the child would find it: itself when it holds a '/', else the
/// first executable file of that name in $PATH.
std::optional<std::string> find_program(const std::string& program);

}  // namespace amp::cli

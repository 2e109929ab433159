// The file target: one JSON file per message, `<dir>/<safe key>.json`, written to a
// temporary name, flushed and renamed; the directory is flushed once per batch.

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "amp/json.hpp"
#include "detail/simdjson_adapter.hpp"
#include "sink/targets.hpp"

namespace amp::sink::detail {
namespace {

namespace dom = simdjson::dom;

std::string errno_text(int e) {
  return std::generic_category().message(e);
}

class fd_guard {
 public:
  explicit fd_guard(int fd) : fd_(fd) {}
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

std::string file_text(const row& r, const std::string& committed_at) {
  json_writer w(r.body.size() + r.headers.size() + 256);
  w.begin_object();
  w.key("key").string(r.key);
  w.key("stream").string(r.stream);
  w.key("seq").integer(r.seq);
  w.key("subject").string(r.subject);
  w.key("topic");
  r.topic ? w.string(*r.topic) : w.null();
  w.key("msg_id").string(r.msg_id);
  w.key("sender").string(r.sender);
  w.key("type");
  r.type.empty() ? w.null() : w.string(r.type);
  w.key("ts").string(r.ts);
  w.key("body").raw(r.body);
  w.key("headers").raw(r.headers);
  w.key("committed_at").string(committed_at);
  w.end_object();
  std::string out = w.take();
  out.push_back('\n');
  return out;
}

class file_target final : public target {
 public:
  explicit file_target(target_config c) : config_(std::move(c)) {}

  std::string describe() const override { return "file " + config_.dir; }

  result<void> open() override {
    std::error_code ec;
    std::filesystem::create_directories(config_.dir, ec);
    if (ec) return away(fmt::format("{}: cannot create the folder: {}", describe(), ec.message()));
    const int fd = ::open(config_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return away(fmt::format("{}: {}", describe(), errno_text(errno)));
    dir_fd_ = std::make_unique<fd_guard>(fd);
    // What a crash left half written: never renamed, so never seen as stored.
    for (const auto& entry : std::filesystem::directory_iterator(config_.dir, ec)) {
      const auto name = entry.path().filename().string();
      if (name.starts_with(".") && name.ends_with(".tmp")) ::unlinkat(fd, name.c_str(), 0);
    }
    return {};
  }

  result<batch_result> write(std::span<const row> rows, duplicate_mode mode) override {
    if (!dir_fd_) {
      if (auto r = open(); !r) return r.error();
    }
    batch_result out;
    out.outcomes.reserve(rows.size());
    out.reasons.resize(rows.size());
    const auto committed_at = committed_now();
    bool changed = false;
    for (const auto& r : rows) {
      const auto name = safe_file_name(r.key) + ".json";
      auto existing = stored_origin(name);
      if (!existing) return failed(existing.error().message());
      row_outcome outcome = row_outcome::written;
      if (*existing) {
        if ((*existing)->first == r.stream && (*existing)->second == r.seq) {
          outcome = row_outcome::same;
        } else if (mode == duplicate_mode::skip) {
          outcome = row_outcome::skipped;
        } else if (mode == duplicate_mode::fail) {
          outcome = row_outcome::duplicate;
        } else {
          outcome = row_outcome::replaced;
        }
      }
      if (outcome == row_outcome::written || outcome == row_outcome::replaced) {
        if (auto w = put(name, file_text(r, committed_at)); !w) return failed(w.error().message());
        changed = true;
      }
      out.outcomes.push_back(outcome);
    }
    if (changed && ::fsync(dir_fd_->get()) != 0) {
      return failed(fmt::format("{}: flushing the folder: {}", describe(), errno_text(errno)));
    }
    return out;
  }

 private:
  // Every failure of the file system is taken as one that may pass (the disk full, the
  // folder gone or read-only, an I/O error): the folder is opened again next time.
  unexpected failed(std::string message) {
    dir_fd_.reset();
    return away(std::move(message));
  }

  // The stream and seq of the message stored as `name`; none when there is no such file.
  using origin = std::optional<std::pair<std::string, std::uint64_t>>;
  result<origin> stored_origin(const std::string& name) {
    const int fd = ::openat(dir_fd_->get(), name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return origin();
      return away(fmt::format("{}: {}: {}", describe(), name, errno_text(errno)));
    }
    fd_guard guard(fd);
    std::string text;
    char buffer[65536];
    for (;;) {
      const auto n = ::read(fd, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return away(fmt::format("{}: {}: {}", describe(), name, errno_text(errno)));
      if (n == 0) break;
      text.append(buffer, static_cast<std::size_t>(n));
    }
    dom::parser parser;
    dom::element doc;
    std::string_view stream;
    std::uint64_t seq = 0;
    if (parser.parse(text).get(doc) || doc["stream"].get_string().get(stream) ||
        doc["seq"].get_uint64().get(seq)) {
      // Not a file this target wrote whole: another message's, as far as keys go.
      return origin(std::pair(std::string(), std::uint64_t{0}));
    }
    return origin(std::pair(std::string(stream), seq));
  }

  result<void> put(const std::string& name, const std::string& text) {
    const auto temp = "." + name + ".tmp";
    fd_guard fd(
        ::openat(dir_fd_->get(), temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) return away(fmt::format("{}: {}: {}", describe(), temp, errno_text(errno)));
    std::size_t done = 0;
    while (done < text.size()) {
      const auto n = ::write(fd.get(), text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        ::unlinkat(dir_fd_->get(), temp.c_str(), 0);
        return away(fmt::format("{}: writing {}: {}", describe(), temp, errno_text(e)));
      }
      done += static_cast<std::size_t>(n);
    }
    if (::fsync(fd.get()) != 0 || ::close(fd.release()) != 0) {
      const int e = errno;
      ::unlinkat(dir_fd_->get(), temp.c_str(), 0);
      return away(fmt::format("{}: flushing {}: {}", describe(), temp, errno_text(e)));
    }
    if (::renameat(dir_fd_->get(), temp.c_str(), dir_fd_->get(), name.c_str()) != 0) {
      const int e = errno;
      ::unlinkat(dir_fd_->get(), temp.c_str(), 0);
      return away(fmt::format("{}: renaming {}: {}", describe(), temp, errno_text(e)));
    }
    return {};
  }

  target_config config_;
  std::unique_ptr<fd_guard> dir_fd_;
};

}  // namespace

std::unique_ptr<target> make_file_target(const target_config& config) {
  return std::make_unique<file_target>(config);
}

}  // namespace amp::sink::detail

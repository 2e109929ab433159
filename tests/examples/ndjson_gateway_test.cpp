// amp-example-ndjson-gateway as a client sees it: the example runs as a process on a free
// loopback port with the memory transport, and plain TCP sockets talk amp.v1 to it, one
// JSON object per line.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <simdjson.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/nats_server.hpp"  // free_port

namespace {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

constexpr const char* k_binary = AMP_EXAMPLE_NDJSON_GATEWAY;
constexpr const char* k_secret = "ndjson-test-secret-of-at-least-32-bytes";

// The example as a child process; its stdout and stderr go to a temporary file. The
// destructor kills it if it still runs, and shows that output when a REQUIRE failed.
class gateway_process {
 public:
  explicit gateway_process(int port) : port_(port) {
    char path[] = "/tmp/amp-ndjson-test-XXXXXX";
    int out = ::mkostemp(path, O_CLOEXEC);  // dup2 below clears O_CLOEXEC
    if (out < 0) throw std::runtime_error("mkstemp failed");
    log_path_ = path;
    std::string listen = "127.0.0.1:" + std::to_string(port);
    std::vector<std::string> args = {k_binary, "--listen", listen, "--secret", k_secret};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(out, STDOUT_FILENO);
      ::dup2(out, STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out);
  }
  ~gateway_process() {
    if (std::uncaught_exceptions() > 0) std::fprintf(stderr, "gateway output:\n%s", log().c_str());
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::unlink(log_path_.c_str());
  }
  gateway_process(const gateway_process&) = delete;
  gateway_process& operator=(const gateway_process&) = delete;

  int port() const { return port_; }
  void signal(int sig) const { ::kill(pid_, sig); }

  // The exit status once the process has ended by itself within `timeout`, else nullopt.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout) {
    auto deadline = steady::now() + timeout;
    for (;;) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (steady::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(10ms);
    }
  }
  bool running() { return pid_ > 0 && !wait_exit(0ms).has_value(); }

  std::string log() const {
    std::ifstream in(log_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  int port_;
  pid_t pid_ = -1;
  std::string log_path_;
};

int connect_to(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
  ::close(fd);
  return -1;
}

// Starts the example on a free port and waits until it accepts connections (3 ports at
// most: another process may take a free port first).
std::unique_ptr<gateway_process> start_gateway() {
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto p = std::make_unique<gateway_process>(amp::testing::free_port());
    auto deadline = steady::now() + 10s;
    while (p->running() && steady::now() < deadline) {
      if (int fd = connect_to(p->port()); fd >= 0) {
        ::close(fd);
        return p;
      }
      std::this_thread::sleep_for(20ms);
    }
    UNSCOPED_INFO("the example did not start; its output:\n" << p->log());
  }
  throw std::runtime_error("amp-example-ndjson-gateway did not start");
}

// `--print-token NAME`: a token for NAME in namespace "demo".
std::string print_token(const std::string& name) {
  std::string command = std::string(k_binary) + " --secret " + k_secret + " --print-token " + name;
  FILE* out = ::popen(command.c_str(), "r");
  REQUIRE(out != nullptr);
  std::string token;
  char buf[512];
  while (std::fgets(buf, sizeof buf, out)) token += buf;
  REQUIRE(::pclose(out) == 0);
  while (!token.empty() && token.back() == '\n') token.pop_back();
  return token;
}

// A line of JSON the gateway sent, with readers by JSON Pointer.
struct line {
  std::string text;

  std::string str(std::string_view pointer) const {
    simdjson::dom::parser parser;
    std::string_view v;
    if (parser.parse(text).at_pointer(pointer).get_string().get(v)) return "<absent>";
    return std::string(v);
  }
  std::int64_t num(std::string_view pointer) const {
    simdjson::dom::parser parser;
    std::int64_t v = 0;
    if (parser.parse(text).at_pointer(pointer).get_int64().get(v)) return -999999;
    return v;
  }
  bool is_null(std::string_view pointer) const {
    simdjson::dom::parser parser;
    simdjson::dom::element e;
    return !parser.parse(text).at_pointer(pointer).get(e) && e.is_null();
  }
  std::string op() const { return str("/op"); }
};

// One client connection: writes lines, reads lines with a timeout.
class client {
 public:
  explicit client(int port) : fd_(connect_to(port)) {
    if (fd_ < 0) throw std::runtime_error("cannot connect to the example");
  }
  ~client() { ::close(fd_); }
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  void write(const std::string& text) {
    std::size_t done = 0;
    while (done < text.size()) {
      auto n = ::send(fd_, text.data() + done, text.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return;  // the gateway closed; what it said is still to be read
      done += static_cast<std::size_t>(n);
    }
  }

  // The next line, or nullopt on end of stream or after `timeout`.
  std::optional<line> next(std::chrono::milliseconds timeout = 5s) {
    auto deadline = steady::now() + timeout;
    for (;;) {
      if (auto end = buf_.find('\n'); end != std::string::npos) {
        line l{buf_.substr(0, end)};
        buf_.erase(0, end + 1);
        return l;
      }
      if (eof_) return std::nullopt;
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - steady::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0)
        return std::nullopt;
      char chunk[4096];
      auto n = ::recv(fd_, chunk, sizeof chunk, 0);
      if (n <= 0)
        eof_ = true;
      else
        buf_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  // The next line whose op is `op`, skipping others (presence events and the like).
  std::optional<line> next_op(const std::string& op) {
    while (auto l = next()) {
      if (l->op() == op) return l;
    }
    return std::nullopt;
  }

  // True when the gateway ended the connection: nothing more but end of stream.
  bool ended(std::chrono::milliseconds timeout = 5s) {
    auto l = next(timeout);
    if (l) UNSCOPED_INFO("unexpected line: " << l->text);
    return !l && eof_;
  }

  line hello(const std::string& name) {
    write(R"({"op":"hello","id":1,"token":")" + print_token(name) + "\"}\n");
    auto reply = next();
    REQUIRE(reply);
    INFO(reply->text);
    REQUIRE(reply->op() == "ok");
    CHECK(reply->str("/participant") == name);
    CHECK(reply->str("/ns") == "demo");
    return *reply;
  }

 private:
  int fd_;
  std::string buf_;
  bool eof_ = false;
};

}  // namespace

TEST_CASE("amp-example-ndjson-gateway carries amp.v1 as lines of JSON over TCP",
          "[example][ndjson]") {
  auto gateway = start_gateway();
  client alice(gateway->port());
  client bob(gateway->port());
  alice.hello("alice");
  bob.hello("bob");

  // A message from alice reaches bob with `from` stamped by the gateway.
  alice.write(R"({"op":"send","id":2,"to":"bob","from":"mallory","body":{"hi":1}})"
              "\n");
  auto sent = alice.next();
  REQUIRE(sent);
  INFO(sent->text);
  CHECK(sent->op() == "ok");
  CHECK(sent->num("/id") == 2);
  auto message = bob.next_op("message");
  REQUIRE(message);
  INFO(message->text);
  CHECK(message->str("/envelope/from") == "alice");
  CHECK(message->str("/envelope/to") == "bob");
  CHECK(message->num("/envelope/body/hi") == 1);
  CHECK(message->num("/seq") == sent->num("/seq"));
  bob.write(R"({"op":"ack","seq":)" + std::to_string(message->num("/seq")) + "}\n");

  // A line that is not JSON is a bad request; the connection stays up.
  alice.write("this is not json\n");
  auto error = alice.next();
  REQUIRE(error);
  INFO(error->text);
  CHECK(error->op() == "error");
  CHECK(error->str("/code") == "bad_request");
  CHECK(error->is_null("/id"));
  alice.write(R"({"op":"who","id":3})"
              "\n");
  auto who = alice.next();
  REQUIRE(who);
  CHECK(who->op() == "ok");
  CHECK(who->num("/id") == 3);

  // A failed hello is answered, then closed with 4401.
  {
    client mallory(gateway->port());
    mallory.write(R"({"op":"hello","id":1,"token":"not.a.token"})"
                  "\n");
    auto refused = mallory.next();
    REQUIRE(refused);
    CHECK(refused->str("/code") == "unauthenticated");
    auto closed = mallory.next();
    REQUIRE(closed);
    CHECK(closed->op() == "closed");
    CHECK(closed->num("/code") == 4401);
    CHECK(mallory.ended());
  }

  // A line longer than max_frame_bytes (1 MiB by default) closes with 1009.
  {
    client big(gateway->port());
    big.write(std::string(1048576 + 100, 'x'));
    auto closed = big.next();
    REQUIRE(closed);
    INFO(closed->text);
    CHECK(closed->op() == "closed");
    CHECK(closed->num("/code") == 1009);
    CHECK(big.ended());
  }

  // SIGTERM: every session is told 1001, the connections end, the process exits 0.
  gateway->signal(SIGTERM);
  for (auto* c : {&alice, &bob}) {
    auto closed = c->next_op("closed");
    REQUIRE(closed);
    INFO(closed->text);
    CHECK(closed->num("/code") == 1001);
    CHECK(c->ended());
  }
  auto status = gateway->wait_exit(20s);
  INFO("gateway output:\n" << gateway->log());
  REQUIRE(status);
  CHECK(*status == 0);
}

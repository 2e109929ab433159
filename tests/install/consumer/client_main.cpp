// A program built against an installed amp::client, by find_package(amp COMPONENTS client)
// and by pkg-config (tests/install/CMakeLists.txt): it talks to the installed amp-server.
//   amp-client-consumer AMP_SERVER AMP
// mints a token with the installed `amp token`, starts the installed amp-server (memory
// transport) on a free loopback port, connects, sends a message to itself, receives and
// acknowledges it, then stops the server with SIGTERM and expects it to exit 0. Exits 0
// when all of that held.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "amp/client.hpp"

extern char** environ;

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "amp client consumer: FAILED: %s\n", what.c_str());
    ++failures;
  }
}

// A loopback port nobody listens on now (the kernel's choice).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(fd);
  return port;
}

// The output of a command run by the shell, or nothing when it fails.
std::optional<std::string> output_of(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::string out;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) out.append(buffer, n);
  const int status = ::pclose(pipe);
  if (status != 0) return std::nullopt;
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// amp-server, started with its output in a log file; stopped by SIGTERM.
struct server_process {
  pid_t pid = 0;
  std::string log;

  bool start(const std::string& binary, const std::vector<std::string>& args) {
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(binary.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) pid = 0;
    return rc == 0;
  }

  bool running() {
    if (pid == 0) return false;
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      exit_status = status;
      pid = 0;
      return false;
    }
    return true;
  }

  // SIGTERM, then the exit status (or -1 after 15 s, when it is killed).
  int stop() {
    if (!running()) return exit_status && WIFEXITED(*exit_status) ? WEXITSTATUS(*exit_status) : -1;
    ::kill(pid, SIGTERM);
    for (int i = 0; i < 150; ++i) {
      if (!running()) return WIFEXITED(*exit_status) ? WEXITSTATUS(*exit_status) : -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = 0;
    return -1;
  }

  std::optional<int> exit_status;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: amp-client-consumer AMP_SERVER AMP\n");
    return 2;
  }
  const std::string server_binary = argv[1];
  const std::string cli = argv[2];

  char dir_template[] = "/tmp/amp-client-consumer.XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  if (dir == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string work = dir;
  const std::string secret_file = work + "/secret";
  {
    std::ofstream secret(secret_file);
    secret << "an-install-test-secret-of-more-than-32-bytes";
  }

  auto token = output_of("'" + cli + "' token --secret-file '" + secret_file +
                         "' --sub bob --ns demo --all --ttl 600");
  expect(token.has_value() && !token->empty(), "the installed `amp token` mints a token");

  server_process server;
  server.log = work + "/amp-server.log";
  std::unique_ptr<amp::client> session;
  std::string url;
  for (int attempt = 0; attempt < 3 && token && !session; ++attempt) {
    const int port = free_port();
    url = "ws://127.0.0.1:" + std::to_string(port) + "/amp";
    if (!server.start(server_binary, {"--listen", "127.0.0.1:" + std::to_string(port),
                                      "--secret-file", secret_file, "--memory"})) {
      expect(false, "the installed amp-server starts");
      break;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (server.running() && std::chrono::steady_clock::now() < deadline) {
      auto connected = amp::client::connect({.url = url, .token = *token});
      if (connected) {
        session = std::move(*connected);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!session) server.stop();  // the port was taken meanwhile, or it never answered
  }
  expect(session != nullptr, "amp::client connects to the installed amp-server at " + url);

  if (session) {
    expect(session->participant() == "bob" && session->ns() == "demo", "hello opened bob@demo");
    expect(session->server().rfind("amp-server/", 0) == 0, "the server names itself amp-server");

    std::mutex mutex;
    std::condition_variable arrived;
    std::optional<amp::client_frame> message;
    session->on_push([&](const amp::client_frame& frame) {
      if (frame.op() != "message") return;
      std::lock_guard lock(mutex);
      message = frame;
      arrived.notify_all();
    });
    auto sent = session->send("bob", R"({"install":"test"})");
    expect(sent.has_value(), "send is answered ok");
    {
      std::unique_lock lock(mutex);
      arrived.wait_for(lock, std::chrono::seconds(10), [&] { return message.has_value(); });
    }
    expect(message.has_value(), "the message comes back to bob");
    if (message && sent) {
      expect(message->string_at("/envelope/from") == "bob", "the sender is stamped bob");
      expect(message->raw_at("/envelope/body") == R"({"install":"test"})",
             "the body arrives as sent");
      expect(message->int_at("/seq") == sent->seq, "the message carries the seq of the send");
      expect(session->ack(sent->seq).has_value(), "ack");
    }
    session->on_push({});
    expect(session->bye().has_value(), "bye");
    session.reset();
  }
  const int status = server.stop();
  expect(status == 0,
         "amp-server exits 0 after SIGTERM (it exited " + std::to_string(status) + ")");

  if (failures != 0) {
    std::fprintf(stderr, "--- amp-server's log:\n%s\n", read_file(server.log).c_str());
  }
  std::remove(server.log.c_str());
  std::remove(secret_file.c_str());
  ::rmdir(work.c_str());
  if (failures == 0) std::puts("amp client consumer: ok");
  return failures == 0 ? 0 : 1;
}

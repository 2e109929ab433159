// Tests of the integration-test harness itself: real nats-server processes, started and stopped
// by tests/support/nats_server.hpp.

#include <catch2/catch.hpp>

#include <fcntl.h>
#include <nats/nats.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "support/checks.hpp"
#include "support/nats_server.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using amp::testing::eventually;
using amp::testing::nats_cluster;
using amp::testing::nats_server;

/// A cnats connection with a JetStream context; destroys what it created.
class js_client {
 public:
  /// `reconnect`: follow the cluster when the connected node dies (else fail at once).
  explicit js_client(const std::vector<std::string>& urls, bool reconnect = false) {
    std::vector<const char*> servers;
    for (const auto& u : urls) servers.push_back(u.c_str());
    status_ = natsOptions_Create(&opts_);
    if (status_ == NATS_OK)
      status_ = natsOptions_SetServers(opts_, servers.data(), static_cast<int>(servers.size()));
    if (status_ == NATS_OK) status_ = natsOptions_SetTimeout(opts_, 2000);
    if (status_ == NATS_OK) status_ = natsOptions_SetAllowReconnect(opts_, reconnect);
    if (status_ == NATS_OK) status_ = natsOptions_SetMaxReconnect(opts_, reconnect ? 600 : 0);
    if (status_ == NATS_OK) status_ = natsOptions_SetReconnectWait(opts_, 100);
    if (status_ == NATS_OK) status_ = natsConnection_Connect(&nc_, opts_);
    if (status_ == NATS_OK) {
      jsOptions jo;
      jsOptions_Init(&jo);
      jo.Wait = 2000;
      status_ = natsConnection_JetStream(&js_, nc_, &jo);
    }
  }
  explicit js_client(const std::string& url) : js_client(std::vector<std::string>{url}) {}
  ~js_client() {
    jsCtx_Destroy(js_);
    natsConnection_Destroy(nc_);
    natsOptions_Destroy(opts_);
  }
  js_client(const js_client&) = delete;
  js_client& operator=(const js_client&) = delete;

  natsStatus status() const { return status_; }

  natsStatus account_info() {
    jsAccountInfo* info = nullptr;
    jsErrCode jerr{};
    natsStatus s = js_GetAccountInfo(&info, js_, nullptr, &jerr);
    jsAccountInfo_Destroy(info);
    return s;
  }

  natsStatus add_stream(const char* name, const char* subject, int replicas = 1) {
    jsStreamConfig cfg;
    jsStreamConfig_Init(&cfg);
    cfg.Name = name;
    const char* subjects[] = {subject};
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.Storage = js_FileStorage;
    cfg.Replicas = replicas;
    jsStreamInfo* info = nullptr;
    jsErrCode jerr{};
    natsStatus s = js_AddStream(&info, js_, &cfg, nullptr, &jerr);
    jsStreamInfo_Destroy(info);
    return s;
  }

  /// With `msg_id`, a retried publish is stored once (Nats-Msg-Id deduplication).
  natsStatus publish(const char* subject, const std::string& data, const char* msg_id = nullptr) {
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MsgId = msg_id;
    jsPubAck* ack = nullptr;
    jsErrCode jerr{};
    natsStatus s =
        js_Publish(&ack, js_, subject, data.data(), static_cast<int>(data.size()), &po, &jerr);
    jsPubAck_Destroy(ack);
    return s;
  }

  /// Messages in the stream and the name of its leader ("" without cluster), if it answers.
  struct stream_state {
    std::uint64_t messages = 0;
    std::string leader;
  };
  std::optional<stream_state> stream_info(const char* name) {
    jsStreamInfo* info = nullptr;
    jsErrCode jerr{};
    if (js_GetStreamInfo(&info, js_, name, nullptr, &jerr) != NATS_OK) return std::nullopt;
    stream_state state;
    state.messages = info->State.Msgs;
    if (info->Cluster != nullptr && info->Cluster->Leader != nullptr)
      state.leader = info->Cluster->Leader;
    jsStreamInfo_Destroy(info);
    return state;
  }

 private:
  natsOptions* opts_ = nullptr;
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
  natsStatus status_ = NATS_OK;
};

/// True once no process `pid` runs (a zombie nobody reaps counts as gone).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) == -1 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

std::vector<fs::path> our_temp_dirs() {
  std::string prefix = "amp-nats-" + std::to_string(::getpid()) + "-";
  std::vector<fs::path> dirs;
  for (const auto& entry : fs::directory_iterator(fs::temp_directory_path()))
    if (entry.path().filename().string().rfind(prefix, 0) == 0) dirs.push_back(entry.path());
  return dirs;
}

constexpr const char* helper_test_name = "harness helper: start a server and die by SIGKILL";

}  // namespace

TEST_CASE("a started server accepts connections and answers JetStream", "[harness]") {
  auto server = nats_server::start();
  REQUIRE(server.running());
  REQUIRE(server.pid() > 0);
  REQUIRE(server.port() > 0);
  REQUIRE(server.url() == "nats://127.0.0.1:" + std::to_string(server.port()));
  REQUIRE(fs::is_directory(server.store_dir()));

  js_client client(server.url());
  REQUIRE(client.status() == NATS_OK);
  REQUIRE(client.account_info() == NATS_OK);
  REQUIRE(server.log_tail().find("Server is ready") != std::string::npos);
}

TEST_CASE("a stopped server refuses connections and restarts on its port with its streams",
          "[harness]") {
  auto server = nats_server::start();
  int port = server.port();
  std::string store = server.store_dir();
  {
    js_client client(server.url());
    REQUIRE(client.status() == NATS_OK);
    REQUIRE(client.add_stream("KEEP", "keep.>") == NATS_OK);
    REQUIRE(client.publish("keep.one", "hello") == NATS_OK);
  }

  server.stop();
  REQUIRE_FALSE(server.running());
  REQUIRE(server.pid() == -1);
  {
    js_client refused(server.url());
    REQUIRE(refused.status() != NATS_OK);
  }

  server.restart();
  REQUIRE(server.running());
  REQUIRE(server.port() == port);
  REQUIRE(server.store_dir() == store);
  js_client client(server.url());
  REQUIRE(client.status() == NATS_OK);
  auto info = client.stream_info("KEEP");
  REQUIRE(info.has_value());
  REQUIRE(info->messages == 1);
}

TEST_CASE("a killed server restarted keeps the messages it acknowledged", "[harness]") {
  auto server = nats_server::start();
  {
    js_client client(server.url());
    REQUIRE(client.status() == NATS_OK);
    REQUIRE(client.add_stream("ACKED", "acked.>") == NATS_OK);
    for (int i = 0; i < 10; ++i)
      REQUIRE(client.publish("acked.x", "message " + std::to_string(i)) == NATS_OK);
  }
  pid_t old_pid = server.pid();
  server.kill();
  REQUIRE_FALSE(server.running());
  REQUIRE(process_gone(old_pid));

  server.restart();
  js_client client(server.url());
  REQUIRE(client.status() == NATS_OK);
  auto info = client.stream_info("ACKED");
  REQUIRE(info.has_value());
  REQUIRE(info->messages == 10);
}

TEST_CASE("destroying a server ends its process and removes its directory", "[harness]") {
  pid_t pid = -1;
  fs::path dir;
  {
    auto server = nats_server::start();
    pid = server.pid();
    dir = fs::path(server.store_dir()).parent_path();
    REQUIRE(fs::is_directory(dir));
    auto moved = std::move(server);  // ownership moves; the moved-from object owns nothing
    REQUIRE(moved.pid() == pid);
    REQUIRE(server.pid() == -1);
  }
  errno = 0;
  REQUIRE(::kill(pid, 0) == -1);
  REQUIRE(errno == ESRCH);
  REQUIRE_FALSE(fs::exists(dir));
}

TEST_CASE("a server that cannot start reports its log and leaves nothing behind", "[harness]") {
  auto before = our_temp_dirs().size();
  nats_server::options opts;
  opts.extra_config = "sync_interval: 1s";  // refused by nats-server 2.9
  try {
    auto server = nats_server::start(opts);
    FAIL("start() should have thrown");
  } catch (const std::runtime_error& e) {
    std::string what = e.what();
    INFO(what);
    REQUIRE(what.find("log tail") != std::string::npos);
    REQUIRE(what.find("sync_interval") != std::string::npos);
  }
  REQUIRE(our_temp_dirs().size() == before);
}

TEST_CASE(helper_test_name, "[.][harness-helper]") {
  // Run only as a child of the test below, which names the output file.
  const char* out = std::getenv("AMP_HARNESS_HELPER_OUT");
  if (out == nullptr) return;
  auto server = nats_server::start();
  {
    std::ofstream file(out);
    file << server.pid() << ' ' << fs::path(server.store_dir()).parent_path().string() << '\n';
  }
  ::raise(SIGKILL);  // no destructors run: only PR_SET_PDEATHSIG stops the server
}

TEST_CASE("the server dies with the test process even if no destructor runs", "[harness]") {
  fs::path out = fs::temp_directory_path() / ("amp-harness-helper-" + std::to_string(::getpid()));
  std::string env_entry = "AMP_HARNESS_HELPER_OUT=" + out.string();
  std::vector<char*> env;
  for (char** e = environ; *e != nullptr; ++e) env.push_back(*e);
  env.push_back(env_entry.data());
  env.push_back(nullptr);
  std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string name = helper_test_name;
  std::vector<char*> argv = {self.data(), name.data(), nullptr};

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t helper = -1;
  int rc = posix_spawn(&helper, self.c_str(), &actions, nullptr, argv.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(rc == 0);
  int status = 0;
  REQUIRE(::waitpid(helper, &status, 0) == helper);
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);

  pid_t server_pid = -1;
  std::string dir;
  {
    std::ifstream file(out);
    file >> server_pid >> dir;
  }
  fs::remove(out);
  REQUIRE(server_pid > 0);
  bool gone = eventually(5s, [&] { return process_gone(server_pid); });
  std::error_code ignored;
  fs::remove_all(dir, ignored);  // the helper died before it could
  REQUIRE(gone);
}

TEST_CASE("a 3-node cluster elects a new stream leader when the leader is killed", "[harness]") {
  auto cluster = nats_cluster::start(3);
  REQUIRE(cluster.size() == 3);
  REQUIRE(cluster.url_list().size() == 3);
  REQUIRE(cluster.urls() ==
          cluster.url_list()[0] + "," + cluster.url_list()[1] + "," + cluster.url_list()[2]);
  REQUIRE(cluster.node_index_by_name("n2") == 1);
  REQUIRE(cluster.node_index_by_name("nope") == -1);

  js_client client(cluster.url_list(), /*reconnect=*/true);
  REQUIRE(client.status() == NATS_OK);
  REQUIRE(eventually(10s, [&] { return client.add_stream("R3", "r3.>", 3) == NATS_OK; }));
  REQUIRE(client.publish("r3.a", "before") == NATS_OK);

  auto info = client.stream_info("R3");
  REQUIRE(info.has_value());
  std::string old_leader = info->leader;
  int leader = cluster.node_index_by_name(old_leader);
  INFO("stream leader: " << old_leader);
  REQUIRE(leader >= 0);

  cluster.kill(leader);
  REQUIRE_FALSE(cluster.node(leader).running());
  std::string new_leader;
  bool elected = eventually(30s, [&] {
    auto now = client.stream_info("R3");
    if (!now || now->leader.empty() || now->leader == old_leader) return false;
    new_leader = now->leader;
    return true;
  });
  INFO(cluster.log_tail(10));
  REQUIRE(elected);
  REQUIRE(cluster.node_index_by_name(new_leader) >= 0);
  REQUIRE(cluster.node_index_by_name(new_leader) != leader);
  REQUIRE(eventually(10s, [&] { return client.publish("r3.a", "after", "after-1") == NATS_OK; }));

  cluster.restart(leader);
  REQUIRE(cluster.node(leader).running());
  js_client back(cluster.node(leader).url());
  REQUIRE(back.status() == NATS_OK);
  REQUIRE(eventually(10s, [&] {
    auto now = back.stream_info("R3");
    return now && now->messages == 2;
  }));
}

#include "support/leader_probe.hpp"

namespace amp::testing {

leader_probe::leader_probe(const std::vector<std::string>& urls) {
  std::vector<const char*> servers;
  for (const auto& u : urls) servers.push_back(u.c_str());
  natsOptions_Create(&opts_);
  natsOptions_SetServers(opts_, servers.data(), static_cast<int>(servers.size()));
  natsOptions_SetTimeout(opts_, 2000);
  natsOptions_SetMaxReconnect(opts_, -1);
  natsOptions_SetReconnectWait(opts_, 100);
  if (natsConnection_Connect(&nc_, opts_) == NATS_OK) {
    jsOptions jo;
    jsOptions_Init(&jo);
    jo.Wait = 2000;
    natsConnection_JetStream(&js_, nc_, &jo);
  }
}

leader_probe::~leader_probe() {
  jsCtx_Destroy(js_);
  natsConnection_Destroy(nc_);
  natsOptions_Destroy(opts_);
}

std::optional<std::string> leader_probe::leader_of(const char* stream) {
  if (js_ == nullptr) return std::nullopt;
  jsStreamInfo* info = nullptr;
  jsErrCode jerr{};
  if (js_GetStreamInfo(&info, js_, stream, nullptr, &jerr) != NATS_OK) return std::nullopt;
  std::optional<std::string> leader;
  if (info->Cluster != nullptr && info->Cluster->Leader != nullptr) leader = info->Cluster->Leader;
  jsStreamInfo_Destroy(info);
  return leader;
}

bool leader_probe::caught_up(const char* stream, const char* durable) {
  if (js_ == nullptr) return false;
  jsErrCode jerr{};
  if (durable == nullptr) {
    jsStreamInfo* info = nullptr;
    if (js_GetStreamInfo(&info, js_, stream, nullptr, &jerr) != NATS_OK) return false;
    const bool ok = current(info->Cluster);
    jsStreamInfo_Destroy(info);
    return ok;
  }
  jsConsumerInfo* info = nullptr;
  if (js_GetConsumerInfo(&info, js_, stream, durable, nullptr, &jerr) != NATS_OK) return false;
  const bool ok = current(info->Cluster);
  jsConsumerInfo_Destroy(info);
  return ok;
}

bool leader_probe::current(const jsClusterInfo* c) {
  last_view_.clear();
  if (c == nullptr) return false;
  last_view_ = std::string("leader ") + (c->Leader ? c->Leader : "none");
  for (int i = 0; i < c->ReplicasLen; ++i) {
    const auto* p = c->Replicas[i];
    last_view_ += std::string(", ") + (p->Name ? p->Name : "?") + (p->Current ? " current" : "") +
                  (p->Offline ? " offline" : "") + " lag " + std::to_string(p->Lag) + " active " +
                  std::to_string(p->Active / 1000000) + " ms";
  }
  if (c->Leader == nullptr || c->ReplicasLen != 2) return false;
  for (int i = 0; i < c->ReplicasLen; ++i) {
    if (!c->Replicas[i]->Current || c->Replicas[i]->Offline) return false;
  }
  return true;
}

}  // namespace amp::testing

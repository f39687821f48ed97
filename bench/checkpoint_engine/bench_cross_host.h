// Cross-host measurements on one machine: "hosts" are network namespaces
// joined by veth pairs to a bridge (in a namespace of its own), each with a
// 10.x.y.k/24 address; peers run in them as processes of this binary
// (`ip netns exec`). Gloo broadcast is measured against a raw TCP stream of
// the same bytes between the same namespaces.
#ifndef SLUICE_BENCH_CHECKPOINT_ENGINE_BENCH_CROSS_HOST_H_
#define SLUICE_BENCH_CHECKPOINT_ENGINE_BENCH_CROSS_HOST_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_local.h"
#include "bench_support.h"

namespace sluice::bench::ce {

// OK if this process may create namespaces (root and `ip` on the PATH);
// otherwise why not.
Status CheckCanUseNetns();

// Deletes namespaces left by benchmark runs whose process is gone.
void SweepStaleNamespaces();

// Everything the benchmark created, deleted by DeleteAll: called by the
// topology's destructor and by the signal thread (SIGINT/SIGTERM/SIGHUP),
// which also kills the registered children.
class CleanupRegistry {
 public:
  static CleanupRegistry& Get();
  void AddNamespace(const std::string& name);
  void AddChild(pid_t pid);
  void RemoveChild(pid_t pid);
  void DeleteAll();
  void KillChildren();
  // Blocks the signals in this thread (call before creating any thread) and
  // starts the thread that cleans up and exits when one arrives.
  static void InstallSignalCleanup();
};

// hosts namespaces h0..h{hosts-1} on one bridge. Host 0 is the publisher.
class NetTopology {
 public:
  static Result<std::unique_ptr<NetTopology>> Create(int hosts);
  ~NetTopology();
  const std::string& ns(int host) const { return namespaces_[host]; }
  std::string ip(int host) const;

 private:
  NetTopology() = default;
  std::string subnet_;  // "10.a.b."
  std::vector<std::string> namespaces_;
  std::string bridge_ns_;
};

struct BroadcastSettings {
  size_t bucket_bytes = size_t{4} << 20;
  uint32_t in_flight = 2;
};

// relayed: host 0 publishes into its shared-memory store and a
// ShmBroadcastRelay broadcasts from there (the pipeline's path to rollout
// replicas on other hosts), timed to every subscriber serving the version.
Result<Measurement> MeasureGlooBroadcast(const NetTopology& net, const RunConfig& config,
                                         const BroadcastSettings& settings, bool relayed);
Result<Measurement> MeasureRawTcp(const NetTopology& net, const RunConfig& config);

// Child roles (inside a namespace).
int BroadcastPublisherMain(const std::map<std::string, std::string>& args);
int RelayPublisherMain(const std::map<std::string, std::string>& args);
int BroadcastSubscriberMain(const std::map<std::string, std::string>& args);
int TcpSenderMain(const std::map<std::string, std::string>& args);
int TcpReceiverMain(const std::map<std::string, std::string>& args);

}  // namespace sluice::bench::ce

#endif  // SLUICE_BENCH_CHECKPOINT_ENGINE_BENCH_CROSS_HOST_H_

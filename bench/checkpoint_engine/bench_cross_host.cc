// Gloo broadcast vs a raw TCP stream between network namespaces. Each
// configuration runs fresh peer processes: the publisher (or TCP sender) in
// host 0, one subscriber (or receiver) in each of hosts 1..N. The relay row
// is the pipeline's path to rollout replicas on other hosts: host 0
// publishes into its shared-memory store, and a ShmBroadcastRelay carries
// the version from there to the subscribers; timed from the store's Publish
// to every subscriber serving the version. Peers print one
// "RESULT {json}" line; everything else goes to stderr.
#include "bench_cross_host.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "sluice/checkpoint_engine/broadcast.h"
#include "sluice/checkpoint_engine/relay.h"
#include "sluice/checkpoint_engine/rendezvous.h"
#include "sluice/checkpoint_engine/shm_store.h"

namespace sluice::bench::ce {

using checkpoint_engine::BroadcastPublisher;
using checkpoint_engine::BroadcastPublisherOptions;
using checkpoint_engine::BroadcastSubscriber;
using checkpoint_engine::BroadcastSubscriberOptions;
using checkpoint_engine::RendezvousServer;
using checkpoint_engine::RendezvousServerOptions;
using checkpoint_engine::VersionStore;
using checkpoint_engine::VersionStoreOptions;

namespace {

constexpr uint16_t kRendezvousPort = 29400;
constexpr uint16_t kTcpPort = 29500;
constexpr auto kConfigDeadline = std::chrono::minutes(5);  // per configuration; only reached when broken

// Runs the peers of one configuration; returns the RESULT json of `leader`.
Result<nlohmann::json> RunPeers(std::vector<std::vector<std::string>> commands, size_t leader) {
  std::vector<Child> children;
  for (auto& argv : commands) {
    SLUICE_ASSIGN_OR_RETURN(Child c, Child::Spawn(argv, /*capture_stdout=*/true, /*signal_pipe=*/false));
    CleanupRegistry::Get().AddChild(c.pid());
    children.push_back(std::move(c));
  }
  const auto deadline = Clock::now() + kConfigDeadline;
  Status first;
  for (Child& c : children) {
    Status s = c.Wait(deadline);
    CleanupRegistry::Get().RemoveChild(c.pid());
    if (!s.ok() && first.ok()) first = s;
    if (!s.ok()) {
      for (Child& other : children) ::kill(other.pid(), SIGKILL);  // do not wait for the others
    }
  }
  if (!first.ok()) return first.WithContext("a peer failed");
  const std::string& out = children[leader].output();
  const size_t at = out.rfind("RESULT ");
  if (at == std::string::npos) return Status::Internal("the leader printed no RESULT line");
  try {
    return nlohmann::json::parse(out.substr(at + 7, out.find('\n', at) - at - 7));
  } catch (const std::exception& e) {
    return Status::Internal(std::string("bad RESULT line: ") + e.what());
  }
}

std::vector<std::string> InNamespace(const std::string& ns, std::vector<std::string> args) {
  std::vector<std::string> argv = {"ip", "netns", "exec", ns, SelfExe()};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

Measurement FromResult(const nlohmann::json& j, const std::string& transport, const RunConfig& config) {
  Measurement m;
  m.transport = transport;
  m.bytes = config.bytes;
  m.subscribers = config.subscribers;
  std::vector<double> all = j.at("seconds").get<std::vector<double>>();
  const size_t warmups = std::min<size_t>(static_cast<size_t>(config.warmups), all.size());
  m.warmup_seconds.assign(all.begin(), all.begin() + warmups);
  m.seconds.assign(all.begin() + warmups, all.end());
  return m;
}

// ---- minimal blocking TCP for the baseline

int Listen(const std::string& ip, uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 8) != 0) {
    std::fprintf(stderr, "bind/listen %s:%u: %s\n", ip.c_str(), port, std::strerror(errno));
    return -1;
  }
  return fd;
}

int ConnectRetrying(const std::string& ip, uint16_t port, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

bool SendAll(int fd, const std::byte* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, std::min<size_t>(n, size_t{1} << 30), MSG_NOSIGNAL);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool RecvAll(int fd, std::byte* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, std::min<size_t>(n, size_t{1} << 30), 0);
    if (r <= 0) {
      if (r < 0 && errno == EINTR) continue;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

Result<Measurement> MeasureGlooBroadcast(const NetTopology& net, const RunConfig& config,
                                         const BroadcastSettings& settings, bool relayed) {
  const std::string versions = std::to_string(config.rounds());
  const std::string bytes = std::to_string(config.bytes);
  std::vector<std::vector<std::string>> commands;
  commands.push_back(InNamespace(
      net.ns(0),
      {relayed ? "--role=bc-relay" : "--role=bc-pub", "--bind=" + net.ip(0),
       "--port=" + std::to_string(kRendezvousPort), "--bytes=" + bytes,
       "--subscribers=" + std::to_string(config.subscribers), "--versions=" + versions,
       "--bucket=" + std::to_string(settings.bucket_bytes), "--in-flight=" + std::to_string(settings.in_flight)}));
  for (int s = 1; s <= config.subscribers; ++s) {
    commands.push_back(InNamespace(
        net.ns(s),
        {"--role=bc-sub", "--bind=" + net.ip(s), "--rendezvous=" + net.ip(0) + ":" + std::to_string(kRendezvousPort),
         "--bytes=" + bytes, "--versions=" + versions, "--name=host" + std::to_string(s)}));
  }
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json result, RunPeers(commands, 0));
  Measurement m = FromResult(result, relayed ? "relay" : "gloo", config);
  m.baseline = "tcp";
  auto median_ms = [&](const char* key) {
    std::vector<double> v = result.at(key).get<std::vector<double>>();
    const size_t warmups = std::min<size_t>(static_cast<size_t>(config.warmups), v.size());
    return Summarize(std::vector<double>(v.begin() + warmups, v.end())).median * 1e3;
  };
  char note[200];
  if (relayed) {
    std::snprintf(note, sizeof(note), "host store publish %.1f ms, then the relay's broadcast %.1f ms",
                  median_ms("store"), median_ms("broadcast"));
  } else {
    std::snprintf(note, sizeof(note), "publisher: checksums %.1f ms, send %.1f ms, acks %.1f ms", median_ms("checksum"),
                  median_ms("send"), median_ms("ack"));
  }
  m.note = note;
  return m;
}

Result<Measurement> MeasureRawTcp(const NetTopology& net, const RunConfig& config) {
  const std::string versions = std::to_string(config.rounds());
  const std::string bytes = std::to_string(config.bytes);
  std::vector<std::vector<std::string>> commands;
  std::string targets;
  for (int s = 1; s <= config.subscribers; ++s) {
    targets += (targets.empty() ? "" : ",") + net.ip(s);
    commands.push_back(
        InNamespace(net.ns(s), {"--role=tcp-recv", "--bind=" + net.ip(s), "--port=" + std::to_string(kTcpPort),
                                "--bytes=" + bytes, "--versions=" + versions}));
  }
  commands.push_back(
      InNamespace(net.ns(0), {"--role=tcp-send", "--targets=" + targets, "--port=" + std::to_string(kTcpPort),
                              "--bytes=" + bytes, "--versions=" + versions}));
  SLUICE_ASSIGN_OR_RETURN(nlohmann::json result, RunPeers(commands, commands.size() - 1));
  return FromResult(result, "tcp", config);
}

// ------------------------------------------------------------ roles

int BroadcastPublisherMain(const std::map<std::string, std::string>& args) {
  RendezvousServerOptions so;
  so.bind_address = args.at("bind");
  so.port = static_cast<uint16_t>(std::stoi(args.at("port")));
  auto server = RendezvousServer::Start(so);
  if (!server.ok()) {
    std::fprintf(stderr, "bc-pub: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const size_t bytes = std::stoull(args.at("bytes"));
  BroadcastPublisherOptions o;
  o.rendezvous_address = (*server)->address();
  o.group = "bench";
  o.bind_address = args.at("bind");
  o.layout = LayoutForBytes(bytes);
  o.bucket_bytes = std::stoull(args.at("bucket"));
  o.max_in_flight = static_cast<uint32_t>(std::stoul(args.at("in-flight")));
  o.min_subscribers = std::stoull(args.at("subscribers"));
  o.join_timeout = std::chrono::seconds(60);
  o.op_timeout = std::chrono::seconds(60);
  auto pub = BroadcastPublisher::Start(o);
  if (!pub.ok()) {
    std::fprintf(stderr, "bc-pub: %s\n", pub.status().ToString().c_str());
    return 1;
  }
  Weights weights(o.layout);
  std::vector<double> seconds, checksum, send, ack;
  const int64_t versions = std::stoll(args.at("versions"));
  for (int64_t v = 1; v <= versions; ++v) {
    weights.Stamp(v);
    const auto t0 = Clock::now();
    auto report = (*pub)->PublishWithReport(v, weights.tensors());
    seconds.push_back(Seconds(Clock::now() - t0));
    if (!report.ok()) {
      std::fprintf(stderr, "bc-pub: %s\n", report.status().ToString().c_str());
      return 1;
    }
    checksum.push_back(report->checksum_seconds);
    send.push_back(report->send_seconds);
    ack.push_back(report->ack_seconds);
    if (report->subscribers.size() != o.min_subscribers || report->attempts != 1) {
      std::fprintf(stderr, "bc-pub: version %lld reached %zu subscribers in %u attempts\n", static_cast<long long>(v),
                   report->subscribers.size(), report->attempts);
      return 1;
    }
  }
  std::printf(
      "RESULT %s\n",
      nlohmann::json{{"seconds", seconds}, {"checksum", checksum}, {"send", send}, {"ack", ack}}.dump().c_str());
  std::fflush(stdout);
  return 0;
}

int RelayPublisherMain(const std::map<std::string, std::string>& args) {
  RendezvousServerOptions so;
  so.bind_address = args.at("bind");
  so.port = static_cast<uint16_t>(std::stoi(args.at("port")));
  auto server = RendezvousServer::Start(so);
  if (!server.ok()) {
    std::fprintf(stderr, "bc-relay: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const size_t bytes = std::stoull(args.at("bytes"));
  const std::string store = "bench-relay-" + std::to_string(::getpid());
  checkpoint_engine::ShmPublisherOptions po;
  po.store_name = store;
  po.layout = LayoutForBytes(bytes);
  auto host = checkpoint_engine::ShmPublisher::Attach(po);
  if (!host.ok()) {
    std::fprintf(stderr, "bc-relay: %s\n", host.status().ToString().c_str());
    return 1;
  }
  struct RemoveStore {
    std::string name;
    ~RemoveStore() { (void)checkpoint_engine::DestroyShmStore("sluice", name); }
  } remove_store{store};
  checkpoint_engine::RelayOptions ro;
  ro.store_name = store;
  ro.broadcast.rendezvous_address = (*server)->address();
  ro.broadcast.group = "bench";
  ro.broadcast.bind_address = args.at("bind");
  ro.broadcast.layout = po.layout;
  ro.broadcast.bucket_bytes = std::stoull(args.at("bucket"));
  ro.broadcast.max_in_flight = static_cast<uint32_t>(std::stoul(args.at("in-flight")));
  ro.broadcast.min_subscribers = std::stoull(args.at("subscribers"));
  ro.broadcast.op_timeout = std::chrono::seconds(60);
  ro.first_timeout = std::chrono::seconds(60);
  auto relay = checkpoint_engine::ShmBroadcastRelay::Start(ro);
  if (!relay.ok()) {
    std::fprintf(stderr, "bc-relay: %s\n", relay.status().ToString().c_str());
    return 1;
  }
  Weights weights(po.layout);
  std::vector<double> seconds, store_seconds, broadcast;
  const int64_t versions = std::stoll(args.at("versions"));
  for (int64_t v = 1; v <= versions; ++v) {
    weights.Stamp(v);
    const auto t0 = Clock::now();
    Status published = (*host)->Publish(v, weights.tensors());
    const auto t1 = Clock::now();
    if (!published.ok()) {
      std::fprintf(stderr, "bc-relay: %s\n", published.ToString().c_str());
      return 1;
    }
    // Until every subscriber serves it (the relay's Publish returned), or
    // the relay stopped on an error.
    const auto deadline = t1 + std::chrono::minutes(4);
    while ((*relay)->stats().last_delivered < v && (*relay)->status().ok() && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    const auto t2 = Clock::now();
    if ((*relay)->stats().last_delivered < v) {
      std::fprintf(stderr, "bc-relay: version %lld not delivered: %s\n", static_cast<long long>(v),
                   (*relay)->status().ToString().c_str());
      return 1;
    }
    seconds.push_back(Seconds(t2 - t0));
    store_seconds.push_back(Seconds(t1 - t0));
    broadcast.push_back(Seconds(t2 - t1));
  }
  std::printf("RESULT %s\n",
              nlohmann::json{{"seconds", seconds}, {"store", store_seconds}, {"broadcast", broadcast}}.dump().c_str());
  std::fflush(stdout);
  return 0;
}

int BroadcastSubscriberMain(const std::map<std::string, std::string>& args) {
  const size_t bytes = std::stoull(args.at("bytes"));
  VersionStoreOptions vo;
  vo.layout = LayoutForBytes(bytes);
  vo.reuse_buffers = true;  // a host fed a version every few seconds
  auto created = VersionStore::Create(vo);
  if (!created.ok()) return 1;
  std::shared_ptr<VersionStore> store(std::move(created).value());
  BroadcastSubscriberOptions o;
  o.rendezvous_address = args.at("rendezvous");
  o.group = "bench";
  o.bind_address = args.at("bind");
  o.name = args.at("name");
  o.join_timeout = std::chrono::seconds(60);
  o.op_timeout = std::chrono::seconds(60);
  auto sub = BroadcastSubscriber::Start(o, store);
  if (!sub.ok()) {
    std::fprintf(stderr, "bc-sub: %s\n", sub.status().ToString().c_str());
    return 1;
  }
  const int64_t versions = std::stoll(args.at("versions"));
  Status s = (*sub)->WaitForVersion(versions, std::chrono::minutes(4));
  if (!s.ok()) {
    std::fprintf(stderr, "bc-sub: %s\n", s.ToString().c_str());
    return 1;
  }
  if (std::getenv("SLUICE_BENCH_VERBOSE") != nullptr) {
    const auto st = (*sub)->stats();
    std::fprintf(stderr, "bc-sub %s: last version received+verified in %.1f ms, committed in %.1f ms\n", o.name.c_str(),
                 st.last_receive_seconds * 1e3, st.last_commit_seconds * 1e3);
  }
  // The stamp of the last version is in place (the store verified every checksum).
  auto h = store->AcquireLatest();
  int64_t stamp = 0;
  std::memcpy(&stamp, h->tensor(vo.layout[0].name)->data, sizeof(stamp));
  if (stamp != versions) {
    std::fprintf(stderr, "bc-sub: serves stamp %lld, expected %lld\n", static_cast<long long>(stamp),
                 static_cast<long long>(versions));
    return 1;
  }
  return 0;
}

int TcpReceiverMain(const std::map<std::string, std::string>& args) {
  const int listen_fd = Listen(args.at("bind"), static_cast<uint16_t>(std::stoi(args.at("port"))));
  if (listen_fd < 0) return 1;
  const int fd = ::accept(listen_fd, nullptr, nullptr);
  if (fd < 0) return 1;
  const size_t bytes = std::stoull(args.at("bytes"));
  auto buffer = AllocateTouched(bytes);
  const int64_t versions = std::stoll(args.at("versions"));
  for (int64_t v = 1; v <= versions; ++v) {
    const std::byte ack{1};
    if (!RecvAll(fd, buffer.get(), bytes) || !SendAll(fd, &ack, 1)) return 1;
  }
  ::close(fd);
  ::close(listen_fd);
  return 0;
}

int TcpSenderMain(const std::map<std::string, std::string>& args) {
  std::vector<int> fds;
  std::stringstream targets(args.at("targets"));
  std::string ip;
  const uint16_t port = static_cast<uint16_t>(std::stoi(args.at("port")));
  while (std::getline(targets, ip, ',')) {
    const int fd = ConnectRetrying(ip, port, Clock::now() + std::chrono::seconds(60));
    if (fd < 0) {
      std::fprintf(stderr, "tcp-send: cannot connect to %s\n", ip.c_str());
      return 1;
    }
    fds.push_back(fd);
  }
  const size_t bytes = std::stoull(args.at("bytes"));
  auto source = AllocateTouched(bytes);
  std::vector<double> seconds;
  const int64_t versions = std::stoll(args.at("versions"));
  for (int64_t v = 1; v <= versions; ++v) {
    std::memcpy(source.get(), &v, sizeof(v));
    std::atomic<bool> ok{true};
    const auto t0 = Clock::now();
    {
      // One stream per receiver, all at once (what N plain TCP copies cost).
      std::vector<std::jthread> threads;
      for (int fd : fds) {
        threads.emplace_back([&, fd] {
          std::byte ack;
          if (!SendAll(fd, source.get(), bytes) || !RecvAll(fd, &ack, 1)) ok = false;
        });
      }
    }
    seconds.push_back(Seconds(Clock::now() - t0));
    if (!ok) return 1;
  }
  for (int fd : fds) ::close(fd);
  std::printf("RESULT %s\n", nlohmann::json{{"seconds", seconds}}.dump().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace sluice::bench::ce

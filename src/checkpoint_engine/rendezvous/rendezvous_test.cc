// The rendezvous store: behaviour through the client, and bad input written
// straight onto the wire.
#include "sluice/checkpoint_engine/rendezvous.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <thread>
#include <vector>

#include "common/testing/byte_mutator.h"
#include "core/codec_fuzz.h"
#include "core/socket_util.h"
#include "rendezvous/rendezvous_wire.h"

namespace sluice::checkpoint_engine {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
namespace wire = rendezvous;

bool Contains(const Status& s, const std::string& needle) { return s.message().find(needle) != std::string::npos; }

std::unique_ptr<RendezvousServer> StartServer(RendezvousServerOptions o = {}) {
  auto server = RendezvousServer::Start(std::move(o));
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(server).value() : nullptr;
}

std::unique_ptr<RendezvousClient> Connect(const RendezvousServer& server) {
  RendezvousClientOptions o;
  o.address = server.address();
  o.connect_timeout = 2s;
  o.io_timeout = 2s;
  auto client = RendezvousClient::Connect(o);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(client).value() : nullptr;
}

// Waits (bounded) until `pred` holds; true if it did.
template <typename Pred>
bool Eventually(Pred pred) {
  const auto deadline = Clock::now() + 5s;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(1ms);
  }
  return pred();
}

TEST(RendezvousTest, SetGetAddDeleteOnAnOsChosenLoopbackPort) {
  auto server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_NE(server->port(), 0);
  EXPECT_EQ(server->address(), "127.0.0.1:" + std::to_string(server->port()));
  auto c = Connect(*server);
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->Set("a/b", std::string("x\0y", 3)).ok());
  auto v = c->Get("a/b");
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, std::string("x\0y", 3));  // values are opaque bytes
  ASSERT_TRUE(c->Set("a/b", "").ok());
  EXPECT_EQ(c->Get("a/b").value(), "");
  EXPECT_EQ(c->Get("missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(c->Add("n", 5).value(), 5);
  EXPECT_EQ(c->Add("n", -7).value(), -2);
  EXPECT_EQ(c->Add("a/b", 1).status().code(), StatusCode::kFailedPrecondition);  // not a counter
  ASSERT_TRUE(c->Delete("a/b").ok());
  EXPECT_EQ(c->Delete("a/b").code(), StatusCode::kNotFound);
  EXPECT_EQ(c->Set("k", "1", KeyLifetime::kPersistent, /*create_only=*/true).code(), StatusCode::kOk);
  Status again = c->Set("k", "2", KeyLifetime::kPersistent, /*create_only=*/true);
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(c->Get("k").value(), "1");
  EXPECT_EQ(server->stats().keys, 2u);  // n, k
}

TEST(RendezvousTest, GetWaitsForTheKeyAndTimesOut) {
  auto server = StartServer();
  auto waiter = Connect(*server);
  auto setter = Connect(*server);
  std::thread t([&] {
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(setter->Set("late", "here").ok());
  });
  const auto start = Clock::now();
  auto v = waiter->Get("late", 5s);
  t.join();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "here");
  EXPECT_LT(Clock::now() - start, 4s);
  const auto t0 = Clock::now();
  auto none = waiter->Get("never", 100ms);
  EXPECT_EQ(none.status().code(), StatusCode::kTimeout) << none.status().ToString();
  EXPECT_GE(Clock::now() - t0, 90ms);
  // The connection is still usable after a timed-out wait.
  EXPECT_EQ(waiter->Get("late").value(), "here");
}

TEST(RendezvousTest, OneSetWakesEveryWaiter) {
  auto server = StartServer();
  constexpr int kWaiters = 8;
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(Connect(*server));
  std::atomic<int> woken{0};
  std::vector<std::thread> threads;
  for (auto& c : clients) {
    threads.emplace_back([&woken, c = c.get()] {
      auto v = c->Get("go", 5s);
      if (v.ok() && *v == "now") ++woken;
    });
  }
  ASSERT_TRUE(Eventually([&] { return server->stats().waiting_gets == kWaiters; }));
  auto setter = Connect(*server);
  ASSERT_TRUE(setter->Add("go-counter", 1).ok());
  ASSERT_TRUE(setter->Set("go", "now").ok());
  for (auto& t : threads) t.join();
  EXPECT_EQ(woken.load(), kWaiters);
  EXPECT_EQ(server->stats().waiting_gets, 0u);
}

TEST(RendezvousTest, EphemeralKeysVanishWithTheirConnection) {
  auto server = StartServer();
  auto owner = Connect(*server);
  auto other = Connect(*server);
  ASSERT_TRUE(owner->Set("alive/1", "me", KeyLifetime::kEphemeral).ok());
  ASSERT_TRUE(owner->Set("persist", "p").ok());
  ASSERT_TRUE(owner->Set("taken-over", "a", KeyLifetime::kEphemeral).ok());
  ASSERT_TRUE(other->Set("taken-over", "b").ok());  // now persistent, owned by nobody
  EXPECT_EQ(other->Get("alive/1").value(), "me");
  owner.reset();  // closes the connection, as a killed process would
  ASSERT_TRUE(Eventually([&] { return other->Get("alive/1").status().code() == StatusCode::kNotFound; }));
  EXPECT_EQ(other->Get("persist").value(), "p");
  EXPECT_EQ(other->Get("taken-over").value(), "b");
  EXPECT_EQ(server->stats().ephemeral_deleted, 1u);
}

// Raw wire access for malformed requests.
class RawConnection {
 public:
  explicit RawConnection(uint16_t port) {
    auto fd = internal::ConnectTcp("127.0.0.1", port, Clock::now() + 2s);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    if (fd.ok()) fd_ = std::move(fd).value();
  }
  void Send(wire::RequestHeader h, std::string_view key = {}, std::string_view value = {}) {
    auto bytes = wire::Encode(h);
    std::string frame(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    frame.append(key);
    frame.append(value);
    ASSERT_TRUE(internal::SendAll(fd_.get(), frame.data(), frame.size(), Clock::now() + 2s).ok());
  }
  void SendRaw(std::string_view bytes) {
    ASSERT_TRUE(internal::SendAll(fd_.get(), bytes.data(), bytes.size(), Clock::now() + 2s).ok());
  }
  // The answer: status and payload.
  Status Receive(std::string* payload = nullptr, uint8_t* flags = nullptr) {
    std::array<std::byte, wire::kHeaderBytes> h;
    Status s = internal::RecvAll(fd_.get(), h.data(), h.size(), Clock::now() + 2s);
    if (!s.ok()) return s;
    wire::ResponseHeader r = wire::DecodeResponse(h.data());
    EXPECT_EQ(r.magic, wire::kMagic);
    std::string body(r.payload_len, '\0');
    s = internal::RecvAll(fd_.get(), body.data(), body.size(), Clock::now() + 2s);
    if (!s.ok()) return s;
    if (payload != nullptr) *payload = body;
    if (flags != nullptr) *flags = r.flags;
    return r.code == 0 ? Status::Ok() : Status(static_cast<StatusCode>(r.code), body);
  }
  // True once the server closed the connection.
  bool Closed() {
    char byte;
    Status s = internal::RecvAll(fd_.get(), &byte, 1, Clock::now() + 2s);
    return s.code() == StatusCode::kUnavailable;
  }

 private:
  internal::UniqueFd fd_;
};

wire::RequestHeader Req(wire::Op op, size_t key_len, size_t value_len = 0, int64_t arg = 0, uint8_t flags = 0) {
  wire::RequestHeader h;
  h.op = static_cast<uint8_t>(op);
  h.key_len = static_cast<uint32_t>(key_len);
  h.value_len = static_cast<uint32_t>(value_len);
  h.arg = arg;
  h.flags = flags;
  return h;
}

TEST(RendezvousTest, AWaiterThatHangsUpIsDropped) {
  auto server = StartServer();
  {
    RawConnection raw(server->port());
    raw.Send(Req(wire::Op::kGet, 4, 0, 10000), "nope");
    ASSERT_TRUE(Eventually([&] { return server->stats().waiting_gets == 1; }));
  }  // hangs up while parked
  ASSERT_TRUE(Eventually([&] { return server->stats().waiting_gets == 0 && server->stats().connections == 0; }));
  auto c = Connect(*server);
  ASSERT_TRUE(c->Set("nope", "v").ok());  // nobody left to answer
}

TEST(RendezvousTest, FramingErrorsAreAnsweredThenTheConnectionIsClosed) {
  RendezvousServerOptions o;
  o.max_key_bytes = 16;
  o.max_value_bytes = 1024;
  auto server = StartServer(o);
  auto good = Connect(*server);
  ASSERT_TRUE(good->Set("kept", "v").ok());
  const RendezvousServerStats before = server->stats();
  uint8_t flags = 0;
  {
    RawConnection raw(server->port());
    wire::RequestHeader h = Req(wire::Op::kGet, 4);
    h.magic = 0x12345678;
    raw.Send(h, "kept");
    Status s = raw.Receive(nullptr, &flags);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(s, "not a rendezvous request") && Contains(s, "magic 0x12345678")) << s.ToString();
    EXPECT_EQ(flags, wire::kFlagClosing);
    EXPECT_TRUE(raw.Closed());
  }
  {
    RawConnection raw(server->port());
    wire::RequestHeader h = Req(wire::Op::kGet, 4);
    h.protocol = 7;
    raw.Send(h, "kept");
    Status s = raw.Receive();
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(s, "protocol 7") && Contains(s, "speaks 1")) << s.ToString();
    EXPECT_TRUE(raw.Closed());
  }
  {
    RawConnection raw(server->port());
    raw.Send(Req(wire::Op::kSet, 17), std::string(17, 'k'));
    Status s = raw.Receive();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(s, "key length 17") && Contains(s, "max_key_bytes=16")) << s.ToString();
    EXPECT_TRUE(raw.Closed());
  }
  {
    RawConnection raw(server->port());
    raw.Send(Req(wire::Op::kSet, 0));
    EXPECT_EQ(raw.Receive().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(raw.Closed());
  }
  {
    // A huge announced value is refused from the header alone: the server
    // never buffers it.
    RawConnection raw(server->port());
    raw.Send(Req(wire::Op::kSet, 4, 0xFFFFFFFFu), "kept");
    Status s = raw.Receive();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(Contains(s, "value length 4294967295") && Contains(s, "max_value_bytes=1024")) << s.ToString();
    EXPECT_TRUE(raw.Closed());
  }
  {
    // A truncated frame followed by a hang-up changes nothing.
    RawConnection raw(server->port());
    auto h = wire::Encode(Req(wire::Op::kSet, 4, 10));
    raw.SendRaw(std::string_view(reinterpret_cast<const char*>(h.data()), h.size()));
    raw.SendRaw("kept12");
  }
  ASSERT_TRUE(Eventually([&] { return server->stats().connections == 1; }));
  EXPECT_EQ(good->Get("kept").value(), "v");  // state untouched, other clients unaffected
  EXPECT_EQ(server->stats().keys, before.keys);
  EXPECT_EQ(server->stats().dropped_connections, 5u);
}

TEST(RendezvousTest, InvalidRequestsAreRefusedAndTheConnectionStaysUsable) {
  RendezvousServerOptions o;
  o.max_keys = 3;
  o.max_total_bytes = 64;
  auto server = StartServer(o);
  RawConnection raw(server->port());
  raw.Send(Req(static_cast<wire::Op>(99), 1), "k");
  Status s = raw.Receive();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "unknown op 99")) << s.ToString();
  raw.Send(Req(wire::Op::kSet, 3, 0, 0, 0x80), "a b");
  EXPECT_TRUE(Contains(raw.Receive(), "outside printable ASCII"));
  raw.Send(Req(wire::Op::kSet, 1, 0, 0, 0x80), "k");
  EXPECT_TRUE(Contains(raw.Receive(), "unknown Set flags 128"));
  raw.Send(Req(wire::Op::kGet, 1, 0, -5), "k");
  EXPECT_EQ(raw.Receive().code(), StatusCode::kInvalidArgument);
  raw.Send(Req(wire::Op::kAdd, 1, 2), "k", "xx");
  EXPECT_EQ(raw.Receive().code(), StatusCode::kInvalidArgument);
  // Limits: keys and bytes held.
  raw.Send(Req(wire::Op::kSet, 1, 70), "a", std::string(70, 'v'));
  s = raw.Receive();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s, "max_total_bytes=64")) << s.ToString();
  for (const char* k : {"a", "b", "c"}) {
    raw.Send(Req(wire::Op::kSet, 1, 1), k, "v");
    EXPECT_TRUE(raw.Receive().ok());
  }
  raw.Send(Req(wire::Op::kSet, 1, 1), "d", "v");
  s = raw.Receive();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s, "max_keys=3")) << s.ToString();
  raw.Send(Req(wire::Op::kAdd, 1, 0, 1), "e");
  EXPECT_EQ(raw.Receive().code(), StatusCode::kResourceExhausted);
  // Counter overflow is refused and leaves the counter.
  raw.Send(Req(wire::Op::kDelete, 1), "c");
  EXPECT_TRUE(raw.Receive().ok());
  raw.Send(Req(wire::Op::kAdd, 1, 0, INT64_MAX), "c");
  EXPECT_TRUE(raw.Receive().ok());
  raw.Send(Req(wire::Op::kAdd, 1, 0, 1), "c");
  EXPECT_EQ(raw.Receive().code(), StatusCode::kOutOfRange);
  // Still usable after all of that.
  raw.Send(Req(wire::Op::kSet, 1, 1), "a", "w");
  EXPECT_TRUE(raw.Receive().ok());
  std::string value;
  raw.Send(Req(wire::Op::kGet, 1), "a");
  EXPECT_TRUE(raw.Receive(&value).ok());
  EXPECT_EQ(value, "w");
  EXPECT_EQ(server->stats().dropped_connections, 0u);
}

TEST(RendezvousTest, ClientRejectsBadInputAndReportsAnUnreachableServer) {
  RendezvousClientOptions o;
  o.address = "localhost";
  EXPECT_EQ(RendezvousClient::Connect(o).status().code(), StatusCode::kInvalidArgument);
  o.address = "127.0.0.1:70000";
  EXPECT_EQ(RendezvousClient::Connect(o).status().code(), StatusCode::kInvalidArgument);
  // A port nobody listens on (bound, then closed).
  uint16_t port;
  {
    auto server = StartServer();
    port = server->port();
  }
  o.address = "127.0.0.1:" + std::to_string(port);
  o.connect_timeout = 100ms;
  Result<std::unique_ptr<RendezvousClient>> none = RendezvousClient::Connect(o);
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable) << none.status().ToString();

  RendezvousServerOptions so;
  so.max_value_bytes = 8;
  auto server = StartServer(so);
  auto c = Connect(*server);
  EXPECT_EQ(c->Set("", "v").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Set("with space", "v").code(), StatusCode::kInvalidArgument);
  // A value over the server's limit is refused, and the server hangs up:
  // the client reports it and stays closed (its ephemeral keys are gone).
  ASSERT_TRUE(c->Set("eph", "1", KeyLifetime::kEphemeral).ok());
  Status big = c->Set("k", "123456789");
  EXPECT_EQ(big.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(big, "max_value_bytes=8")) << big.ToString();
  EXPECT_EQ(c->Get("k").status().code(), StatusCode::kInvalidArgument);  // sticky
  auto other = Connect(*server);
  ASSERT_TRUE(Eventually([&] { return other->Get("eph").status().code() == StatusCode::kNotFound; }));
}

TEST(RendezvousTest, ServerRejectsMalformedOptions) {
  RendezvousServerOptions o;
  o.bind_address = "not-an-ip";
  EXPECT_EQ(RendezvousServer::Start(o).status().code(), StatusCode::kInvalidArgument);
  o = {};
  o.max_key_bytes = 0;
  Status s = RendezvousServer::Start(o).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "max_key_bytes")) << s.ToString();
  // The port is taken.
  auto first = StartServer();
  o = {};
  o.port = first->port();
  s = RendezvousServer::Start(o).status();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(s, std::to_string(first->port()))) << s.ToString();
}

// The fuzzer's body (core/codec_fuzz.h) on seeded random and mutated
// frames, so the default suite runs the framing checks' error paths without
// clang. Every sample passes as what it is (a request or an answer); a few
// hundred mutated ones still pass (the checks ran past the first field).
// Mutation: CheckRequest accepting Get with flags set fails the body's
// invariant (abort).
TEST(RendezvousFuzzSmokeTest, SeededRandomAndMutatedFramesNeverCrash) {
  std::vector<std::vector<uint8_t>> seeds;
  for (const std::string& f : wire::RendezvousSampleFrames()) {
    seeds.emplace_back(f.begin(), f.end());
    EXPECT_GE(wire::FuzzRendezvousFrames(seeds.back().data(), seeds.back().size()), 1) << "sample " << seeds.size();
  }
  sluice::testing::ByteRng rng(20261207);
  int passed = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> input =
        i % 4 == 0 ? rng.Bytes(rng.Below(80)) : sluice::testing::MutateBytes(seeds[rng.Below(seeds.size())], rng);
    passed += wire::FuzzRendezvousFrames(input.data(), input.size());
  }
  EXPECT_GT(passed, 100);
}

}  // namespace
}  // namespace sluice::checkpoint_engine

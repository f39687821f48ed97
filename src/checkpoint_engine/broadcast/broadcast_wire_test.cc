// The broadcast's messages and stream plan, including malformed input.
#include "broadcast/broadcast_wire.h"

#include <gtest/gtest.h>

#include "broadcast/broadcast_test_util.h"
#include "common/testing/byte_mutator.h"
#include "core/codec_fuzz.h"
#include "core/socket_util.h"

namespace sluice::checkpoint_engine::bcast {
namespace {

bool Contains(const Status& s, const std::string& needle) { return s.message().find(needle) != std::string::npos; }

TEST(StreamPlanTest, SlicesLargeTensorsAndPacksSmallOnesInLayoutOrder) {
  // bucket 100: threshold for packing is 25 bytes.
  StreamPlan plan = MakeStreamPlan({10, 250, 20, 0, 24, 30, 60, 5}, 100);
  EXPECT_EQ(plan.total_bytes, 399u);
  ASSERT_EQ(plan.buckets.size(), 8u);
  // [10] packed, then 250 sliced 100/100/50, then [20, 24] packed, 30 and 60
  // are single slices, [5] packed.
  EXPECT_TRUE(plan.buckets[0].packed);
  EXPECT_EQ(plan.buckets[0].nbytes, 10u);
  for (int b = 1; b <= 3; ++b) {
    EXPECT_FALSE(plan.buckets[b].packed);
    ASSERT_EQ(plan.buckets[b].pieces.size(), 1u);
    EXPECT_EQ(plan.buckets[b].pieces[0].tensor, 1u);
    EXPECT_EQ(plan.buckets[b].pieces[0].tensor_offset, 100u * (b - 1));
  }
  EXPECT_EQ(plan.buckets[3].nbytes, 50u);
  ASSERT_EQ(plan.buckets[4].pieces.size(), 2u);
  EXPECT_EQ(plan.buckets[4].pieces[1].tensor, 4u);
  EXPECT_EQ(plan.buckets[4].pieces[1].bucket_offset, 20u);
  EXPECT_EQ(plan.buckets[4].nbytes, 44u);
  EXPECT_EQ(plan.pieces_per_tensor, (std::vector<uint32_t>{1, 3, 1, 0, 1, 1, 1, 1}));
  // Every byte of every tensor is covered exactly once.
  std::vector<uint64_t> covered(8, 0);
  for (const Bucket& b : plan.buckets) {
    uint64_t sum = 0;
    for (const Piece& p : b.pieces) {
      covered[p.tensor] += p.nbytes;
      sum += p.nbytes;
    }
    EXPECT_EQ(sum, b.nbytes);
    EXPECT_LE(b.nbytes, 100u);
  }
  EXPECT_EQ(covered, (std::vector<uint64_t>{10, 250, 20, 0, 24, 30, 60, 5}));
}

TEST(StreamPlanTest, PacksCloseWhenFull) {
  StreamPlan plan = MakeStreamPlan({20, 20, 20, 20, 20, 20}, 100);
  ASSERT_EQ(plan.buckets.size(), 2u);
  EXPECT_EQ(plan.buckets[0].nbytes, 100u);
  EXPECT_EQ(plan.buckets[1].nbytes, 20u);
  EXPECT_TRUE(MakeStreamPlan({0, 0}, 100).buckets.empty());
}

TEST(BroadcastWireTest, MessagesRoundTrip) {
  PublisherHello hello;
  hello.epoch = 7;
  hello.bucket_bytes = 1 << 20;
  hello.max_in_flight = 3;
  hello.layout = testing::BroadcastLayout();
  hello.layout_hash = LayoutHash(hello.layout);
  auto h = DecodePublisherHello(Encode(hello));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->epoch, 7u);
  EXPECT_EQ(h->max_in_flight, 3u);
  EXPECT_EQ(LayoutHash(h->layout), hello.layout_hash);
  ASSERT_EQ(h->layout.size(), 6u);
  EXPECT_EQ(h->layout[0].shape, (std::vector<int64_t>{256, 1024}));

  SubscriberHello sh{42, 5, "host:1"};
  auto s = DecodeSubscriberHello(Encode(sh));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->name, "host:1");
  EXPECT_EQ(s->latest_version, 5);

  Members m{9, {3, 1, 2}};
  auto mm = DecodeMembers(Encode(m));
  ASSERT_TRUE(mm.ok());
  EXPECT_EQ(mm->ids, m.ids);

  Announcement a;
  a.generation = 2;
  a.seq = 5;
  a.version = 11;
  a.layout_hash = 1234;
  a.total_bytes = 99;
  a.checksums = {1, 2, 3};
  auto aa = DecodeAnnouncement(Encode(a));
  ASSERT_TRUE(aa.ok());
  EXPECT_EQ(aa->kind, Kind::kVersion);
  EXPECT_EQ(aa->checksums, a.checksums);
  a.kind = Kind::kReform;
  a.checksums.clear();
  EXPECT_EQ(DecodeAnnouncement(Encode(a))->kind, Kind::kReform);
  // A hash depends on names, dtypes and shapes.
  Layout other = testing::BroadcastLayout();
  other[2].shape = {128, 64};
  EXPECT_NE(LayoutHash(other), LayoutHash(testing::BroadcastLayout()));
}

TEST(BroadcastWireTest, ForeignOtherProtocolAndTruncatedMessagesAreClearErrors) {
  Announcement a;
  a.version = 3;
  a.checksums = {1, 2};
  const std::string good = Encode(a);

  std::string foreign = good;
  foreign[0] = 'X';
  Status s = DecodeAnnouncement(foreign).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "not a Sluice broadcast message")) << s.ToString();

  a.protocol = 2;
  s = DecodeAnnouncement(Encode(a)).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "protocol version 2") && Contains(s, "speaks version 1")) << s.ToString();

  EXPECT_EQ(DecodeAnnouncement(good.substr(0, 10)).status().code(), StatusCode::kDataLoss);
  for (size_t cut = kPreambleBytes; cut < good.size(); ++cut) {
    Status t = DecodeAnnouncement(good.substr(0, cut)).status();
    EXPECT_EQ(t.code(), StatusCode::kDataLoss) << cut;
  }
  s = DecodeAnnouncement(good + "x").status();
  EXPECT_TRUE(Contains(s, "1 trailing bytes")) << s.ToString();

  // A huge count is refused before any allocation.
  std::string huge = good;
  const size_t count_at = kPreambleBytes + 5 * 8;
  internal::StoreLe<uint32_t>(reinterpret_cast<std::byte*>(huge.data() + count_at), 0xFFFFFFFFu);
  s = DecodeAnnouncement(huge).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s, "checksum count 4294967295")) << s.ToString();

  // The wrong kind of message for the key.
  s = DecodeMembers(good).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "unexpected message kind 4")) << s.ToString();

  // A hello with a malformed layout.
  PublisherHello hello;
  hello.bucket_bytes = 1 << 20;
  hello.max_in_flight = 2;
  hello.layout = testing::BroadcastLayout();
  std::string bad_layout = Encode(hello);
  bad_layout[bad_layout.size() - 1] ^= 0;  // unchanged: sanity
  ASSERT_TRUE(DecodePublisherHello(bad_layout).ok());
  bad_layout.resize(bad_layout.size() - 3);
  EXPECT_EQ(DecodePublisherHello(bad_layout).status().code(), StatusCode::kDataLoss);
  hello.max_in_flight = 0;
  EXPECT_EQ(DecodePublisherHello(Encode(hello)).status().code(), StatusCode::kDataLoss);
  SubscriberHello long_name{1, 1, std::string(200, 'n')};
  s = DecodeSubscriberHello(Encode(long_name)).status();
  EXPECT_TRUE(Contains(s, "over the limit of 128")) << s.ToString();
}

TEST(BroadcastWireTest, GroupNamesAndKeys) {
  EXPECT_TRUE(ValidateGroupName("weights_1-a", "group").ok());
  EXPECT_EQ(ValidateGroupName("", "group").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateGroupName("a/b", "group").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateGroupName(std::string(65, 'a'), "group").code(), StatusCode::kInvalidArgument);
  Keys k("w");
  k.set_epoch(3);
  EXPECT_EQ(k.Hello(), "w/hello");
  EXPECT_EQ(k.Ready(2, 5), "w/e3/g2/ready/5");
  EXPECT_EQ(k.Seq(2, 0), "w/e3/g2/seq/0");
  EXPECT_EQ(k.MeshPrefix(4), "w/e3/g4/mesh/");
}

// The fuzzer's body (core/codec_fuzz.h) on seeded random and mutated
// messages, so the default suite runs the decoders' error paths without
// clang. Every sample decodes as its kind; a few hundred mutated ones still
// decode (the round trip ran). Mutation: DecodeMembers dropping its last id
// breaks the fixed point (abort).
TEST(BroadcastFuzzSmokeTest, SeededRandomAndMutatedMessagesNeverCrash) {
  std::vector<std::vector<uint8_t>> seeds;
  for (const std::string& m : BroadcastSampleMessages()) {
    seeds.emplace_back(m.begin(), m.end());
    EXPECT_GE(FuzzBroadcastMessages(seeds.back().data(), seeds.back().size()), 1) << "sample " << seeds.size();
  }
  sluice::testing::ByteRng rng(20261207);
  int decoded = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> input =
        i % 4 == 0 ? rng.Bytes(rng.Below(200)) : sluice::testing::MutateBytes(seeds[rng.Below(seeds.size())], rng);
    decoded += FuzzBroadcastMessages(input.data(), input.size());
  }
  EXPECT_GT(decoded, 100);
}

}  // namespace
}  // namespace sluice::checkpoint_engine::bcast

// Helpers for the broadcast tests: a layout that exercises sliced, packed
// and empty tensors at the smallest bucket size, unique group names, and
// checks that a store serves one whole version whose every element encodes
// its number (see shm_test_util.h).
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_TEST_UTIL_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_TEST_UTIL_H_

#include <chrono>
#include <memory>
#include <string>

#include "sluice/checkpoint_engine/broadcast.h"
#include "sluice/checkpoint_engine/rendezvous.h"
#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/checkpoint_engine/version_store.h"

namespace sluice::checkpoint_engine::testing {

// The smallest bucket the publisher accepts: the layout below then needs
// 19 buckets (16 slices of "embed", 1 each of "w_i64" and "w_i32", 1 pack).
inline constexpr size_t kTestBucketBytes = size_t{64} << 10;
inline constexpr auto kTestOpTimeout = std::chrono::milliseconds(5000);

// embed F32 [256, 1024] (1 MiB), w_i64 I64 [8192] (64 KiB), w_i32 I32
// [64, 128] (32 KiB), norm F32 [1024] (4 KiB, packed), bias I32 [100]
// (packed), empty F32 [0].
Layout BroadcastLayout();

// "g<pid>x<random>".
std::string UniqueGroup();

std::unique_ptr<RendezvousServer> StartRendezvous();
std::shared_ptr<VersionStore> MakeVersionStore(const Layout& layout);

BroadcastPublisherOptions TestPublisherOptions(const std::string& address, const std::string& group);
BroadcastSubscriberOptions TestSubscriberOptions(const std::string& address, const std::string& group,
                                                 const std::string& name);

// "" if `store` serves a version >= at_least, whole and checksum-valid.
std::string CheckServes(VersionStore& store, int64_t at_least);
// The same for a shared-memory store, through a subscriber attachment.
std::string CheckServes(ShmSubscriber& store, int64_t at_least);

}  // namespace sluice::checkpoint_engine::testing

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_TEST_UTIL_H_

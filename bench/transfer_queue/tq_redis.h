// The Redis baseline of the TransferQueue benchmark: what a team would use
// otherwise. Round trips are pipelined SETs of each row (a key per row), then
// pipelined GETs, then one DEL of the batch's keys (the Ack equivalent), over
// hiredis on loopback. Built without hiredis, every call is Unimplemented.
#ifndef SLUICE_BENCH_TRANSFER_QUEUE_TQ_REDIS_H_
#define SLUICE_BENCH_TRANSFER_QUEUE_TQ_REDIS_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "tq_measure.h"

namespace sluice::bench::tq {

// False when built without hiredis.
bool RedisClientBuilt();

// A round tripper on a fresh connection to 127.0.0.1:port. Unavailable if it
// cannot connect.
Result<std::unique_ptr<RoundTripper>> NewRedisRoundTripper(int port);

// Get latency at batch 1: SETs `samples` keys of `row_bytes` (pipelined),
// then times one GET (a blocking round trip, stamp checked) per key; stops
// early after `max_seconds`; DELs the keys. Seconds per sample.
Result<std::vector<double>> MeasureRedisGetLatency(int port, size_t row_bytes, int samples, double max_seconds);

// Redis Streams with a consumer group, the acknowledged work queue people
// use instead: a producer's Put is a pipelined XADD per row (one round
// trip); a consumer's Take is XACK + XDEL of its previous batch pipelined
// with XREADGROUP COUNT batch BLOCK 100 (one round trip, as the queue's
// Take carries the previous ack). XDEL keeps the stream from growing, as the
// queue frees acked rows.
Status CreateRedisStream(int port, const std::string& stream, const std::string& group);
Status DropRedisStream(int port, const std::string& stream);
Result<std::unique_ptr<QueueProducer>> NewRedisStreamProducer(int port, std::string stream);
Result<std::unique_ptr<QueueConsumer>> NewRedisStreamConsumer(int port, std::string stream, std::string group,
                                                              std::string consumer);

}  // namespace sluice::bench::tq

#endif  // SLUICE_BENCH_TRANSFER_QUEUE_TQ_REDIS_H_

// The Redis baseline over hiredis; see tq_redis.h. Every blocking hiredis
// call is bounded by the connection's timeout (kReplyTimeout).
#include "tq_redis.h"

#include <algorithm>
#include <string>

#include "tq_support.h"

#if defined(SLUICE_TQ_BENCH_HAVE_HIREDIS)
#include <hiredis/hiredis.h>
#include <sys/time.h>
#endif

namespace sluice::bench::tq {

#if defined(SLUICE_TQ_BENCH_HAVE_HIREDIS)

namespace {

constexpr timeval kConnectTimeout{2, 0};
constexpr timeval kReplyTimeout{30, 0};

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// One hiredis connection with pipelining helpers.
class RedisConnection {
 public:
  static Result<std::unique_ptr<RedisConnection>> Connect(int port) {
    redisContext* ctx = redisConnectWithTimeout("127.0.0.1", port, kConnectTimeout);
    if (ctx == nullptr) return Status::Unavailable("redis: cannot allocate a connection");
    std::unique_ptr<RedisConnection> conn(new RedisConnection(ctx));
    if (ctx->err != 0) return Status::Unavailable(std::string("redis: connect: ") + ctx->errstr);
    if (redisSetTimeout(ctx, kReplyTimeout) != REDIS_OK) return Status::Unavailable("redis: cannot set a timeout");
    return conn;
  }
  ~RedisConnection() { redisFree(ctx_); }

  Status Append(const std::vector<const char*>& argv, const std::vector<size_t>& lengths) {
    if (redisAppendCommandArgv(ctx_, static_cast<int>(argv.size()), const_cast<const char**>(argv.data()),
                               lengths.data()) != REDIS_OK) {
      return Error("append");
    }
    return Status::Ok();
  }

  // The next pipelined reply; an error reply is an error.
  Result<Reply> Next() {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) return Error("reply");
    Reply reply(static_cast<redisReply*>(raw));
    if (reply->type == REDIS_REPLY_ERROR) return Status::Internal("redis: " + std::string(reply->str, reply->len));
    return reply;
  }

 private:
  explicit RedisConnection(redisContext* ctx) : ctx_(ctx) {}
  Status Error(const char* what) const {
    return Status::Unavailable(std::string("redis: ") + what + ": " + (ctx_->err != 0 ? ctx_->errstr : "no reply"));
  }
  redisContext* ctx_;
};

std::string KeyOf(uint64_t i) { return "tq:" + std::to_string(i); }

// Pipelined SET of `n` rows whose bytes are rows + i * row_bytes under keys[i].
Status SetRows(RedisConnection& conn, const std::vector<std::string>& keys, const std::byte* rows, size_t row_bytes) {
  for (size_t i = 0; i < keys.size(); ++i) {
    SLUICE_RETURN_IF_ERROR(conn.Append({"SET", keys[i].data(), reinterpret_cast<const char*>(rows + i * row_bytes)},
                                       {3, keys[i].size(), row_bytes}));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    SLUICE_ASSIGN_OR_RETURN(Reply r, conn.Next());
    if (r->type != REDIS_REPLY_STATUS) return Status::Internal("redis: SET did not answer OK");
  }
  return Status::Ok();
}

Status DeleteKeys(RedisConnection& conn, const std::vector<std::string>& keys) {
  std::vector<const char*> argv = {"DEL"};
  std::vector<size_t> lengths = {3};
  for (const std::string& k : keys) {
    argv.push_back(k.data());
    lengths.push_back(k.size());
  }
  SLUICE_RETURN_IF_ERROR(conn.Append(argv, lengths));
  SLUICE_ASSIGN_OR_RETURN(Reply r, conn.Next());
  if (r->type != REDIS_REPLY_INTEGER || r->integer != static_cast<long long>(keys.size())) {
    return Status::DataLoss("redis: DEL removed fewer keys than were set");
  }
  return Status::Ok();
}

Status CheckValue(const redisReply& r, size_t row_bytes, uint64_t stamp) {
  if (r.type != REDIS_REPLY_STRING || r.len != row_bytes ||
      !RowHasStamp(reinterpret_cast<const std::byte*>(r.str), row_bytes, stamp)) {
    return Status::DataLoss("redis: GET returned the wrong value for stamp " + std::to_string(stamp));
  }
  return Status::Ok();
}

class RedisRoundTripper final : public RoundTripper {
 public:
  explicit RedisRoundTripper(std::unique_ptr<RedisConnection> conn) : conn_(std::move(conn)) {}

  Status Put(const std::shared_ptr<std::byte[]>& source, size_t row_bytes, uint32_t batch) override {
    while (keys_.size() < batch) keys_.push_back(KeyOf(keys_.size()));
    keys_.resize(batch);
    return SetRows(*conn_, keys_, source.get(), row_bytes);
  }

  Status Get(size_t row_bytes, uint32_t batch, uint64_t first_stamp) override {
    for (uint32_t i = 0; i < batch; ++i) {
      SLUICE_RETURN_IF_ERROR(conn_->Append({"GET", keys_[i].data()}, {3, keys_[i].size()}));
    }
    for (uint32_t i = 0; i < batch; ++i) {
      SLUICE_ASSIGN_OR_RETURN(Reply r, conn_->Next());
      SLUICE_RETURN_IF_ERROR(CheckValue(*r, row_bytes, first_stamp + i));
    }
    return DeleteKeys(*conn_, keys_);
  }

 private:
  std::unique_ptr<RedisConnection> conn_;
  std::vector<std::string> keys_;
};

}  // namespace

bool RedisClientBuilt() { return true; }

Result<std::unique_ptr<RoundTripper>> NewRedisRoundTripper(int port) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RedisConnection> conn, RedisConnection::Connect(port));
  return std::unique_ptr<RoundTripper>(new RedisRoundTripper(std::move(conn)));
}

Result<std::vector<double>> MeasureRedisGetLatency(int port, size_t row_bytes, int samples, double max_seconds) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RedisConnection> conn, RedisConnection::Connect(port));
  constexpr int kPutBatch = 256;
  std::shared_ptr<std::byte[]> source = AllocateTouched(row_bytes * kPutBatch);
  std::vector<std::string> all_keys;
  for (int done = 0; done < samples; done += kPutBatch) {
    std::vector<std::string> keys;
    for (int i = done; i < std::min(samples, done + kPutBatch); ++i) {
      StampRow(source.get() + (i - done) * row_bytes, row_bytes, static_cast<uint64_t>(i) + 1);
      keys.push_back(KeyOf(static_cast<uint64_t>(i)));
    }
    SLUICE_RETURN_IF_ERROR(SetRows(*conn, keys, source.get(), row_bytes));
    all_keys.insert(all_keys.end(), keys.begin(), keys.end());
  }
  std::vector<double> latencies;
  latencies.reserve(samples);
  const auto start = Clock::now();
  for (int i = 0; i < samples && Seconds(Clock::now() - start) < max_seconds; ++i) {
    const auto t0 = Clock::now();
    SLUICE_RETURN_IF_ERROR(conn->Append({"GET", all_keys[i].data()}, {3, all_keys[i].size()}));
    SLUICE_ASSIGN_OR_RETURN(Reply r, conn->Next());
    SLUICE_RETURN_IF_ERROR(CheckValue(*r, row_bytes, static_cast<uint64_t>(i) + 1));
    latencies.push_back(Seconds(Clock::now() - t0));
  }
  SLUICE_RETURN_IF_ERROR(DeleteKeys(*conn, all_keys));
  return latencies;
}

#else  // no hiredis

bool RedisClientBuilt() { return false; }

Result<std::unique_ptr<RoundTripper>> NewRedisRoundTripper(int) {
  return Status::Unimplemented("built without hiredis");
}

Result<std::vector<double>> MeasureRedisGetLatency(int, size_t, int, double) {
  return Status::Unimplemented("built without hiredis");
}

#endif

}  // namespace sluice::bench::tq

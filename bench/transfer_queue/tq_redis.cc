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

class StreamProducer final : public QueueProducer {
 public:
  StreamProducer(std::unique_ptr<RedisConnection> conn, std::string stream)
      : conn_(std::move(conn)), stream_(std::move(stream)) {}
  Status Put(const std::byte* rows, size_t row_bytes, uint32_t batch) override {
    for (uint32_t i = 0; i < batch; ++i) {
      SLUICE_RETURN_IF_ERROR(
          conn_->Append({"XADD", stream_.data(), "*", "p", reinterpret_cast<const char*>(rows + i * row_bytes)},
                        {4, stream_.size(), 1, 1, row_bytes}));
    }
    for (uint32_t i = 0; i < batch; ++i) {
      SLUICE_ASSIGN_OR_RETURN(Reply r, conn_->Next());
      if (r->type != REDIS_REPLY_STRING) return Status::Internal("redis: XADD did not answer an id");
    }
    return Status::Ok();
  }

 private:
  std::unique_ptr<RedisConnection> conn_;
  std::string stream_;
};

class StreamConsumer final : public QueueConsumer {
 public:
  StreamConsumer(std::unique_ptr<RedisConnection> conn, std::string stream, std::string group, std::string consumer)
      : conn_(std::move(conn)), stream_(std::move(stream)), group_(std::move(group)), consumer_(std::move(consumer)) {}

  Result<uint32_t> Take(uint32_t batch, size_t row_bytes) override {
    const bool acking = !pending_.empty();
    if (acking) SLUICE_RETURN_IF_ERROR(AppendAck());
    const std::string count = std::to_string(batch);
    SLUICE_RETURN_IF_ERROR(
        conn_->Append({"XREADGROUP", "GROUP", group_.data(), consumer_.data(), "COUNT", count.data(), "BLOCK", "100",
                       "STREAMS", stream_.data(), ">"},
                      {10, 5, group_.size(), consumer_.size(), 5, count.size(), 5, 3, 7, stream_.size(), 1}));
    if (acking) SLUICE_RETURN_IF_ERROR(ReadAckReplies());
    SLUICE_ASSIGN_OR_RETURN(Reply r, conn_->Next());
    if (r->type == REDIS_REPLY_NIL) return 0u;  // nothing within BLOCK
    // [[stream, [[id, [field, value]], ...]]]
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 1 || r->element[0]->type != REDIS_REPLY_ARRAY ||
        r->element[0]->elements != 2 || r->element[0]->element[1]->type != REDIS_REPLY_ARRAY) {
      return Status::DataLoss("redis: XREADGROUP reply has an unexpected shape");
    }
    const redisReply* entries = r->element[0]->element[1];
    for (size_t i = 0; i < entries->elements; ++i) {
      const redisReply* e = entries->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements != 2 || e->element[1]->type != REDIS_REPLY_ARRAY ||
          e->element[1]->elements != 2) {
        return Status::DataLoss("redis: XREADGROUP entry has an unexpected shape");
      }
      const redisReply* value = e->element[1]->element[1];
      const auto* bytes = reinterpret_cast<const std::byte*>(value->str);
      if (value->type != REDIS_REPLY_STRING || value->len != row_bytes ||
          !RowHasStamp(bytes, row_bytes, LoadStamp(bytes))) {
        return Status::DataLoss("redis: a stream entry of the wrong size or with torn stamps");
      }
      pending_.emplace_back(e->element[0]->str, e->element[0]->len);
    }
    return static_cast<uint32_t>(entries->elements);
  }

  Status Finish() override {
    if (pending_.empty()) return Status::Ok();
    SLUICE_RETURN_IF_ERROR(AppendAck());
    return ReadAckReplies();
  }

 private:
  // XACK and XDEL of the pending ids (two commands, replies read later).
  Status AppendAck() {
    for (const char* verb : {"XACK", "XDEL"}) {
      std::vector<const char*> argv = {verb, stream_.data()};
      std::vector<size_t> lengths = {4, stream_.size()};
      if (verb[1] == 'A') {
        argv.push_back(group_.data());
        lengths.push_back(group_.size());
      }
      for (const std::string& id : pending_) {
        argv.push_back(id.data());
        lengths.push_back(id.size());
      }
      SLUICE_RETURN_IF_ERROR(conn_->Append(argv, lengths));
    }
    return Status::Ok();
  }
  Status ReadAckReplies() {
    for (int i = 0; i < 2; ++i) {
      SLUICE_ASSIGN_OR_RETURN(Reply r, conn_->Next());
      if (r->type != REDIS_REPLY_INTEGER || r->integer != static_cast<long long>(pending_.size())) {
        return Status::DataLoss("redis: XACK/XDEL touched fewer entries than were read");
      }
    }
    pending_.clear();
    return Status::Ok();
  }

  std::unique_ptr<RedisConnection> conn_;
  std::string stream_, group_, consumer_;
  std::vector<std::string> pending_;  // ids read, to ack with the next Take
};

}  // namespace

bool RedisClientBuilt() { return true; }

Status CreateRedisStream(int port, const std::string& stream, const std::string& group) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RedisConnection> conn, RedisConnection::Connect(port));
  SLUICE_RETURN_IF_ERROR(conn->Append({"XGROUP", "CREATE", stream.data(), group.data(), "0", "MKSTREAM"},
                                      {6, 6, stream.size(), group.size(), 1, 8}));
  return conn->Next().status();
}

Status DropRedisStream(int port, const std::string& stream) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RedisConnection> conn, RedisConnection::Connect(port));
  SLUICE_RETURN_IF_ERROR(conn->Append({"DEL", stream.data()}, {3, stream.size()}));
  return conn->Next().status();
}

Result<std::unique_ptr<QueueProducer>> NewRedisStreamProducer(int port, std::string stream) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RedisConnection> conn, RedisConnection::Connect(port));
  return std::unique_ptr<QueueProducer>(new StreamProducer(std::move(conn), std::move(stream)));
}

Result<std::unique_ptr<QueueConsumer>> NewRedisStreamConsumer(int port, std::string stream, std::string group,
                                                              std::string consumer) {
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RedisConnection> conn, RedisConnection::Connect(port));
  return std::unique_ptr<QueueConsumer>(
      new StreamConsumer(std::move(conn), std::move(stream), std::move(group), std::move(consumer)));
}

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
Status CreateRedisStream(int, const std::string&, const std::string&) {
  return Status::Unimplemented("built without hiredis");
}
Status DropRedisStream(int, const std::string&) { return Status::Unimplemented("built without hiredis"); }
Result<std::unique_ptr<QueueProducer>> NewRedisStreamProducer(int, std::string) {
  return Status::Unimplemented("built without hiredis");
}
Result<std::unique_ptr<QueueConsumer>> NewRedisStreamConsumer(int, std::string, std::string, std::string) {
  return Status::Unimplemented("built without hiredis");
}

#endif

}  // namespace sluice::bench::tq

// Round trips, Get latency and backpressure of the TransferQueue benchmark;
// see tq_measure.h.
#include "tq_measure.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "tq_support.h"

namespace sluice::bench::tq {

using transfer_queue::AckResponse;
using transfer_queue::BatchData;
using transfer_queue::BatchMeta;
using transfer_queue::CapacityWait;
using transfer_queue::ColumnBatch;
using transfer_queue::RowTags;
using transfer_queue::TransferQueueClient;

namespace {

// GetMeta waits this long for rows that were committed before it was called:
// it returns at once unless something is wrong.
constexpr std::chrono::milliseconds kGetMetaTimeout{5000};

// Row i of `rows` as a tensor of the payload column (a view, kept alive by
// `owner` if any; PutRows copies).
ColumnBatch PayloadColumn(const std::byte* rows, std::shared_ptr<const void> owner, size_t row_bytes, uint32_t batch) {
  ColumnBatch columns;
  std::vector<HostTensor>& tensors = columns[kColumn];
  tensors.reserve(batch);
  for (uint32_t i = 0; i < batch; ++i) {
    HostTensor t;
    t.dtype = DType::kU8;
    t.shape = {static_cast<int64_t>(row_bytes)};
    t.owner = owner;
    t.data = rows + i * row_bytes;
    t.nbytes = row_bytes;
    tensors.push_back(std::move(t));
  }
  return columns;
}

Status CheckPayload(const BatchData& data, size_t row_bytes, uint64_t first_stamp) {
  auto it = data.columns.find(kColumn);
  if (it == data.columns.end()) return Status::DataLoss("GetData returned no payload column");
  const std::vector<HostTensor>& tensors = it->second;
  if (tensors.size() != data.rows.size()) return Status::DataLoss("GetData returned a tensor count unlike the rows");
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].nbytes != row_bytes || tensors[i].data == nullptr ||
        !RowHasStamp(tensors[i].data, row_bytes, first_stamp + i)) {
      return Status::DataLoss("row " + std::to_string(data.rows[i]) + " does not carry stamp " +
                              std::to_string(first_stamp + i));
    }
  }
  return Status::Ok();
}

class MemcpyRoundTripper final : public RoundTripper {
 public:
  MemcpyRoundTripper(size_t row_bytes, uint32_t batch)
      : store_(AllocateTouched(row_bytes * batch)), out_(AllocateTouched(row_bytes * batch)) {}

  Status Put(const std::shared_ptr<std::byte[]>& source, size_t row_bytes, uint32_t batch) override {
    for (uint32_t i = 0; i < batch; ++i) {
      std::memcpy(store_.get() + i * row_bytes, source.get() + i * row_bytes, row_bytes);
    }
    return Status::Ok();
  }

  Status Get(size_t row_bytes, uint32_t batch, uint64_t first_stamp) override {
    for (uint32_t i = 0; i < batch; ++i) {
      std::byte* row = out_.get() + i * row_bytes;
      std::memcpy(row, store_.get() + i * row_bytes, row_bytes);
      if (!RowHasStamp(row, row_bytes, first_stamp + i)) return Status::DataLoss("memcpy lost a stamp");
    }
    return Status::Ok();
  }

 private:
  std::shared_ptr<std::byte[]> store_;
  std::shared_ptr<std::byte[]> out_;
};

class QueueRoundTripper final : public RoundTripper {
 public:
  QueueRoundTripper(TransferQueueClient client, std::string partition, bool steps)
      : client_(std::move(client)), partition_(std::move(partition)), steps_(steps) {}

  Status Put(const std::shared_ptr<std::byte[]>& source, size_t row_bytes, uint32_t batch) override {
    SLUICE_ASSIGN_OR_RETURN(std::vector<transfer_queue::RowId> rows,
                            client_.PutRows(partition_, std::vector<RowTags>(batch),
                                            PayloadColumn(source.get(), source, row_bytes, batch)));
    if (rows.size() != batch) return Status::DataLoss("PutRows created " + std::to_string(rows.size()) + " rows");
    return Status::Ok();
  }

  Status Get(size_t row_bytes, uint32_t batch, uint64_t first_stamp) override {
    transfer_queue::GetMetaRequest request;
    request.task = kTask;
    request.columns = {kColumn};
    request.n = batch;
    request.partition = partition_;
    request.timeout = kGetMetaTimeout;
    if (steps_) {
      SLUICE_ASSIGN_OR_RETURN(BatchMeta meta, client_.GetMeta(request));
      if (meta.rows.size() != batch) return Status::DataLoss("GetMeta leased " + std::to_string(meta.rows.size()));
      SLUICE_ASSIGN_OR_RETURN(BatchData data, client_.GetData(meta));
      SLUICE_RETURN_IF_ERROR(CheckPayload(data, row_bytes, first_stamp));
      SLUICE_ASSIGN_OR_RETURN(AckResponse ack, client_.Ack(meta.lease_id));
      if (ack.rows_acked != batch) return Status::DataLoss("Ack acked " + std::to_string(ack.rows_acked) + " rows");
      return Status::Ok();
    }
    SLUICE_ASSIGN_OR_RETURN(transfer_queue::TakenBatch taken, client_.Take(request, {}, pending_ack_));
    pending_ack_ = taken.meta.lease_id;
    if (taken.meta.rows.size() != batch) {
      return Status::DataLoss("Take leased " + std::to_string(taken.meta.rows.size()) + " rows");
    }
    return CheckPayload(taken.data, row_bytes, first_stamp);
  }

  Status Finish() override {
    if (pending_ack_ != 0) SLUICE_RETURN_IF_ERROR(client_.Ack(pending_ack_).status());
    pending_ack_ = 0;
    SLUICE_ASSIGN_OR_RETURN(transfer_queue::ClearResponse cleared, client_.ClearPartition(partition_));
    if (cleared.rows_cleared != 0) {
      return Status::DataLoss(std::to_string(cleared.rows_cleared) + " rows were left unacked in " + partition_);
    }
    return Status::Ok();
  }

 private:
  TransferQueueClient client_;
  std::string partition_;
  bool steps_;
  transfer_queue::LeaseId pending_ack_ = 0;  // rides on the next Take
};

class QueueProducerImpl final : public QueueProducer {
 public:
  QueueProducerImpl(TransferQueueClient client, std::string partition)
      : client_(std::move(client)), partition_(std::move(partition)) {}
  Status Put(const std::byte* rows, size_t row_bytes, uint32_t batch) override {
    const ColumnBatch columns = PayloadColumn(rows, nullptr, row_bytes, batch);
    // Waits (bounded) while the queue is at capacity: producers cannot run
    // away from consumers.
    return client_
        .PutRows(partition_, std::vector<RowTags>(batch), columns, transfer_queue::CapacityWait{true, kGetMetaTimeout})
        .status();
  }

 private:
  TransferQueueClient client_;
  std::string partition_;
};

class QueueConsumerImpl final : public QueueConsumer {
 public:
  QueueConsumerImpl(TransferQueueClient client, std::string partition) : client_(std::move(client)) {
    request_.task = kTask;
    request_.columns = {kColumn};
    request_.partition = std::move(partition);
    request_.timeout = std::chrono::milliseconds(100);
  }
  Result<uint32_t> Take(uint32_t batch, size_t row_bytes) override {
    request_.n = batch;
    Result<transfer_queue::TakenBatch> taken = client_.Take(request_, {}, pending_ack_);
    pending_ack_ = 0;
    if (!taken.ok()) {
      if (taken.status().code() == StatusCode::kTimeout) return 0u;
      return taken.status();
    }
    pending_ack_ = taken->meta.lease_id;
    for (const HostTensor& t : taken->data.columns.at(kColumn)) {
      if (t.nbytes != row_bytes || !RowHasStamp(t.data, row_bytes, LoadStamp(t.data))) {
        return Status::DataLoss("Take returned a row of the wrong size or with torn stamps");
      }
    }
    return static_cast<uint32_t>(taken->meta.rows.size());
  }
  Status Finish() override {
    if (pending_ack_ == 0) return Status::Ok();
    const transfer_queue::LeaseId lease = std::exchange(pending_ack_, 0);
    return client_.Ack(lease).status();
  }

 private:
  TransferQueueClient client_;
  transfer_queue::GetMetaRequest request_;
  transfer_queue::LeaseId pending_ack_ = 0;
};

}  // namespace

std::unique_ptr<QueueProducer> NewQueueProducer(TransferQueueClient client, std::string partition) {
  return std::make_unique<QueueProducerImpl>(std::move(client), std::move(partition));
}
std::unique_ptr<QueueConsumer> NewQueueConsumer(TransferQueueClient client, std::string partition) {
  return std::make_unique<QueueConsumerImpl>(std::move(client), std::move(partition));
}

Status SetUpQueue(TransferQueueClient& client) {
  SLUICE_RETURN_IF_ERROR(client.RegisterColumns({{kColumn, DType::kU8, {transfer_queue::kRaggedDim}}}));
  return client.RegisterTask(kTask);
}

Result<RoundTripResult> RunRoundTrips(RoundTripper& transport, size_t row_bytes, uint32_t batch,
                                      const LoopBounds& bounds) {
  std::shared_ptr<std::byte[]> source = AllocateTouched(row_bytes * batch);
  uint64_t stamp = 1;
  // split: read the clock between put and get (adds ~3 clock reads).
  auto round_trip = [&](bool split, double& put, double& get) -> Status {
    for (uint32_t i = 0; i < batch; ++i) StampRow(source.get() + i * row_bytes, row_bytes, stamp + i);
    const auto t0 = split ? Clock::now() : Clock::time_point();
    SLUICE_RETURN_IF_ERROR(transport.Put(source, row_bytes, batch));
    const auto t1 = split ? Clock::now() : Clock::time_point();
    SLUICE_RETURN_IF_ERROR(transport.Get(row_bytes, batch, stamp));
    if (split) {
      put += Seconds(t1 - t0);
      get += Seconds(Clock::now() - t1);
    }
    stamp += batch;
    return Status::Ok();
  };

  RoundTripResult result;
  double warm_put = 0, warm_get = 0;
  SLUICE_RETURN_IF_ERROR(round_trip(true, warm_put, warm_get));
  result.warmup_seconds = warm_put + warm_get;
  const bool split = result.warmup_seconds >= kSplitMinSeconds;
  // Without the split, the time limit is checked every 64 round trips only.
  const int64_t check_every = split ? 1 : 64;
  for (int r = 0; r < bounds.repeats; ++r) {
    double put = 0, get = 0;
    int64_t n = 0;
    const auto start = Clock::now();
    do {
      SLUICE_RETURN_IF_ERROR(round_trip(split, put, get));
      ++n;
    } while (n < bounds.max_iterations &&
             (n % check_every != 0 || Seconds(Clock::now() - start) < bounds.seconds_per_repeat));
    const double count = static_cast<double>(n);
    result.round_trip_seconds.push_back(Seconds(Clock::now() - start) / count);
    if (split) {
      result.put_seconds.push_back(put / count);
      result.get_seconds.push_back(get / count);
    }
    result.iterations.push_back(n);
  }
  SLUICE_RETURN_IF_ERROR(transport.Finish());
  return result;
}

std::unique_ptr<RoundTripper> NewMemcpyRoundTripper(size_t row_bytes, uint32_t batch) {
  return std::make_unique<MemcpyRoundTripper>(row_bytes, batch);
}

Result<std::unique_ptr<RoundTripper>> NewQueueRoundTripper(TransferQueueClient client, std::string partition,
                                                           bool steps) {
  SLUICE_RETURN_IF_ERROR(client.CreatePartition(partition));
  return std::unique_ptr<RoundTripper>(new QueueRoundTripper(std::move(client), std::move(partition), steps));
}

Result<std::vector<double>> MeasureQueueGetLatency(TransferQueueClient client, const std::string& partition,
                                                   size_t row_bytes, int samples, double max_seconds) {
  SLUICE_RETURN_IF_ERROR(client.CreatePartition(partition));
  constexpr uint32_t kPutBatch = 256;
  std::shared_ptr<std::byte[]> source = AllocateTouched(row_bytes * kPutBatch);
  for (int done = 0; done < samples;) {
    const uint32_t n = static_cast<uint32_t>(std::min<int>(kPutBatch, samples - done));
    for (uint32_t i = 0; i < n; ++i) StampRow(source.get() + i * row_bytes, row_bytes, done + i + 1);
    SLUICE_RETURN_IF_ERROR(
        client.PutRows(partition, std::vector<RowTags>(n), PayloadColumn(source.get(), source, row_bytes, n)).status());
    done += static_cast<int>(n);
  }
  std::vector<double> latencies;
  latencies.reserve(samples);
  transfer_queue::GetMetaRequest request;
  request.task = kTask;
  request.columns = {kColumn};
  request.n = 1;
  request.partition = partition;
  request.timeout = kGetMetaTimeout;
  transfer_queue::LeaseId pending_ack = 0;  // rides on the next Take
  const auto start = Clock::now();
  for (int i = 0; i < samples && Seconds(Clock::now() - start) < max_seconds; ++i) {
    const auto t0 = Clock::now();
    SLUICE_ASSIGN_OR_RETURN(transfer_queue::TakenBatch taken, client.Take(request, {}, pending_ack));
    SLUICE_RETURN_IF_ERROR(CheckPayload(taken.data, row_bytes, static_cast<uint64_t>(i) + 1));
    latencies.push_back(Seconds(Clock::now() - t0));
    pending_ack = taken.meta.lease_id;
  }
  if (pending_ack != 0) SLUICE_RETURN_IF_ERROR(client.Ack(pending_ack).status());
  SLUICE_RETURN_IF_ERROR(client.ClearPartition(partition).status());
  return latencies;
}

Result<BackpressureResult> MeasureBackpressure(TransferQueueClient client, pid_t rss_pid,
                                               const std::string& shm_segment,
                                               const std::function<uint64_t()>& exact_peak,
                                               const BackpressureConfig& config) {
  const std::string partition = "backpressure";
  SLUICE_RETURN_IF_ERROR(SetUpQueue(client));
  SLUICE_RETURN_IF_ERROR(client.CreatePartition(partition));
  const size_t row_bytes = config.row_bytes;
  const uint32_t per_call = config.rows_per_call;
  std::shared_ptr<std::byte[]> source = AllocateTouched(row_bytes * per_call);

  BackpressureResult result;
  result.rss_before = ResidentBytes(rss_pid);
  result.shm_before = ShmSegmentBytes(shm_segment);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> rows_put{0}, rows_got{0}, waits{0};
  Status producer_status, consumer_status;
  // Short waits so both threads notice `stop` quickly; a full queue simply
  // makes the producer wait again.
  const std::chrono::milliseconds kPoll{200};
  {
    std::jthread producer([&] {
      uint64_t next = 1;
      while (!stop.load()) {
        for (uint32_t i = 0; i < per_call; ++i) StampRow(source.get() + i * row_bytes, row_bytes, next + i);
        Status s = client
                       .PutRows(partition, std::vector<RowTags>(per_call),
                                PayloadColumn(source.get(), source, row_bytes, per_call), CapacityWait{true, kPoll})
                       .status();
        if (s.code() == StatusCode::kTimeout) {
          waits.fetch_add(1);
          continue;
        }
        if (!s.ok()) {
          producer_status = s.WithContext("producer");
          break;
        }
        next += per_call;
        rows_put.fetch_add(per_call);
      }
    });
    std::jthread consumer([&] {
      uint64_t next = 1;
      while (!stop.load()) {
        Result<BatchMeta> meta = client.GetMeta(kTask, {kColumn}, per_call, partition, {}, kPoll);
        if (!meta.ok() && meta.status().code() == StatusCode::kTimeout) continue;
        Status s = meta.status();
        if (s.ok()) {
          Result<BatchData> data = client.GetData(*meta);
          s = data.ok() ? CheckPayload(*data, row_bytes, next) : data.status();
        }
        if (s.ok()) s = client.Ack(meta->lease_id).status();
        if (!s.ok()) {
          consumer_status = s.WithContext("consumer");
          break;
        }
        next += per_call;
        rows_got.fetch_add(per_call);
        std::this_thread::sleep_for(config.consumer_pause);
      }
    });
    const auto start = Clock::now();
    while (Seconds(Clock::now() - start) < config.seconds) {
      Result<transfer_queue::ControllerStats> stats = client.controller()->Stats();
      if (stats.ok()) result.peak_bytes_held = std::max(result.peak_bytes_held, stats->bytes_held);
      result.rss_peak = std::max(result.rss_peak, ResidentBytes(rss_pid));
      result.shm_peak = std::max(result.shm_peak, ShmSegmentBytes(shm_segment));
      ++result.samples;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    stop.store(true);
  }  // joins both threads (each notices `stop` within kPoll + one call)
  SLUICE_RETURN_IF_ERROR(producer_status);
  SLUICE_RETURN_IF_ERROR(consumer_status);
  result.rows_put = rows_put.load();
  result.rows_got = rows_got.load();
  result.producer_waits = waits.load();
  if (exact_peak) result.exact_peak_bytes = exact_peak();
  SLUICE_RETURN_IF_ERROR(client.ClearPartition(partition).status());
  return result;
}

}  // namespace sluice::bench::tq

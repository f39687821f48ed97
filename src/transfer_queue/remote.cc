// RemoteController and RemoteStorageUnit: the Controller and StorageUnit
// interfaces over an RpcChannel. Each method is one request/reply; the only
// logic here is how long a request may block on the server.
#include "sluice/transfer_queue/remote.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "rpc_channel.h"
#include "wire.h"

namespace sluice::transfer_queue {
namespace {

using internal::RpcChannel;
using std::chrono::milliseconds;
using wire::MessageTraits;
using wire::MessageType;

// How long the server may hold a producer call waiting for capacity.
milliseconds Blocking(const CapacityWait& wait) {
  return wait.block ? std::max(wait.timeout, milliseconds(0)) : milliseconds(0);
}

class RemoteController final : public Controller {
 public:
  explicit RemoteController(std::shared_ptr<RpcChannel> channel) : channel_(std::move(channel)) {}

  Status RegisterColumns(const RegisterColumnsRequest& r) override {
    return Call<MessageType::kRegisterColumns>(r).status();
  }
  Status RegisterTask(const RegisterTaskRequest& r) override { return Call<MessageType::kRegisterTask>(r).status(); }
  Result<DescribeResponse> Describe() override { return Call<MessageType::kDescribe>(wire::Empty{}); }
  Result<CreatePartitionResponse> CreatePartition(const CreatePartitionRequest& r) override {
    return Call<MessageType::kCreatePartition>(r);
  }
  Result<CreateRowsResponse> CreateRows(const CreateRowsRequest& r) override {
    return Call<MessageType::kCreateRows>(r, Blocking(r.wait));
  }
  Result<BeginWriteResponse> BeginWrite(const BeginWriteRequest& r) override {
    return Call<MessageType::kBeginWrite>(r, Blocking(r.wait));
  }
  Status CommitWrite(const CommitWriteRequest& r) override { return Call<MessageType::kCommitWrite>(r).status(); }
  Status AbortWrite(const AbortWriteRequest& r) override { return Call<MessageType::kAbortWrite>(r).status(); }
  Result<BatchMeta> GetMeta(const GetMetaRequest& r) override {
    return Call<MessageType::kGetMeta>(r, std::max(r.timeout, milliseconds(0)));
  }
  Result<AckResponse> Ack(const AckRequest& r) override { return Call<MessageType::kAck>(r); }
  Result<ReleaseResponse> Release(const ReleaseRequest& r) override { return Call<MessageType::kRelease>(r); }
  Result<ClearResponse> ClearPartition(const ClearPartitionRequest& r) override {
    return Call<MessageType::kClearPartition>(r);
  }
  Result<std::vector<KvEntry>> KvLookup(const KvLookupRequest& r) override { return Call<MessageType::kKvLookup>(r); }
  Result<std::vector<KvEntry>> KvList(const KvListRequest& r) override { return Call<MessageType::kKvList>(r); }
  Result<ClearResponse> KvClear(const KvClearRequest& r) override { return Call<MessageType::kKvClear>(r); }
  Status FinishReclaim(const FinishReclaimRequest& r) override { return Call<MessageType::kFinishReclaim>(r).status(); }
  Result<ControllerStats> Stats() override { return Call<MessageType::kStats>(wire::Empty{}); }
  void Close() override { closed_.store(true); }

 private:
  template <MessageType T>
  Result<typename MessageTraits<T>::Reply> Call(const typename MessageTraits<T>::Request& request,
                                                milliseconds blocking = milliseconds(0)) {
    if (closed_.load()) {
      return Status::Aborted("remote controller for " + channel_->endpoint() + " was closed");
    }
    return channel_->Call<typename MessageTraits<T>::Reply>(T, 0, request, blocking);
  }

  std::shared_ptr<RpcChannel> channel_;
  std::atomic<bool> closed_{false};
};

class RemoteStorageUnit final : public StorageUnit {
 public:
  RemoteStorageUnit(std::shared_ptr<RpcChannel> channel, uint32_t unit)
      : channel_(std::move(channel)), unit_(static_cast<uint16_t>(unit)) {}

  Status Write(const StorageWriteRequest& r) override { return Call<MessageType::kStorageWrite>(r).status(); }
  Result<StorageReadResponse> Read(const StorageReadRequest& r) override { return Call<MessageType::kStorageRead>(r); }
  Status Discard(const StorageDiscardRequest& r) override { return Call<MessageType::kStorageDiscard>(r).status(); }
  Status FreeRows(const StorageFreeRequest& r) override { return Call<MessageType::kStorageFreeRows>(r).status(); }
  Result<StorageStats> Stats() override { return Call<MessageType::kStorageStats>(wire::Empty{}); }

 private:
  template <MessageType T>
  Result<typename MessageTraits<T>::Reply> Call(const typename MessageTraits<T>::Request& request) {
    return channel_->Call<typename MessageTraits<T>::Reply>(T, unit_, request, milliseconds(0));
  }

  std::shared_ptr<RpcChannel> channel_;
  const uint16_t unit_;
};

Status CheckUnit(uint32_t unit) {
  if (unit >= wire::kMaxStorageUnits) {
    return Status::InvalidArgument("storage unit " + std::to_string(unit) + " is out of range (at most " +
                                   std::to_string(wire::kMaxStorageUnits) + " units)");
  }
  return Status::Ok();
}

}  // namespace

Result<RemoteQueue> ConnectTransferQueue(const std::string& endpoint, RemoteOptions options) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<RpcChannel> channel, RpcChannel::Create(endpoint, std::move(options)));
  Result<wire::ServerInfo> info =
      channel->Call<wire::ServerInfo>(MessageType::kServerInfo, 0, wire::Empty{}, milliseconds(0));
  if (!info.ok()) return info.status().WithContext("connecting to TransferQueue server " + endpoint);
  if (info->protocol_version != wire::kProtocolVersion) {
    return Status::Unimplemented("TransferQueue server " + endpoint + " speaks protocol version " +
                                 std::to_string(info->protocol_version) + ", this build speaks version " +
                                 std::to_string(wire::kProtocolVersion));
  }
  if (info->storage_units == 0 || info->storage_units > wire::kMaxStorageUnits) {
    return Status::DataLoss("TransferQueue server " + endpoint + " reports " + std::to_string(info->storage_units) +
                            " storage units");
  }
  channel->RaiseLimits(*info);
  RemoteQueue queue;
  queue.endpoint = endpoint;
  queue.token_required = info->token_required;
  queue.controller = std::make_shared<RemoteController>(channel);
  for (uint32_t u = 0; u < info->storage_units; ++u) {
    queue.storage.push_back(std::make_shared<RemoteStorageUnit>(channel, u));
  }
  return queue;
}

Result<std::shared_ptr<Controller>> NewRemoteController(const std::string& endpoint, RemoteOptions options) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<RpcChannel> channel, RpcChannel::Create(endpoint, std::move(options)));
  return std::shared_ptr<Controller>(std::make_shared<RemoteController>(std::move(channel)));
}

Result<std::shared_ptr<StorageUnit>> NewRemoteStorageUnit(const std::string& endpoint, uint32_t unit,
                                                          RemoteOptions options) {
  SLUICE_RETURN_IF_ERROR(CheckUnit(unit));
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<RpcChannel> channel, RpcChannel::Create(endpoint, std::move(options)));
  return std::shared_ptr<StorageUnit>(std::make_shared<RemoteStorageUnit>(std::move(channel), unit));
}

}  // namespace sluice::transfer_queue

// Storage units on other hosts (ServerOptions::storage_hosts): a
// controller's server's link to one storage server, and the checks both
// ends make of where the units live.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_STORAGE_HOSTS_H_
#define SLUICE_SRC_TRANSFER_QUEUE_STORAGE_HOSTS_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/transfer_queue/storage.h"
#include "wire/wire.h"

namespace sluice::transfer_queue::internal {

class RpcChannel;

// A storage server as its controller's server sees it: its units (calls
// carry the peer token) and the declaration of writes into them.
class StorageHostLink {
 public:
  // Connects to the storage server at `host.endpoint` and checks it serves
  // the hub's layout (Unavailable if it does not answer within `timeout`,
  // FailedPrecondition if it serves other units).
  static Result<std::unique_ptr<StorageHostLink>> Connect(const wire::UnitHost& host, uint32_t storage_units,
                                                          const std::string& peer_token,
                                                          std::chrono::milliseconds timeout);
  const wire::UnitHost& host() const { return host_; }
  bool Holds(uint32_t unit) const { return unit >= host_.first_unit && unit - host_.first_unit < host_.count; }
  // Its units, first_unit first.
  const std::vector<std::shared_ptr<StorageUnit>>& units() const { return units_; }
  Status Declare(const wire::DeclareWriteRequest& request);

 private:
  StorageHostLink() = default;
  wire::UnitHost host_;
  std::shared_ptr<RpcChannel> channel_;
  std::vector<std::shared_ptr<StorageUnit>> units_;
};

// Ranges of units elsewhere, checked against a hub of `storage_units` units:
// each non-empty, inside the hub, none overlapping another, an endpoint each.
// `what` names the source in errors.
Status CheckUnitHosts(const std::vector<wire::UnitHost>& hosts, uint32_t storage_units, const std::string& what);

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_STORAGE_HOSTS_H_

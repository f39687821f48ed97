// Data-parallel trainer ranks: one process group of N trainer processes
// (torch's c10d ProcessGroupGloo over a c10d TCPStore, the store torchrun
// uses), through which a Trainer all-reduces its gradients and the sums its
// metrics and loss normalizers are made of. Every rank keeps a whole copy of
// the model and the optimizer state; each trains its shard of every
// mini-batch (DataParallelShard), and because the gradients, the token counts
// that normalize the loss and the gradient norm are all global, N ranks take
// the same optimizer step as one process given the same batch (within float
// rounding).
//
// Every collective is bounded by the group's timeout: a rank that died or
// never joined turns into DeadlineExceeded / Unavailable on the others, never
// a hang. After such an error the group is broken; the ranks are to be
// restarted together.
//
// Thread safety: one owner thread per group (the trainer's); collectives must
// be issued in the same order on every rank.
#ifndef SLUICE_TRAINER_DATA_PARALLEL_H_
#define SLUICE_TRAINER_DATA_PARALLEL_H_

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/status.h"

namespace sluice::trainer {

struct DataParallelOptions {
  int64_t rank = 0;
  int64_t world_size = 1;
  // The rendezvous: a TCPStore at master_addr:master_port, served by rank 0
  // (port 0 there: any free port, see DataParallelGroup::store_port) unless
  // the launcher already serves one there (torchrun's agent store).
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool store_served_by_launcher = false;
  // Non-empty: the ranks are on one host and meet through c10d's FileStore
  // at this path instead (nothing listens on the network; the TCPStore
  // listens on every interface). master_addr and master_port are unused.
  std::string store_file;
  // Where in the store this group's keys live (its collectives' and the
  // shared values): one run attempt's own namespace, so that a store that
  // outlives an attempt (torchrun's agent store across --max-restarts)
  // never hands the next attempt the last one's keys.
  std::string key_prefix = "sluice";

  // Sets the store from "HOST:PORT" (master_addr, master_port) or
  // "file:PATH" (store_file). InvalidArgument naming what is wrong.
  Status SetStore(const std::string& spec);
  // The address this rank's Gloo transport binds and is reached at. Empty:
  // loopback when master_addr is a loopback address, else this host's
  // address on the route to master_addr.
  std::string bind_address;
  // Bounds the rendezvous and every collective.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Gradients are flattened into buckets of at most this many bytes (a
  // larger tensor alone), all in flight at once; small enough that a
  // model's gradients make several, so the first can be summed while
  // backward computes the rest (Trainer's overlap_gradient_sum).
  int64_t bucket_bytes = 4 << 20;

  Status Validate() const;
};

class DataParallelGroup {
 public:
  enum class Reduce { kSum, kMax };

  // Joins the group (every rank calls this with the same world size and
  // store). Errors: InvalidArgument for bad options; Unavailable naming the
  // store or the missing peers when the rendezvous does not complete within
  // the timeout.
  static Result<std::unique_ptr<DataParallelGroup>> Connect(const DataParallelOptions& options);
  ~DataParallelGroup();
  DataParallelGroup(const DataParallelGroup&) = delete;
  DataParallelGroup& operator=(const DataParallelGroup&) = delete;

  int64_t rank() const { return options_.rank; }
  int64_t size() const { return options_.world_size; }
  // Seconds this rank has spent in collectives so far (waiting for the
  // others included): what data parallelism costs it.
  double collective_seconds() const { return collective_seconds_; }

  // Sums (or takes the maximum of) each tensor over the ranks, in place.
  // Tensors of one dtype and device are flattened into buckets.
  Status AllReduce(const std::vector<at::Tensor>& tensors, Reduce op = Reduce::kSum);

  // A sum over the ranks of tensors that become final one at a time while
  // this rank still computes (gradients during backward, overlapped with
  // it as DDP's reducer does): bucketed as AllReduce buckets them, each
  // bucket sent once all of its members are final and every bucket before
  // it was sent, so every rank sends the same collectives in the same order
  // whatever order its tensors become final in. Only one PendingSum (or other
  // collective) of a group may be under way at a time.
  class PendingSum {
   public:
    ~PendingSum();
    PendingSum(const PendingSum&) = delete;
    PendingSum& operator=(const PendingSum&) = delete;
    // Tensor `index` holds its final value: a copy is taken now. Returns how
    // many buckets this call sent. Thread-safe; a second call for an index
    // is ignored. A failure to send is kept for Finish to return.
    int64_t Ready(size_t index, const at::Tensor& value);
    // Sends the rest (each tensor not yet ready copied from `finals` as it
    // is now), waits for every bucket and writes the sums into `finals`
    // (the shapes BeginSum was given). Unavailable when a collective failed
    // or timed out; only the time spent here counts in collective_seconds.
    Status Finish(const std::vector<at::Tensor>& finals);
    int64_t buckets() const;

    struct State;  // data_parallel.cc's

   private:
    friend class DataParallelGroup;
    explicit PendingSum(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
  };
  // `like`: the tensors' shapes, dtypes and devices, the same list on every
  // rank. InvalidArgument for an empty list or undefined tensors.
  Result<std::unique_ptr<PendingSum>> BeginSum(const std::vector<at::Tensor>& like);
  Status AllReduce(std::vector<double>& values, Reduce op);
  // Copies rank `root`'s tensors into every other rank's, in place.
  Status Broadcast(const std::vector<at::Tensor>& tensors, int64_t root = 0);
  // FailedPrecondition naming the ranks whose `value` differs from rank 0's
  // (what they disagree on is `what`), on every rank.
  Status CheckSame(const std::string& what, uint64_t value);

  // Small values passed through the rendezvous store, not a collective: one
  // rank sets a key, the others wait for it (e.g. the leader's plan of a
  // step, which the others may wait minutes for). GetShared returns Timeout
  // when the key is not set within `timeout`, Unavailable when the store is
  // unreachable. DeleteShared is a no-op on a FileStore.
  Status SetShared(const std::string& key, const std::string& value);
  Result<std::string> GetShared(const std::string& key, std::chrono::milliseconds timeout);
  Status DeleteShared(const std::string& key);

 private:
  struct Impl;
  DataParallelGroup(const DataParallelOptions& options, std::unique_ptr<Impl> impl);
  Status Run(const std::string& op, const std::function<void()>& fn);

  DataParallelOptions options_;
  std::unique_ptr<Impl> impl_;
  double collective_seconds_ = 0;
};

// The rendezvous store of a group, served by a process that is not one of
// its ranks (as torchrun's agent serves it): a launcher serves it on
// host:port (0: any free port) and starts the ranks with
// store_served_by_launcher and master_port = port().
class DataParallelStore {
 public:
  // `key_prefix`: the group's DataParallelOptions::key_prefix.
  static Result<std::unique_ptr<DataParallelStore>> Serve(const std::string& host, int port,
                                                          std::chrono::milliseconds timeout,
                                                          const std::string& key_prefix = "sluice");
  // A client of a store served elsewhere (torchrun's agent, another host's
  // launcher). Unavailable when it cannot be reached within `timeout`.
  static Result<std::unique_ptr<DataParallelStore>> Connect(const std::string& host, int port,
                                                            std::chrono::milliseconds timeout,
                                                            const std::string& key_prefix = "sluice");
  ~DataParallelStore();
  DataParallelStore(const DataParallelStore&) = delete;
  DataParallelStore& operator=(const DataParallelStore&) = delete;
  int port() const;
  // The values DataParallelGroup::SetShared / GetShared pass (one namespace).
  Status SetShared(const std::string& key, const std::string& value);
  Result<std::string> GetShared(const std::string& key, std::chrono::milliseconds timeout);
  // Adds `delta` to the counter `key` (0 if never set) atomically in the
  // store and returns the new value (e.g. numbering processes that join).
  Result<int64_t> AddShared(const std::string& key, int64_t delta);
  // Removes `key` (Ok if it was not set).
  Status DeleteShared(const std::string& key);

  struct Impl;  // data_parallel.cc's

 private:
  explicit DataParallelStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Which samples of a batch of `n` (split into `mini_batches` consecutive
// mini-batches as Trainer::RlStep splits it) rank `rank` of `world` trains:
// one list of indices per mini-batch, every `world`-th member starting at
// `rank`, so the ranks' lists of one mini-batch partition it. A rank's list
// may be empty when a mini-batch has fewer members than ranks.
std::vector<std::vector<size_t>> DataParallelShard(size_t n, int64_t mini_batches, int64_t rank, int64_t world);

}  // namespace sluice::trainer

#endif  // SLUICE_TRAINER_DATA_PARALLEL_H_

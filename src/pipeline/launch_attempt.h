// One attempt of the launcher of pipeline.processes (TrainingRun's
// RunProcessesOnce; TrainInProcesses starts another after a failure, from
// the latest checkpoint): its phases in order, each a method, and what they
// leave running as members, which go in the reverse order when the attempt
// ends, however it ends.
//
//   Prepare         the run's shared-memory names, the roles' starting weights
//                   (roles/init), run.trace's parts
//   OpenRanksStore  where trainer ranks and processes elsewhere meet
//                   (ranks_store.h): a file store here, or a TCPStore; the
//                   hand-over from a previous attempt; the launcher's beat
//   StartHub        the TransferQueue server (its storage units elsewhere
//                   placed: cluster.storage_ranks) and its partitions
//   StartHealth     the run's health segment, the live counters, the
//                   prompt feeder
//   RunProcesses    the weight store for pipeline.trainer_command, the relay
//                   to replicas elsewhere and the run info for them, the role
//                   processes started and supervised, the watchdog over them
//                   and over those elsewhere, until they end
//   Finish          the run's figures, the cleanup, the trained weights
//
// Thread safety: one thread runs an attempt.
#ifndef SLUICE_SRC_PIPELINE_LAUNCH_ATTEMPT_H_
#define SLUICE_SRC_PIPELINE_LAUNCH_ATTEMPT_H_

#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hub_records.h"
#include "remote_link.h"
#include "run_state.h"
#include "sluice/common/background_thread.h"
#include "sluice/common/metrics_server.h"
#include "sluice/pipeline/run_health.h"
#include "sluice/runtime/supervisor.h"
#include "sluice/transfer_queue/server.h"
#include "watchdog.h"

namespace sluice::checkpoint_engine {
class ShmSubscriber;
}

namespace sluice::pipeline {

namespace ce = checkpoint_engine;

// The prefix of the run's shared-memory objects (weight stores, health).
inline constexpr char kShmPrefix[] = "sluice";

class WeightRelay;

class LaunchAttempt {
 public:
  // `resumed`: the roles resume from the run's latest checkpoint (a restart
  // after a failure).
  LaunchAttempt(TrainingRun::State& s, bool resumed);
  ~LaunchAttempt();
  LaunchAttempt(const LaunchAttempt&) = delete;
  LaunchAttempt& operator=(const LaunchAttempt&) = delete;

  // The attempt from start to end (`stop`: SIGINT); afterwards the run's
  // state holds the trained weights, step and version.
  Status Run(const std::atomic<bool>* stop);

 private:
  Status Prepare();
  Status OpenRanksStore();
  Status StartHub();
  Status StartHealth();
  Status RunProcesses(const std::atomic<bool>* stop);
  Status Finish(Status result);

  // RunProcesses' parts.
  Status PrepareExternalTrainer();
  Status PublishRunInfo();
  Status StartProcesses();
  void WatchProcessesElsewhere();
  Status Check();
  Status CheckRanksElsewhere();
  Status RecordExternalProgress();
  void ReleaseDeadHolders();
  std::optional<int> FreshSlot();
  std::optional<StallWatch::Role> RemoteRole(PipelineRole role, int64_t index);
  void EndProcesses();

  TrainingRun::State& s_;
  const PipelineOptions& po_;
  const bool resumed_;
  const bool remote_processes_;  // trainer ranks, replicas, workers or storage elsewhere
  const bool external_;          // pipeline.trainer_command
  Clock::time_point run_start_;
  std::string tag_, store_name_, health_name_;
  std::filesystem::path init_dir_;
  std::vector<std::string> trace_parts_;
  struct TraceEnd {
    LaunchAttempt* attempt = nullptr;  // once the trace started
    ~TraceEnd();
  } trace_end_;
  // The ranks' store (pipeline.trainer_ranks > 1 or processes elsewhere).
  std::unique_ptr<trainer::DataParallelStore> rank_store_;
  std::string store_at_, store_host_ = "127.0.0.1";
  struct RemoveFile {
    std::filesystem::path path;
    ~RemoveFile();
  } rank_file_;
  // Said last, once everything below has stopped: the processes of the
  // next attempt elsewhere start their wait for its rank 0 from here
  // (AwaitPreviousAttempt), not from the word below, which comes before
  // this launcher's shutdown (seconds, more with a dead storage rank).
  struct ExitedForRanks {
    trainer::DataParallelStore* store = nullptr;
    ~ExitedForRanks();
  } exited_for_ranks_;
  // How this attempt ended, said once in the ranks' store however it ends:
  // the ranks elsewhere stop waiting and exit as the run did (so a failed
  // attempt fails on every host, and torchrun starts every host's ranks
  // again).
  struct EndForRanks {
    trainer::DataParallelStore* store = nullptr;
    bool said = false;
    bool ok = false;
    void Say(const Status& outcome);
    ~EndForRanks();
  } end_for_ranks_;
  BackgroundThread launcher_beat_{"launcher beat"};
  tq::ServerOptions so_;
  std::unique_ptr<tq::TransferQueueServer> server_;
  // However the run ends, the storage ranks stop once the hub has; after a
  // run that finished, the ranks' store (which may be this process's) stays
  // until each has seen that, or for 5 s.
  struct StoppedForStorage {
    trainer::DataParallelStore* store = nullptr;
    tq::TransferQueueServer* hub = nullptr;
    int32_t ranks = 0;
    EndForRanks* end = nullptr;
    ~StoppedForStorage();
  } stopped_for_storage_;
  std::optional<tq::TransferQueueClient> local_;  // this process's view of the hub
  std::unique_ptr<RunHealth> health_;             // (unlinked when it goes)
  int64_t local_ranks_ = 0;                       // the trainer ranks started here
  std::vector<RoleProcess> processes_;
  std::unique_ptr<MetricsServer> metrics_server_;  // stopped before the health and the hub go
  Status fed_;
  std::atomic<bool> feed_failed_{false};  // set by the feeder after fed_
  BackgroundThread feeder_{"prompts"};

  // RunProcesses' own, ended (EndProcesses) before it returns.
  std::unique_ptr<ce::ShmSubscriber> store_reader_;  // pipeline.trainer_command's store
  std::string info_path_;
  std::unique_ptr<WeightRelay> relay_;  // rollout replicas elsewhere
  std::unique_ptr<runtime::Supervisor> supervisor_;
  std::vector<StallWatch::Role> watched_;
  int trainer_command_slot_ = -1;  // pipeline.trainer_command's slot, when watched
  std::unique_ptr<RemoteBeats> remote_beats_, storage_beats_;
  std::unique_ptr<StallWatch> watch_;
  int next_slot_ = 3;
  std::map<std::string, pid_t> holders_;  // rollout and reward processes: the pid last seen
  std::map<PipelineRole, int64_t> joined_ = {{PipelineRole::kRollout, 0}, {PipelineRole::kReward, 0}};
  bool checked_exit_ = false;
  Clock::time_point next_ranks_check_, next_record_;
  uint64_t trainer_acked_ = 0;
  PolicyVersion trainer_version_ = 0;
  TrainerRecord external_record_;
};

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_LAUNCH_ATTEMPT_H_

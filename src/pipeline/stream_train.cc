// The streaming modes (sync, one_step_off, async): rollout, reward and trainer
// as separate roles joined by the TransferQueue (samples) and the
// CheckpointEngine (weights). Threads in one process here; see
// docs/pipeline.md for the data flow and the guarantees.
//
//   prompt feeder  ── PutRows(prompts: prompt, example, reference_answer) ──► hub
//   rollout thread ◄── GetMeta("rollout", prompts) ── hub
//   rollout thread ── PutRows(answers: prompt, response, logprobs, versions, ...) ──► hub
//   reward thread  ◄── GetMeta("reward") ── hub ── PutColumns(reward) ──► hub
//   trainer        ◄── GetMeta("train", whole groups) ── hub
//   trainer ── Publish(version) ──► VersionStore ──► StandbyWeights ──► engine hook
//
// Staleness is bounded by admission: the rollout admits prompts for the
// version it serves, following the trainer through the hub (the groups it
// acked after each update) and the newest published version; the same code
// in process mode (stream_roles.h).

#include <torch/torch.h>

#include <atomic>

#include "run_state.h"
#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/background_thread.h"
#include "sluice/common/first_error.h"
#include "sluice/rollout/standby_weights.h"
#include "sluice/transfer_queue/client.h"
#include "stream_roles.h"

namespace sluice::pipeline {

namespace ce = checkpoint_engine;

Status TrainingRun::TrainStreaming(const ProgressFn& progress) {
  State& s = *state_;
  const RlOptions& rl = s.options.rl;
  const int64_t G = rl.group_size;
  if (s.step >= rl.steps) return Status::Ok();

  // ---- the hub: prompts for the rollout, answers for reward and train.
  tq::HubOptions hub_options;
  hub_options.controller.columns = HubColumns();
  hub_options.controller.tasks = HubTasks();
  SLUICE_ASSIGN_OR_RETURN(auto hub, tq::TransferQueueHub::Create(hub_options));
  tq::TransferQueueClient client = hub->client();
  SLUICE_RETURN_IF_ERROR(CreateHubPartitions(client, G));

  // ---- the weights: the trainer publishes into a version store; the rollout
  // serves its own copy, refreshed through a standby buffer.
  SLUICE_ASSIGN_OR_RETURN(TensorMap initial, model::ExportWeights(*s.policy));
  ce::VersionStoreOptions store_options;
  store_options.layout = ce::LayoutOf(initial);
  SLUICE_ASSIGN_OR_RETURN(auto store, ce::VersionStore::Create(store_options));
  SLUICE_RETURN_IF_ERROR(store->Publish(s.version, initial));
  initial.clear();
  std::shared_ptr<model::Transformer> rollout_model = model::CloneModel(*s.policy, s.rollout_device, s.rollout_dtype);
  SLUICE_ASSIGN_OR_RETURN(auto standby, rollout::StandbyWeights::Create(rollout_model, s.version, *store));

  // run.trace: every role is a thread of this process, each on its role's track.
  std::remove(StreamRoles::TracePart(s, "run").c_str());  // one a killed run left (StartTrace appends)
  SLUICE_RETURN_IF_ERROR(StreamRoles::StartTrace(s, "run"));
  struct FinishTrace {
    const State& s;
    ~FinishTrace() { StreamRoles::FinishTrace(s, {"run"}); }
  } finish_trace{s};
  const std::unique_ptr<RunHealth> health = RunHealth::InProcess();
  health->RecordTrainer(s.step, s.version);
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<MetricsServer> metrics_server,
                          StreamRoles::ServeMetrics(s, *health, client, RoleProcesses(1, 1, 1), nullptr));
  FirstError errors;
  BackgroundThread feeder_thread("prompts"), rollout_thread("rollout"), reward_thread("reward");
  SLUICE_RETURN_IF_ERROR(feeder_thread.Start([&](std::stop_token stop) {
    errors.Set(StreamRoles::FeedPrompts(s, client, *health, [&] { return stop.stop_requested(); }));
  }));
  RolloutRole::Wiring rollout_wiring{rollout_model, standby.get(), store.get(), &client, health.get(), s.hooks};
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RolloutRole> rollout_role,
                          RolloutRole::Create(StreamRoles::RolloutOptions(s), std::move(rollout_wiring)));
  RewardRole reward_role(StreamRoles::RewardOptions(s), {s.task, s.tokenizer, &client, health.get()});
  SLUICE_RETURN_IF_ERROR(rollout_thread.Start(
      [&](std::stop_token stop) { errors.Set(rollout_role->Run([&] { return stop.stop_requested(); })); }));
  SLUICE_RETURN_IF_ERROR(reward_thread.Start(
      [&](std::stop_token stop) { errors.Set(reward_role.Run([&] { return stop.stop_requested(); })); }));

  const auto run_start = Clock::now();
  Status trained = [&]() -> Status {
    SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<StreamRoles::RunLearner> learner,
                            StreamRoles::RunLearner::Open(
                                s, *health, [this] { return Evaluate(); }, progress));
    TrainerRole::Wiring wiring{learner.get(),
                               &client,
                               health.get(),
                               store.get(),
                               [&] { return errors.failed() ? errors.Get() : Status::Ok(); },
                               s.hooks};
    return TrainerRole(StreamRoles::TrainerOptions(s), std::move(wiring)).Run();
  }();
  health->RequestStop();
  feeder_thread.Stop();
  rollout_thread.Stop();
  reward_thread.Stop();
  standby->Stop();
  errors.Set(trained);
  SLUICE_RETURN_IF_ERROR(errors.Get());
  s.stream_stats = health->Summary(std::chrono::duration<double>(Clock::now() - run_start).count());
  return Status::Ok();
}

}  // namespace sluice::pipeline

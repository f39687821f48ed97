// The roles of the streaming modes (trainer, rollout, reward) and what a
// role process is told by the launcher that starts it. A role process runs
// TrainingRun::RunRole (run.h); docs/pipeline.md has the data flow.
#ifndef SLUICE_PIPELINE_ROLES_H_
#define SLUICE_PIPELINE_ROLES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "sluice/common/status.h"

namespace sluice::runtime {
class FlagSet;
}

namespace sluice::pipeline {

// The roles of the streaming modes.
enum class PipelineRole { kTrainer, kRollout, kReward };
Result<PipelineRole> ParsePipelineRole(const std::string& name);  // trainer, rollout, reward
std::string PipelineRoleName(PipelineRole role);
// One process of a role in messages: "trainer rank 1", "rollout replica 2",
// "reward worker 0".
std::string PipelineProcessTitle(PipelineRole role, int64_t index);

// What a role process is told by its launcher.
// The environment variable a role process finds the hub's token in.
inline constexpr char kHubTokenVariable[] = "SLUICE_HUB_TOKEN";

struct RoleConnection {
  PipelineRole role = PipelineRole::kTrainer;
  std::string hub;      // TransferQueue server endpoint (same-host shared memory when available)
  std::string weights;  // CheckpointEngine shared-memory store name (the trainer publishes, rollout reads)
  std::string health;   // shared-memory segment of the run's health and control (RunHealth)
  int64_t start_step = 0;
  int64_t start_version = 0;
  // The trainer role with pipeline.trainer_ranks > 1: this process's rank
  // and the ranks' rendezvous store ("HOST:PORT", served by the launcher).
  int64_t trainer_rank = 0;
  std::string trainer_store;
  std::string trainer_store_prefix;  // LaunchWiring::trainer_store_prefix
  // Which process of its role this is: the rollout replica or reward
  // worker index (0-based; trainer ranks use trainer_rank), and its slot in
  // the run's health (-1: the role's first slot).
  int64_t replica = 0;
  int64_t health_slot = -1;
  // The hub's token (required when it listens beyond loopback).
  std::string hub_token;
  // A trainer rank launched on another host (torchrun, Slurm, Open MPI): no
  // run health segment or shared memory there; the hub over TCP, and the run's end
  // from the ranks' store.
  bool remote = false;
  // A rollout replica on another host: the rendezvous ("IP:PORT") of the
  // CheckpointEngine broadcast that brings it the weights.
  std::string weights_rendezvous;
  // The run's trainer ranks when a launcher (torchrun, Slurm, Open MPI)
  // placed them; 0: the config's pipeline.trainer_ranks.
  int64_t trainer_ranks = 0;
};

// The flags a launcher appends to pipeline.wiring.role_command (--role, --hub,
// --weights, --health, ...): a program that starts as a role declares them
// with AddRoleFlags and reads them with RoleFromFlags (nullopt without
// --role; the hub token from kHubTokenVariable). Errors: InvalidArgument
// (an unknown role, connection flags missing, values out of range).
void AddRoleFlags(runtime::FlagSet& flags);
Result<std::optional<RoleConnection>> RoleFromFlags(const runtime::FlagSet& flags);

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_ROLES_H_

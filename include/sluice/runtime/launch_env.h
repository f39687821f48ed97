// Where this process sits in a multi-process job, read from the variables
// the launchers users already use set: torchrun (and torch.distributed.run),
// Slurm's srun, and Open MPI's mpirun. The rendezvous (c10d's TCPStore)
// listens on master_addr:master_port, served by rank 0.
//
// Precedence: torchrun's variables when RANK is set, else Slurm's when
// SLURM_PROCID is set, else Open MPI's when OMPI_COMM_WORLD_RANK is set,
// else one process alone. MASTER_ADDR / MASTER_PORT override what a
// launcher implies (Slurm: the first host of the step's node list; Open
// MPI: required, mpirun does not say).
#ifndef SLUICE_RUNTIME_LAUNCH_ENV_H_
#define SLUICE_RUNTIME_LAUNCH_ENV_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/common/status.h"

namespace sluice::runtime {

struct ProcessPlacement {
  std::string launcher = "single";  // single, torchrun, slurm, openmpi
  int64_t rank = 0;                 // in [0, world_size)
  int64_t world_size = 1;
  int64_t local_rank = 0;  // on this host, in [0, local_world_size)
  int64_t local_world_size = 1;
  int64_t node_rank = 0;  // this host's index among the job's hosts
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // torchrun's default
  // torchrun's agent already serves the TCPStore at master_addr:master_port
  // (TORCHELASTIC_USE_AGENT_STORE=True): rank 0 must not serve another.
  bool store_served_by_launcher = false;
  // torchrun's restart attempt (TORCHELASTIC_RESTART_COUNT: 0 first, one
  // more after each --max-restarts restart); 0 from the other launchers.
  // Its agent store lives across attempts, so each keeps its keys apart.
  int64_t restart_count = 0;
  // torchrun's job (TORCHELASTIC_RUN_ID, its --rdzv_id; "none", its default,
  // is left empty). With the c10d rendezvous a host's agent starts its
  // workers again, without counting a restart, when another host's failed.
  std::string job_id;

  std::string ToString() const;  // e.g. "rank 3 of 8 (local 1 of 4, node 0), rendezvous at host:29500, from slurm"
};

// `getenv` returns a variable's value or nullptr (std::getenv, or a map in
// tests). Errors: InvalidArgument naming the variable for a value that is
// not a whole number, is out of range (a rank not below the world size, a
// port outside 1..65535), or is missing from a set the launcher always
// sets together (RANK without WORLD_SIZE, say).
Result<ProcessPlacement> PlacementFromEnvironment(const std::function<const char*(const char*)>& getenv);

// The hosts of a Slurm node list, in order: "node[01-03,7],gpu-a" ->
// node01, node02, node03, node7, gpu-a (zero padding kept; several bracket
// groups in one name multiply). InvalidArgument naming the list for an
// unbalanced bracket, an empty or reversed range, or more than `max_hosts`.
Result<std::vector<std::string>> ExpandSlurmNodeList(std::string_view list, size_t max_hosts = 100000);

}  // namespace sluice::runtime

#endif  // SLUICE_RUNTIME_LAUNCH_ENV_H_

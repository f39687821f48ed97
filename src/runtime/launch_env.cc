#include "sluice/runtime/launch_env.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

namespace sluice::runtime {

namespace {

using Getenv = std::function<const char*(const char*)>;

// A whole number in [0, 2^31) or an error naming the variable.
Result<int64_t> ParseCount(const char* name, std::string_view text) {
  int64_t v = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < 0 || v >= (int64_t{1} << 31)) {
    return Status::InvalidArgument(std::string(name) + "='" + std::string(text) +
                                   "' is not a whole number in [0, 2^31)");
  }
  return v;
}

// The variable's number, or `fallback` when it is not set.
Result<int64_t> CountOr(const Getenv& getenv, const char* name, int64_t fallback) {
  const char* v = getenv(name);
  if (v == nullptr) return fallback;
  return ParseCount(name, v);
}

Result<int64_t> RequiredCount(const Getenv& getenv, const char* name, const char* launcher, const char* set_by) {
  const char* v = getenv(name);
  if (v == nullptr) {
    return Status::InvalidArgument(std::string(set_by) + " is set but " + name + " is not: " + launcher +
                                   " sets them together (a partial or hand-made environment?)");
  }
  return ParseCount(name, v);
}

Status CheckPlacement(const ProcessPlacement& p, const char* rank_var, const char* world_var) {
  if (p.world_size < 1) return Status::InvalidArgument(std::string(world_var) + " must be at least 1");
  if (p.rank >= p.world_size) {
    return Status::InvalidArgument(std::string(rank_var) + "=" + std::to_string(p.rank) + " is not below " + world_var +
                                   "=" + std::to_string(p.world_size));
  }
  if (p.local_world_size < 1 || p.local_world_size > p.world_size) {
    return Status::InvalidArgument("the local world size " + std::to_string(p.local_world_size) +
                                   " is not in [1, world size " + std::to_string(p.world_size) + "]");
  }
  if (p.local_rank >= p.local_world_size) {
    return Status::InvalidArgument("the local rank " + std::to_string(p.local_rank) +
                                   " is not below the local world size " + std::to_string(p.local_world_size));
  }
  if (p.master_addr.empty()) return Status::InvalidArgument("MASTER_ADDR is empty");
  return Status::Ok();
}

// MASTER_ADDR / MASTER_PORT over what the launcher implies.
Status ApplyMasterOverrides(const Getenv& getenv, ProcessPlacement* p) {
  if (const char* addr = getenv("MASTER_ADDR")) p->master_addr = addr;
  if (const char* port = getenv("MASTER_PORT")) {
    SLUICE_ASSIGN_OR_RETURN(const int64_t v, ParseCount("MASTER_PORT", port));
    if (v < 1 || v > 65535) {
      return Status::InvalidArgument("MASTER_PORT=" + std::string(port) + " is not a port in 1..65535");
    }
    p->master_port = static_cast<int>(v);
  }
  return Status::Ok();
}

// Slurm's tasks-per-node form: "4", "2(x3),1" -> the count on node `node`.
Result<int64_t> TasksOnNode(const char* name, std::string_view spec, int64_t node) {
  int64_t index = 0;
  size_t at = 0;
  while (at <= spec.size()) {
    size_t comma = spec.find(',', at);
    if (comma == std::string_view::npos) comma = spec.size();
    std::string_view item = spec.substr(at, comma - at);
    int64_t repeat = 1;
    const size_t paren = item.find("(x");
    if (paren != std::string_view::npos) {
      if (item.back() != ')')
        return Status::InvalidArgument(std::string(name) + "='" + std::string(spec) + "' is malformed");
      SLUICE_ASSIGN_OR_RETURN(repeat, ParseCount(name, item.substr(paren + 2, item.size() - paren - 3)));
      item = item.substr(0, paren);
    }
    SLUICE_ASSIGN_OR_RETURN(const int64_t count, ParseCount(name, item));
    if (node < index + repeat) return count;
    index += repeat;
    at = comma + 1;
  }
  return Status::InvalidArgument(std::string(name) + "='" + std::string(spec) + "' names no count for node " +
                                 std::to_string(node));
}

Result<ProcessPlacement> FromTorchrun(const Getenv& getenv) {
  ProcessPlacement p;
  p.launcher = "torchrun";
  SLUICE_ASSIGN_OR_RETURN(p.rank, ParseCount("RANK", getenv("RANK")));
  SLUICE_ASSIGN_OR_RETURN(p.world_size, RequiredCount(getenv, "WORLD_SIZE", "torchrun", "RANK"));
  SLUICE_ASSIGN_OR_RETURN(p.local_rank, CountOr(getenv, "LOCAL_RANK", p.rank));
  SLUICE_ASSIGN_OR_RETURN(p.local_world_size, CountOr(getenv, "LOCAL_WORLD_SIZE", p.world_size));
  SLUICE_ASSIGN_OR_RETURN(p.node_rank, CountOr(getenv, "GROUP_RANK", 0));
  const char* agent_store = getenv("TORCHELASTIC_USE_AGENT_STORE");
  p.store_served_by_launcher = agent_store != nullptr && std::string_view(agent_store) == "True";
  SLUICE_ASSIGN_OR_RETURN(p.restart_count, CountOr(getenv, "TORCHELASTIC_RESTART_COUNT", 0));
  if (const char* job = getenv("TORCHELASTIC_RUN_ID"); job != nullptr && std::string_view(job) != "none") {
    p.job_id = std::string(job).substr(0, 256);
  }
  if (p.world_size > 1 && getenv("MASTER_ADDR") == nullptr) {
    return Status::InvalidArgument("RANK and WORLD_SIZE are set but MASTER_ADDR is not: torchrun sets them together");
  }
  SLUICE_RETURN_IF_ERROR(ApplyMasterOverrides(getenv, &p));
  SLUICE_RETURN_IF_ERROR(CheckPlacement(p, "RANK", "WORLD_SIZE"));
  return p;
}

Result<ProcessPlacement> FromSlurm(const Getenv& getenv) {
  ProcessPlacement p;
  p.launcher = "slurm";
  SLUICE_ASSIGN_OR_RETURN(p.rank, ParseCount("SLURM_PROCID", getenv("SLURM_PROCID")));
  // The step's task count (srun's), not the allocation's: a batch script
  // running one process inside a 4-task allocation is one process.
  const char* ntasks = getenv("SLURM_STEP_NUM_TASKS") != nullptr ? "SLURM_STEP_NUM_TASKS"
                       : getenv("SLURM_NTASKS") != nullptr       ? "SLURM_NTASKS"
                                                                 : "SLURM_NPROCS";
  SLUICE_ASSIGN_OR_RETURN(p.world_size, RequiredCount(getenv, ntasks, "srun", "SLURM_PROCID"));
  SLUICE_ASSIGN_OR_RETURN(p.local_rank, CountOr(getenv, "SLURM_LOCALID", 0));
  SLUICE_ASSIGN_OR_RETURN(p.node_rank, CountOr(getenv, "SLURM_NODEID", 0));
  p.local_world_size = 1;
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    if (const char* spec = getenv(name)) {
      SLUICE_ASSIGN_OR_RETURN(p.local_world_size, TasksOnNode(name, spec, p.node_rank));
      break;
    }
  }
  p.local_world_size = std::max(p.local_world_size, p.local_rank + 1);
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (const char* list = getenv(name)) {
      SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> hosts, ExpandSlurmNodeList(list));
      if (hosts.empty()) return Status::InvalidArgument(std::string(name) + " is empty");
      p.master_addr = hosts.front();
      break;
    }
  }
  SLUICE_RETURN_IF_ERROR(ApplyMasterOverrides(getenv, &p));
  SLUICE_RETURN_IF_ERROR(CheckPlacement(p, "SLURM_PROCID", ntasks));
  return p;
}

Result<ProcessPlacement> FromOpenMpi(const Getenv& getenv) {
  ProcessPlacement p;
  p.launcher = "openmpi";
  SLUICE_ASSIGN_OR_RETURN(p.rank, ParseCount("OMPI_COMM_WORLD_RANK", getenv("OMPI_COMM_WORLD_RANK")));
  SLUICE_ASSIGN_OR_RETURN(p.world_size,
                          RequiredCount(getenv, "OMPI_COMM_WORLD_SIZE", "mpirun", "OMPI_COMM_WORLD_RANK"));
  SLUICE_ASSIGN_OR_RETURN(p.local_rank, CountOr(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", 0));
  SLUICE_ASSIGN_OR_RETURN(p.local_world_size, CountOr(getenv, "OMPI_COMM_WORLD_LOCAL_SIZE", 1));
  // mpirun names no host index; with the same count on every host (its
  // usual --map-by ppr) it is the rank's block.
  p.node_rank = p.local_world_size > 0 ? p.rank / p.local_world_size : 0;
  if (p.world_size > 1 && getenv("MASTER_ADDR") == nullptr) {
    return Status::InvalidArgument(
        "Open MPI does not say where rank 0 runs: set MASTER_ADDR (and MASTER_PORT) for every rank, e.g. mpirun -x "
        "MASTER_ADDR=host0");
  }
  SLUICE_RETURN_IF_ERROR(ApplyMasterOverrides(getenv, &p));
  SLUICE_RETURN_IF_ERROR(CheckPlacement(p, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"));
  return p;
}

}  // namespace

std::string ProcessPlacement::ToString() const {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (local " +
         std::to_string(local_rank) + " of " + std::to_string(local_world_size) + ", node " +
         std::to_string(node_rank) + "), rendezvous at " + master_addr + ":" + std::to_string(master_port) + ", from " +
         launcher + (restart_count > 0 ? " (restart " + std::to_string(restart_count) + ")" : "");
}

Result<ProcessPlacement> PlacementFromEnvironment(const std::function<const char*(const char*)>& getenv) {
  if (getenv("RANK") != nullptr) return FromTorchrun(getenv);
  if (getenv("SLURM_PROCID") != nullptr) return FromSlurm(getenv);
  if (getenv("OMPI_COMM_WORLD_RANK") != nullptr) return FromOpenMpi(getenv);
  ProcessPlacement p;
  SLUICE_RETURN_IF_ERROR(ApplyMasterOverrides(getenv, &p));
  return p;
}

Result<std::vector<std::string>> ExpandSlurmNodeList(std::string_view list, size_t max_hosts) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("Slurm node list '" + std::string(list) + "': " + why);
  };
  std::vector<std::string> hosts;
  size_t at = 0;
  while (at < list.size()) {
    // One name: up to a comma outside brackets.
    size_t end = at;
    int depth = 0;
    for (; end < list.size() && !(list[end] == ',' && depth == 0); ++end) {
      if (list[end] == '[' && ++depth > 1) return bad("nested brackets");
      if (list[end] == ']' && --depth < 0) return bad("']' without '['");
    }
    if (depth != 0) return bad("'[' without ']'");
    const std::string_view name = list.substr(at, end - at);
    if (name.empty()) return bad("an empty name");
    // Expand its bracket groups left to right.
    std::vector<std::string> partial = {""};
    for (size_t i = 0; i < name.size();) {
      if (name[i] != '[') {
        const size_t next = std::min(name.find('[', i), name.size());
        for (std::string& p : partial) p.append(name.substr(i, next - i));
        i = next;
        continue;
      }
      const size_t close = name.find(']', i);
      const std::string_view group = name.substr(i + 1, close - i - 1);
      std::vector<std::string> choices;
      size_t g = 0;
      while (g <= group.size()) {
        size_t comma = group.find(',', g);
        if (comma == std::string_view::npos) comma = group.size();
        const std::string_view range = group.substr(g, comma - g);
        const size_t dash = range.find('-');
        const std::string_view lo_text = range.substr(0, dash);
        const std::string_view hi_text = dash == std::string_view::npos ? lo_text : range.substr(dash + 1);
        auto lo = ParseCount("node list range", lo_text), hi = ParseCount("node list range", hi_text);
        if (!lo.ok() || !hi.ok() || *hi < *lo) return bad("'" + std::string(range) + "' is not a range like 1-4");
        if (static_cast<size_t>(*hi - *lo) >= max_hosts)
          return bad("more than " + std::to_string(max_hosts) + " hosts");
        for (int64_t v = *lo; v <= *hi; ++v) {
          std::string digits = std::to_string(v);
          if (digits.size() < lo_text.size()) digits.insert(0, lo_text.size() - digits.size(), '0');
          choices.push_back(std::move(digits));
        }
        g = comma + 1;
      }
      if (partial.size() * choices.size() > max_hosts) return bad("more than " + std::to_string(max_hosts) + " hosts");
      std::vector<std::string> next;
      for (const std::string& p : partial) {
        for (const std::string& c : choices) next.push_back(p + c);
      }
      partial = std::move(next);
      i = close + 1;
    }
    for (std::string& h : partial) hosts.push_back(std::move(h));
    if (hosts.size() > max_hosts) return bad("more than " + std::to_string(max_hosts) + " hosts");
    at = end + 1;
  }
  return hosts;
}

}  // namespace sluice::runtime

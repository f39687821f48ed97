#include "sluice/runtime/launch_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace sluice::runtime {
namespace {

using Env = std::map<std::string, std::string>;

Result<ProcessPlacement> From(const Env& env) {
  return PlacementFromEnvironment([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

void ExpectRefused(const Env& env, const std::string& needle) {
  auto p = From(env);
  ASSERT_FALSE(p.ok()) << "accepted: " << p->ToString();
  EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find(needle), std::string::npos) << p.status().ToString();
}

TEST(LaunchEnvTest, NoLauncherIsOneProcessAlone) {
  auto p = From({});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->launcher, "single");
  EXPECT_EQ(p->world_size, 1);
  EXPECT_EQ(p->master_addr, "127.0.0.1");
  EXPECT_EQ(p->master_port, 29500);
}

TEST(LaunchEnvTest, TorchrunVariables) {
  auto p = From({{"RANK", "5"},
                 {"WORLD_SIZE", "8"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "4"},
                 {"GROUP_RANK", "1"},
                 {"MASTER_ADDR", "node0"},
                 {"MASTER_PORT", "29600"}});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->launcher, "torchrun");
  EXPECT_EQ(p->rank, 5);
  EXPECT_EQ(p->world_size, 8);
  EXPECT_EQ(p->local_rank, 1);
  EXPECT_EQ(p->local_world_size, 4);
  EXPECT_EQ(p->node_rank, 1);
  EXPECT_EQ(p->master_addr, "node0");
  EXPECT_EQ(p->master_port, 29600);
  EXPECT_EQ(p->ToString(), "rank 5 of 8 (local 1 of 4, node 1), rendezvous at node0:29600, from torchrun");
  EXPECT_EQ(p->restart_count, 0);
  // A --max-restarts attempt says which it is.
  p = From({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_RESTART_COUNT", "2"}});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->restart_count, 2);
  EXPECT_NE(p->ToString().find("from torchrun (restart 2)"), std::string::npos) << p->ToString();
  EXPECT_EQ(p->job_id, "");
  // The job (--rdzv_id); torchrun's default "none" names none.
  p = From({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_RUN_ID", "job-17"}});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->job_id, "job-17");
  p = From({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"TORCHELASTIC_RUN_ID", "none"}});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->job_id, "");
}

// `srun torchrun ...` (one agent per node, for torchrun's restarts under
// Slurm): the worker sees both launchers' variables, and its rank is
// torchrun's (Slurm's SLURM_PROCID numbers the agents).
TEST(LaunchEnvTest, TorchrunUnderSrunTakesTorchrunsRank) {
  auto p = From({{"RANK", "3"},
                 {"WORLD_SIZE", "4"},
                 {"LOCAL_RANK", "1"},
                 {"LOCAL_WORLD_SIZE", "2"},
                 {"GROUP_RANK", "1"},
                 {"MASTER_ADDR", "node0"},
                 {"MASTER_PORT", "29600"},
                 {"SLURM_PROCID", "1"},
                 {"SLURM_NTASKS", "2"},
                 {"SLURM_LOCALID", "0"},
                 {"SLURM_NODEID", "1"},
                 {"SLURM_JOB_NODELIST", "node[0-1]"}});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->launcher, "torchrun");
  EXPECT_EQ(p->rank, 3);
  EXPECT_EQ(p->world_size, 4);
  EXPECT_EQ(p->local_rank, 1);
}

TEST(LaunchEnvTest, SlurmVariablesAndTheFirstHostAsRendezvous) {
  auto p = From({{"SLURM_PROCID", "6"},
                 {"SLURM_NTASKS", "7"},
                 {"SLURM_LOCALID", "0"},
                 {"SLURM_NODEID", "3"},
                 {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"},
                 {"SLURM_STEP_NODELIST", "gpu[07-09],cpu-a"}});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->launcher, "slurm");
  EXPECT_EQ(p->rank, 6);
  EXPECT_EQ(p->world_size, 7);
  EXPECT_EQ(p->node_rank, 3);
  EXPECT_EQ(p->local_world_size, 1);  // the fourth node runs one task
  EXPECT_EQ(p->master_addr, "gpu07");
  // One process started by a batch script in a 4-task allocation: the step has one task.
  auto batch = From({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "1"}});
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(batch->world_size, 1);
  auto overridden = From({{"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "2"},
                          {"SLURM_JOB_NODELIST", "n[1-2]"},
                          {"MASTER_ADDR", "10.0.0.5"},
                          {"MASTER_PORT", "1234"}});
  ASSERT_TRUE(overridden.ok()) << overridden.status().ToString();
  EXPECT_EQ(overridden->master_addr, "10.0.0.5");
  EXPECT_EQ(overridden->master_port, 1234);
}

TEST(LaunchEnvTest, OpenMpiVariablesNeedAMasterAddress) {
  auto p = From({{"OMPI_COMM_WORLD_RANK", "3"},
                 {"OMPI_COMM_WORLD_SIZE", "4"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                 {"MASTER_ADDR", "head"}});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->launcher, "openmpi");
  EXPECT_EQ(p->rank, 3);
  EXPECT_EQ(p->node_rank, 1);
  EXPECT_EQ(p->master_addr, "head");
  ExpectRefused({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "set MASTER_ADDR");
}

TEST(LaunchEnvTest, BadValuesAreRefusedNamingTheVariable) {
  const Env torchrun = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  auto with = [&](const std::string& key, const std::string& value) {
    Env e = torchrun;
    e[key] = value;
    return e;
  };
  ExpectRefused(with("RANK", "2"), "RANK=2 is not below WORLD_SIZE=2");
  ExpectRefused(with("RANK", "-1"), "RANK='-1' is not a whole number");
  ExpectRefused(with("WORLD_SIZE", "two"), "WORLD_SIZE='two'");
  ExpectRefused(with("WORLD_SIZE", "0"), "WORLD_SIZE must be at least 1");
  ExpectRefused(with("MASTER_PORT", "70000"), "MASTER_PORT=70000 is not a port");
  ExpectRefused(with("LOCAL_RANK", "3"), "local rank 3");
  ExpectRefused(with("RANK", "99999999999"), "RANK='99999999999'");
  ExpectRefused(with("TORCHELASTIC_RESTART_COUNT", "x"), "TORCHELASTIC_RESTART_COUNT='x' is not a whole number");
  ExpectRefused({{"RANK", "0"}}, "RANK is set but WORLD_SIZE is not");
  ExpectRefused({{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "MASTER_ADDR is not");
  ExpectRefused({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "n[1-"}}, "'[' without ']'");
  ExpectRefused({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "2(x"}}, "malformed");
}

TEST(LaunchEnvTest, SlurmNodeListsExpandInOrder) {
  auto hosts = ExpandSlurmNodeList("node[001-003,7],gpu-a,rack[1-2]-n[0-1]");
  ASSERT_TRUE(hosts.ok()) << hosts.status().ToString();
  EXPECT_EQ(*hosts, (std::vector<std::string>{"node001", "node002", "node003", "node7", "gpu-a", "rack1-n0", "rack1-n1",
                                              "rack2-n0", "rack2-n1"}));
  for (const char* bad : {"n[3-1]", "n[]", "n]1[", "n[[1]]", ",a", "n[1-x]"}) {
    auto r = ExpandSlurmNodeList(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find(bad), std::string::npos) << r.status().ToString();
    }
  }
  auto huge = ExpandSlurmNodeList("n[0-99999999]");
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("more than 100000 hosts"), std::string::npos);
  auto product = ExpandSlurmNodeList("a[0-999]b[0-999]");
  ASSERT_FALSE(product.ok());
}

}  // namespace
}  // namespace sluice::runtime

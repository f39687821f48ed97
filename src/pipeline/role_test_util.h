// Private to the pipeline's tests: a test binary that runs the roles as
// processes re-executes itself as each role, with a gtest filter that selects
// its role-entry test and the launcher's connection flags appended.
#ifndef SLUICE_SRC_PIPELINE_ROLE_TEST_UTIL_H_
#define SLUICE_SRC_PIPELINE_ROLE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "sluice/model/weights.h"
#include "sluice/pipeline/run.h"

namespace sluice::pipeline::role_test {

// This process's command line.
inline std::vector<std::string> OwnArguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

// The value of --flag=value among `args` ("" when absent).
inline std::string ArgumentValue(const std::vector<std::string>& args, const std::string& flag) {
  for (const auto& a : args) {
    if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
  }
  return "";
}

// A role process's connection and run directory, from its command line;
// nullopt when this process is not a role (no --role).
struct RoleArguments {
  RoleConnection connection;
  std::string run_dir;
};
inline std::optional<RoleArguments> RoleFromArguments() {
  const std::vector<std::string> args = OwnArguments();
  const std::string role = ArgumentValue(args, "--role");
  if (role.empty()) return std::nullopt;
  RoleArguments r;
  RoleConnection& c = r.connection;
  c.role = *ParsePipelineRole(role);
  c.hub = ArgumentValue(args, "--hub");
  c.weights = ArgumentValue(args, "--weights");
  c.health = ArgumentValue(args, "--health");
  c.start_step = std::stoll(ArgumentValue(args, "--start-step"));
  c.start_version = std::stoll(ArgumentValue(args, "--start-version"));
  const std::string rank = ArgumentValue(args, "--trainer-rank");
  c.trainer_rank = rank.empty() ? 0 : std::stoll(rank);
  c.trainer_store = ArgumentValue(args, "--trainer-store");
  r.run_dir = ArgumentValue(args, "--run-dir");
  return r;
}

// The command that starts this binary as a role running the test `filter`.
inline std::vector<std::string> RoleCommand(const std::string& filter, const std::string& run_dir) {
  std::error_code ec;
  return {std::filesystem::read_symlink("/proc/self/exe", ec).string(), filter, "--run-dir=" + run_dir};
}

// The body of a role-entry test: this process, started by the launcher as
// the role its arguments name, loads the run's starting weights, makes the
// run with `task` and the test's `options(run_dir)` and runs the role.
template <typename OptionsFn>
void RunAsRole(const RoleArguments& role, std::shared_ptr<const reward::Task> task, OptionsFn options) {
  torch::set_num_threads(1);
  auto policy = model::LoadPretrained((std::filesystem::path(role.run_dir) / "roles" / "init").string());
  ASSERT_TRUE(policy.ok()) << policy.status().ToString();
  auto loop = TrainingRun::Create(*policy, std::move(task), options(role.run_dir));
  ASSERT_TRUE(loop.ok()) << loop.status().ToString();
  Status st = (*loop)->RunRole(role.connection, nullptr);
  ASSERT_TRUE(st.ok()) << PipelineRoleName(role.connection.role) << ": " << st.ToString();
}

}  // namespace sluice::pipeline::role_test

#endif  // SLUICE_SRC_PIPELINE_ROLE_TEST_UTIL_H_

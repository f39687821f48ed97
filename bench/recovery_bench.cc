// What a dead process costs a run (pipeline.max_restarts): the same
// process-mode async run, interleaved, with no kill, with one rollout
// replica SIGKILLed (started again alone; the launcher releases the leases
// it held at once) and with trainer rank 0 SIGKILLed (every role started
// again from the latest checkpoint). Every run gets the same config, cores
// and work; the table gives each mode's wall time (median, min-max) and the
// seconds lost per kill against the no-kill runs of the same invocation.
// Each run must finish every step (exit 0, one metrics line per step), or
// the benchmark fails.
//
//   build/release/bench/recovery_bench [--repeats=3] [--steps=30] [--kill-at=10] [--json=PATH]
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_stats.h"
#include "sluice/common/file_util.h"
#include "sluice/common/status.h"
#include "sluice/runtime/flags.h"

extern char** environ;

namespace sluice::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct Mode {
  std::string name;
  std::string victim;  // "" (no kill), or "<role> <index>" as in the role's flags
};

// The launcher's children as "<role> <index>" -> pid, from /proc.
std::map<std::string, pid_t> RoleProcesses(pid_t launcher) {
  std::map<std::string, pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream status(entry.path() / "status");
    std::string line;
    pid_t parent = -1;
    while (std::getline(status, line)) {
      if (line.rfind("PPid:", 0) == 0) parent = std::stoi(line.substr(5));
    }
    if (parent != launcher) continue;
    std::ifstream cmdline(entry.path() / "cmdline");
    std::string role, index = "0";
    for (std::string arg; std::getline(cmdline, arg, '\0');) {
      if (arg.rfind("--role=", 0) == 0) role = arg.substr(7);
      if (arg.rfind("--replica=", 0) == 0) index = arg.substr(10);
      if (arg.rfind("--trainer-rank=", 0) == 0) index = arg.substr(15);
    }
    if (!role.empty()) out[role + " " + index] = std::stoi(name);
  }
  return out;
}

int64_t LinesIn(const fs::path& path) {
  std::ifstream in(path);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.empty() ? 0 : 1;
  return n;
}

// One run: its wall time in seconds, or an error naming what went wrong.
Result<double> RunOnce(const std::string& sluice, const std::vector<std::string>& config, const Mode& mode,
                       int64_t steps, int64_t kill_at, const fs::path& dir) {
  (void)RemoveTree(dir.string());
  fs::create_directories(dir);
  std::vector<std::string> args = {sluice, "train"};
  args.insert(args.end(), config.begin(), config.end());
  args.push_back("run.dir=" + (dir / "run").string());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  const std::string log = (dir / "run.log").string();
  posix_spawn_file_actions_addopen(&files, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&files, 1, 2);
  pid_t launcher = -1;
  const auto start = Clock::now();
  const int rc = posix_spawn(&launcher, sluice.c_str(), &files, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  if (rc != 0) return Status::Unavailable("cannot start " + sluice + ": " + std::strerror(rc));
  const fs::path metrics = dir / "run" / "metrics.jsonl";
  bool killed = mode.victim.empty();
  int status = 0;
  for (;;) {
    const pid_t done = ::waitpid(launcher, &status, WNOHANG);
    if (done == launcher) break;
    if (!killed && LinesIn(metrics) >= kill_at) {
      const auto roles = RoleProcesses(launcher);
      if (auto it = roles.find(mode.victim); it != roles.end() && ::kill(it->second, SIGKILL) == 0) killed = true;
    }
    if (Clock::now() - start > std::chrono::minutes(10)) {
      ::kill(launcher, SIGKILL);
      ::waitpid(launcher, nullptr, 0);
      return Status::Timeout(mode.name + ": the run took over 10 minutes (log " + log + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Status::Internal(mode.name + ": the run failed (log " + log + ")");
  }
  if (!killed) return Status::Internal(mode.name + ": the run ended before step " + std::to_string(kill_at));
  if (LinesIn(metrics) != steps) {
    return Status::DataLoss(mode.name + ": " + std::to_string(LinesIn(metrics)) + " metrics lines for " +
                            std::to_string(steps) + " steps");
  }
  return seconds;
}

Status Main(int argc, char** argv) {
  runtime::FlagSet flags;
  flags.Add("sluice", "", "the sluice binary (default: apps/sluice next to this build's bench/)");
  flags.Add("repeats", "3", "runs of each mode, interleaved");
  flags.Add("steps", "30", "RL steps per run");
  flags.Add("kill-at", "10", "kill once the run has logged this many steps");
  flags.Add("json", "", "also write the results here");
  SLUICE_RETURN_IF_ERROR(flags.Parse(std::vector<std::string>(argv + 1, argv + argc)));
  if (flags.help_requested()) {
    std::printf("usage: recovery_bench [flags]\n%s", flags.Usage().c_str());
    return Status::Ok();
  }
  SLUICE_ASSIGN_OR_RETURN(std::string sluice, flags.GetString("sluice"));
  if (sluice.empty())
    sluice = (fs::canonical("/proc/self/exe").parent_path().parent_path() / "apps" / "sluice").string();
  if (!fs::exists(sluice)) return Status::NotFound("no sluice binary at " + sluice + " (pass --sluice)");
  SLUICE_ASSIGN_OR_RETURN(const int64_t repeats, flags.GetInt("repeats", 1, 20));
  SLUICE_ASSIGN_OR_RETURN(const int64_t steps, flags.GetInt("steps", 4, 10000));
  SLUICE_ASSIGN_OR_RETURN(const int64_t kill_at, flags.GetInt("kill-at", 1, steps - 2));
  SLUICE_ASSIGN_OR_RETURN(const std::string json, flags.GetString("json"));

  const int64_t lease = 5, interval = 5;
  const std::vector<std::string> config = {"model.preset=tiny",
                                           "sft.steps=0",
                                           "rl.steps=" + std::to_string(steps),
                                           "rl.prompts_per_step=4",
                                           "rl.group_size=4",
                                           "rl.max_new_tokens=32",
                                           "rl.dynamic_sampling=false",
                                           "eval.size=4",
                                           "eval.max_new_tokens=8",
                                           "eval.interval=0",
                                           "run.threads=1",
                                           "run.progress=off",
                                           "checkpoint.interval=" + std::to_string(interval),
                                           "pipeline.mode=async",
                                           "pipeline.max_staleness=2",
                                           "pipeline.processes=true",
                                           "pipeline.rollout_threads=1",
                                           "pipeline.trainer_threads=1",
                                           "pipeline.rollout_replicas=2",
                                           "pipeline.reward_workers=1",
                                           "pipeline.worker_lease_seconds=" + std::to_string(lease),
                                           "pipeline.max_restarts=2"};
  const std::vector<Mode> modes = {
      {"no kill", ""}, {"kill rollout replica 1", "rollout 1"}, {"kill trainer rank 0", "trainer 0"}};
  std::printf(
      "recovery_bench: every run async, process mode, 2 rollout replicas x 1 thread, 1 trainer x 1 thread, 1 "
      "reward worker (%u cores here); %lld steps x 4 prompts x 4 answers, up to 32 new tokens, tiny model; "
      "checkpoint every %lld steps; worker lease %lld s; kill (SIGKILL) after step %lld; %lld interleaved runs "
      "per mode\n",
      std::thread::hardware_concurrency(), static_cast<long long>(steps), static_cast<long long>(interval),
      static_cast<long long>(lease), static_cast<long long>(kill_at), static_cast<long long>(repeats));
  const fs::path dir = fs::temp_directory_path() / ("recovery_bench." + std::to_string(::getpid()));
  std::vector<std::vector<double>> seconds(modes.size());
  for (int64_t r = 0; r < repeats; ++r) {
    for (size_t m = 0; m < modes.size(); ++m) {
      SLUICE_ASSIGN_OR_RETURN(const double s, RunOnce(sluice, config, modes[m], steps, kill_at, dir / "run"));
      seconds[m].push_back(s);
      std::fprintf(stderr, "  %-24s run %lld: %.2f s\n", modes[m].name.c_str(), static_cast<long long>(r + 1), s);
    }
  }
  (void)RemoveTree(dir.string());
  const Stats base = Summarize(seconds[0]);
  std::printf("%-24s %18s %12s %10s\n", "mode", "wall s (min-max)", "lost s", "vs no kill");
  std::ostringstream out;
  out << "{\"steps\":" << steps << ",\"kill_at\":" << kill_at << ",\"modes\":[";
  for (size_t m = 0; m < modes.size(); ++m) {
    const Stats st = Summarize(seconds[m]);
    char range[64];
    std::snprintf(range, sizeof(range), "%.1f (%.1f-%.1f)", st.median, st.min, st.max);
    std::printf("%-24s %18s %+12.1f %9.2fx\n", modes[m].name.c_str(), range, st.median - base.median,
                st.median / base.median);
    out << (m ? "," : "") << "{\"mode\":\"" << modes[m].name << "\",\"median_s\":" << st.median
        << ",\"min_s\":" << st.min << ",\"max_s\":" << st.max << ",\"lost_s\":" << st.median - base.median << "}";
  }
  out << "]}\n";
  if (!json.empty()) SLUICE_RETURN_IF_ERROR(WriteFileAtomically(json, out.str()));
  return Status::Ok();
}

}  // namespace
}  // namespace sluice::bench

int main(int argc, char** argv) {
  const sluice::Status st = sluice::bench::Main(argc, argv);
  if (!st.ok()) {
    std::fprintf(stderr, "recovery_bench: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
